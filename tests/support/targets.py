"""A torch function captured with from_torch and run on every target: tdag.run, to_torch,
to_jax and to_onnx (onnxruntime), each output compared with eager; the linear-algebra and
special-function tests share it."""
from __future__ import annotations

import warnings

import numpy as np
import torch

import tdag
from support.guards import run_onnx
from support.torch_models import Fn


def _tuple(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def on_targets(prog, args, targets=("run", "torch", "onnx", "jax")) -> dict:
    """{target: the program's outputs as a tuple of torch tensors}."""
    runners = {
        "run": lambda: tdag.run(prog, *args),
        "torch": lambda: tdag.to_torch(prog)(*args),
        "onnx": lambda: run_onnx(tdag.to_onnx(prog), *args),
        "jax": lambda: tuple(torch.from_numpy(np.array(o)) for o in
                             _tuple(tdag.to_jax(prog)(*[a.numpy() for a in args]))),
    }
    with torch.no_grad():
        return {t: _tuple(runners[t]()) for t in targets}


def capture(fn, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tdag.from_torch(Fn(fn).eval(), tuple(args))


def assert_on_targets(fn, args, rtol=1e-4, atol=1e-5, targets=("run", "torch", "onnx", "jax"),
                      normalize=lambda outs: outs):
    """fn's outputs on every target equal eager's within rtol, atol of the output's scale
    (NaN where eager has NaN); ``normalize`` maps both sides first (eigenvector signs)."""
    with torch.no_grad():
        want = normalize(_tuple(fn(*args)))
    prog = capture(fn, args)
    for target, got in on_targets(prog, args, targets).items():
        got = normalize(got)
        assert len(got) == len(want), target
        for g, w in zip(got, want):
            assert g.shape == w.shape, (target, g.shape, w.shape)
            if not w.is_floating_point():
                assert torch.equal(g.to(w.dtype), w), target
                continue
            finite = w[torch.isfinite(w)]
            scale = finite.abs().max().item() if finite.numel() else 1.0
            torch.testing.assert_close(g.to(w.dtype), w, rtol=rtol, atol=atol * max(scale, 1.0),
                                       equal_nan=True, msg=lambda m, t=target: f"{t}: {m}")
    return prog
