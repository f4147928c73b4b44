"""How fast is reified linear algebra? ``inv``, ``solve``, ``eigh``, ``svd`` and ``qr``
captured with from_torch: tdag's torch module (one ``torch.linalg`` call per kernel, the
multi-result ones through ``_rt.linalg_*``, which stack the results) / eager, at n = 64 and
256 (and 512 for ``inv``, the issue's 2x target); and ``to_onnx(runtime="onnxruntime")``'s
file on onnxruntime / eager: onnxruntime's ``Inverse`` kernel for ``inv`` at any n, the
unrolled compositions of standard ONNX for the others (refused past n = 64: "-").

Both sides on one thread, timed interleaved (A B B A ...) in one process, medians compared;
a ratio below 1 means tdag's module is faster. Target: within 1.2x of eager.

    python benchmarks/linalg_speed.py
    python benchmarks/linalg_speed.py --sizes 64,256,512 --rounds 31
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

import torch  # noqa: E402
from reify_speed import _inner, _session, interleaved_all, set_threads  # noqa: E402
from support.torch_models import Fn  # noqa: E402

import tdag  # noqa: E402

OPS = {
    "inv": (torch.linalg.inv, False),
    "solve": (lambda a, b: torch.linalg.solve(a, b), False),
    "eigh": (torch.linalg.eigh, True),
    "svd": (lambda a: torch.linalg.svd(a, full_matrices=False), False),
    "qr": (torch.linalg.qr, False),
}


def _args(name: str, n: int) -> tuple:
    torch.manual_seed(0)
    a = torch.randn(n, n)
    if OPS[name][1]:
        a = a @ a.T + n * torch.eye(n)
    return (a, torch.randn(n, 16)) if name == "solve" else (a,)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256")
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    set_threads(1)
    print(f"{'op':8} {'n':>5} {'eager ms':>10} {'tdag ms':>10} {'tdag/eager':>11} "
          f"{'onnx ms':>10} {'onnx/eager':>11}")
    for name, (fn, _) in OPS.items():
        for n in [int(s) for s in args.sizes.split(",")]:
            xs = _args(name, n)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                program = tdag.from_torch(Fn(fn).eval(), xs)
                module = tdag.to_torch(program)
            sides = [lambda: fn(*xs), lambda: module(*xs)]
            onnx_run = _onnx_run(program, xs)
            sides += [onnx_run] if onnx_run else []
            with torch.no_grad():
                times = interleaved_all(sides, args.rounds, _inner(sides[0]))
            onnx = f"{times[2] * 1e3:>10.3f} {times[2] / times[0]:>11.2f}" if onnx_run \
                else f"{'-':>10} {'-':>11}"
            print(f"{name:8} {n:>5} {times[0] * 1e3:>10.3f} {times[1] * 1e3:>10.3f} "
                  f"{times[1] / times[0]:>11.2f} {onnx}")


def _onnx_run(program, xs):
    """A call of the program's onnxruntime file, or None where to_onnx refuses it."""
    try:
        model = tdag.to_onnx(program, runtime="onnxruntime")
    except tdag.TdagError:
        return None
    session = _session(model.SerializeToString())
    feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), xs)}
    return lambda: session.run(None, feeds)


if __name__ == "__main__":
    main()
