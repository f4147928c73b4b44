"""Constant values: which names hold compile-time constants, and folding them.

A name is constant when it is a ``const`` weight with a value, or a node whose inputs are all
constant (an ``iota`` has none). Parameters and buffers are not: they change between runs.
Values are computed lazily with each primitive's reference evaluator, and only where small:
folding a broadcast of a scalar into a big tensor would duplicate memory, not save work.
"""
from __future__ import annotations

import torch

from tdag.errors import TdagError
from tdag.ir.carriers import run_carried
from tdag.ir.graph import TDAG, Node, Weight
from tdag.ir.record import REGISTRY, Trait, has
from tdag.ir.symbols import evaluate, shape_is_static
from tdag.ir.types import TensorKind

FOLD_LIMIT = 4096  # elements: larger results stay computed (a weight is not duplicated)


class Constants:
    """The constant values of a graph, evaluated node by node as nodes are added in order."""

    def __init__(self, weights: dict[str, Weight], limit: int = FOLD_LIMIT):
        self.limit = limit
        self.values: dict[str, torch.Tensor] = {
            name: w.value for name, w in weights.items()
            if w.kind is TensorKind.const and w.value is not None}

    def add(self, node: Node) -> None:
        """Evaluate ``node`` if its inputs are constant, it is static, and (unless it is a
        free view) small."""
        if not all(n in self.values for n in node.inputs):
            return
        if not shape_is_static(node.type.shape):
            return
        if not has(node.op, Trait.VIEW) and _numel(node) > self.limit:
            return
        value = evaluate_node(node, [self.values[n] for n in node.inputs])
        if value is not None and tuple(value.shape) == node.type.shape and \
                value.dtype == node.type.dtype.torch:
            self.values[node.name] = value

    def value(self, name: str) -> torch.Tensor | None:
        return self.values.get(name)

    def scalar(self, name: str) -> float | None:
        """The one value every element of a small constant holds, or None."""
        value = self.values.get(name)
        if value is None or value.numel() == 0 or value.numel() > self.limit:
            return None
        first = value.reshape(-1)[0]
        if bool((value == first).all()) and not torch.isnan(first):
            return first.item()
        return None


def _numel(node: Node) -> int:
    return int(node.type.numel)


def evaluate_node(node: Node, args) -> torch.Tensor | None:
    """The node's value as the interpreter computes it (on carrier types where torch lacks a
    kernel for the node's), or None where it cannot."""
    rec = REGISTRY[node.op]
    try:
        return run_carried(node, lambda xs: rec.evaluate(node.spec, xs, lambda d: evaluate(d, {})),
                           args)
    except (TdagError, RuntimeError, ValueError, IndexError):
        return None


def fold_constants(graph: TDAG, limit: int = FOLD_LIMIT) -> tuple[TDAG, bool]:
    """Replace each computing node with constant inputs by a ``const`` weight of its value.

    Views of constants are left alone (they cost nothing and fold into their user), and so
    are results over ``limit`` elements.
    """
    consts = Constants(graph.weights, limit)
    weights = dict(graph.weights)
    nodes = []
    for node in graph.nodes:
        consts.add(node)
        value = consts.value(node.name)
        if value is not None and not has(node.op, Trait.VIEW):
            weights[node.name] = Weight(TensorKind.const, node.type, value.contiguous())
            continue
        nodes.append(node)
    if len(nodes) == len(graph.nodes):
        return graph, False
    return graph.replace(nodes=tuple(nodes), weights=weights), True


__all__ = ["Constants", "FOLD_LIMIT", "evaluate_node", "fold_constants"]
