"""What a comparison says about the ``where`` it selects with: integer ``max`` and ``min``.

An ``Affine`` holds one value's bounds, so ``where(x > 0, x, 0)`` (``max(x, 0)``, as
``tdag.ops.maximum`` writes it) gets only the union of its branches' bounds: with ``x``
unbounded (a float cast to int, DeBERTa's log-bucketed relative positions), so is the result,
and the clamp that keeps a gather's index inside its rows is lost. ``Order`` remembers which
two values each integer comparison compares, so such a ``where`` is read as the max or min of
its branches: ``max(x, y) >= lo(y)`` whatever ``x`` is. ``maximum``'s nan test ``x != x`` is
false on integers, and the ``or`` that adds it (``where(c, True, False)``) is ``c``.
"""
from __future__ import annotations

from tdag.deinops.elementwise import CompareKind
from tdag.ir.batching import Affine
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.symbols import Dim, as_dim, is_static
from tdag.ir.types import DType

# what x <kind> y says of where(cond, x, y): x is the larger (max) or the smaller (min)
_LARGER = {CompareKind.gt: "max", CompareKind.ge: "max", CompareKind.lt: "min",
           CompareKind.le: "min"}
_SWAP = {"max": "min", "min": "max"}  # where(x > y, y, x) is min(x, y)
_REFLEXIVE = {CompareKind.eq: True, CompareKind.le: True, CompareKind.ge: True,
              CompareKind.ne: False, CompareKind.lt: False, CompareKind.gt: False}
_ORDERED = frozenset((DType.i64, DType.i32, DType.i16, DType.i8, DType.u8))


class Order:
    """Each integer comparison's operands, by the name of the bool it makes."""

    def __init__(self):
        self.compares: dict[str, tuple] = {}  # bool name -> (kind, x, y): it is x <kind> y

    def refine(self, node: Node, facts: list[Affine], fact: Affine, types) -> Affine:
        """``fact`` (from the op's ``values`` hook), narrowed by what the comparisons say."""
        if node.op is Op.compare and types[0].dtype in _ORDERED:
            if node.inputs[0] == node.inputs[1]:  # x != x on integers: never (no nan)
                known = int(_REFLEXIVE[node.spec.kind])
                return Affine(0, known, known)
            self.compares[node.name] = (node.spec.kind, *node.inputs)
        elif node.op is Op.where and node.inputs[0] in self.compares:
            return self._select(node, facts, fact)
        return fact

    def _select(self, node: Node, facts: list[Affine], fact: Affine) -> Affine:
        kind, x, y = self.compares[node.inputs[0]]
        _, a, b = facts
        if node.type.dtype is DType.bool and a.constant == 1 and b.constant == 0:
            self.compares[node.name] = (kind, x, y)  # c or False: c
            return fact
        branches = node.inputs[1:]
        if kind not in _LARGER or set(branches) != {x, y} or x == y or a.stride or b.stride:
            return fact
        larger = _LARGER[kind] if branches[0] == x else _SWAP[_LARGER[kind]]
        if larger == "max":  # max(a, b) >= each lower bound, <= the larger upper bound
            return Affine(0, _best(a.lo, b.lo, max), _both(a.hi, b.hi, max))
        return Affine(0, _both(a.lo, b.lo, min), _best(a.hi, b.hi, min))


def _best(p: Dim | None, q: Dim | None, pick) -> Dim | None:
    """The tighter of two bounds either of which holds (one where they do not compare)."""
    known = [v for v in (p, q) if v is not None]
    if len(known) == 2 and all(map(is_static, known)):
        return as_dim(pick(known))
    return known[0] if known else None


def _both(p: Dim | None, q: Dim | None, pick) -> Dim | None:
    """A bound that needs both operands' (the max's upper bound): None where one is unknown."""
    if p is None or q is None or not (is_static(p) and is_static(q)):
        return None
    return as_dim(pick(p, q))


__all__ = ["Order"]
