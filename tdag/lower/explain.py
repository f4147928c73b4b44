"""Why a node was or was not lowered: ``tdag.lower.explain(prog, "%42")``.

The lowering passes run again in the rewrite engine's explain mode, which records, for the
one node asked about, every rule that looked at it (in which pass and round), the reason it
gave for not firing, or what the node became. The node is followed by name: a rewrite keeps
the name on the node that replaces it.

>>> import tdag, tdag.lower
>>> from tdag import ops
>>> prog = tdag.trace(lambda a, b: ops.matmul(a, b), tdag.TensorSpec((4, 8)),
...                   tdag.TensorSpec((8, 3)))
>>> out = prog.graph.outputs[0]
>>> why = tdag.lower.explain(prog, out)
>>> (why.op.value, why.final.value)
('reduce', 'einsum')
>>> [look.rule for look in why.looks if look.fired]
['contraction_rule']
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Sequence

from tdag.errors import TdagError
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.record import Trait, has
from tdag.ir.rewrite import Look, Trace, explaining
from tdag.lower.passes import run_passes
from tdag.lower.pipeline import DEFAULT, PASSES


@dataclass(frozen=True)
class Explanation:
    """The rules that looked at ``node`` of TDAG ``graph`` while lowering, in order."""

    graph: str
    node: str
    op: Op | None      # its op in the program given (None: a node that lowering made)
    final: Op | None   # its op in the lowered program (None: it left the program)
    looks: tuple[Look, ...]

    @property
    def lowered(self) -> bool:
        """Whether the node ended as a kernel it was not before."""
        return self.final is not None and self.final is not self.op and \
            has(self.final, Trait.KERNEL)

    def __str__(self) -> str:
        lines = [f"%{self.node} in {self.graph}: {self._verdict()}"]
        rows = _grouped(self.looks)
        if not rows:
            lines.append("  no rule looked at it (no rule has its op at the root)")
            return "\n".join(lines)
        rows.insert(0, ("round", "pass", "op", "rule", "outcome"))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        for row in rows:
            cells = [cell.ljust(width) for cell, width in zip(row, widths)]
            lines.append("  " + "  ".join(cells + [row[4]]))
        return "\n".join(lines)

    def _verdict(self) -> str:
        before = self.op.value if self.op is not None else "made by lowering"
        if self.final is None:
            return f"{before}, gone from the lowered program"
        if self.final is self.op:
            return f"{before}, not lowered"
        kind = "a kernel" if has(self.final, Trait.KERNEL) else "a primitive"
        return f"{before} -> {self.final.value} ({kind})"


def _grouped(looks: Sequence[Look]) -> list[tuple[str, str, str, str, str]]:
    """One row per (pass path, op, rule, outcome), with the rounds it happened in: the later
    rounds of a fixed-point loop mostly repeat the first."""
    rows: dict[tuple[str, str, str, str], list[int]] = {}
    for look in looks:
        where = "/".join(name for name, _ in look.where) or "-"
        op = look.op.value if look.op is not None else "-"
        if not look.rule:  # not a rule: the node left the program in this pass
            outcome = look.outcome
        else:
            outcome = f"became {look.outcome}" if look.fired else f"no match: {look.outcome}"
        key = (where, op, look.rule or "-", outcome)
        round_ = look.where[0][1] if look.where else 0
        rounds = rows.setdefault(key, [])
        if round_ not in rounds:
            rounds.append(round_)
    return [(_rounds(r), *key) for key, r in rows.items()]


def _rounds(rounds: list[int]) -> str:
    if len(rounds) == 1:
        return f"round {rounds[0]}"
    if rounds == list(range(rounds[0], rounds[-1] + 1)):
        return f"rounds {rounds[0]}-{rounds[-1]}"
    return "rounds " + ",".join(map(str, rounds))


def explain(prog: Program, node: str, graph: str | None = None,
            passes: Sequence[str] | None = None) -> Explanation:
    """Why ``node`` (``"%42"`` or ``"42"``) was or was not lowered by ``passes`` (the default
    list). ``graph`` names its TDAG where the program has several that hold the name."""
    names = DEFAULT if passes is None else passes
    name = node[1:] if node.startswith("%") else node
    where = _graph_of(prog, name, graph)
    lowered = None
    if where is None:  # perhaps a node that lowering made: lower and look there
        lowered = run_passes(prog, names, PASSES)
        where = _graph_of(lowered, name, graph)
        if where is None:
            raise _unknown(prog, lowered, name, graph)
    trace = Trace(focus=(where, name))
    with explaining(trace):
        lowered = run_passes(prog, names, PASSES)
    return Explanation(where, name, _op_of(prog, where, name), _op_of(lowered, where, name),
                       tuple(trace.looks))


def _graph_of(prog: Program, name: str, graph: str | None) -> str | None:
    """The TDAG holding node ``name`` (``graph`` if given), None if none does."""
    if graph is not None and graph not in prog.graphs:
        raise TdagError(f"no TDAG {graph!r}; the program has {', '.join(prog.graphs)}")
    holders = [g for g in ([graph] if graph else prog.graphs)
               if any(n.name == name for n in prog.graphs[g].nodes)]
    if len(holders) > 1:
        raise TdagError(f"%{name} is a node of several TDAGs ({', '.join(holders)}): "
                        "name one with graph=")
    return holders[0] if holders else None


def _op_of(prog: Program, graph: str, name: str) -> Op | None:
    found = [n.op for n in prog.graphs[graph].nodes if n.name == name] \
        if graph in prog.graphs else []
    return found[0] if found else None


def _unknown(prog: Program, lowered: Program, name: str, graph: str | None) -> TdagError:
    """The error for a name that is no node: what it is instead, or close node names."""
    graphs = [graph] if graph else list(prog.graphs)
    for g in graphs:
        tdag = prog.graphs[g]
        if name in tdag.weights or any(v.name == name for v in tdag.inputs):
            return TdagError(f"%{name} is an input or weight of {g}, not a node: no rule "
                             "rewrites it")
    nodes = {n.name for p in (prog, lowered) for g in graphs if g in p.graphs
             for n in p.graphs[g].nodes}
    close = difflib.get_close_matches(name, sorted(nodes), n=5, cutoff=0.5)
    hint = f"; close names: {', '.join('%' + c for c in close)}" if close else ""
    where = f"TDAG {graph}" if graph else "the program"
    return TdagError(f"no node %{name} in {where}{hint}")


__all__ = ["Explanation", "explain"]
