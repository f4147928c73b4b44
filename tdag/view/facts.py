"""The program as a table of tensors: what a graph view (networkx, the HTML page) shows.

One row per tensor of each TDAG: its inputs, weights and nodes, with the op that makes it,
its type, its module scope, where it came from and what it costs: ``tdag.refine.cost.report`` of
the program as it stands, node by node and times the calls of its TDAG (``tdag.cost`` costs
the lowered kernels, which merge nodes; a view of the nodes wants each node's own
figures). Inputs and weights cost nothing; a weight sits in the scope of its first user, so
a layer's weights open with the layer.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.ir.graph import TDAG
from tdag.ir.program import Program
from tdag.refine.cost.report import CostReport, Figures, cost


@dataclass(frozen=True, slots=True)
class TensorFacts:
    graph: str          # the TDAG's name in the program
    name: str
    kind: str           # "node", or the boundary tensor's kind: input, param, buffer, const
    op: str             # the primitive op; the kind again for a boundary tensor
    type: object        # TensorType
    scope: str          # module path, "" at the top
    provenance: str     # "aten.linear @ encoder.0.fc (model.py:12)"; "" for boundary tensors
    inputs: tuple       # names of the tensors it reads, in operand order
    figures: Figures    # this node's cost, all calls of its TDAG together


def program_facts(prog: Program | TDAG, report: CostReport | None = None) -> list[TensorFacts]:
    """Every tensor of every TDAG of ``prog``, each TDAG's in definition order."""
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    report = report if report is not None else cost(prog)
    rows: list[TensorFacts] = []
    for gname, graph in prog.graphs.items():
        rows += graph_facts(gname, graph, report)
    return rows


def graph_facts(gname: str, graph: TDAG, report: CostReport) -> list[TensorFacts]:
    """The rows of one TDAG: its inputs, then its nodes, each weight just before its first
    user (unused weights last), so that the rows are in an order a reader can follow."""
    none = Figures()
    rows = [TensorFacts(gname, v.name, "input", "input", v.type, "", "", (), none)
            for v in graph.inputs]
    placed: set[str] = set()
    for node in graph.nodes:
        for name in node.inputs:
            if name in graph.weights and name not in placed:
                placed.add(name)
                rows.append(_weight_facts(gname, name, graph, node.origin.scope))
        # a TDAG that no Call runs has no per-node figures: it costs nothing
        rows.append(TensorFacts(gname, node.name, "node", node.op.value, node.type,
                                node.origin.scope, str(node.origin), tuple(node.inputs),
                                report.per_node.get((gname, node.name), none)))
    rows += [_weight_facts(gname, name, graph, "") for name in graph.weights
             if name not in placed]
    return rows


def _weight_facts(gname: str, name: str, graph: TDAG, scope: str) -> TensorFacts:
    weight = graph.weights[name]
    return TensorFacts(gname, name, weight.kind.value, weight.kind.value, weight.type, scope,
                       "", (), Figures())
