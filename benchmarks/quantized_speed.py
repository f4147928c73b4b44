"""Re-emitted vs original time on onnxruntime for quantized files (issue 20).

A dynamically quantized BERT and a QDQ CNN (tests/support/quantized_files.py, built from
tiny random models by onnxruntime.quantization) are imported, re-emitted by ``tdag.to_onnx``
and run side by side in one process, one thread each: the median of ``--repeats`` runs,
printed as re-emitted/original ratios and their geometric mean (the issue wants each
<= 1.25, the geo-mean <= 1.05).

    python benchmarks/quantized_speed.py [--repeats 200]
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

import tdag

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from support.quantized_files import bert_dynamic, cnn_qdq  # noqa: E402


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    data = model.SerializeToString() if not isinstance(model, str) else model
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _median(session, feed, repeats: int) -> float:
    for _ in range(10):
        session.run(None, feed)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        for name, make in (("bert-dynamic", bert_dynamic), ("cnn-qdq", cnn_qdq)):
            path, feed = make(tmp)
            original = _session(str(path))
            emitted = _session(tdag.to_onnx(tdag.from_onnx(path)))
            t0, t1 = _median(original, feed, args.repeats), _median(emitted, feed, args.repeats)
            ratios.append(t1 / t0)
            print(f"{name:14s} original {t0 * 1e3:7.3f} ms  re-emitted {t1 * 1e3:7.3f} ms  "
                  f"ratio {t1 / t0:5.2f}x")
    print(f"geo-mean ratio {float(np.exp(np.mean(np.log(ratios)))):.2f}x")


if __name__ == "__main__":
    main()
