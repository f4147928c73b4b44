"""Sorting and order statistics in the ATen table, over the ``sort`` primitive
(``tdag.ops.sorting``): O(n log n) per row.

tdag's sort is always stable: for ``sort.default`` (stable=False) that is one of the answers
torch may give (an unstable sort orders ties as it likes), and the one its CPU kernel gives.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.ops import sorting
from tdag.ops.core import norm_axis
from tdag.ops.writes import take_along
from tdag.ir.types import DType


@aten("sort.default", "sort.stable")
def sort(x, *args, stable=None, dim=-1, descending=False):
    if args:  # sort.default(self, dim=-1, descending=False)
        dim, descending = args[0], (args[1] if len(args) > 1 else descending)
    return sorting.sort(x, dim, descending)


@aten("argsort.default", "argsort.stable")
def argsort(x, *args, stable=False, dim=-1, descending=False):
    if args:  # argsort.default(self, dim=-1, descending=False)
        dim, descending = args[0], (args[1] if len(args) > 1 else descending)
    return sorting.argsort(x, dim, descending)


@aten("msort")
def msort(x):
    return sorting.sort(x, 0)[0]


@aten("topk")
def topk(x, k, dim=-1, largest=True, sorted=True):
    """The k largest (smallest) in sorted order; ties by position. torch's ``sorted=False``
    may return them in any order: sorted is one of its answers."""
    return sorting.topk(x, k, dim, largest)


@aten("kthvalue")
def kthvalue(x, k, dim=-1, keepdim=False):
    return sorting.at_rank(x, dim, k - 1, keepdim)


@aten("median.dim")
def median_dim(x, dim, keepdim=False):
    return sorting.median(x, dim, keepdim)


@aten("nanmedian.dim")
def nanmedian_dim(x, dim, keepdim=False):
    return sorting.nanmedian(x, dim, keepdim)


@aten("median.default")
def median(x):
    return sorting.median(ops.reshape(x, (-1,)), 0)[0]


@aten("nanmedian.default")
def nanmedian(x):
    return sorting.nanmedian(ops.reshape(x, (-1,)), 0)[0]


@aten("mode")
def mode(x, dim=-1, keepdim=False):
    """The most frequent value (the smallest among equally frequent ones) and the last
    position where it occurs, as torch. In the sorted row, a value's count is the distance
    between its right and left insertion points; the first largest count is the smallest
    most frequent value."""
    if x.ndim == 0:
        return x, ops.full((), 0, DType.i64, like=x)
    dim = norm_axis(dim, x.ndim)
    row = ops.movedim(x, dim, -1)
    values = sorting.sort(row, -1)[0]
    counts = ops.sub(sorting.searchsorted(values, values, right=True),
                     sorting.searchsorted(values, values))
    value = take_along(values, -1, ops.argmax(counts, -1, keepdim=True))
    pos = ops.iota(row.shape[-1], "i64", x.builder)
    index = ops.amax(ops.where(ops.eq(row, value), pos, -1), -1, keepdim=True)
    if keepdim:
        return ops.movedim(value, -1, dim), ops.movedim(index, -1, dim)
    return ops.squeeze(value, -1), ops.squeeze(index, -1)


@aten("unique_consecutive")
def unique_consecutive(x, return_inverse=False, return_counts=False, dim=None):
    axis = None if dim is None else norm_axis(dim, x.ndim)
    return sorting.unique_consecutive(x, return_inverse, return_counts, axis)


@aten("unique_dim")
def unique_dim(x, dim, sorted=True, return_inverse=False, return_counts=False):
    values, _, inverse, counts = sorting.unique_slices(x, norm_axis(dim, x.ndim), True,
                                                       return_inverse)
    return values, inverse, counts
