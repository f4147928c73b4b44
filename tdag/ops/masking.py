"""Compositions over sizes that data decides (the primitives are in
``tdag/deinops/runtime.py``), and the minting of their fresh size symbols.

``masked_select`` and boolean-mask indexing are ``nonzero`` + ``gather``; ``unique`` compares
every pair of elements (O(n^2), as tdag's sort) and keeps the first of each value with
``nonzero``. Each result reads the node that defines its fresh size, so every pass keeps the
definer before it.
"""
from __future__ import annotations

from tdag.ops import core as ops
from tdag.ops import creation
from tdag.ops.arrays import cumsum
from tdag.ops.tensor import Tensor
from tdag.deinops.runtime import Arange, NonZero
from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.symbols import dims_equal, is_static
from tdag.ir.types import DType


def fresh_symbol(builder, hint: str) -> str:
    """A size symbol no input of ``builder``'s graph uses and no other node defines."""
    used = {s.name for v in builder.inputs for d in v.type.shape
            if not isinstance(d, int) for s in d.free_symbols}
    return builder.names.fresh(hint, avoid=used)  # taken: no later tensor or symbol takes it


def nonzero(x: Tensor) -> Tensor:
    """``torch.nonzero``: i64[count, rank], count a fresh symbol."""
    b = x.builder
    return b.emit(Op.nonzero, NonZero(fresh_symbol(b, "nz")), x)


def arange_of(t: Tensor) -> Tensor:
    """0..t-1 for an integer scalar tensor t: i64[n], n a fresh symbol equal to t's value."""
    b = t.builder
    if t.ndim != 0:
        t = ops.reshape(t, ())
    return b.emit(Op.arange, Arange(fresh_symbol(b, "u")), t)


def size_of(t: Tensor) -> tuple[Tensor, object]:
    """A scalar tensor's value as a size: (the arange that binds it, the fresh symbol)."""
    r = arange_of(t)
    return r, r.shape[0]


def checked_size(t: Tensor, ok: Tensor) -> Tensor:
    """``arange_of(t)`` where the bool scalar ``ok`` holds; where it does not, the length is
    -1 and every runtime refuses it (tdag.run with a TdagError, torch.arange and ONNX's
    ConstantOfShape with their own): a run-time check that lives in the data flow, so no
    pass can drop it while the value it guards is used."""
    return arange_of(ops.where(ok, ops.cast(t, DType.i64), -1))


def checked_zero(ok: Tensor) -> Tensor:
    """An i64 scalar 0 that raises at run time where the bool scalar ``ok`` is false: add it
    to an index to make a check part of a value whose shape stays static."""
    return ops.sum(checked_size(creation.full((), 0, DType.i64, like=ok), ok), 0)


def broadcast_index(aranges: list, strides: list) -> Tensor:
    """The row-major offsets of a grid: ``sum_k aranges[k][i_k] * strides[k]`` with one axis
    per arange (each i64[u_k], a fresh size), so the result reads every arange that defines
    its shape."""
    rank = len(aranges)
    shape = tuple(a.shape[0] for a in aranges)
    total = None
    for k, (a, stride) in enumerate(zip(aranges, strides)):
        term = ops.mul(a, stride)
        term = ops.unsqueeze(term, tuple(j for j in range(rank) if j != k)) if rank > 1 \
            else term
        term = ops.broadcast_to(term, shape)
        total = term if total is None else ops.add(total, term)
    return total


def flat_nonzero(mask: Tensor) -> Tensor:
    """The row-major positions of a mask's true elements: i64[count]."""
    flat = ops.reshape(mask, (-1,)) if mask.ndim != 1 else mask
    return ops.select(nonzero(flat), 1, 0)


def masked_select(x: Tensor, mask: Tensor) -> Tensor:
    """``torch.masked_select``: the elements of x where the (broadcast) mask holds, as 1-d."""
    shape = ops.broadcast_shapes(x.shape, mask.shape)
    x, mask = ops.broadcast_to(x, shape), ops.broadcast_to(mask, shape)
    return ops.gather(ops.reshape(x, (-1,)), flat_nonzero(mask), 0, wrap=False)


def mask_index(x: Tensor, mask: Tensor, axis: int = 0) -> Tensor:
    """``x[..., mask]``: the mask covers ``mask.ndim`` axes of x from ``axis`` on, which
    become one axis of the selected rows."""
    covered = x.shape[axis:axis + mask.ndim]
    if len(covered) != mask.ndim or not all(dims_equal(a, m) for a, m in zip(covered, mask.shape)):
        raise ShapeError(f"boolean index of shape {list(mask.shape)} does not match the axes "
                         f"{list(covered)} of {x.type}")
    merged = ops.group(x, axis, mask.ndim) if mask.ndim != 1 else x
    if mask.ndim == 0:
        raise UnsupportedOpError("a 0-d boolean index (x[True])")
    return ops.gather(merged, flat_nonzero(mask), axis, wrap=False)


def unique(x: Tensor, return_inverse: bool = False, return_counts: bool = False):
    """``torch.unique(x, sorted=True)``: (values, inverse, counts), the last two None unless
    asked. Pairwise compares over the flattened input, so its length must be static."""
    values, _, inverse, counts = unique_all(x)
    return (values, ops.reshape(inverse, tuple(x.shape)) if return_inverse else None,
            counts if return_counts else None)


def unique_all(x: Tensor, sorted: bool = True):
    """ONNX ``Unique`` without an axis: (values, the index of each value's first occurrence,
    the inverse index of every element of the flattened x, counts), values ascending or, if
    not ``sorted``, in order of first occurrence."""
    flat = ops.reshape(x, (-1,)) if x.ndim != 1 else x
    return _unique(flat, sorted, ops.eq, ops.lt)


def unique_slices(x: Tensor, axis: int, sorted: bool = True):
    """ONNX ``Unique`` along ``axis``: the distinct slices ``x[..., i, ...]``, ordered
    lexicographically (or by first occurrence), with the same index, inverse and counts as
    ``unique_all`` has for elements."""
    moved = ops.movedim(x, axis, 0) if axis else x
    rows = ops.reshape(moved, (moved.shape[0], -1))
    values, index, inverse, counts = _unique(rows, sorted, _same_rows, _rows_before)
    values = ops.reshape(values, (values.shape[0], *moved.shape[1:]))
    return (ops.movedim(values, 0, axis) if axis else values), index, inverse, counts


def _same_rows(a: Tensor, b: Tensor) -> Tensor:
    return ops.eq(_count(ops.ne(a, b), -1), 0)


def _rows_before(a: Tensor, b: Tensor) -> Tensor:
    """Lexicographic ``a < b`` over the last axis: less at the first column that differs."""
    differ = ops.cast(ops.ne(a, b), DType.i64)
    undecided = ops.eq(ops.sub(cumsum(differ, differ.ndim - 1), differ), 0)
    return _any(ops.logical_and(ops.lt(a, b), undecided), -1)


def _unique(items: Tensor, sorted: bool, same, before):
    """The distinct items along axis 0 (elements, or rows compared by ``same`` and ordered
    by ``before``, each broadcasting over leading axes)."""
    n = items.shape[0]
    if not is_static(n):
        raise UnsupportedOpError("unique of a tensor with a symbolic size")
    b = items.builder
    col, row = ops.unsqueeze(items, 1), ops.unsqueeze(items, 0)     # x[i] down, x[j] across
    pos = creation.iota(n, "i64", b)
    earlier = ops.lt(ops.unsqueeze(pos, 0), ops.unsqueeze(pos, 1))  # j < i
    first = ops.logical_not(_any(ops.logical_and(same(row, col), earlier), 1))
    index = flat_nonzero(first)                                     # i64[u], input order
    values = ops.gather(items, index, 0, wrap=False)
    if sorted:  # rank of each distinct value = how many distinct values are smaller
        rank = _count(ops.logical_and(before(row, ops.unsqueeze(values, 1)),
                                      ops.unsqueeze(first, 0)), 1)  # i64[u]
        slots = creation.iota(values.shape[0], "i64", b)
        hit = ops.eq(ops.unsqueeze(rank, 0), ops.unsqueeze(slots, 1))  # [k, m]: rank[m] == k
        order = ops.sum(ops.where(hit, ops.broadcast_to(ops.unsqueeze(slots, 0), hit.shape),
                                  0), 1)
        values, index = (ops.gather(values, order, 0, wrap=False),
                         ops.gather(index, order, 0, wrap=False))
    slots = creation.iota(values.shape[0], "i64", b)
    match = same(ops.unsqueeze(values, 0), col)                     # [i, k]: x[i] == values[k]
    inverse = ops.sum(ops.where(match, ops.broadcast_to(ops.unsqueeze(slots, 0), match.shape),
                                0), 1)
    counts = _count(match, 0)
    return values, index, inverse, counts


def _any(mask: Tensor, axis: int) -> Tensor:
    return ops.gt(_count(mask, axis), 0)


def _count(mask: Tensor, axis: int) -> Tensor:
    """How many elements are true along ``axis`` (i64)."""
    return ops.sum(ops.cast(mask, DType.i64), axis)


__all__ = ["arange_of", "broadcast_index", "checked_size", "checked_zero", "flat_nonzero",
           "mask_index", "masked_select", "nonzero", "size_of", "unique", "unique_all",
           "unique_slices"]
