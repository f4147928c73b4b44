"""How fast is a reified recurrent model? The LSTM tagger (embedding, 2-layer bidirectional
``nn.LSTM``, linear), captured once with a dynamic sequence length, at several lengths:
tdag's torch module / eager, and tdag's ONNX on onnxruntime / eager.

``from_torch`` makes the LSTM a Loop per layer and direction; lowering turns each loop into
the fused ``lstm`` kernel (``torch.lstm``, ONNX ``LSTM``). Both sides of each comparison run
on one thread, timed interleaved (A B B A ...) in one process, medians compared. A ratio
below 1 means tdag's version is faster. Target: reified torch no slower than eager (<= 1.0)
at lengths 16 and 256.

    python benchmarks/recurrent_speed.py
    python benchmarks/recurrent_speed.py --lengths 16,64,256 --rounds 31
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from reify_speed import _inner, _session, interleaved, set_threads  # noqa: E402
from support.torch_models import Tagger  # noqa: E402

import tdag  # noqa: E402
import tdag.lower  # noqa: E402
from tdag.ir.program import Loop  # noqa: E402
from tdag.reify import to_onnx, to_torch  # noqa: E402

BATCH, VOCAB = 8, 200


def capture(model) -> tdag.Program:
    tokens = torch.randint(1, VOCAB, (BATCH, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tdag.from_torch(model, (tokens,),
                               dynamic_shapes=({1: torch.export.Dim("seq", min=2)},))


def bench(model, module, session, length: int, rounds: int) -> dict:
    tokens = torch.randint(1, VOCAB, (BATCH, length))
    feeds = {session.get_inputs()[0].name: tokens.numpy()}

    def eager():
        with torch.inference_mode():
            return model(tokens)

    def reified():
        with torch.inference_mode():
            return module(tokens)

    def ort_run():
        return session.run(None, feeds)[0]

    want = eager()
    error = max(float((reified() - want).abs().max()),
                float(np.abs(ort_run() - want.numpy()).max()))
    inner = _inner(eager)
    t_eager, t_tdag = interleaved(eager, reified, rounds, inner)
    t_eager2, t_ort = interleaved(eager, ort_run, rounds, inner)
    return {"length": length, "eager_ms": t_eager * 1e3, "tdag_ms": t_tdag * 1e3,
            "torch_ratio": t_tdag / t_eager, "ort_ms": t_ort * 1e3,
            "onnx_ratio": t_ort / t_eager2, "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="16,256")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    set_threads(opts.threads)
    torch.manual_seed(0)
    model = Tagger(VOCAB, 64, 64, 9).eval()
    prog = capture(model)
    lowered = tdag.lower.lower(prog)
    loops = sum(isinstance(s, Loop) for s in prog.main.steps)
    kernels = sum(n.op.value == "lstm" for g in lowered.graphs.values() for n in g.nodes)
    print(f"tagger: {prog.num_nodes} nodes, {loops} loops; lowered: {lowered.num_nodes} nodes, "
          f"{kernels} lstm kernels; batch {BATCH}, {opts.threads} thread(s)")
    module = to_torch(lowered, lower=False).eval()
    session = _session(to_onnx(lowered, lower=False).SerializeToString())
    rows = [bench(model, module, session, int(n), opts.rounds) for n in opts.lengths.split(",")]
    header = (f"{'length':>6} {'eager ms':>9} {'tdag ms':>8} {'ratio':>6} {'ort(tdag) ms':>13} "
              f"{'ratio':>6} {'max abs err':>11}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['length']:>6} {r['eager_ms']:>9.3f} {r['tdag_ms']:>8.3f} "
              f"{r['torch_ratio']:>6.3f} {r['ort_ms']:>13.3f} {r['onnx_ratio']:>6.3f} "
              f"{r['error']:>11.1e}")
    print("ratios: tdag time / eager nn.LSTM time (target <= 1.0 for the torch module)")


if __name__ == "__main__":
    main()
