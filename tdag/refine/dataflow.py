"""Small dataflow helpers the refine passes share: liveness, renaming, ordering.

Every helper is one pass over the nodes (linear in their number).
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import sympy

from tdag.ir.graph import TDAG, Node
from tdag.ir.record import Trait, has
from tdag.ir.types import TensorKind


def live_names(graph: TDAG, outputs: Iterable[str] | None = None,
               stop: Iterable[str] = ()) -> set[str]:
    """Names the ``outputs`` depend on (nodes, inputs and weights), not looking past ``stop``.

    A node also depends on the nodes that define the run-time sizes in its type and spec
    (``nonzero``, ``arange``: trait FRESH_SIZE), even where it does not read their values:
    ``zeros(n)`` for ``n = x.item()`` needs the node that binds ``n``."""
    producer = {n.name: n for n in graph.nodes}
    definer = fresh_definers(graph)
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
            if definer:
                todo.extend(definer[s] for s in sizes_named(node) if s in definer)
    return live


def fresh_definers(graph: TDAG) -> dict[str, str]:
    """Each run-time size symbol -> the node that defines it (nonzero, arange)."""
    return {s: n.name for n in graph.nodes if has(n.op, Trait.FRESH_SIZE)
            for s in n.spec.fresh}


def sizes_named(node: Node) -> set[str]:
    """The symbols in a node's type and in the Dims of its spec."""
    names = {s.name for d in node.type.shape if not isinstance(d, int)
             for s in d.free_symbols}
    for field in dataclasses.fields(node.spec) if dataclasses.is_dataclass(node.spec) else ():
        stack = [getattr(node.spec, field.name)]
        while stack:
            value = stack.pop()
            if isinstance(value, tuple):
                stack.extend(value)
            elif isinstance(value, sympy.Expr):
                names.update(s.name for s in value.free_symbols)
    return names


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


__all__ = ["all_names", "live_names", "prune", "renamed", "toposort"]
