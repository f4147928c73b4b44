"""Indexing ATen ops: advanced indexing, gather, scatters into slices, embeddings.

Reads are ``gather`` (numpy ``take`` along one axis): multi-tensor indexing merges the
indexed axes into one and gathers at the linear index; writes into a slice are ``where``
over a gather of the source. ``embedding_bag`` is ``tdag.ops.embedding_bag``, a scatter of
the gathered rows into their bags, linear in the indices.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.ops.writes import as_index, take_along, wrap
from tdag.ir.symbols import as_dim, is_static
from tdag.ir.types import DType


@aten("index", "_unsafe_index")
def index(x, indices):
    """``x[i0, i1, ...]`` with tensor indices (None: the whole axis), broadcast together; a
    boolean index over k axes is the k index columns of its nonzero (a size data decides)."""
    indices = masks_as_indices(list(indices))
    axes = [a for a, i in enumerate(indices) if i is not None]
    tensors = [wrap(as_index(indices[a]), x, a) for a in axes]
    if len(axes) == 1:
        return ops.gather(x, tensors[0], axes[0])
    shape = ops.broadcast_shapes(*(t.shape for t in tensors))
    tensors = [ops.broadcast_to(t, shape) for t in tensors]
    adjacent = axes == list(range(axes[0], axes[0] + len(axes)))
    first = axes[0] if adjacent else 0
    if not adjacent:  # ATen puts the broadcast index dims first when the axes are apart
        x = ops.permute(x, tuple(axes) + tuple(a for a in range(x.ndim) if a not in axes))
    linear = tensors[0]
    for k, t in enumerate(tensors[1:], start=1):
        linear = ops.add(ops.mul(linear, ops.size_tensor(x, (first + k,), DType.i64)), t)
    merged = ops.group(x, first, len(axes))
    return ops.gather(merged, linear, first)


def masks_as_indices(indices: list) -> list:
    """Each boolean (or u8) index over k axes as its k index columns (its nonzero)."""
    out = []
    for i in indices:
        if i is not None and i.dtype is DType.bool or i is not None and i.dtype is DType.u8:
            rows = ops.nonzero(i)
            out.extend(ops.select(rows, 1, k) for k in range(i.ndim))
        else:
            out.append(i)
    return out


@aten("index_select")
def index_select(x, dim, index):
    if x.ndim == 0:
        return x
    return ops.gather(x, as_index(index), dim)


@aten("take")
def take(x, index):
    return ops.gather(ops.reshape(x, (-1,)), wrap(as_index(index), ops.reshape(x, (-1,)), 0), 0)


@aten("gather")
def gather(x, dim, index, sparse_grad=False):
    return take_along(x, dim, index)


@aten("slice_scatter")
def slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    """``x`` with ``x[start:end:step]`` along ``dim`` replaced by ``src``."""
    n = x.shape[dim]
    start = 0 if start is None else (start + n if isinstance(start, int) and start < 0 else start)
    if step == 1:
        stop = as_dim(start + src.shape[dim])
        parts = [ops.slice(x, dim, 0, start), src, ops.slice(x, dim, stop, n)]
        return ops.concat([p for p in parts if not (is_static(p.shape[dim]) and
                                                    p.shape[dim] == 0)] or [src], dim)
    position = ops.iota(n, "i64", x.builder)
    offset = ops.sub(position, start)
    inside = ops.logical_and(ops.ge(offset, 0), ops.lt(offset, as_dim(src.shape[dim] * step)))
    inside = ops.logical_and(inside, ops.eq(ops.remainder(offset, step), 0))
    picked = ops.gather(src, ops.clamp(ops.floor_divide(offset, step), 0,
                                       as_dim(src.shape[dim] - 1)), dim)
    shape = [1] * x.ndim
    shape[dim] = n
    return ops.where(ops.reshape(inside, shape), picked, x)


@aten("select_scatter")
def select_scatter(x, src, dim, index):
    index = index + x.shape[dim] if isinstance(index, int) and index < 0 else index
    return slice_scatter(x, ops.unsqueeze(src, dim % x.ndim), dim % x.ndim, index,
                         as_dim(index + 1), 1)


@aten("embedding")
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    # torch refuses a negative index here (F.embedding: "index out of range"), so no wrap:
    # three passes over the indices fewer, and the reified module refuses it too
    return ops.gather(weight, as_index(indices), 0, wrap=False)


_BAG_MODES = ("sum", "mean", "max")  # ATen's mode numbers


@aten("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                  per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """The bags' sums, means or maxima (``tdag.ops.embedding_bag``). Only the output is
    computed (the other three results serve the backward pass)."""
    out = ops.embedding_bag(weight, indices, offsets, _BAG_MODES[mode], per_sample_weights,
                            include_last_offset, padding_idx)
    return out, None, None, None
