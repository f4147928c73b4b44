"""``tdag.to_networkx``: the program as a networkx DiGraph with op, type, scope and cost."""
from __future__ import annotations

import networkx
import pytest

import tdag
from support.io_programs import control_program
from support.refine_programs import from_torch
from tdag.refine.cost.report import cost as cost_of_primitives


@pytest.fixture(scope="module")
def encoder():
    return from_torch("encoder")


def test_a_node_per_tensor_and_an_edge_per_operand(encoder):
    g = encoder.graph
    graph = tdag.to_networkx(encoder)
    assert graph.number_of_nodes() == len(g.inputs) + len(g.weights) + len(g.nodes)
    # one edge per distinct (producer, user) pair; ``x * x`` feeds one edge twice
    assert graph.number_of_edges() == sum(len(set(n.inputs)) for n in g.nodes)
    for node in g.nodes:
        attrs = graph.nodes[node.name]
        assert (attrs["op"], attrs["type"], attrs["scope"]) == \
            (node.op.value, node.type, node.origin.scope)
        assert attrs["provenance"] == str(node.origin)
        assert attrs["shape"] == node.type.shape and attrs["dtype"] == node.type.dtype.value
        assert set(graph.predecessors(node.name)) == set(node.inputs)
        for position, name in enumerate(node.inputs):
            assert position in graph.edges[name, node.name]["operands"]
    for name, weight in g.weights.items():
        assert graph.nodes[name]["kind"] == graph.nodes[name]["op"] == weight.kind.value
        assert graph.in_degree(name) == 0
    assert graph.graph["tdags"] == ["main"]


def test_cost_on_each_node_adds_up_to_the_report(encoder):
    graph = tdag.to_networkx(encoder)
    report = cost_of_primitives(encoder).evaluate(batch=3)  # the nodes as captured
    sizes = {"batch": 3}
    total = sum(tdag.ir.symbols.evaluate(d["flops"], sizes) for _, d in graph.nodes(data=True))
    assert total == report.flops > 0
    moved = sum(tdag.ir.symbols.evaluate(d["bytes"], sizes) for _, d in graph.nodes(data=True))
    assert moved == report.bytes


def test_networkx_algorithms_run(encoder):
    graph = tdag.to_networkx(encoder)
    assert networkx.is_directed_acyclic_graph(graph)
    order = list(networkx.topological_sort(graph))
    position = {name: i for i, name in enumerate(order)}
    assert all(position[a] < position[b] for a, b in graph.edges)
    # the critical path runs from a graph input or weight to the program's output
    path = networkx.dag_longest_path(graph)
    assert graph.in_degree(path[0]) == 0 and path[-1] in encoder.graph.outputs
    assert len(path) > 10


def test_several_tdags_key_nodes_by_tdag():
    prog = control_program()
    graph = tdag.to_networkx(prog)
    assert graph.graph["tdags"] == list(prog.graphs)
    assert graph.number_of_nodes() == sum(len(g.inputs) + len(g.weights) + len(g.nodes)
                                          for g in prog.graphs.values())
    for gname, g in prog.graphs.items():
        for node in g.nodes:
            assert graph.nodes[(gname, node.name)]["graph"] == gname
    # no edge crosses from one TDAG to another: controllers join them, not tensors
    assert all(a[0] == b[0] for a, b in graph.edges)
