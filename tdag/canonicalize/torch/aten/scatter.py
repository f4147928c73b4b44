"""Writes at computed positions: scatter, index_put, masked_scatter and their kin.

tdag has no scatter primitive. Every write is brought to one form, on the flattened target:
``positions`` (where each value goes) and ``values``; the positions are found by running the
matching *read* (gather, index) on a tensor of flat positions, so the two can never disagree.
The write itself compares each position with every target element (one-hot, O(M*N)): exact,
but a reference implementation for modest sizes. Among duplicate positions without
accumulation the last write wins, as in torch's CPU kernels (torch leaves it unspecified).
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten import indexing
from tdag.canonicalize.torch.aten.movement import diagonal
from tdag.canonicalize.torch.aten.registry import aten, scalar
from tdag.ops.writes import positions_of, write
from tdag.ir.types import DType


# -- torch.scatter family: positions along one dim ------------------------------------------------

@aten("scatter")
def scatter(x, dim, index, src=None, value=None, reduce=None):
    src = src if src is not None else value
    positions = indexing.gather(positions_of(x), dim, index)
    if hasattr(src, "dtype"):
        src = _cropped(src, index.shape)
    mode = {None: "replace", "add": "sum", "multiply": "prod"}[reduce]
    return write(x, positions, scalar(src) if not hasattr(src, "dtype") else src, mode)


@aten("scatter_add")
def scatter_add(x, dim, index, src):
    return write(x, indexing.gather(positions_of(x), dim, index), _cropped(src, index.shape),
                 "sum")


@aten("scatter_reduce.two")
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    positions = indexing.gather(positions_of(x), dim, index)
    return write(x, positions, _cropped(src, index.shape), reduce, include_self)


def _cropped(src, shape):
    """ATen reads src only where index has elements."""
    for axis, size in enumerate(shape):
        src = ops.slice(src, axis, 0, size)
    return src


# -- advanced-index writes ------------------------------------------------------------------------

@aten("index_put", "_unsafe_index_put")
def index_put(x, indices, values, accumulate=False):
    masks = [i for i in indices if i is not None and i.dtype is DType.bool]
    if masks and len(indices) == 1 and _one_value(values):  # x[mask] = v
        mask = ops.reshape(masks[0], tuple(masks[0].shape) + (1,) * (x.ndim - masks[0].ndim))
        value = ops.reshape(values, ())
        return ops.where(mask, ops.add(x, value) if accumulate else value, x)
    axis = _one_axis(x, indices)
    if axis is not None and not accumulate:
        return _put_along(x, axis, indices[axis], values)
    positions = indexing.index(positions_of(x), indices)
    return write(x, positions, values, "sum" if accumulate else "replace")


def _one_axis(x, indices) -> int | None:
    """The axis of ``x[:, ..., idx] = v`` (one 1-D integer index, whole slices elsewhere: a
    KV-cache update), else None."""
    given = [a for a, i in enumerate(indices) if i is not None]
    if len(given) != 1:
        return None
    idx = indices[given[0]]
    return given[0] if idx.ndim == 1 and idx.dtype is not DType.bool else None


def _put_along(x, axis: int, idx, values):
    """``x[..., idx, ...] = values`` compared along that axis only (O(len(idx) * x.shape[axis])
    plus one pass over x), not element by element: the last write to a position wins."""
    idx = indexing.wrap(ops.cast(idx, DType.i64), x, axis)
    length = x.shape[axis]
    shape = list(x.shape)
    shape[axis] = idx.shape[0]
    values = ops.broadcast_to(ops.cast(values, x.dtype), tuple(shape))
    hit = ops.eq(ops.unsqueeze(idx, 1), ops.unsqueeze(ops.iota(length, "i64", x.builder), 0))
    order = ops.unsqueeze(ops.iota(idx.shape[0], "i64", x.builder), 1)
    last = ops.amax(ops.where(hit, order, -1), 0)                       # [length]
    picked = ops.gather(values, ops.maximum(last, 0), axis, wrap=False)  # shaped like x
    along = [1] * x.ndim
    along[axis] = length
    touched = ops.reshape(ops.ge(last, 0), tuple(along))
    return ops.where(touched, picked, x)


def _one_value(values):
    return all(d == 1 for d in values.shape)


@aten("index_reduce")
def index_reduce(x, dim, index, source, reduce, include_self=True):
    positions = indexing.index_select(positions_of(x), dim, index)
    return write(x, positions, source, reduce, include_self)


@aten("put")
def put(x, index, source, accumulate=False):
    flat = ops.reshape(x, (-1,))
    positions = indexing.wrap(ops.cast(index, DType.i64), flat, 0)  # index is a flat position
    return write(x, positions, ops.reshape(source, positions.shape),
                 "sum" if accumulate else "replace")


@aten("diagonal_scatter")
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    return write(x, diagonal(positions_of(x), offset, dim1, dim2), src)


@aten("masked_scatter")
def masked_scatter(x, mask, source):
    """Masked elements take source's elements in order: the k-th masked element (a running
    count of the mask) takes source.flatten()[k]."""
    mask = ops.broadcast_to(mask, x.shape)
    flat_mask = ops.reshape(ops.cast(mask, DType.i64), (-1,))
    order = ops.sub(ops.cumsum(flat_mask, 0), 1)
    picked = ops.gather(ops.reshape(source, (-1,)), ops.maximum(order, 0), 0)
    return ops.where(mask, ops.reshape(picked, x.shape), x)
