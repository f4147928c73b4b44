"""Useful flops: the share of an attention kernel's work that a causal mask leaves.

A dense attention kernel computes every query-key score and weighs every value; a masked
(flash, causal) kernel skips the blocks the mask removes, so for a causal mask it does about
half the work. The mask is *structurally* causal when

- the kernel says so (``Attention.causal``: the lowering recognised an iota comparison
  ``j <= i``), or
- the mask operand is, through views, casts, a bool ``and`` (multiply), a float ``add`` or the
  condition of a ``where``, a constant whose last two axes hold a lower-triangular pattern
  (``tril`` with an offset): what an ``arange(L)[:, None] >= arange(S)`` comparison of fixed
  length folds to. Another mask combined with it (padding) only removes more, so the causal
  share stays an upper bound of the useful work.

Only the two contractions (scores and values) count as skipped; the softmax's flops do not.
"""
from __future__ import annotations

import sympy
import torch

from tdag.deinops.kernels.sequence import Attention
from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.symbols import Dim, as_dim, dims_equal
from tdag.ir.types import DType

_MAX_DEPTH = 12  # masks are built a few ops away from the kernel; do not walk the whole graph


def masked_flops(graph: TDAG, node: Node, types: dict, producers: dict,
                 matmul_flops: Dim) -> Dim:
    """The contraction flops a causal kernel skips at attention ``node`` (0 when its mask is
    not structurally causal); ``types`` and ``producers`` map names to types and nodes."""
    if node.op is not Op.attention:
        return 0
    q, k = types[node.inputs[0]], types[node.inputs[1]]
    length, keys = q.shape[-2], k.shape[-2]
    if isinstance(node.spec, Attention) and node.spec.causal:
        offset = 0  # torch's is_causal keeps j <= i (top-left aligned)
    elif len(node.inputs) == 4:
        offset = _causal_offset(graph, node.inputs[3], producers, 0)
        if offset is None:
            return 0
    else:
        return 0
    return as_dim(sympy.expand(matmul_flops * (1 - _kept_share(length, keys, offset))))


def _kept_share(length: Dim, keys: Dim, offset: int) -> Dim:
    """The share of an [L, S] score matrix where key j <= query i + offset."""
    if isinstance(length, int) and isinstance(keys, int):
        kept = sum(min(keys, max(0, i + offset + 1)) for i in range(length))
        return sympy.Rational(kept, length * keys) if length * keys else sympy.Integer(1)
    if offset == 0 and dims_equal(length, keys):
        return (sympy.sympify(length) + 1) / (2 * sympy.sympify(length))
    # L <= S with the last query seeing every key (offset S - L): L(L+1)/2 + (S-L)L kept
    length, keys = sympy.sympify(length), sympy.sympify(keys)
    return (length * (length + 1) / 2 + (keys - length) * length) / (length * keys)


def _causal_offset(graph: TDAG, name: str, nodes: dict, depth: int) -> int | None:
    """The diagonal offset of a causal pattern ``name`` is built from, or None."""
    if depth > _MAX_DEPTH:
        return None
    if name in graph.weights:
        return _triangular_offset(graph.weights[name].value)
    node = nodes.get(name)
    if node is None:
        return None
    for operand in _mask_operands(node, graph):
        offset = _causal_offset(graph, operand, nodes, depth + 1)
        if offset is not None:
            return offset
    return None


def _mask_operands(node: Node, graph: TDAG) -> tuple:
    """The operands a mask keeps its causal zeros through (an ``or`` would not)."""
    if has(node.op, Trait.VIEW) or node.op is Op.cast:
        return node.inputs[:1]
    if node.op is Op.multiply and node.type.dtype is DType.bool:  # and
        return node.inputs
    if node.op is Op.add and node.type.dtype.is_float:  # -inf + anything is -inf
        return node.inputs
    if node.op is Op.where:  # where(keep, 0, -inf): the condition holds the pattern
        return node.inputs[:1]
    return ()


def _triangular_offset(value: torch.Tensor | None) -> int | None:
    """o where ``value``'s last two axes keep exactly j <= i + o (the same for every leading
    index), or None. A float mask keeps what it does not push to -inf or the dtype's lowest."""
    if value is None or value.dim() < 2 or value.is_meta:
        return None
    keep = value if value.dtype is torch.bool else value > torch.finfo(value.dtype).min / 2
    rows, cols = keep.shape[-2:]
    if rows * cols == 0:
        return None
    flat = keep.reshape(-1, rows, cols)
    if not bool((flat == flat[:1]).all()):
        return None
    pattern = flat[0]
    offset = int(pattern[0].sum()) - 1  # row 0 keeps keys 0..offset
    expected = torch.ones(rows, cols, dtype=torch.bool).tril(offset)
    if offset >= cols - 1 or not torch.equal(pattern, expected):
        return None  # no key masked in row 0 is not causal (or not this pattern)
    return offset


__all__ = ["masked_flops"]
