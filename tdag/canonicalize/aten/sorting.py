"""Sorting and order statistics as ranks: compare every pair along a static axis, sum.

The rank of element i is the number of elements that sort before it (NaN after every
number, ties by position, as torch's stable sort); the sorted order is the inverse
permutation, found by matching ranks to output slots. O(n^2) work and memory per row, but
exact and a fixed DAG. Counts are summed in float32: exact up to 2**24 elements per row.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.aten.indexing import gather
from tdag.canonicalize.aten.registry import aten
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType


def _last(x, dim):
    """x with ``dim`` moved last (a scalar becomes one element) and the axis length."""
    x = ops.reshape(x, (1,)) if x.ndim == 0 else ops.movedim(x, dim, -1)
    n = x.shape[-1]
    if not is_static(n):
        raise UnsupportedOpError("sorting along a symbolic axis")
    return x, n


def _pairs(x):
    """(xi, xj, j < i): [..., n, 1], [..., 1, n] and the position order [n, n]."""
    n = x.shape[-1]
    pos = ops.iota(n, "i64", x.builder)
    earlier = ops.lt(ops.unsqueeze(pos, 0), ops.unsqueeze(pos, 1))
    return ops.unsqueeze(x, x.ndim), ops.unsqueeze(x, x.ndim - 1), earlier


def ranks(x, descending=False):
    """For each element of the last axis, how many elements sort before it (an f32 count)."""
    xi, xj, earlier = _pairs(x)
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


def _sorted(x, dim, descending, k):
    """The first k of x sorted along dim: (values, indices)."""
    scalar = x.ndim == 0
    dim = dim % x.ndim if x.ndim else 0
    flat, n = _last(x, dim)
    index = at_rank(ranks(flat, descending), _slots(k, flat))
    return _finish(x, gather(flat, -1, index), index, dim, scalar)


@aten("sort.default", "sort.stable")
def sort(x, *args, stable=None, dim=-1, descending=False):
    if args:  # sort.default(self, dim=-1, descending=False)
        dim, descending = args[0], (args[1] if len(args) > 1 else descending)
    return _sorted(x, dim, descending, x.shape[dim] if x.ndim else 1)


@aten("topk")
def topk(x, k, dim=-1, largest=True, sorted=True):
    return _sorted(x, dim, largest, k)


def _select(x, dim, keepdim, rank_of):
    """(value, index) of the element at a per-row rank ``rank_of(row, n)`` (an f32 [...])."""
    scalar = x.ndim == 0
    dim = dim % x.ndim if x.ndim else 0
    flat, n = _last(x, dim)
    index = at_rank(ranks(flat), ops.unsqueeze(rank_of(flat, n), flat.ndim - 1))
    values = gather(flat, -1, index)
    if scalar:
        return ops.reshape(values, ()), ops.reshape(index, ())
    if keepdim:
        return ops.movedim(values, -1, dim), ops.movedim(index, -1, dim)
    return ops.squeeze(values, -1), ops.squeeze(index, -1)


@aten("kthvalue")
def kthvalue(x, k, dim=-1, keepdim=False):
    return _select(x, dim, keepdim, lambda row, n: ops.full(row.shape[:-1], k - 1.0, DType.f32,
                                                             like=row))


def _nan_count(row):
    return ops.sum(ops.cast(ops.isnan(row), DType.f32), row.ndim - 1)


def _median_rank(row, n):
    """The lower median's rank; with a NaN in the row, the first NaN's (torch returns NaN)."""
    nans = _nan_count(row)
    return ops.where(ops.gt(nans, 0.0), ops.sub(float(n), nans), float((n - 1) // 2))


def _nanmedian_rank(row, n):
    """The lower median of the numbers (NaNs sort last); all NaN: the first NaN."""
    numbers = ops.sub(float(n), _nan_count(row))
    return ops.maximum(ops.floor_divide(ops.sub(numbers, 1.0), 2.0), 0.0)


@aten("median.dim")
def median_dim(x, dim, keepdim=False):
    return _select(x, dim, keepdim, _median_rank)


@aten("nanmedian.dim")
def nanmedian_dim(x, dim, keepdim=False):
    return _select(x, dim, keepdim, _nanmedian_rank)


@aten("median.default")
def median(x):
    return _select(ops.reshape(x, (-1,)), 0, False, _median_rank)[0]


@aten("nanmedian.default")
def nanmedian(x):
    return _select(ops.reshape(x, (-1,)), 0, False, _nanmedian_rank)[0]


@aten("mode")
def mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among equally frequent ones) and the last
    position where it occurs, as torch."""
    scalar = x.ndim == 0
    dim = dim % x.ndim if x.ndim else 0
    flat, n = _last(x, dim)
    xi, xj, _ = _pairs(flat)
    counts = ops.sum(ops.cast(ops.eq(xj, xi), DType.f32), flat.ndim)
    best = ops.eq(counts, ops.amax(counts, -1, keepdim=True))
    value = ops.amin(ops.where(best, flat, float("inf") if flat.dtype.is_float else
                               ops.amax(flat)), -1, keepdim=True)
    pos = ops.iota(n, "i64", flat.builder)
    index = ops.amax(ops.where(ops.eq(flat, value), pos, -1), -1, keepdim=True)
    if scalar:
        return ops.reshape(value, ()), ops.reshape(index, ())
    if keepdim:
        return ops.movedim(value, -1, dim), ops.movedim(index, -1, dim)
    return ops.squeeze(value, -1), ops.squeeze(index, -1)
