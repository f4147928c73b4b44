"""ONNX reads and writes at computed positions: Gather, GatherElements, GatherND,
ScatterElements (and the old Scatter), ScatterND, TensorScatter (a KV-cache write), and the
selections whose size data decides: NonZero, Compress.

Gathers and scatters reuse the ATen table's forms (ops/writes.py ``take_along``,
``scatter_elements``, ``combine_at``: writes are the scatter primitive, linear in what they
touch); a size data decides is a fresh one (tdag/deinops/runtime.py).
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.onnx import runtime
from tdag.canonicalize.onnx.ops.table import norm_axis, register
from tdag.canonicalize.onnx.values import Known, fits
from tdag.ops import writes
from tdag.errors import InvalidModelError
from tdag.ir.symbols import is_static, product
from tdag.ir.types import DType


def _wrapped(index, x, axis):
    """i64 indices with negatives counted from the end of ``x``'s ``axis``."""
    return writes.wrap(ops.cast(index, DType.i64), x, axis)


# -- gathers ---------------------------------------------------------------------------------------

@register("Gather")
def _gather(ctx, data, index):
    axis = norm_axis(ctx.attr("axis", 0), len(data.shape))
    if isinstance(data, Known) and isinstance(index, Known) and index.static and \
            fits(data.shape[:axis] + index.shape + data.shape[axis + 1:]):
        return Known(np.take(data.values, index.values.astype(np.int64), axis), data.dtype)
    picked = runtime.picked_entries(ctx, data, index.values.astype(np.int64)) \
        if axis == 0 and isinstance(index, Known) and index.static else None
    return runtime.known_or_noted(ctx, picked, data.dtype, lambda: ops.gather(
        ctx.tensor(data), ctx.tensor(index), axis))


@register("GatherElements")
def _gather_elements(ctx, x, index):
    x = ctx.tensor(x)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    return writes.take_along(x, axis, _wrapped(ctx.tensor(index), x, axis))


def _gather_nd(x, index, batch: int):
    """``x[b..., index[b..., :]]``: the first ``batch`` axes and the k indexed axes merged
    into one, gathered at the linear position."""
    k, linear = _nd_linear(x, index, batch)
    if batch:
        rows = ops.reshape(ops.iota(product(x.shape[:batch]), "i64", x.builder),
                           tuple(x.shape[:batch]) + (1,) * (linear.ndim - batch))
        linear = ops.add(ops.mul(rows, ops.size_tensor(x, tuple(range(batch, batch + k)),
                                                         DType.i64)), linear)
    merged = ops.flatten(x, 0, batch + k - 1) if batch + k > 0 else ops.unsqueeze(x, 0)
    out = ops.gather(merged, linear, 0, wrap=False)
    return out


def _nd_linear(x, index, batch: int, what: str = "GatherND") -> tuple:
    """(k, the row-major position of ``index[..., :k]`` among x's axes batch..batch+k-1)."""
    k = index.shape[-1]
    if not is_static(k) or k > x.ndim - batch:
        raise InvalidModelError(f"{what}: indices of depth {k} for {x.type}")
    index = ops.cast(index, DType.i64)
    linear = None
    for j in range(k):
        axis = batch + j
        part = _wrapped(ops.select(index, index.ndim - 1, j), x, axis)
        linear = part if linear is None else ops.add(
            ops.mul(linear, ops.size_tensor(x, (axis,), DType.i64)), part)
    if linear is None:
        linear = ops.zeros(tuple(index.shape[:-1]), DType.i64, like=x)
    return k, linear


@register("GatherND")
def _gather_nd_entry(ctx, x, index):
    x = ctx.tensor(x)
    return _gather_nd(x, ctx.tensor(index), ctx.attr("batch_dims", 0))


# -- scatters: the scatter primitive (ops/writes.py); duplicates under reduction "none" (which
# ONNX leaves undefined) resolve as torch's CPU kernels: the last in the index's order wins ----

_REDUCTION = {"none": "replace", "add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduction(ctx) -> str:
    return _REDUCTION[ctx.choice("reduction", "none", _REDUCTION)]


@register("ScatterElements", "Scatter")
def _scatter_elements(ctx, x, index, updates):
    x = ctx.tensor(x)
    axis = norm_axis(ctx.attr("axis", 0), x.ndim)
    return writes.scatter_elements(x, axis, ctx.tensor(index), ctx.tensor(updates),
                                   _reduction(ctx))


@register("ScatterND")
def _scatter_nd(ctx, x, index, updates):
    """The k indexed axes merged into one, whose rows the updates write."""
    x = ctx.tensor(x)
    k, linear = _nd_linear(x, ctx.tensor(index), 0, "ScatterND")
    merged = ops.flatten(x, 0, k - 1) if k > 0 else ops.unsqueeze(x, 0)
    out = writes.combine_at(merged, 0, linear, ctx.tensor(updates), _reduction(ctx))
    return ops.reshape(out, x.shape)


@register("TensorScatter")
def _tensor_scatter(ctx, cache, update, write_indices=None):
    """A KV-cache write: cache position p along ``axis`` of batch entry b takes update[s]
    for s = p - write_indices[b] (mod the cache length in circular mode) where 0 <= s <
    the update's length, else keeps its value: one gather of the update, no scatter."""
    cache, update = ctx.tensor(cache), ctx.tensor(update)
    axis = norm_axis(ctx.attr("axis", -2), cache.ndim)
    if axis == 0:
        raise InvalidModelError("TensorScatter: axis 0 is the batch axis")
    length, steps = cache.shape[axis], update.shape[axis]
    start = ops.zeros((cache.shape[0],), DType.i64, like=cache) if write_indices is None \
        else ops.cast(ctx.tensor(write_indices), DType.i64)
    shape = [1] * cache.ndim
    shape[0] = -1
    start = ops.reshape(start, tuple(shape))
    shape[0], shape[axis] = 1, -1
    offset = ops.sub(ops.reshape(ops.iota(length, "i64", ctx.builder), tuple(shape)), start)
    if ctx.choice("mode", "linear", ("linear", "circular")) == "circular":
        offset = ops.remainder(offset, ops.size_tensor(cache, (axis,), DType.i64))
    inside = ops.logical_and(ops.ge(offset, 0), ops.lt(offset, ops.size_tensor(
        update, (axis,), DType.i64)))
    index = ops.clamp(offset, 0, ops.sub(ops.size_tensor(update, (axis,), DType.i64), 1)) \
        if not (is_static(steps) and steps == 0) else offset
    sizes = list(cache.shape)
    index = ops.broadcast_to(index, tuple(sizes))
    written = writes.take_along(update, axis, index)
    return ops.where(ops.broadcast_to(inside, tuple(sizes)), written, cache)


# -- selections: sizes data decides ----------------------------------------------------------------

@register("NonZero")
def _nonzero(ctx, x):
    return ops.permute(ops.nonzero(ctx.tensor(x)), (1, 0))  # ONNX: one row per axis


@register("Compress")
def _compress(ctx, x, condition):
    x, condition = ctx.tensor(x), ctx.tensor(condition)
    if condition.ndim != 1:
        raise InvalidModelError(f"Compress: the condition must be 1-d, got {condition.type}")
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = ops.reshape(x, (-1,)), 0
    axis = norm_axis(axis, x.ndim)
    n, length = x.shape[axis], condition.shape[0]
    if is_static(n) and is_static(length) and length > n:
        raise InvalidModelError(f"Compress: a condition of {length} for an axis of {n}")
    if length != n:  # a shorter condition selects among the first elements only
        x = ops.slice(x, axis, 0, length)
    return ops.gather(x, ops.flat_nonzero(ops.cast(condition, DType.bool)), axis, wrap=False)
