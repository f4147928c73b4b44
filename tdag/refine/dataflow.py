"""Small dataflow helpers the refine passes share: liveness, renaming, fresh names, ordering.

Every helper is one pass over the nodes (linear in their number).
"""
from __future__ import annotations

from typing import Iterable

from tdag.ir.graph import TDAG, Node
from tdag.ir.names import FreshNames as Names  # noqa: F401  (re-exported)
from tdag.ir.types import TensorKind


def live_names(graph: TDAG, outputs: Iterable[str] | None = None,
               stop: Iterable[str] = ()) -> set[str]:
    """Names the ``outputs`` depend on (nodes, inputs and weights), not looking past ``stop``."""
    producer = {n.name: n for n in graph.nodes}
    stop = set(stop)
    live: set[str] = set()
    todo = list(graph.outputs if outputs is None else outputs)
    while todo:
        name = todo.pop()
        if name in live:
            continue
        live.add(name)
        node = producer.get(name)
        if node is not None and name not in stop:
            todo.extend(node.inputs)
    return live


def prune(graph: TDAG, keep_weights: bool = True) -> TDAG:
    """``graph`` without dead nodes and unused consts (and unused parameters and buffers too
    when ``keep_weights`` is False)."""
    live = live_names(graph)
    nodes = tuple(n for n in graph.nodes if n.name in live)
    weights = {k: w for k, w in graph.weights.items()
               if k in live or (keep_weights and w.kind is not TensorKind.const)}
    if len(nodes) == len(graph.nodes) and len(weights) == len(graph.weights):
        return graph
    return graph.replace(nodes=nodes, weights=weights)


def renamed(node: Node, env: dict[str, str]) -> Node:
    """``node`` reading ``env[name]`` in place of each input ``name`` found in ``env``."""
    inputs = tuple(env.get(n, n) for n in node.inputs)
    return node if inputs == node.inputs else node.replace(inputs=inputs)


def all_names(graph: TDAG) -> set[str]:
    names = {v.name for v in graph.inputs} | set(graph.weights)
    names.update(n.name for n in graph.nodes)
    return names


def toposort(nodes: list[Node], defined: Iterable[str]) -> list[Node]:
    """``nodes`` in an order where each comes after its producers, as close as possible to
    the given order (a depth-first walk that emits a node's missing producers first)."""
    producer = {n.name: n for n in nodes}
    done = set(defined)
    order: list[Node] = []
    for root in nodes:
        stack = [(root, False)]
        while stack:
            node, expanded = stack.pop()
            if node.name in done:
                continue
            if expanded:
                done.add(node.name)
                order.append(node)
                continue
            stack.append((node, True))
            for name in reversed(node.inputs):
                if name not in done and name in producer:
                    stack.append((producer[name], False))
    return order


__all__ = ["Names", "all_names", "live_names", "prune", "renamed", "toposort"]
