"""The 9 real CNNs that ship with onnx (``onnx/backend/test/data/light``), imported by
``tdag.from_onnx`` and re-emitted by ``tdag.to_onnx``: each re-emitted model's time on
onnxruntime over the original's, side by side in one process (interleaved rounds, medians,
one thread). A ratio below 1 means tdag's model is faster. Targets: each within 1.10x,
geo-mean at most 1.05x. The largest output difference is printed beside: these files' weights
are constants, so some (SqueezeNet, ResNet-50) reach logits of 1e10 to 1e19 that are equal
only in exact arithmetic, and their softmax then depends on the last bit of each sum; the
tests (tests/canonicalize/onnx/test_onnx_robust.py) check every model's output on a fixed input.

    python benchmarks/light_models.py
    python benchmarks/light_models.py --models vgg19,resnet50 --rounds 20
"""
from __future__ import annotations

import argparse
import glob
import os
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort

import tdag

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def data_input(model: onnx.ModelProto) -> onnx.ValueInfoProto:
    """The graph input that is not a weight (old files list initializers as inputs)."""
    weights = {i.name for i in model.graph.initializer}
    return next(i for i in model.graph.input if i.name not in weights)


def measure(path: str, rounds: int) -> tuple[float, float, float, float]:
    """(convert seconds, original median seconds, tdag median seconds, max |difference|)."""
    original = onnx.load(path)
    start = time.perf_counter()
    emitted = tdag.to_onnx(tdag.from_onnx(path))
    convert = time.perf_counter() - start
    name = data_input(original).name
    shape = [d.dim_value for d in data_input(original).type.tensor_type.shape.dim]
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    sides = [(session(original), name), (session(emitted), emitted.graph.input[0].name)]
    outs = [s.run(None, {n: x})[0] for s, n in sides]
    difference = float(np.abs(outs[1] - outs[0]).max())
    times: list[list[float]] = [[], []]
    for r in range(rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):
            s, n = sides[k]
            t = time.perf_counter()
            s.run(None, {n: x})
            times[k].append(time.perf_counter() - t)
    return convert, statistics.median(times[0]), statistics.median(times[1]), difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated, e.g. vgg19,resnet50")
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(LIGHT, "light_*.onnx")))
    wanted = set(args.models.split(",")) if args.models else None
    print(f"{'model':<14}{'convert s':>10}{'original ms':>13}{'tdag ms':>10}{'ratio':>8}"
          f"{'max |diff|':>12}")
    ratios = []
    for path in paths:
        name = os.path.basename(path)[len("light_"):-len(".onnx")]
        if wanted and name not in wanted:
            continue
        convert, orig, ours, difference = measure(path, args.rounds)
        ratios.append(ours / orig)
        print(f"{name:<14}{convert:>10.2f}{orig * 1e3:>13.1f}{ours * 1e3:>10.1f}"
              f"{ours / orig:>8.2f}{difference:>12.1e}")
    geo = statistics.geometric_mean(ratios)
    print(f"geo-mean ratio {geo:.3f}, worst {max(ratios):.2f} ({len(ratios)} models)")


if __name__ == "__main__":
    main()
