"""Writes at computed positions: scatter, index_put, index_add and their kin, bincount.

Every write is tdag's ``scatter`` primitive (rows written along one axis with a combine,
linear in what it touches) through ``tdag/ops/writes.py``: ``combine_at`` for rows along an
axis (index_add, index_copy, index_reduce, index_put on one axis or on adjacent axes merged),
``scatter_elements`` for torch.scatter's per-element index (a write at computed linear
positions of the flattened target, or rows where the index is one column broadcast), and
``write`` for flat positions. Among duplicate positions without accumulation the last write
(in the index's row-major order) wins, as in torch's CPU kernels (torch leaves it unspecified).
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten import indexing
from tdag.canonicalize.torch.aten.movement import diagonal
from tdag.canonicalize.torch.aten.registry import aten, scalar
from tdag.ops import writes
from tdag.ops.writes import positions_of, write
from tdag.ir.types import DType


# -- torch.scatter family: a per-element index along one dim ------------------------------------

_SCATTER_REDUCE = {None: "replace", "add": "sum", "multiply": "prod"}


@aten("scatter")
def scatter(x, dim, index, src=None, value=None, reduce=None):
    src = src if src is not None else scalar(value)
    return writes.scatter_elements(x, dim, index, src, _SCATTER_REDUCE[reduce])


@aten("scatter_add")
def scatter_add(x, dim, index, src):
    return writes.scatter_elements(x, dim, index, src, "sum")


@aten("scatter_reduce.two")
def scatter_reduce(x, dim, index, src, reduce, include_self=True):
    return writes.scatter_elements(x, dim, index, src, reduce, include_self)


# -- rows along one axis ------------------------------------------------------------------------

def _rows(x, dim, index):
    return writes.wrap(writes.as_index(index), x, dim % x.ndim)


def _of_scalars(write_rows):
    """torch takes a 0-d tensor as one row along dim 0 (or -1) for the index_* writes: the
    write runs on its 1-element view, and the result is 0-d again."""
    def rows_write(x, dim, index, *rest, **kwargs):
        if x.ndim:
            return write_rows(x, dim, index, *rest, **kwargs)
        rest = [ops.reshape(r, 1) if getattr(r, "ndim", None) == 0 else r for r in rest]
        return ops.reshape(write_rows(ops.reshape(x, 1), 0, ops.reshape(index, 1), *rest,
                                      **kwargs))
    rows_write.__name__ = write_rows.__name__
    return rows_write


@aten("index_add")
@_of_scalars
def index_add(x, dim, index, source, alpha=1):
    if alpha != 1:
        source = ops.mul(source, scalar(alpha))
    return writes.combine_at(x, dim, _rows(x, dim, index), source, "sum")


@aten("index_copy")
@_of_scalars
def index_copy(x, dim, index, source):
    return writes.combine_at(x, dim, _rows(x, dim, index), source)


@aten("index_fill")
@_of_scalars
def index_fill(x, dim, index, value):
    return writes.combine_at(x, dim, _rows(x, dim, index), scalar(value))


@aten("index_reduce")
@_of_scalars
def index_reduce(x, dim, index, source, reduce, include_self=True):
    return writes.combine_at(x, dim, _rows(x, dim, index), source, reduce, include_self)


# -- advanced-index writes ------------------------------------------------------------------------

@aten("index_put", "_unsafe_index_put")
def index_put(x, indices, values, accumulate=False):
    """``x[i0, i1, ...] = values`` (or ``+=``): the indexed axes merged into one (moved first
    where they are apart, as ATen orders the result) and its rows written at the linear
    index; a boolean index is the index columns of its nonzero."""
    masks = [i for i in indices if i is not None and i.dtype is DType.bool]
    if masks and len(indices) == 1 and _one_value(values):  # x[mask] = v
        mask = ops.reshape(masks[0], tuple(masks[0].shape) + (1,) * (x.ndim - masks[0].ndim))
        value = ops.reshape(values, ())
        return ops.where(mask, ops.add(x, value) if accumulate else value, x)
    indices = indexing.masks_as_indices(list(indices))
    axes = [a for a, i in enumerate(indices) if i is not None]
    tensors = [writes.wrap(writes.as_index(indices[a]), x, a) for a in axes]
    shape = ops.broadcast_shapes(*(t.shape for t in tensors))
    tensors = [ops.broadcast_to(t, shape) for t in tensors]
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    first = axes[0] if adjacent else 0
    order = list(range(x.ndim)) if adjacent else \
        axes + [a for a in range(x.ndim) if a not in axes]
    moved = ops.permute(x, tuple(order)) if order != list(range(x.ndim)) else x
    linear = tensors[0]
    for k, t in enumerate(tensors[1:], start=1):
        linear = ops.add(ops.mul(linear, ops.size_tensor(moved, (first + k,), DType.i64)), t)
    merged = ops.group(moved, first, len(axes)) if len(axes) > 1 else moved
    out = writes.combine_at(merged, first, linear, values, "sum" if accumulate else "replace")
    out = ops.reshape(out, moved.shape) if len(axes) > 1 else out
    if moved is x:
        return out
    return ops.permute(out, tuple(order.index(a) for a in range(x.ndim)))


def _one_value(values):
    return all(d == 1 for d in values.shape)


@aten("put")
def put(x, index, source, accumulate=False):
    flat = ops.reshape(x, (-1,))
    positions = writes.wrap(ops.cast(index, DType.i64), flat, 0)  # index is a flat position
    return write(x, positions, ops.reshape(source, positions.shape),
                 "sum" if accumulate else "replace")


@aten("bincount")
def bincount(x, weights=None, minlength=0):
    return writes.bincount(x, weights, minlength)


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
