"""The walk that strip_batch and add_batch share over one TDAG.

Each value is in one of three states (``tdag.ir.batching``): free (``None``: it does not
depend on the batch), ``Batched(p)`` (axis ``p`` is the batch) or ``Folded(p, inner)`` (a
reshape merged the batch into axis ``p``). ``Rewriter`` visits the nodes in order: a node with
no batched operand is copied as it is, any other is rewritten by the *kind* of its op's batch
rule (``AxisRule``, ``Aligned``, ``OperandRule``, ``Refuse``), never by its op; the subclass
of each pass says what a kind does. New nodes are made by the one emitter
(``tdag.ir.emit``), so a node a rule cannot rewrite is a ``BatchError`` naming it.
"""
from __future__ import annotations

from dataclasses import replace

from tdag.errors import TdagError
from tdag.ir.batching import Aligned, AxisRule, Batched, Folded, OperandRule, Refuse
from tdag.ir.emit import typed_node
from tdag.ir.graph import TDAG, Node, Value
from tdag.ir.names import FreshNames
from tdag.ir.op import Op
from tdag.ir.record import record
from tdag.ir.symbols import Dim, format_dim
from tdag.ir.types import TensorType
from tdag.refine.dataflow import all_names, prune


class BatchError(TdagError):
    """A batch axis that cannot be removed or added: the op mixes samples."""


class Rewriter:
    """Shared machinery: the new nodes, their types, and a state per old name. A subclass
    names its pass (``pass_name``) and says what each rule kind does (``one_input``,
    ``aligned``, ``operands``) and how a value's type changes (``new_type``)."""

    pass_name: str

    def __init__(self, graph: TDAG, states, batch: Dim):
        self.graph, self.batch = graph, batch
        self.old_types = graph.types()
        self.producer = {n.name: n for n in graph.nodes}
        self.state = {v.name: s for v, s in zip(graph.inputs, states)}
        self.env = {name: name for name in self.old_types}  # old name -> new name
        self.types: dict[str, TensorType] = {}
        self.nodes: list[Node] = []
        self.names = FreshNames(all_names(graph))  # new nodes: <node>_b, <node>_b_1 ...
        self.shape_cache: dict = {}
        self.cache: dict = {}
        self.weights = dict(graph.weights)

    def run(self):
        inputs = tuple(Value(v.name, self.new_type(v.type, self.state[v.name]))
                       for v in self.graph.inputs)
        self.types.update((v.name, v.type) for v in inputs)
        self.types.update((k, w.type) for k, w in self.graph.weights.items())
        for node in self.graph.nodes:
            self.state[node.name] = self.visit(node, [self.state.get(n) for n in node.inputs])
        outputs = tuple(self.env[n] for n in self.graph.outputs)
        graph = prune(TDAG(inputs, self.weights, self.nodes, outputs))
        self.check(graph)
        return graph, [self.state.get(n) for n in self.graph.outputs]

    def visit(self, node: Node, states) -> object:
        """Rewrite one node; its output's state."""
        if all(s is None for s in states):
            return self.free(node)
        return self.rewrite(node, states)

    def free(self, node: Node) -> object:
        """A node none of whose inputs depends on the batch: copied as it is."""
        self.emit(node, node.op, node.spec, [self.env[n] for n in node.inputs], node.name)
        return None

    def emit(self, origin: Node, op: Op, spec, inputs, name: str | None = None) -> str:
        """Append a node (typed by its op's shape rule) and return its name."""
        name = name if name is not None else self.names.fresh(f"{origin.name}_b")
        node = typed_node(op, spec, inputs, tuple(self.types[n] for n in inputs), name=name,
                          origin=origin.origin, cache=self.shape_cache,
                          refused=lambda why: self.error(origin, f"cannot be rewritten: {why}"))
        self.nodes.append(node)
        self.types[name] = node.type
        return name

    def emit_steps(self, origin: Node, steps, inputs, name: str | None) -> str:
        """Emit a rule's steps (``tdag.ir.batching``) on ``inputs``, the last node named
        ``name``; return the result (the first input where there are no steps)."""
        x = inputs[0] if inputs else None
        for k, (op, spec) in enumerate(steps):
            x = self.emit(origin, op, spec, inputs if k == 0 else [x],
                          name if k == len(steps) - 1 else None)
        return x

    def rewrite(self, node: Node, states) -> object:
        """A node with a batched operand: by the kind of its op's batch rule, never the op."""
        rule = record(node.op).batch
        if isinstance(rule, AxisRule):
            return self.one_input(node, rule, states[0])
        if isinstance(rule, Aligned):
            return self.aligned(node, rule, states)
        if isinstance(rule, OperandRule):
            return self.operands(node, rule, states)
        if isinstance(rule, Refuse):
            raise self.error(node, f"is refused: it {rule.mixing}")
        raise self.error(node, "has no batch rule")

    def error(self, node: Node, reason: str) -> BatchError:
        return BatchError(f"{self.pass_name}: {node.op.value} {reason}", node=node.name,
                          origin=node.origin)

    def mixes(self, node: Node, how: str) -> BatchError:
        return self.error(node, f"mixes samples: it {how}")

    def check(self, graph: TDAG) -> None:
        pass


# -- states -----------------------------------------------------------------------------------

def is_broadcast(state) -> bool:
    """A free value repeated to the batch size: the same for every sample."""
    return isinstance(state, Batched) and state.broadcast


def describe(state) -> str:
    """Where ``state`` holds the batch, in words (for errors)."""
    if isinstance(state, Folded):
        return f"folded into axis {state.axis} with {format_dim(state.inner)} after it"
    return f"axis {state.axis}"


def fits(state, target) -> bool:
    """An operand in ``state`` can be used as it is next to ``target``."""
    return state == target or (is_broadcast(state) and isinstance(target, Batched)
                               and state.axis == target.axis)


def layout(state):
    """Where a value holds the batch, whether or not it is a broadcast."""
    return replace(state, broadcast=False) if isinstance(state, Batched) else state


__all__ = ["BatchError", "Rewriter", "describe", "fits", "is_broadcast", "layout"]
