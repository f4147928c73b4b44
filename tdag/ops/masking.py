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
from tdag.ops.tensor import Tensor
from tdag.deinops.runtime import Arange, NonZero
from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.symbols import dims_equal
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


def arange_of(t: Tensor, name: str | None = None) -> Tensor:
    """0..t-1 for an integer scalar tensor t: i64[n], n a fresh symbol equal to t's value
    (``name``, where a kernel's decomposition must name the symbol its node defines)."""
    b = t.builder
    if t.ndim != 0:
        t = ops.reshape(t, ())
    return b.emit(Op.arange, Arange(name or fresh_symbol(b, "u")), t)


def size_of(t: Tensor) -> tuple[Tensor, object]:
    """A scalar tensor's value as a size: (the arange that binds it, the fresh symbol)."""
    r = arange_of(t)
    return r, r.shape[0]


def checked_size(t: Tensor, ok: Tensor, name: str | None = None) -> Tensor:
    """``arange_of(t)`` where the bool scalar ``ok`` holds; where it does not, the length is
    -1 and every runtime refuses it (tdag.run with a TdagError, torch.arange and ONNX's
    ConstantOfShape with their own): a run-time check that lives in the data flow, so no
    pass can drop it while the value it guards is used."""
    return arange_of(ops.where(ok, ops.cast(t, DType.i64), -1), name)


def checked_zero(ok: Tensor, what: str | None = None) -> Tensor:
    """An i64 scalar 0 that raises at run time where the bool scalar ``ok`` is false: add it
    to an index to make a check part of a value whose shape stays static. ``what`` names the
    check's size symbol, which tdag.run's error names."""
    name = fresh_symbol(ok.builder, what) if what else None
    return ops.sum(checked_size(creation.full((), 0, DType.i64, like=ok), ok, name), 0)


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


__all__ = ["arange_of", "broadcast_index", "checked_size", "checked_zero", "flat_nonzero",
           "mask_index", "masked_select", "nonzero", "size_of"]
