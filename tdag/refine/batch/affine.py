"""What strip_batch knows of integer values: each one's ``Affine`` (``tdag.ir.batching``).

An integer value is ``stride * i + r`` with ``i`` the sample index and ``lo <= r <= hi``. The
facts start from the bounds of the integer consts and grow, node by node, by the ``values``
hook of each op's batch rule. A value computed from ``arange(batch)`` has a stride (the
per-sample program holds only ``r``); bounds decide comparisons, so a ``where`` on a known
condition is its chosen operand (``Pick``); a ``where`` selecting by a comparison of its
branches is their max or min (``order.py``).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from tdag.ir.batching import UNKNOWN, Affine, Aligned, AxisRule, OperandRule, Pick
from tdag.ir.graph import Node, Weight
from tdag.ir.record import record
from tdag.ir.symbols import Dim
from tdag.ir.types import DType, TensorKind
from tdag.refine.batch.order import Order

INTEGRAL = frozenset((DType.i64, DType.i32, DType.i16, DType.i8, DType.u8, DType.bool))


class SampleFacts:
    """The ``Affine`` of each value known so far (unknown ones are not kept)."""

    def __init__(self, weights: Mapping[str, Weight], batch: Dim):
        self.batch = batch
        self.known: dict[str, Affine] = {}
        self.order = Order()  # integer max / min read from their comparisons
        for name, w in weights.items():
            if w.kind is TensorKind.const and w.value is not None and w.value.numel() \
                    and w.type.dtype in INTEGRAL:
                self.known[name] = Affine(0, int(w.value.min()), int(w.value.max()))

    def get(self, name: str) -> Affine:
        return self.known.get(name, UNKNOWN)

    def of(self, names: Iterable[str]) -> list[Affine]:
        return [self.known.get(n, UNKNOWN) for n in names]

    def learn(self, name: str, fact: Affine) -> None:
        if fact != UNKNOWN:
            self.known[name] = fact

    def derive(self, node: Node, facts: list[Affine], strided: bool,
               types) -> Affine | Pick | None:
        """The node's ``Affine`` (or ``Pick``) by its rule's hook (``types``: the operands'
        full-size types); None where a strided operand has no hook to read it."""
        rule = record(node.op).batch
        hook = rule.values if isinstance(rule, (AxisRule, Aligned, OperandRule)) else None
        if hook is not None and (strided or node.type.dtype in INTEGRAL
                                 or any(f != UNKNOWN for f in facts)):
            fact = hook(node.spec, facts, self.batch, types)
            return self.order.refine(node, facts, fact, types) \
                if isinstance(fact, Affine) else fact
        return None if strided else UNKNOWN


__all__ = ["INTEGRAL", "SampleFacts"]
