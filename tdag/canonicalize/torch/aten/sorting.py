"""Sorting and order statistics in the ATen table: the pairwise-rank forms of
``tdag.ops.sorting`` (exact, O(n^2) per row)."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.ops.sorting import along_last, at_rank, pairs, ranks, sorted_along
from tdag.ops.writes import take_along as gather
from tdag.ir.types import DType


@aten("sort.default", "sort.stable")
def sort(x, *args, stable=None, dim=-1, descending=False):
    if args:  # sort.default(self, dim=-1, descending=False)
        dim, descending = args[0], (args[1] if len(args) > 1 else descending)
    return sorted_along(x, dim, descending, x.shape[dim] if x.ndim else 1)


@aten("topk")
def topk(x, k, dim=-1, largest=True, sorted=True):
    return sorted_along(x, dim, largest, k)


def _select(x, dim, keepdim, rank_of):
    """(value, index) of the element at a per-row rank ``rank_of(row, n)`` (an f32 [...])."""
    scalar = x.ndim == 0
    dim = dim % x.ndim if x.ndim else 0
    flat, n = along_last(x, dim)
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
    flat, n = along_last(x, dim)
    xi, xj, _ = pairs(flat)
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
