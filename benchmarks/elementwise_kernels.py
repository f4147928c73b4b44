"""torch functions that tdag.ops writes as compositions (|x|, leaky_relu, elu, hardsigmoid,
softplus, mish, floor, ceil, round, log1p, expm1, logsumexp, selu, celu, hardshrink,
softshrink, the 2-norm, logaddexp, nan_to_num, histc), reified: the torch module tdag
makes (one kernel each: ``tdag/lower/activations.py``, ``softmax.py``, ``norms.py``,
``writes.py``) and the same program
unlowered (the composition, ``to_torch(prog, lower=False)``), each / torch eager; and the
ONNX file tdag writes on onnxruntime / torch.onnx.export's file (dynamo), side by side in one
process, one thread, on an activation of a real CNN's size ([16, 64, 56, 56], 3.2M floats).
torch.onnx writes log1p as Log(1 + x) and expm1 as Exp(x) - 1, which lose every digit by 0
(log1p(1e-8) is 0); tdag's file writes Kahan's log1p (ten nodes) and tanh(x/2) (e^x + 1).

    python benchmarks/elementwise_kernels.py [--shape 16 64 56 56] [--rounds 15]
"""
from __future__ import annotations

import argparse
import io
import math
import os
import sys
import time
import warnings

import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import tdag  # noqa: E402

from support.torch_models import Fn  # noqa: E402

FUNCTIONS = {
    "abs": torch.abs,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.1),
    "elu": F.elu,
    "hardsigmoid": F.hardsigmoid,
    "softplus": F.softplus,
    "mish": F.mish,
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "log1p": lambda x: torch.log1p(x.abs()),
    "expm1": torch.expm1,
    "logsumexp": lambda x: torch.logsumexp(x, 1),
    "selu": F.selu,
    "celu": lambda x: F.celu(x, 0.5),
    "hardshrink": F.hardshrink,
    "softshrink": F.softshrink,
    "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=1),  # over the channels
    "normalize": lambda x: F.normalize(x, dim=-1),
    "logaddexp": lambda x: torch.logaddexp(x, x * 0.5),
    "nan_to_num": torch.nan_to_num,
    "histc": lambda x: torch.histc(x, 100, -3.0, 3.0),
}


def round_ratios(fns: dict, rounds: int) -> dict:
    """Milliseconds of each of ``fns`` (the first is the reference) and the median over rounds
    of each one's time / the reference's in the same round, the order rotating each round (a
    fresh output's page faults make single calls of this size vary 2-5x)."""
    names = list(fns)
    for fn in fns.values():  # warm up
        fn()
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            fns[n]()
            times[n].append(time.perf_counter() - start)
    ref = times[names[0]]
    return {n: (float(np.median(t)) * 1e3,
                float(np.median([a / b for a, b in zip(t, ref)]))) for n, t in times.items()}


def session(model_bytes: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def exported(module, x) -> bytes:
    """torch.onnx.export's file (dynamo), as bytes."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), buffer, dynamo=True, verbose=False)
    return buffer.getvalue()


def row(name: str, x: torch.Tensor, rounds: int) -> dict:
    module = Fn(FUNCTIONS[name])
    prog = tdag.from_torch(module, (x,))
    kernel, composition = tdag.to_torch(prog), tdag.to_torch(prog, lower=False)
    ours = session(tdag.to_onnx(prog).SerializeToString())
    theirs = session(exported(module, x))
    with torch.no_grad():
        error = float((kernel(x) - module(x)).abs().nan_to_num().max())
        torch_side = round_ratios({"eager": lambda: module(x), "kernel": lambda: kernel(x),
                                   "composition": lambda: composition(x)}, rounds)
    onnx_side = round_ratios({
        "export": lambda: theirs.run(None, {theirs.get_inputs()[0].name: x.numpy()}),
        "onnx": lambda: ours.run(None, {ours.get_inputs()[0].name: x.numpy()})}, rounds)
    return {"name": name, "error": error, **torch_side, **onnx_side}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[16, 64, 56, 56])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    x = torch.randn(*args.shape, generator=torch.Generator().manual_seed(0)) * 3
    print(f"x {list(x.shape)} f32, one thread, {args.rounds} interleaved rounds: ms medians, "
          "ratios medians of each round's, / eager (torch) and / torch.onnx.export's file "
          "(onnxruntime)")
    print(f"{'function':12} {'eager ms':>9} {'tdag x':>7} {'unlowered x':>12} {'export ms':>10} "
          f"{'onnx x':>7} {'err':>8}")
    ratios = []
    for name in FUNCTIONS:
        r = row(name, x, args.rounds)
        ratios.append((r["kernel"][1], r["composition"][1], r["onnx"][1]))
        print(f"{name:12} {r['eager'][0]:9.2f} {ratios[-1][0]:7.2f} {ratios[-1][1]:12.2f} "
              f"{r['export'][0]:10.2f} {ratios[-1][2]:7.2f} {r['error']:8.1e}", flush=True)
    geo = [math.exp(sum(math.log(r[k]) for r in ratios) / len(ratios)) for k in range(3)]
    print(f"geo-mean: tdag module x eager {geo[0]:.2f}, unlowered {geo[1]:.2f}; "
          f"tdag ONNX x export {geo[2]:.2f}")


if __name__ == "__main__":
    main()
