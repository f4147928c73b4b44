"""Searching and counting ATen ops.

``bucketize``/``searchsorted`` are torch's binary search (``tdag.ops.sorting.searchsorted``);
``histc`` counts the values in each bin (a scatter-add); ``pdist`` picks a static index set.
"""
from __future__ import annotations


import torch

from tdag import ops
from tdag.canonicalize.torch.aten.contraction import cdist
from tdag.canonicalize.torch.aten.registry import aten
from tdag.ops import sorting
from tdag.ops import writes
from tdag.ops.writes import take_along
from tdag.ir.types import DType


def _index_type(out_int32):
    return DType.i32 if out_int32 else DType.i64


@aten("bucketize.Tensor", "bucketize.Scalar")
def bucketize(x, boundaries, out_int32=False, right=False):
    """Each value's insertion point in the 1-d ``boundaries``: torch's binary search
    (``tdag.ops.sorting.searchsorted``), n log m."""
    x = ops.as_tensor(x, boundaries.builder)
    flat = ops.reshape(x, (1,)) if x.ndim == 0 else x
    found = sorting.searchsorted(boundaries, flat, right)
    return ops.cast(ops.reshape(found, tuple(x.shape)), _index_type(out_int32))


@aten("searchsorted.Tensor", "searchsorted.Scalar")
def searchsorted(sorted_sequence, x, out_int32=False, right=False, side=None, sorter=None):
    if sorter is not None:
        sorted_sequence = take_along(sorted_sequence, -1, sorter)
    right = right or side == "right"
    if sorted_sequence.ndim == 1:
        return bucketize(x, sorted_sequence, out_int32, right)
    return ops.cast(sorting.searchsorted(sorted_sequence, x, right), _index_type(out_int32))


def _count_below(values, boundaries, right):
    """For each value, the number of boundaries < value (<= with ``right``), by comparing
    each with every boundary: for the few edges of a histogram's bins only."""
    below = ops.le if right else ops.lt
    hits = below(ops.unsqueeze(boundaries, boundaries.ndim - 1), ops.unsqueeze(values, values.ndim))
    return ops.sum(ops.cast(hits, DType.i64), values.ndim)


@aten("histc")
def histc(x, bins=100, min=0, max=0):
    return writes.histc(x, bins, min, max)


@aten("angle")
def angle(x):
    return ops.angle(x)


@aten("_pdist_forward")
def pdist(x, p=2.0):
    """The upper triangle (i < j) of the distance matrix, row by row."""
    n = x.shape[0]
    full = ops.reshape(cdist(x, x, p), (-1,))
    pairs = [i * n + j for i in range(n) for j in range(i + 1, n)]
    return ops.gather(full, x.builder.const(torch.tensor(pairs, dtype=torch.int64)), 0)


def _outer_edges(values, bounds):
    """(low, high) of the bins: ``bounds`` or the data's range; one value: torch centres a
    bin of width 1 on it."""
    if bounds is None:
        low, high = ops.amin(values), ops.amax(values)
    else:
        low, high = (ops.full((), float(b), values.dtype, like=values) for b in bounds)
    same = ops.eq(low, high)
    return ops.where(same, ops.sub(low, 0.5), low), ops.where(same, ops.add(high, 0.5), high)


def _edges(low, high, bins, like):
    steps = ops.iota(bins + 1, "i64", like.builder)
    edges = ops.add(low, ops.mul(ops.div(ops.sub(high, low), float(bins)),
                                 ops.cast(steps, like.dtype)))
    return ops.where(ops.eq(steps, bins), high, edges)


def _bin_of(values, edges, low, high, bins):
    """Each value's bin (the last includes its right edge) and whether it is counted."""
    index = ops.sub(_count_below(values, edges, right=True), 1)
    index = ops.where(ops.eq(values, high), bins - 1, index)
    return index, ops.logical_and(ops.ge(values, low), ops.le(values, high))


def _counts(index, inside, total, weight, like):
    """Per-bin sums of the counted values' weights: a scatter-add (ops/writes.py)."""
    return writes.bin_counts(index, total, weight, keep=inside, dtype=like.dtype)


def _widths(edges, bins):
    return ops.sub(ops.slice(edges, 0, 1, bins + 1), ops.slice(edges, 0, 0, bins))


@aten("histogram.bin_ct")
def histogram(x, bins=100, range=None, weight=None, density=False):
    """(counts, edges) over ``bins`` equal bins of [min, max] (the data's range by default);
    the last bin includes its right edge; values outside are not counted."""
    flat = ops.reshape(x, (-1,))
    low, high = _outer_edges(flat, range)
    edges = _edges(low, high, bins, x)
    counts = _counts(*_bin_of(flat, edges, low, high, bins), bins, weight, x)
    if density:
        counts = ops.div(counts, ops.mul(ops.sum(counts), _widths(edges, bins)))
    return counts, edges


def _dd_edges(x, bins, range):
    points = ops.reshape(x, (-1, x.shape[-1]))
    out = []
    for d, b in enumerate(bins):
        column = ops.select(points, 1, d)
        low, high = _outer_edges(column, None if range is None else range[2 * d:2 * d + 2])
        out.append(_edges(low, high, b, x))
    return points, out


@aten("_histogramdd_bin_edges")
def histogramdd_bin_edges(x, bins, range=None, weight=None, density=False):
    """The edges of each of the D axes of points x [..., D]."""
    return _dd_edges(x, bins, range)[1]


@aten("_histogramdd_from_bin_cts")
def histogramdd(x, bins, range=None, weight=None, density=False):
    """Counts of the points x [..., D] in a grid of bins; a point's cell is its row-major
    number among prod(bins) cells, counted by one one-hot sum."""
    points, edges = _dd_edges(x, bins, range)
    cell, counted = None, None
    for d, b in enumerate(bins):
        column = ops.select(points, 1, d)
        low, high = ops.select(edges[d], 0, 0), ops.select(edges[d], 0, b)
        index, inside = _bin_of(column, edges[d], low, high, b)
        cell = index if cell is None else ops.add(ops.mul(cell, b), index)
        counted = inside if counted is None else ops.logical_and(counted, inside)
    total = 1
    for b in bins:
        total *= b
    counts = ops.reshape(_counts(cell, counted, total, weight, x), tuple(bins))
    if density:
        volume = None
        for d, b in enumerate(bins):
            shape = [1] * len(bins)
            shape[d] = b
            w = ops.reshape(_widths(edges[d], b), shape)
            volume = w if volume is None else ops.mul(volume, w)
        counts = ops.div(counts, ops.mul(ops.sum(counts), volume))
    return counts
