"""``tdag.remat``: a training program that fits a memory budget as ``tdag.to_torch`` runs it.

The plan lives in ``tdag.refine.memory.remat``; this module gives it the lowering and the
liveness of the torch code generator, so each plan is judged by the peak of the module that
will run (``tdag.memory``'s replay).
"""
from __future__ import annotations

from tdag.errors import ShapeError
from tdag.ir.graph import TDAG
from tdag.ir.passes import gc_paused
from tdag.ir.program import Program
from tdag.refine.memory import program_symbols
from tdag.refine.memory.walk import Walk
from tdag.refine.memory.remat import RematProgram, Target
from tdag.refine.memory.remat import remat as plan
from tdag.reify.torch.codegen import liveness
from tdag.reify.torch.module import lowered


def remat(prog: Program | TDAG, budget: int, **sizes: int) -> RematProgram:
    """``prog`` (a gradient or training program) recomputing, in its backward pass, the
    cheapest forward values it would keep, so that ``tdag.memory(result).peak <= budget``
    bytes. The result is lowered (the plan picks among the kernels that run); its
    ``report`` holds the peak before and after, the flops added and the values recomputed.
    Raises MemoryBudgetError, naming the smallest peak reachable, where no plan fits.

    >>> import tdag, torch
    >>> from tdag import ops
    >>> ws = [torch.randn(64, 64) / 8 for _ in range(4)]
    >>> def net(x):
    ...     for i, w in enumerate(ws):
    ...         x = ops.tanh(x @ ops.param(f"w{i}", w))
    ...     return ops.sum(x)
    >>> step = tdag.train_step(tdag.trace(net, tdag.TensorSpec((512, 64))),
    ...                        tdag.optim.SGD(lr=0.1))
    >>> budget = int(0.8 * tdag.memory(step).peak)
    >>> smaller = tdag.remat(step, budget)
    >>> tdag.memory(smaller).peak <= budget, smaller.report.added_flops > 0
    (True, True)
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    free = sorted(program_symbols(prog) - set(sizes))
    if free:
        raise ShapeError(f"remat: the budget is in bytes; bind the sizes {', '.join(free)} "
                         "(tdag.remat(prog, budget, b=8, ...))")
    return plan(lowered(prog), budget, Target(lowered, lambda p: _peak(p, sizes)), sizes)


def _peak(prog: Program, sizes: dict) -> int:
    """The peak of ``prog`` (lowered) as ``to_torch``'s module runs it: one replay
    (``memory_of`` replays twice, the second time for the report's live set, which a plan
    does not need)."""
    with gc_paused():  # a replay makes a record per event, as in memory_of
        events = Walk(prog, liveness, dict(sizes), dict(sizes)).run().events
    return max(e.total.at(sizes) for e in events)


__all__ = ["remat"]
