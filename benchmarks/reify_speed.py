"""How fast is reified code? tdag's torch module vs the eager original, and tdag's ONNX vs
``torch.onnx.export``'s ONNX, both on onnxruntime.

Each model goes torch -> ``tdag.from_torch`` -> ``to_torch`` / ``to_onnx`` (lowered). The
two sides of each comparison are timed interleaved (A B B A ...: the order alternates every
round) and each side's median is taken, so a noisy machine slows both alike. A ratio below 1
means tdag's version is faster. Targets: at most 1.05 each, as a geometric mean.

    python benchmarks/reify_speed.py                  # all models, default sizes
    python benchmarks/reify_speed.py --models mlp,cnn --rounds 30
"""
from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

import tdag  # noqa: E402
import tdag.lower  # noqa: E402
from tdag.canonicalize import from_torch  # noqa: E402
from tdag.reify import to_onnx, to_torch  # noqa: E402
from support.torch_models import (CNN, MLP, Decoder, Encoder, Tagger, UNetBlock,  # noqa: E402
                          attention_mask, padding_mask)




# one thread each for torch and onnxruntime: on a shared machine, thread pools that wait
# for busy cores make small kernels 100x slower at random, which no interleaving evens out
THREADS = 1

# name -> (model factory, example inputs): sizes where kernels, not Python, take the time
MODELS = {
    "mlp": (lambda: MLP((256, 512, 512, 10)), lambda: (torch.randn(64, 256),)),
    "cnn": (lambda: CNN(3, 10), lambda: (torch.randn(16, 3, 32, 32),)),
    "encoder": (lambda: Encoder(128, 4, 2), lambda: (torch.randn(8, 64, 128), padding_mask(8, 64))),
    "decoder": (lambda: Decoder(vocab=512, d=128, layers=2, heads=4, kv_heads=2, hidden=256),
                lambda: (torch.randint(1, 512, (4, 64)), attention_mask(4, 64))),
    "tagger": (lambda: Tagger(200, 64, 64, 9), lambda: (torch.randint(1, 200, (8, 24)),)),
    "unet": (lambda: UNetBlock(16), lambda: (torch.randn(4, 16, 64, 64),)),
}


def set_threads(n: int) -> None:
    global THREADS
    THREADS = n
    torch.set_num_threads(n)


def interleaved(a, b, rounds: int, inner: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, timed in alternating order."""
    for _ in range(3):  # warm up both
        a(), b()
    times = {0: [], 1: []}
    fns = (a, b)
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for i in order:
            start = time.perf_counter()
            for _ in range(inner):
                fns[i]()
            times[i].append((time.perf_counter() - start) / inner)
    return statistics.median(times[0]), statistics.median(times[1])


def _inner(fn, budget: float = 0.02) -> int:
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(200, int(budget / once)))


def _session(model_bytes: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = options.inter_op_num_threads = THREADS
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _torch_onnx(model, args) -> bytes:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stdout, sys.stdout = sys.stdout, io.StringIO()
        try:
            program = torch.onnx.export(model, args, dynamo=True)
        finally:
            sys.stdout = stdout
    return program.model_proto.SerializeToString()


def bench(name: str, rounds: int) -> dict:
    torch.manual_seed(0)
    factory, make_inputs = MODELS[name]
    model = factory().eval()
    args = make_inputs()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = from_torch(model, args)
    lowered = tdag.lower.lower(prog)
    module = to_torch(lowered, lower=False).eval()
    with torch.inference_mode():
        ref = torch.utils._pytree.tree_leaves(model(*args))
        got = module(*args)
    got = got if isinstance(got, tuple) else (got,)
    error = max(((g - r).abs().max() / (r.abs().max() + 1e-12)).item() for g, r in zip(got, ref))

    def eager():
        with torch.inference_mode():
            return model(*args)

    def reified():
        with torch.inference_mode():
            return module(*args)

    t_eager, t_tdag = interleaved(eager, reified, rounds, _inner(eager))
    ours = _session(to_onnx(lowered, lower=False).SerializeToString())
    theirs = _session(_torch_onnx(model, args))
    feeds = [{i.name: a.numpy() for i, a in zip(s.get_inputs(), args)} for s in (ours, theirs)]
    run_theirs = lambda: theirs.run(None, feeds[1])  # noqa: E731
    run_ours = lambda: ours.run(None, feeds[0])  # noqa: E731
    onnx_error = max(float(np.abs(a - b.numpy()).max() / (np.abs(b.numpy()).max() + 1e-12))
                     for a, b in zip(run_ours(), ref))
    t_theirs, t_ours = interleaved(run_theirs, run_ours, rounds, _inner(run_theirs))
    return {"model": name, "nodes": prog.num_nodes, "lowered": lowered.num_nodes,
            "eager_ms": t_eager * 1e3, "tdag_ms": t_tdag * 1e3, "torch_ratio": t_tdag / t_eager,
            "ort_export_ms": t_theirs * 1e3, "ort_tdag_ms": t_ours * 1e3,
            "onnx_ratio": t_ours / t_theirs, "error": max(error, onnx_error)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=THREADS)
    opts = parser.parse_args()
    set_threads(opts.threads)
    rows = [bench(name, opts.rounds) for name in opts.models.split(",")]
    header = (f"{'model':<9} {'nodes':>6} {'lowered':>7} {'eager ms':>9} {'tdag ms':>8} "
              f"{'ratio':>6} {'ort(export) ms':>15} {'ort(tdag) ms':>13} {'ratio':>6} "
              f"{'max rel err':>11}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['model']:<9} {r['nodes']:>6} {r['lowered']:>7} {r['eager_ms']:>9.3f} "
              f"{r['tdag_ms']:>8.3f} {r['torch_ratio']:>6.3f} {r['ort_export_ms']:>15.3f} "
              f"{r['ort_tdag_ms']:>13.3f} {r['onnx_ratio']:>6.3f} {r['error']:>11.1e}")
    geo = lambda key: math.exp(statistics.fmean(math.log(r[key]) for r in rows))  # noqa: E731
    print(f"geometric mean: torch {geo('torch_ratio'):.3f}, onnxruntime {geo('onnx_ratio'):.3f}"
          f"  (target <= 1.05; below 1 is faster than the original)")


if __name__ == "__main__":
    main()
