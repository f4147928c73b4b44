"""ONNX order ops: TopK, ArgMax, ArgMin and Unique, over the ``sort`` primitive
(``tdag/ops/sorting.py``); Unique's count is a fresh size.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import norm_axis, register
from tdag.ops import sorting
from tdag.ir.symbols import is_static
from tdag.ir.types import DType


@register("TopK")
def _topk(ctx, x, k=None):
    """The k largest (smallest) in sorted order, ties by the lower index (the spec's rule,
    which the stable sort gives); a run-time k takes the first k of the whole sorted axis."""
    x = ctx.tensor(x)
    axis = norm_axis(ctx.attr("axis", -1), x.ndim)
    largest = ctx.flag("largest", 1)
    if ctx.opset < 10:
        count = ctx.attr("k")
    else:
        known = ctx.known(k)
        count = int(known.dims()[0]) if known is not None and is_static(known.dims()[0]) \
            else None
    if count is not None:
        return sorting.topk(x, count, axis, largest)
    values, index = sorting.sort(x, axis, largest)
    first = ops.arange_of(ops.reshape(ops.cast(ctx.tensor(k), DType.i64), ()))
    return (ops.gather(values, first, axis, wrap=False),
            ops.gather(index, first, axis, wrap=False))


def _arg(extreme):
    def convert(ctx, x):
        x = ctx.tensor(x)
        axis = norm_axis(ctx.attr("axis", 0), x.ndim)
        keep = ctx.flag("keepdims", 1)
        if not ctx.flag("select_last_index", 0):
            return (ops.argmax if extreme is ops.amax else ops.argmin)(x, axis, keep)
        hit = ops.eq(x, extreme(x, axis, True))
        if x.dtype.is_float:
            hit = ops.logical_or(hit, ops.isnan(x))
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        positions = ops.reshape(ops.iota(x.shape[axis], "i64", x.builder), tuple(shape))
        return ops.amax(ops.where(hit, positions, -1), axis, keep)
    return convert


register("ArgMax")(_arg(ops.amax))


register("ArgMin")(_arg(ops.amin))


@register("Unique")
def _unique(ctx, x):
    x, axis, ordered = ctx.tensor(x), ctx.attr("axis"), bool(ctx.attr("sorted", 1))
    if axis is None:
        return sorting.unique_all(x, ordered)
    return sorting.unique_slices(x, norm_axis(axis, x.ndim), ordered)
