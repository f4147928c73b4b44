"""The ``sort`` primitive: the permutation of a stable sort along one axis.

Its output is the i64 permutation, not the values: the sorted values are a take-along gather
of the input with it (``tdag.ops.sorting.sort``), and so is every other operand sorted by the
same key (JAX's multi-operand sort). Ties keep their input order (torch's ``stable=True``;
an unstable framework sort may order ties either way, so stable is one of its valid
answers). NaN is larger than every number, as torch orders it: last ascending, first
descending; -0.0 and 0.0 are equal (a tie). Top-k, k-th value, median, unique and
searchsorted are compositions over it (``tdag/ops/sorting.py``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import sympy
import torch

from tdag.deinops.primitive import Cost, primitive
from tdag.errors import ShapeError
from tdag.ir.batching import AxisRule, same_axis
from tdag.ir.op import Op
from tdag.ir.record import Trait, no_gradient
from tdag.ir.symbols import Dim, as_dim, is_static
from tdag.ir.types import DType, TensorType


@dataclass(frozen=True, slots=True)
class Sort:
    axis: int
    descending: bool = False


def _sort_shape(spec: Sort, ins):
    (x,) = ins
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"sort: axis {spec.axis} out of range for {x}")
    return TensorType(x.shape, DType.i64)


def _sort_eval(spec: Sort, xs, resolve):
    return torch.sort(xs[0], dim=spec.axis, descending=spec.descending, stable=True).indices


def comparisons(n: Dim) -> Dim:
    """ceil(log2 n): the comparisons a merge sort makes per element of an n-long row."""
    if is_static(n):
        return math.ceil(math.log2(n)) if int(n) > 1 else 0
    return as_dim(sympy.ceiling(sympy.log(n, 2)))


def _sort_cost(spec: Sort, ins, out: TensorType) -> Cost:
    (x,) = ins
    return Cost(as_dim(x.numel * comparisons(x.shape[spec.axis])), x.nbytes, out.nbytes)


def _sort_torch(node, a, code):
    s = node.spec
    return f"torch.sort({a[0]}, dim={s.axis}, descending={s.descending}, stable=True).indices"


_TOP_BIT = -2 ** 63


def onnx_order_key(g, x: str, dtype: DType) -> tuple[str, object]:
    """(a tensor onnxruntime's TopK takes, ordered as ``x``; the function taking its values
    back to ``dtype``): bool, bf16, uint16/32 widen exactly; uint64 becomes int64 with the top
    bit flipped, which maps unsigned order onto signed order."""
    if dtype is DType.u64:
        top = g.const(_TOP_BIT)
        key = g.node("BitwiseXor", [g.cast(x, DType.i64), top])
        return key, lambda v: g.cast(g.node("BitwiseXor", [v, top]), DType.u64)
    wider = {DType.bool: DType.u8, DType.bf16: DType.f32, DType.u16: DType.i64,
             DType.u32: DType.i64}.get(dtype)
    if wider is None:
        return x, lambda v: v
    return g.cast(x, wider), lambda v: g.cast(v, dtype)


def _sort_onnx(node, ins, g, cx):
    """TopK of the whole axis: onnxruntime breaks ties by the lower index and orders NaN as
    the largest value, as torch (tests/deinops/test_sort.py checks both)."""
    x, _ = onnx_order_key(g, ins[0], cx.type(node.inputs[0]).dtype)
    n = g.node("Shape", [x], start=node.spec.axis, end=node.spec.axis + 1)
    _, index = g.node("TopK", [x, n], axis=node.spec.axis,
                      largest=int(node.spec.descending), sorted=1, outputs=2)
    return index


def _sort_jax(node, a, cx):
    # jnp's stable descending sort keeps ties in input order and puts NaN first, as torch
    return cx.jnp.argsort(a[0], axis=node.spec.axis, stable=True,
                          descending=node.spec.descending).astype(cx.dtype(DType.i64))


# works along its axis only: any other axis may be the batch
_SORT_BATCH = AxisRule(
    lambda s, t: {s.axis}, same_axis, lambda s, t, p: Sort(s.axis - (p < s.axis), s.descending),
    lambda s: Sort(s.axis + 1, s.descending), mixing="sorts along the batch axis")


primitive(Op.sort, Sort, 1, _sort_shape, _sort_eval, _sort_cost,
          "the stable sorting permutation along an axis: n log n compares per row, where "
          "ranking every pair (the composition) costs n^2 time and memory",
          traits=Trait.NONE, batch=_SORT_BATCH,
          torch=_sort_torch, onnx=_sort_onnx, jax=_sort_jax, vjp=no_gradient)
