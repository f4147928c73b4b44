"""``tdag.to_networkx``: the program as a networkx DiGraph, for graph algorithms and plots.

>>> import tdag, networkx
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.exp(x) * x, tdag.TensorSpec((4, 8)))
>>> g = tdag.to_networkx(prog)
>>> node = g.nodes["1"]
>>> node["op"], str(node["type"]), node["flops"], g.number_of_edges()
('multiply', 'f32[4,8]', 32, 3)
>>> [g.nodes[n]["op"] for n in networkx.topological_sort(g)]
['input', 'exp', 'multiply']
"""
from __future__ import annotations

import networkx

from tdag.ir.graph import TDAG
from tdag.ir.program import Program
from tdag.refine.cost.report import CostReport
from tdag.view.facts import program_facts


def to_networkx(prog: Program | TDAG, report: CostReport | None = None) -> networkx.DiGraph:
    """A node per tensor (every input, weight and node of each TDAG) and an edge from each
    tensor to the nodes that read it.

    A node's key is its tensor name when the program has one TDAG, ``(tdag name, tensor
    name)`` when it has several. Attributes: ``graph`` (the TDAG), ``kind`` ("node", "input",
    "param", "buffer", "const"), ``op`` (the primitive; the kind for a boundary tensor),
    ``type`` (a TensorType), ``shape``, ``dtype``, ``scope``, ``provenance``, and the cost
    figures of each node as captured (``tdag.refine.cost.report.cost(prog)``, op by op)
    ``flops``, ``matmul_flops``, ``bytes_read``, ``bytes_written``, ``bytes``,
    ``fused_bytes`` (ints, or sympy expressions in symbolic sizes; all calls of the TDAG
    together); ``report`` passes a report already made. An edge's ``operands`` lists the
    operand positions it feeds (``x * x``: both). ``graph.graph["tdags"]`` names the TDAGs
    in program order.
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    several = len(prog.graphs) > 1
    graph = networkx.DiGraph(tdags=list(prog.graphs))

    def key(gname: str, name: str):
        return (gname, name) if several else name

    for row in program_facts(prog, report):
        fig = row.figures
        graph.add_node(key(row.graph, row.name), graph=row.graph, kind=row.kind, op=row.op,
                       type=row.type, shape=row.type.shape, dtype=row.type.dtype.value,
                       scope=row.scope, provenance=row.provenance, flops=fig.flops,
                       matmul_flops=fig.matmul_flops, bytes_read=fig.bytes_read,
                       bytes_written=fig.bytes_written, bytes=fig.bytes,
                       fused_bytes=fig.fused_bytes)
        for position, name in enumerate(row.inputs):
            source, target = key(row.graph, name), key(row.graph, row.name)
            if graph.has_edge(source, target):
                graph.edges[source, target]["operands"].append(position)
            else:
                graph.add_edge(source, target, operands=[position])
    return graph
