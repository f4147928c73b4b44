"""Sorting and order statistics as ranks: compare every pair along a static axis, sum.

The rank of element i is the number of elements that sort before it (NaN after every
number, ties by position, as torch's stable sort); the sorted order is the inverse
permutation, found by matching ranks to output slots. O(n^2) work and memory per row, but
exact and a fixed DAG. Counts are summed in float32: exact up to 2**24 elements per row.
"""
from __future__ import annotations

from tdag import ops
from tdag.ops.writes import take_along as gather
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType


def along_last(x, dim):
    """x with ``dim`` moved last (a scalar becomes one element) and the axis length."""
    x = ops.reshape(x, (1,)) if x.ndim == 0 else ops.movedim(x, dim, -1)
    n = x.shape[-1]
    if not is_static(n):
        raise UnsupportedOpError("sorting along a symbolic axis")
    return x, n


def pairs(x):
    """(xi, xj, j < i): [..., n, 1], [..., 1, n] and the position order [n, n]."""
    n = x.shape[-1]
    pos = ops.iota(n, "i64", x.builder)
    earlier = ops.lt(ops.unsqueeze(pos, 0), ops.unsqueeze(pos, 1))
    return ops.unsqueeze(x, x.ndim), ops.unsqueeze(x, x.ndim - 1), earlier


def ranks(x, descending=False):
    """For each element of the last axis, how many elements sort before it (an f32 count)."""
    xi, xj, earlier = pairs(x)
    first = ops.gt(xj, xi) if descending else ops.lt(xj, xi)
    if x.dtype.is_float:  # NaN is larger than every number: last ascending, first descending
        nan_i, nan_j = ops.isnan(xi), ops.isnan(xj)
        nan_first = ops.logical_and(nan_j, ops.logical_not(nan_i)) if descending else \
            ops.logical_and(nan_i, ops.logical_not(nan_j))
        first = ops.logical_or(first, nan_first)
        tie = ops.logical_or(ops.eq(xj, xi), ops.logical_and(nan_i, nan_j))
    else:
        tie = ops.eq(xj, xi)
    before = ops.logical_or(first, ops.logical_and(tie, earlier))
    return ops.sum(ops.cast(before, DType.f32), x.ndim)


def at_rank(rank, slots):
    """The position whose rank equals each slot: rank [..., n], slots [..., k] -> i64."""
    n = rank.shape[-1]
    pos = ops.cast(ops.iota(n, "i64", rank.builder), DType.f32)
    hit = ops.eq(ops.unsqueeze(rank, rank.ndim), ops.unsqueeze(slots, slots.ndim - 1))
    return ops.cast(ops.sum(ops.where(hit, ops.unsqueeze(pos, 1), 0.0), rank.ndim - 1),
                    DType.i64)


def _slots(k, like):
    return ops.cast(ops.iota(k, "i64", like.builder), DType.f32)


def _finish(x, values, index, dim, scalar):
    if scalar:
        return ops.reshape(values, ()), ops.reshape(index, ())
    return ops.movedim(values, -1, dim), ops.movedim(index, -1, dim)


def sorted_along(x, dim, descending, k):
    """The first k of x sorted along dim: (values, indices)."""
    scalar = x.ndim == 0
    dim = dim % x.ndim if x.ndim else 0
    flat, n = along_last(x, dim)
    index = at_rank(ranks(flat, descending), _slots(k, flat))
    return _finish(x, gather(flat, -1, index), index, dim, scalar)
