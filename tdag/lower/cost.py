"""``tdag.cost``: the cost report with bytes as the lowered program moves them.

The analysis lives in ``tdag.refine.cost.report``; lowering is a later stage, so the function that
runs one before the other lives here.
"""
from __future__ import annotations

from tdag.ir.graph import TDAG
from tdag.ir.program import Program
from tdag.lower.pipeline import DEFAULT, lower
from tdag.refine.cost.report import CostReport
from tdag.refine.cost.report import cost as cost_of


def cost(prog: Program | TDAG, lowered: bool = True) -> CostReport:
    """Flops and bytes of ``prog`` per node, op, module scope, TDAG and step (conventions in
    ``tdag.refine.cost.report``); with ``lowered``, bytes and flops are those of
    ``tdag.lower.lower(prog)``'s kernels, and ``unfused_bytes`` the primitives' op by op.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x, w: ops.matmul(x, w), tdag.TensorSpec((64, 128)),
    ...                   tdag.TensorSpec((128, 32)))
    >>> report = tdag.cost(prog)
    >>> report.matmul_flops, report.bytes, report.unfused_bytes > 10 * report.bytes
    (524288, 57344, True)
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    return cost_of(prog, lowered_for_cost(prog) if lowered else None)


def lowered_for_cost(prog: Program) -> Program:
    """The lowered program ``cost`` counts: its TDAGs and controllers are the source's, and
    so is its work (no deployment folds)."""
    return lower(prog, _KEEP_STEPS, final=())


# every pass but join_calls: the lowered program keeps the source's TDAGs and controllers, so
# per TDAG and per step the two programs' figures line up
_KEEP_STEPS = tuple(p for p in DEFAULT if p != "join_calls")


__all__ = ["cost", "lowered_for_cost"]
