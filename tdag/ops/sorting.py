"""Sorting and order statistics, each a composition over the ``sort`` primitive.

``sort`` gives the stable permutation along an axis (NaN largest, ties in input order, as
torch's ``stable=True``); values are a take-along gather with it. On top of it: top-k and
the k-th value (a slice of the permutation), medians (a rank per row, picked from the
permutation), lexicographic sorts (one stable sort per key, last key first), ``unique``
(sorted runs), and ``searchsorted`` (torch's binary search, unrolled; at a symbolic number of
boundaries a merge: the values and the boundaries sorted together). Everything is
O(n log n) per row, where ranking every pair was O(n^2), and a symbolic axis is fine
(``unique``'s count is a fresh size).
"""
from __future__ import annotations

from tdag.ops import arrays, core, creation, scans
from tdag.deinops.sort import Sort
from tdag.ir.op import Op
from tdag.ir.symbols import is_static, product
from tdag.ir.types import DType
from tdag.ops.core import norm_axis
from tdag.ops.masking import checked_zero, flat_nonzero
from tdag.ops.writes import scatter_elements, take_along


def argsort(x, dim: int = -1, descending: bool = False):
    """The stable sorting permutation along ``dim`` (i64, x's shape)."""
    if x.ndim == 0:
        return creation.full((), 0, DType.i64, like=x)
    return x.builder.emit(Op.sort, Sort(norm_axis(dim, x.ndim), bool(descending)), x)


def sort(x, dim: int = -1, descending: bool = False):
    """(values, indices) of a stable sort along ``dim``, as ``torch.sort(stable=True)``."""
    index = argsort(x, dim, descending)
    return take_sorted(x, dim, index), index


def topk(x, k, dim: int = -1, largest: bool = True):
    """(values, indices) of the first k along ``dim`` in sorted order; ties by position."""
    if x.ndim == 0:
        return x, argsort(x)
    index = core.slice(argsort(x, dim, largest), dim, 0, k)
    return take_sorted(x, dim, index), index


def take_sorted(x, dim: int, index):
    """x's values at ``index`` along ``dim``, every entry in range (a sort's permutation or
    its first k): one gather of the flat x at ``row * n + index``, the form lowering turns
    into the framework's sort or top-k (``tdag/lower/sorting.py``)."""
    if x.ndim == 0:
        return x
    dim = norm_axis(dim, x.ndim)
    if x.ndim == 1:
        return core.gather(x, index, 0, wrap=False)
    moved, index = core.movedim(x, dim, -1), core.movedim(index, dim, -1)
    rows = creation.iota(product(moved.shape[:-1]), "i64", x.builder)
    offsets = core.mul(rows, creation.size_tensor(moved, (moved.ndim - 1,), DType.i64))
    offsets = core.reshape(offsets, (*moved.shape[:-1], 1))
    out = core.gather(core.reshape(moved, (-1,)), core.add(offsets, index), 0, wrap=False)
    return core.movedim(out, -1, dim)


def at_rank(x, dim: int, rank, keepdim: bool = False):
    """(value, index) of the element of sorted rank ``rank`` along ``dim`` (an int, or an
    i64 tensor of x's shape without ``dim``): kthvalue and the medians."""
    if x.ndim == 0:
        return x, argsort(x)
    dim = norm_axis(dim, x.ndim)
    order = argsort(x, dim)
    if isinstance(rank, int):
        index = core.slice(order, dim, rank, rank + 1)
    else:
        index = take_along(order, dim, core.unsqueeze(rank, dim))
    values = take_along(x, dim, index)
    if keepdim:
        return values, index
    return core.squeeze(values, dim), core.squeeze(index, dim)


def _nan_count(x, dim):
    return core.sum(core.cast(core.isnan(x), DType.i64), dim)


def median(x, dim: int, keepdim: bool = False):
    """torch's lower median ((n-1)//2 in sorted order); a row with a NaN gives its first
    NaN in input order (NaN sorts last, stably)."""
    dim = norm_axis(dim, x.ndim) if x.ndim else 0
    n = _length(x, dim)
    lower = core.floor_divide(core.sub(n, 1), 2)
    if not x.dtype.is_float:
        return at_rank(x, dim, core.broadcast_to(lower, _rest(x, dim)), keepdim)
    nans = _nan_count(x, dim)
    return at_rank(x, dim, core.where(core.gt(nans, 0), core.sub(n, nans), lower), keepdim)


def nanmedian(x, dim: int, keepdim: bool = False):
    """The lower median of the numbers in each row (NaNs sort last); all NaN: the first."""
    if not x.dtype.is_float:
        return median(x, dim, keepdim)
    dim = norm_axis(dim, x.ndim) if x.ndim else 0
    numbers = core.sub(_length(x, dim), _nan_count(x, dim))
    return at_rank(x, dim, core.maximum(core.floor_divide(core.sub(numbers, 1), 2), 0), keepdim)


def _length(x, dim):
    """The length of axis ``dim`` as an i64 scalar tensor (symbolic lengths too)."""
    return creation.size_tensor(x, (dim,), DType.i64) if x.ndim else creation.full((), 1, DType.i64,
                                                                            like=x)


def _rest(x, dim):
    return tuple(d for i, d in enumerate(x.shape) if i != dim)


def lexsort(keys, dim: int = -1, descending: bool = False):
    """The stable permutation ordering by ``keys[0]``, ties by ``keys[1]``, ...: one stable
    sort per key, the last key first, each applied to the order so far."""
    order = argsort(keys[-1], dim, descending)
    for key in reversed(keys[:-1]):
        order = take_along(order, dim, argsort(take_along(key, dim, order), dim, descending))
    return order


def inverse_permutation(perm, dim: int = -1):
    """Where each position went: ``out[perm[i]] = i`` along ``dim``, a scatter (linear)."""
    dim = norm_axis(dim, perm.ndim)
    shape = tuple(d if a == dim else 1 for a, d in enumerate(perm.shape))
    positions = core.broadcast_to(core.reshape(creation.iota(perm.shape[dim], "i64",
                                                             perm.builder), shape), perm.shape)
    return scatter_elements(core.mul(positions, 0), dim, perm, positions)


# -- searching ------------------------------------------------------------------------------

def searchsorted(boundaries, values, right: bool = False):
    """For each value, its insertion point in the sorted ``boundaries`` [..., m]: how many
    boundaries are < it (<= with ``right``). ``values`` [..., n] shares the leading axes, or
    ``boundaries`` is 1-d and ``values`` has any shape. With a static m, torch's own binary
    search, step by step (``binary_search``): exact wherever the boundaries are unsorted or
    hold NaN too, n log2 m. With a symbolic m, a merge (``_merge``)."""
    dtype = core.result_dtype(boundaries, values)
    b, v = core.cast(boundaries, dtype), core.cast(values, dtype)
    if is_static(b.shape[-1]):
        return binary_search(b, v, right)
    if b.ndim == 1 and v.ndim != 1:
        return core.reshape(_merge(b, core.reshape(v, (-1,)), right), tuple(v.shape))
    return _merge(b, v, right)


def binary_search(b, v, right: bool):
    """ATen's ``cus_lower_bound``/``cus_upper_bound`` over the static m boundaries, one step
    per bit of m (the loop's most trips), each row masked once its range is empty: a row's
    range [lo, lo + size) halves at ``mid = lo + size // 2``, moving right where
    ``!(b[mid] >= v)`` (``>`` for right), so NaN on either side moves right, as in torch."""
    m = int(b.shape[-1])
    lo = creation.full(tuple(v.shape), 0, DType.i64, like=v)
    size = creation.full(tuple(v.shape), m, DType.i64, like=v)
    if m == 0:
        return lo
    table, offsets = _rows_of(b, v)
    for _ in range(m.bit_length()):
        half = core.trunc_divide(size, 2)  # sizes are never negative: one Div in ONNX
        mid = core.add(lo, half)
        at = core.gather(table, mid if offsets is None else core.add(offsets, mid), 0,
                         wrap=False)
        stop = core.gt(at, v) if right else core.ge(at, v)
        go = core.logical_and(core.logical_not(stop), core.gt(size, 0))
        lo = core.where(go, core.add(mid, 1), lo)
        size = core.where(go, core.sub(core.sub(size, half), 1), half)
    return lo


def _rows_of(b, v):
    """(the boundaries padded with one entry, flat; each value's row offset, None for 1-d
    boundaries): ``mid`` reaches m only in a row whose range is empty, where the pad is read
    and ignored."""
    pad = core.slice(b, b.ndim - 1, 0, 1)
    table = arrays.concat([b, pad], -1)
    if b.ndim == 1:
        return table, None
    rows = creation.iota(product(b.shape[:-1]), "i64", b.builder)
    offsets = core.mul(rows, int(b.shape[-1]) + 1)
    return core.reshape(table, (-1,)), core.reshape(offsets, (*b.shape[:-1], 1))


def _merge(b, v, right: bool):
    """The merge: sorted together (the values first among equals for left, last for right),
    the boundaries counted along the merged order (a scan), each value reads the count at its
    place; O((n+m) log(n+m)), never n x m. Its order puts NaN last, where torch's search
    takes a path through NaN boundaries no merge follows, so NaN boundaries are refused at
    run time."""
    m, n = b.shape[-1], v.shape[-1]
    parts = [b, v] if right else [v, b]
    # 1 marks a boundary
    flags = [creation.full(tuple(p.shape), int(p is b), DType.i64, like=p) for p in parts]
    order = argsort(arrays.concat(parts, -1), -1)
    before = scans.cumsum(take_along(arrays.concat(flags, -1), -1, order), -1)
    at = take_along(before, -1, inverse_permutation(order, -1))
    found = core.slice(at, -1, m, m + n) if right else core.slice(at, -1, 0, n)
    if not b.dtype.is_float:
        return found
    no_nan = core.eq(core.sum(core.cast(core.isnan(b), DType.i64)), 0)
    return core.add(found, checked_zero(no_nan))


# -- unique ---------------------------------------------------------------------------------

def unique(x, return_inverse: bool = False, return_counts: bool = False):
    """``torch.unique(x, sorted=True)``: (values, inverse, counts), the last two None unless
    asked. The count of distinct values is a fresh size; NaNs are each distinct, as torch."""
    values, _, inverse, counts = _unique(_flat(x), [_flat(x)], True, return_inverse)
    return (values, core.reshape(inverse, tuple(x.shape)) if return_inverse else None,
            counts if return_counts else None)


def unique_all(x, sorted: bool = True):
    """ONNX ``Unique`` without an axis: (values, the index of each value's first occurrence,
    the inverse index of every element of the flattened x, counts), values ascending or, if
    not ``sorted``, in order of first occurrence."""
    flat = _flat(x)
    return _unique(flat, [flat], sorted, True)


def unique_slices(x, axis: int, sorted: bool = True, inverse: bool = True):
    """The distinct slices ``x[..., i, ...]`` along ``axis``, ordered lexicographically (or
    by first occurrence), with the same index, inverse and counts as ``unique_all``."""
    rows, keys, back = _slices(x, axis)
    values, index, inv, counts = _unique(rows, keys, sorted, inverse)
    return back(values), index, inv, counts


def unique_consecutive(x, return_inverse: bool = False, return_counts: bool = False,
                       axis: int | None = None):
    """``torch.unique_consecutive``: runs of equal neighbours (elements of the flattened x,
    or slices along ``axis``), in input order."""
    if axis is None:
        rows, keys, back = _flat(x), [_flat(x)], lambda v: v
    else:
        rows, keys, back = _slices(x, axis)
    values, _, inverse, counts = _runs(rows, keys, None, return_inverse)
    if return_inverse and axis is None:
        inverse = core.reshape(inverse, tuple(x.shape))
    return back(values), inverse if return_inverse else None, \
        counts if return_counts else None


def _slices(x, axis: int):
    """(the slices along ``axis`` as rows [n, w], their columns, the inverse reshape)."""
    moved = core.movedim(x, axis, 0) if axis else x
    rows = core.reshape(moved, (moved.shape[0], -1))
    keys = [core.select(rows, 1, j) for j in range(rows.shape[1])]

    def back(values):
        values = core.reshape(values, (values.shape[0], *moved.shape[1:]))
        return core.movedim(values, 0, axis) if axis else values
    return rows, keys, back


def _flat(x):
    return core.reshape(x, (-1,)) if x.ndim != 1 else x


def _unique(items, keys, sorted: bool, inverse: bool):
    """The distinct items along axis 0 (elements, or rows ordered by their columns ``keys``):
    sorted stably, the first of each run of equal items is kept."""
    order = lexsort(keys, 0)
    values, index, inv, counts = _runs(core.gather(items, order, 0, wrap=False),
                                       [core.gather(k, order, 0, wrap=False) for k in keys],
                                       order, inverse)
    if not sorted:  # by first occurrence: the runs ordered by their first index
        by_first = argsort(index, 0)
        values, index, counts = (core.gather(t, by_first, 0, wrap=False)
                                 for t in (values, index, counts))
        if inv is not None:
            inv = core.gather(inverse_permutation(by_first, 0), inv, 0, wrap=False)
    return values, index, inv, counts


def _runs(items, keys, order, inverse: bool):
    """(values, first index, inverse, counts) of the runs of equal neighbours along axis 0
    of ``items`` (equal where every key is; NaN is never equal), which are ``x`` permuted by
    ``order`` (None: not permuted)."""
    first = _run_starts(items, keys)
    starts = flat_nonzero(first)                      # i64[u], u a fresh size
    values = core.gather(items, starts, 0, wrap=False)
    index = starts if order is None else core.gather(order, starts, 0, wrap=False)
    total = core.reshape(creation.size_tensor(items, (0,), DType.i64), (1,))
    counts = core.sub(core.slice(arrays.concat([starts, total], 0), 0, 1), starts)
    inv = None
    if inverse:  # the run of each sorted position, sent back to the input's positions
        run = core.sub(scans.cumsum(core.cast(first, DType.i64), 0), 1)
        inv = run if order is None else core.gather(run, inverse_permutation(order, 0), 0,
                                                   wrap=False)
    return values, index, inv, counts


def _run_starts(items, keys):
    """Where a run starts along axis 0: the first item, and each that differs from the one
    before in some key: ``k != [pad, *k[:-1]]``, the shifted key a pad and a slice, one
    copy where a gather at the clamped previous position took five passes. Every operand
    is n long, a symbolic n that turns out 0 at run time too (``k[1:] != k[:-1]`` with a
    True prepended has one flag there: ``k[1:]``'s n - 1 is 0, not -1)."""
    n = items.shape[0]
    nothing = creation.full((n,), False, DType.bool, like=items)
    first = _shifted(nothing, True)                   # True at 0 alone
    for k in keys:
        first = core.logical_or(first, core.ne(k, _shifted(k, 0)))
    return first


def _shifted(x, fill):
    """``[fill, *x[:-1]]`` along axis 0 of a 1-d x."""
    return core.slice(core.pad(x, [(1, 0)], fill), 0, 0, x.shape[0])
