"""Rematerialisation: a training program that recomputes chosen forward activations in its
backward pass instead of keeping them, so that its peak memory fits a budget.

The plan works on the lowered program, the kernels the reified module runs, so the flops it
adds and the peak it reaches are those of the schedule that runs. A candidate is a forward
value that a backward (or optimizer) node reads: kept from the forward to the backward. To
recompute it, the backward reads a copy made just before its first reader there, from the
values still kept (inputs, weights, the saved values not chosen), copying the forward
intermediates between them too (a segment from kept checkpoints, as activation
checkpointing recomputes one). Candidates go cheapest first: the flops of the segment per
byte it frees, so elementwise and normalisation outputs go before matmul outputs, as
selective activation checkpointing orders them. A candidate is taken where the peak (the
memory replay, ``tdag.refine.memory``) does not rise; once the peak fits, the costliest
ones the budget does not need are given back.

A copy's origin op reads ``recompute:remat:<op>`` (``REMAT``): phase ``recompute`` in the
cost tables, and a mark common-subexpression elimination respects, which would otherwise
merge a copy whose inputs are kept values back into its forward original.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tdag.errors import MemoryBudgetError
from tdag.ir.graph import TDAG, Node
from tdag.ir.names import FreshNames
from tdag.ir.program import Program
from tdag.ir.record import Trait, ops_with
from tdag.ir.symbols import Dim, evaluate
from tdag.ir.types import REMAT, Origin
from tdag.refine.cost.report import graph_figures

Key = tuple  # (graph name, node name): one forward value of one TDAG


@dataclass(frozen=True)
class Target:
    """What the plan asks of the target: its lowering of a program (a forward value no
    longer read by the backward may join a kernel there) and the peak of a program as its
    module runs it, not lowered again (the memory replay)."""

    lower: Callable[[Program], Program]
    peak: Callable[[Program], int]

    def run(self, prog: Program) -> tuple[Program, int]:
        """(the program the target runs, its peak)."""
        prog = self.lower(prog)
        return prog, self.peak(prog)


@dataclass(frozen=True)
class RematReport:
    """What ``tdag.remat`` did: the peak before and after, the budget, the flops the copies
    add (one training step) and the forward values recomputed (``graph:node``)."""

    budget: int
    peak_before: int
    peak: int
    added_flops: int
    recomputed: tuple = ()

    def __str__(self) -> str:
        return (f"remat: peak {self.peak_before} -> {self.peak} B (budget {self.budget} B), "
                f"{len(self.recomputed)} values recomputed, +{self.added_flops} flops")


@dataclass(frozen=True)
class RematProgram(Program):
    """A Program from ``tdag.remat``; ``report`` says what it recomputes and at what cost."""

    report: RematReport | None = None


@dataclass
class _Candidate:
    key: Key
    flops: int       # the segment's, alone: the node and the intermediates it reads
    freed: int       # the bytes of storage it stops keeping
    order: int       # its place in the forward, to break ties

    @property
    def ratio(self) -> float:
        return self.flops / self.freed


@dataclass
class _Graph:
    """One TDAG's forward nodes and which of them the later phases read."""

    graph: TDAG
    forward: dict = field(default_factory=dict)   # name -> Node
    saved: list = field(default_factory=list)     # forward names a later node reads

    @staticmethod
    def of(graph: TDAG) -> "_Graph":
        info = _Graph(graph)
        info.forward = {n.name: n for n in graph.nodes if n.origin.phase == "forward"}
        seen: set = set()
        for node in graph.nodes:
            if node.name in info.forward:
                continue
            for name in node.inputs:
                if name in info.forward and name not in seen:
                    seen.add(name)
                    info.saved.append(name)
        return info


def remat(prog: Program, budget: int, target: Target, sizes: dict) -> RematProgram:
    """``prog`` (lowered as ``target`` lowers) recomputing the cheapest kept activations
    until its peak is at most ``budget``; raises MemoryBudgetError naming the smallest peak
    reachable.

    A trial replays the memory of ``prog`` with copies inserted, without lowering it again
    (lowering was most of a trial's time); the plan found is lowered once and replayed.
    Where that lowering changes the peak past the budget (copies joined into kernels
    differently), the plan is made again judging each trial lowered."""
    graphs = {name: _Graph.of(g) for name, g in prog.graphs.items()}
    before = target.peak(prog)
    if before <= budget:
        return _result(prog, budget, before, before, 0, ())
    flops = {name: graph_figures(g) for name, g in prog.graphs.items()}
    candidates = _candidates(graphs, flops, sizes)
    if not candidates:
        raise MemoryBudgetError(f"remat: the peak is {before} B, over the budget of {budget} B, "
                                "and the program keeps no forward values for a backward pass "
                                "(a training program from tdag.grad or tdag.train_step?)",
                                smallest=before)

    def replayed(chosen: list) -> tuple[Program, int]:
        rebuilt = _rebuilt(prog, graphs, chosen)
        return rebuilt, target.peak(rebuilt)

    def lowered(chosen: list) -> tuple[Program, int]:
        return target.run(_rebuilt(prog, graphs, chosen))

    chosen, best, peak = _plan(candidates, budget, before, replayed, flops, sizes)
    fits = peak <= budget
    if chosen:
        best, peak = target.run(best)
    if fits and peak > budget:  # lowering the copies moved the peak past the budget
        chosen, best, peak = _plan(candidates, budget, before, lowered, flops, sizes)
    if peak > budget:
        raise MemoryBudgetError(
            f"remat: no plan fits {budget} B: the smallest peak reachable by recomputing "
            f"forward values is {peak} B ({len(chosen)} of {len(candidates)} kept values "
            f"recomputed; {before} B before)", smallest=peak)
    return _result(best, budget, before, peak, _added_flops(best, sizes),
                   tuple(f"{g}:{n}" for g, n in chosen))


def _plan(candidates: list, budget: int, before: int, trial, flops,
          sizes) -> tuple[list, Program, int]:
    """The greedy choice, then the give-back where it fits."""
    chosen, best, peak = _greedy(candidates, budget, before, trial)
    if peak <= budget:
        chosen, best, peak = _give_back(chosen, budget, best, peak, trial, flops, sizes)
    return chosen, best, peak


def _result(prog: Program, budget, before, peak, added, recomputed) -> RematProgram:
    report = RematReport(budget, before, peak, added, recomputed)
    return RematProgram(prog.graphs, prog.main, prog.state, prog.class_labels, report=report)


def _added_flops(prog: Program, sizes: dict) -> int:
    """The flops of the copies, as the cost report counts the ``recompute`` phase."""
    total = 0
    for graph in prog.graphs.values():
        figures = graph_figures(graph)
        total += sum(_value(figures[n.name].flops, sizes) for n in graph.nodes
                     if n.origin.op.startswith(REMAT))
    return total


def _value(value: Dim, sizes: dict) -> int:
    return value if isinstance(value, int) else evaluate(value, sizes)


# -- candidates, cheapest first -------------------------------------------------------------------

def _candidates(graphs: dict, flops: dict, sizes: dict) -> list[_Candidate]:
    """Every kept forward value that frees storage, ordered by flops per byte freed."""
    views = ops_with(Trait.VIEW)
    out = []
    for gname, info in graphs.items():
        outputs = set(info.graph.outputs)
        order = {name: i for i, name in enumerate(info.forward)}
        kept = set(info.saved) | outputs
        for name in info.saved:
            if name in outputs:
                continue
            segment = _segment(info, name, kept - {name})
            base = name
            while info.forward[base].op in views and info.forward[base].inputs[0] in segment:
                base = info.forward[base].inputs[0]
            if info.forward[base].op in views:
                continue  # a view of a kept value: recomputing it frees nothing
            freed = _value(info.forward[base].type.nbytes, sizes)
            cost = sum(_value(flops[gname][n].flops, sizes) for n in segment)
            if freed:
                out.append(_Candidate((gname, name), cost, freed, order[name]))
    return sorted(out, key=lambda c: (c.ratio, -c.freed, c.key[0], c.order))


def _segment(info: _Graph, name: str, kept: set) -> list[str]:
    """``name`` and the forward values between it and ``kept``: what a copy of it computes."""
    seen, stack = {name}, [name]
    while stack:
        for i in info.forward[stack.pop()].inputs:
            if i in info.forward and i not in kept and i not in seen:
                seen.add(i)
                stack.append(i)
    return list(seen)


def _greedy(candidates: list, budget: int, before: int, trial) -> tuple[list, Program, int]:
    """Take candidates in order while the peak does not rise, until it fits the budget."""
    chosen: list = []
    best, peak = None, before
    for candidate in candidates:
        new, value = trial(chosen + [candidate.key])
        if value <= peak:
            chosen, best, peak = chosen + [candidate.key], new, value
            if peak <= budget:
                break
    return chosen, best, peak


def _give_back(chosen: list, budget: int, best: Program, peak: int, trial, flops,
               sizes) -> tuple[list, Program, int]:
    """Keep again, costliest first, the chosen values the budget does not need."""
    for key in sorted(chosen, key=lambda k: -_value(flops[k[0]][k[1]].flops, sizes)):
        rest = [k for k in chosen if k != key]
        if not rest:
            break
        new, value = trial(rest)
        if value <= budget:
            chosen, best, peak = rest, new, value
    return chosen, best, peak


# -- the rebuilt program ----------------------------------------------------------------------

def _rebuilt(prog: Program, graphs: dict, chosen: list) -> Program:
    changed = {}
    for gname, info in graphs.items():
        picked = {n for g, n in chosen if g == gname}
        if picked:
            changed[gname] = _with_copies(info, picked)
    return prog.replace(graphs={**prog.graphs, **changed})


def _with_copies(info: _Graph, picked: set) -> TDAG:
    """The TDAG whose later nodes read copies of ``picked``, each made right before the
    first later node that reads it and shared by the later readers after it. A copy made
    only on the way to another (an intermediate of its segment) serves that one segment: a
    later reader of it recomputes it again rather than keep it from the segment's time (the
    backward reads a CNN's layers in reverse, so a kept intermediate would stay for long)."""
    graph = info.graph
    kept = (set(info.saved) - picked) | set(graph.outputs)
    names = FreshNames({v.name for v in graph.inputs} | set(graph.weights) |
                       {n.name for n in graph.nodes})
    shared: dict[str, str] = {}  # a value a later node reads -> its copy
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.name not in info.forward:
            wanted = [i for i in node.inputs if i in info.forward and i not in kept]
            segment = dict(shared)
            for name in wanted:
                _copy(info, name, kept, segment, nodes, names)
                shared[name] = segment[name]
            node = node.replace(inputs=tuple(shared.get(i, i) for i in node.inputs))
        nodes.append(node)
    return graph.replace(nodes=tuple(nodes))


def _copy(info: _Graph, name: str, kept: set, copies: dict, nodes: list,
          names: FreshNames) -> None:
    """Append copies of ``name`` and of the uncopied forward values it reads (inputs first;
    a stack, not recursion: a segment may span the whole forward)."""
    stack = [(name, False)]
    while stack:
        current, ready = stack.pop()
        if current in copies:
            continue
        node = info.forward[current]
        todo = [i for i in node.inputs
                if i in info.forward and i not in kept and i not in copies]
        if not ready and todo:
            stack.append((current, True))
            stack += [(i, False) for i in todo]
            continue
        inputs = tuple(copies.get(i, i) for i in node.inputs)  # a kept value is never copied
        copies[current] = names.fresh(f"{current}_re")
        nodes.append(node.replace(name=copies[current], inputs=inputs,
                                  origin=_marked(node)))


def _marked(node: Node) -> Origin:
    origin = node.origin
    return Origin(REMAT + (origin.op or node.op.value), origin.scope, origin.location)


__all__ = ["RematProgram", "RematReport", "remat"]
