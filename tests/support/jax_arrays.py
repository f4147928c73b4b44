"""Tensors between torch and JAX bit for bit (bfloat16 and float8 included, as numpy's view of
JAX's ml_dtypes), and a JAX function run on torch tensors: the JAX back end's tests
(tests/reify/test_to_jax.py) and benchmark (benchmarks/jax_speed.py).
"""
from __future__ import annotations

import numpy as np
import torch

import tdag
from tdag.reify.jax.context import jax_dtype, tdag_dtype


_INT = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """Bit for bit, bfloat16 and float8 included (numpy's view of JAX's ml_dtypes)."""
    t = t.detach().contiguous()
    bits = t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
                  [t.element_size()]).numpy()
    return bits.view(jax_dtype(tdag.DType.of(t.dtype)))


def to_torch(a) -> torch.Tensor:
    """A JAX or numpy array as a torch tensor of the same bits and element type."""
    a = np.asarray(a)
    bits = torch.from_numpy(a.view(_INT[a.dtype.itemsize]).copy())
    return bits.view(tdag_dtype(a.dtype, "an output").torch)


def run_jax(fn, args, **kw):
    """``fn`` on ``args`` (torch tensors) and its outputs as torch tensors."""
    outs = fn(*[to_numpy(a) for a in args], **kw)
    return tuple(to_torch(o) for o in outs) if isinstance(outs, tuple) else to_torch(outs)
