"""The grouped_mm kernel against torch's grouped matmuls, through every back end.

``ops.grouped_matmul`` lowers to ``grouped_mm``; the lowered program through ``tdag.run``,
``to_torch``, ``to_onnx`` (onnxruntime) and ``to_jax`` matches transformers'
``grouped_mm_fallback`` (float32 and float64) and ``torch._grouped_mm`` (float32, its rows
past the last offset set to zero, which it leaves unwritten) on offsets with empty groups,
one group holding every row, and rows past the last offset. Offsets the front ends never
write (unsorted, negative, past the rows) give what the composition gives. Tolerances:
float32 within 1e-5 relative and absolute (XLA's and onnxruntime's sums in their own order),
float64 exact to 1e-12.
"""
from __future__ import annotations

import functools
import importlib.util

import numpy as np
import pytest
import torch
import transformers.integrations.moe  # noqa: F401  (registers the fallback op)

import tdag
import tdag.lower
from tdag import ops

from support.guards import run_onnx

ROWS, IN, OUT = 9, 16, 8
SORTED = [[3, 3, 9], [0, 4, 7], [9, 9, 9], [0, 0, 0], [2, 6, 6]]
OTHER = [[7, 2, 5], [-3, 12, 4], [5, 1, 0], [4, 4, 20]]  # unsorted, negative, past the rows


def _program(dtype: str, offsets_dtype: str = "int32"):
    return tdag.trace(ops.grouped_matmul, tdag.TensorSpec(("s", IN), dtype),
                      tdag.TensorSpec((3, IN, OUT), dtype), tdag.TensorSpec((3,), offsets_dtype))


def _inputs(dtype, offsets, offsets_dtype=torch.int32):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(ROWS, IN, generator=gen, dtype=dtype),
            torch.randn(3, IN, OUT, generator=gen, dtype=dtype),
            torch.tensor(offsets, dtype=offsets_dtype))


@functools.lru_cache(maxsize=None)
def _back_ends(dtype: str, offsets_dtype: str = "int32") -> dict:
    """The lowered program (one grouped_mm) as each back end runs it, built once."""
    low = tdag.lower.lower(_program(dtype, offsets_dtype))
    assert [n.op.value for n in low.graph.nodes] == ["grouped_mm"]
    model, module = tdag.to_onnx(low, lower=False), tdag.to_torch(low, lower=False)
    fns = {"run": lambda *a: tdag.run(low, *a), "torch": module,
           "onnx": lambda *a: run_onnx(model, *a)}
    if importlib.util.find_spec("jax") is not None:
        jax_fn = tdag.to_jax(low, lower=False)
        fns["jax"] = lambda *a: torch.from_numpy(np.array(jax_fn(*[t.numpy() for t in a])))
    return fns


def _every_back_end(args, offsets_dtype: str = "int32") -> dict:
    dtype = str(args[0].dtype).removeprefix("torch.")
    return {where: fn(*args) for where, fn in _back_ends(dtype, offsets_dtype).items()}


def _tolerance(dtype) -> dict:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else \
        {"rtol": 1e-12, "atol": 1e-12}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("offsets", SORTED, ids=str)
def test_matches_transformers_fallback(offsets, dtype):
    args = _inputs(dtype, offsets)
    want = torch.ops.transformers.grouped_mm_fallback(*args)
    for where, got in _every_back_end(args).items():
        torch.testing.assert_close(got, want, **_tolerance(dtype), msg=where)


@pytest.mark.parametrize("offsets", SORTED, ids=str)
def test_matches_torch_grouped_mm(offsets):
    x, weight, offs = _inputs(torch.float32, offsets)
    want = torch._grouped_mm(x, weight, offs=offs)
    want[offsets[-1]:] = 0  # rows past the last offset: unwritten by torch, zero here
    got = _back_ends("float32")["torch"](x, weight, offs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("offsets", OTHER, ids=str)
def test_other_offsets_as_the_composition(offsets):
    """Offsets no front end writes: each row in the group counting the offsets <= it, rows
    from the last offset on zero, in every back end as in the composition."""
    args = _inputs(torch.float32, offsets, torch.int64)
    want = tdag.run(_program("float32", "int64"), *args)
    for where, got in _every_back_end(args, "int64").items():
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=where)


def test_no_rows():
    args = (torch.zeros(0, IN), torch.randn(3, IN, OUT), torch.tensor([0, 0, 0]).int())
    for where, got in _every_back_end(args).items():
        assert got.shape == (0, OUT), where


def test_cost_is_each_row_by_one_expert():
    low = tdag.lower.lower(_program("float32"))
    report = tdag.cost(low)
    s = low.graph.inputs[0].type.shape[0]
    assert report.matmul_flops == 2 * s * IN * OUT
