"""The scan primitive and the cumulative ops over it, against torch, onnxruntime and numpy.

The one-node differential cases (every combine, dtype, reverse, empty and symbolic axes, NaN
and infinities) are rows of tests/support/primitive_cases.py; here: the ATen entries through
``from_torch`` (values and torch's indices of cummax/cummin with ties and NaN, the dtypes
torch promotes to, logcumsumexp over a wide range), ONNX's CumSum/CumProd attributes, the
algebra (hypothesis) and the cost, linear in the axis.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import tdag
from tdag import ops
from tdag.ir.op import Op

from support.guards import assert_close, run_onnx


class Cumulative(torch.nn.Module):
    """Every cumulative ATen op of a tensor, along axis 1."""

    def forward(self, x):
        outs = [torch.cumsum(x, 1), torch.cumprod(x, 1), *torch.cummax(x, 1),
                *torch.cummin(x, 1), torch.cumsum(x, 1, dtype=torch.int32)]
        if x.dtype.is_floating_point:
            outs.append(torch.logcumsumexp(x, 1))
        return tuple(outs)


def _ties(dtype: torch.dtype, shape=(3, 11)) -> torch.Tensor:
    """Few distinct values, so running extremes tie; NaN and infinities for floats."""
    g = torch.Generator().manual_seed(0)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    x = torch.randint(-2, 3, shape, generator=g).to(dtype)
    if dtype.is_floating_point:
        x[0, 4], x[0, 8], x[1, 0], x[2, 5] = float("nan"), float("nan"), float("inf"), -float("inf")
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.int64,
                                   torch.int32, torch.int8, torch.bool], ids=str)
def test_aten_cumulative_ops_match_torch(dtype):
    x = _ties(dtype)
    ref = Cumulative()(x)
    prog = tdag.from_torch(Cumulative(), (x,))
    assert not any(n.op is Op.unfold for n in prog.graph.nodes)
    assert_close(tdag.run(prog, x), ref, "run")
    assert_close(tdag.to_torch(prog)(x), ref, "to_torch")
    assert_close(run_onnx(tdag.to_onnx(prog), x), ref, "to_onnx")


def test_aten_cumulative_ops_over_an_empty_axis():
    x = torch.zeros(2, 0)
    prog = tdag.from_torch(Cumulative(), (x,))
    assert_close(tdag.to_torch(prog)(x), Cumulative()(x))
    assert_close(run_onnx(tdag.to_onnx(prog), x), Cumulative()(x))


def test_logcumsumexp_is_stable_over_a_wide_range():
    """Terms far below the row's top (-1000 next to 0, rows spanning +-300) neither vanish
    to -inf nor overflow: within f32's rounding of torch's own sequential kernel."""
    g = torch.Generator().manual_seed(1)
    x = torch.cat([torch.tensor([[-1000.0, 0.0, 5.0, -float("inf"), 3.0] * 60]),
                   torch.rand(2, 300, generator=g) * 600 - 300,
                   torch.tensor([[-float("inf")] * 150 + [1.0] * 150]),
                   torch.tensor([[80.0, 90.0, float("inf"), 1.0] * 75])])

    class Lcse(torch.nn.Module):
        def forward(self, x):
            return torch.logcumsumexp(x, 1), torch.logcumsumexp(x.double(), 0)

    prog = tdag.from_torch(Lcse(), (x,))
    ref = Lcse()(x)
    for got in (tdag.run(prog, x), tdag.to_torch(prog)(x), run_onnx(tdag.to_onnx(prog), x)):
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5, equal_nan=True)


# -- ONNX ------------------------------------------------------------------------------------

def _onnx_scan(op: str, dtype, axis: int, reverse: int, exclusive: int, opset: int):
    node = helper.make_node(op, ["x", "axis"], ["y"], reverse=reverse, exclusive=exclusive)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", dtype, [3, 7])],
        [helper.make_tensor_value_info("y", dtype, [3, 7])],
        [helper.make_tensor("axis", TensorProto.INT64, [], [axis])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _numpy_scan(x, ufunc, axis, reverse, exclusive, identity):
    y = np.flip(x, axis) if reverse else x
    if exclusive:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (1, 0)
        y = np.pad(y, widths, constant_values=identity).take(range(x.shape[axis]), axis)
    y = ufunc.accumulate(y, axis=axis, dtype=x.dtype)
    return np.flip(y, axis) if reverse else y


@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.INT32])
def test_onnx_cumsum_matches_onnxruntime(reverse, exclusive, dtype):
    model = _onnx_scan("CumSum", dtype, -1, reverse, exclusive, 17)
    x = torch.from_numpy(np.random.default_rng(2).integers(-9, 9, (3, 7))).to(
        torch.float32 if dtype == TensorProto.FLOAT else torch.int32)
    prog = tdag.from_onnx(model)
    assert {n.op for n in prog.graph.nodes} & {Op.scan}
    ref = run_onnx(model, x)
    assert_close(tdag.run(prog, x), ref)
    assert_close(run_onnx(tdag.to_onnx(prog), x), ref)


@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("exclusive", [0, 1])
def test_onnx_cumprod_matches_numpy(reverse, exclusive):
    """onnxruntime runs no CumProd (opset 26): numpy's multiply.accumulate is the reference."""
    model = _onnx_scan("CumProd", TensorProto.FLOAT, 0, reverse, exclusive, 26)
    x = np.random.default_rng(3).uniform(0.5, 1.5, (3, 7)).astype(np.float32)
    prog = tdag.from_onnx(model)
    ref = torch.from_numpy(_numpy_scan(x, np.multiply, 0, reverse, exclusive, 1.0).copy())
    assert_close(tdag.run(prog, torch.from_numpy(x)), ref)
    assert_close(run_onnx(tdag.to_onnx(prog), torch.from_numpy(x)), ref)


class Running(torch.nn.Module):
    """cumprod, cummax and cummin (values and indices) along axis 1, forward and reversed."""

    def forward(self, x):
        r = x.flip(1)
        return (torch.cumprod(x, 1), *torch.cummax(x, 1), *torch.cummin(x, 1),
                torch.cumprod(r, 1).flip(1), torch.cummax(r, 1).values.flip(1),
                torch.cummin(r, 1).values.flip(1))


def test_onnx_running_prod_max_min_along_a_symbolic_axis_match_torch():
    """ONNX has CumSum only: along an axis whose length is symbolic, prod/max/min are an
    ONNX Scan carrying the running value (zeros, negatives, NaN and ties included)."""
    n = torch.export.Dim("n", min=2)
    prog = tdag.from_torch(Running(), (_ties(torch.float32, (3, 11)),),
                           dynamic_shapes=({1: n},))
    model = tdag.to_onnx(prog)
    for length in (9, 10, 23):
        x = _ties(torch.float32, (3, length))
        assert_close(run_onnx(model, x), Running()(x))


# -- algebra ---------------------------------------------------------------------------------

_COMBINES = st.sampled_from(["add", "mul", "max", "min"])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(0, 1), _COMBINES,
       st.sampled_from(["float32", "int64", "bool"]), st.integers(0, 2 ** 31))
def test_a_reverse_scan_is_the_scan_of_the_flipped_axis(n, axis, combine, dtype, seed):
    shape = (3, n) if axis else (n, 3)
    x = _draw(shape, dtype, seed)
    flip = torch.arange(shape[axis] - 1, -1, -1)
    prog = tdag.trace(lambda t: (ops.scan(t, axis, combine, reverse=True),
                                 ops.gather(ops.scan(ops.gather(t, flip, axis), axis, combine),
                                            flip, axis)),
                      tdag.TensorSpec(shape, dtype))
    rev, flipped = tdag.run(prog, x)
    assert_close(rev, flipped)
    assert_close(run_onnx(tdag.to_onnx(prog, lower=False), x), (rev, flipped))


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 50), st.sampled_from(["add", "max", "min"]), st.integers(0, 2 ** 31))
def test_the_last_entry_of_a_scan_is_the_reduction(n, combine, seed):
    x = _draw((4, n), "int64", seed)
    kind = {"add": "sum"}.get(combine, combine)
    prog = tdag.trace(lambda t: (ops.scan(t, 1, combine), ops.reduce(t, kind, (1,))),
                      tdag.TensorSpec((4, n), "int64"))
    scanned, reduced = tdag.to_torch(prog)(x)
    assert torch.equal(scanned[:, -1], reduced)
    assert torch.equal(tdag.run(prog, x)[0], scanned)


def _draw(shape, dtype: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == "bool":
        return torch.rand(shape, generator=g) < 0.5
    if dtype == "int64":
        return torch.randint(-4, 5, shape, generator=g)
    return torch.rand(shape, generator=g) + 0.5  # products of 40 stay in range


# -- cost ------------------------------------------------------------------------------------

def test_cost_is_linear_in_the_axis():
    """One combine per element: a cumulative sum over 65,536 positions counts 65,536 flops
    per row (the unfolded form counted n^2 / 2 more)."""
    prog = tdag.trace(lambda x: ops.cumsum(x, 1), tdag.TensorSpec((8, 65536)))
    assert tdag.cost(prog).flops == 8 * 65536
    prog = tdag.trace(lambda x: ops.cummax(x, 1), tdag.TensorSpec((8, 65536)))
    assert tdag.cost(prog).flops <= 8 * 8 * 65536
