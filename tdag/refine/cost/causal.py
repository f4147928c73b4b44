"""Useful flops: the share of an attention kernel's work that a causal mask leaves.

A dense attention kernel computes every query-key score and weighs every value; a masked
(flash, causal) kernel skips the blocks the mask removes, so for a causal mask it does about
half the work. The mask is *structurally* causal when

- the kernel says so (``Attention.causal``: the lowering recognised an iota comparison
  ``j <= i``), or
- the mask operand is, through views, casts, a bool ``and`` (multiply), a float ``add`` or the
  condition of a ``where``, a value that only constants decide (a constant, or a comparison
  of two constant aranges, evaluated) whose last two axes hold a lower-triangular pattern
  (``tril`` with an offset): an ``arange(L)[:, None] >= arange(S)`` of fixed length.
  Another mask combined with it (padding) only removes more, so the causal share stays an
  upper bound of the useful work.

Only the two contractions (scores and values) count as skipped; the softmax's flops do not.
"""
from __future__ import annotations

import sympy
import torch

from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.record import REGISTRY, Trait, has
from tdag.ir.symbols import Dim, as_dim, dims_equal, is_static
from tdag.ir.types import DType

_MAX_DEPTH = 12  # masks are built a few ops away from the kernel; do not walk the whole graph
_MAX_ELEMENTS = 2**26  # a mask evaluated to read its pattern: 64M bools at most
# the ops a mask is built with from aranges: evaluated when only constants feed them
_MASK_OPS = frozenset((Op.compare, Op.multiply, Op.add, Op.where, Op.cast, Op.expand,
                       Op.reshape, Op.repeat, Op.unsqueeze, Op.squeeze, Op.permute, Op.slice))


class CausalMasks:
    """The causal masks of one TDAG, each mask's pattern worked out once (every layer of a
    decoder reads the same one)."""

    def __init__(self, graph: TDAG, types: dict):
        self.graph, self.types = graph, types
        self.producers = {n.name: n for n in graph.nodes}
        self.offsets: dict = {}  # mask name -> its diagonal offset, or None

    def masked_flops(self, node: Node, matmul_flops: Dim) -> Dim:
        """The contraction flops a causal kernel skips at attention ``node`` (0 when its mask
        is not structurally causal)."""
        if node.op is not Op.attention:
            return 0
        q, k = self.types[node.inputs[0]], self.types[node.inputs[1]]
        if getattr(node.spec, "causal", False):  # the kernel's spec (refine sits below lower)
            offset = 0  # torch's is_causal keeps j <= i (top-left aligned)
        elif len(node.inputs) == 4:
            offset = self.offset(node.inputs[3], 0)
            if offset is None:
                return 0
        else:
            return 0
        share = _kept_share(q.shape[-2], k.shape[-2], offset)
        return as_dim(sympy.expand(matmul_flops * (1 - share)))

    def offset(self, name: str, depth: int) -> int | None:
        """The diagonal offset of the causal pattern ``name`` holds or is built from."""
        if name not in self.offsets:
            self.offsets[name] = self._offset(name, depth)
        return self.offsets[name]

    def _offset(self, name: str, depth: int) -> int | None:
        if depth > _MAX_DEPTH:
            return None
        value = self._value(name)
        if value is not None:
            return _triangular_offset(value)
        node = self.producers.get(name)
        for operand in (_mask_operands(node) if node is not None else ()):
            offset = self.offset(operand, depth + 1)
            if offset is not None:
                return offset
        return None

    def _value(self, name: str, depth: int = 0) -> torch.Tensor | None:
        """The mask's values where only constants decide them (a comparison of two aranges
        too large for constant folding), by the ops' reference evaluators; else None."""
        if name in self.graph.weights:
            return self.graph.weights[name].value
        node = self.producers.get(name)
        if node is None or depth > _MAX_DEPTH or node.op not in _MASK_OPS or \
                not all(is_static(d) for d in node.type.shape) or node.type.numel > _MAX_ELEMENTS:
            return None
        operands = [self._value(i, depth + 1) for i in node.inputs]
        if any(v is None or v.is_meta for v in operands):
            return None
        return REGISTRY[node.op].evaluate(node.spec, operands, int)


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


def _mask_operands(node: Node) -> tuple:
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


__all__ = ["CausalMasks"]
