"""Peak memory from liveness: ``memory_of(prog, liveness, **sizes)`` replays the schedule of
the reified torch module on storages (``walk``) and reports the peak, what is live at it by
kind and module scope, and the curve (``report``). ``tdag.memory`` lowers the program and
passes the torch code generator's liveness (``tdag.reify.torch.memory``)."""
from __future__ import annotations

from tdag.ir.graph import TDAG
from tdag.ir.passes import gc_paused
from tdag.ir.program import Loop, Program, all_steps
from tdag.ir.symbols import free_symbols
from tdag.refine.memory.report import Live, MemoryReport, PhasePeak, build, peaks_of
from tdag.refine.memory.walk import Liveness, Walk

PROBE = 17  # a free size's value where only the structure matters (which reshapes copy)


def memory_of(prog: Program, liveness: Liveness, **sizes: int) -> MemoryReport:
    """The memory report of ``prog`` run in the order of its TDAGs' nodes, each value deleted
    where ``liveness`` says; ``sizes`` bind symbols (a Loop's symbolic count must be bound)."""
    free = sorted(program_symbols(prog) - set(sizes))
    probe = dict(sizes, **{s: PROBE for s in free})
    with gc_paused():  # the replays make a record per event: a third of their time in GC
        first = Walk(prog, liveness, dict(sizes), probe).run()
        peaks = peaks_of(first.events, free, sizes)
        again = Walk(prog, liveness, dict(sizes), probe, capture=frozenset(i for i, _ in
                                                                         peaks.values()),
                     choices=first.choices, graphs=first.graphs).run()
        return build(first.events, again.heap.storages, again.captured, peaks, sizes)


def program_symbols(prog: Program) -> set[str]:
    """The names of every size symbol in ``prog``'s types and loop counts."""
    names: set[str] = set()
    for graph in prog.graphs.values():
        names |= _graph_symbols(graph)
    for value in prog.main.inputs:
        names |= {n for d in value.type.shape for n in free_symbols(d)}
    for step in all_steps(prog.main):
        if isinstance(step, Loop) and step.count is not None:
            names |= free_symbols(step.count)
    return names


def _graph_symbols(graph: TDAG) -> set[str]:
    types = [v.type for v in graph.inputs] + [w.type for w in graph.weights.values()] + \
        [n.type for n in graph.nodes]
    return {n for t in set(types) for d in t.shape for n in free_symbols(d)}


__all__ = ["Live", "MemoryReport", "PhasePeak", "memory_of", "program_symbols"]
