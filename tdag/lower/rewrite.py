"""Rewriting TDAGs: a rule looks at one node and may return the nodes that replace it.

A rule is ``rule(node, ctx) -> list[Node] | str | None``: the new nodes (built with
``ctx.emitter(node)``), whose last value takes the node's name, or a reason (a string) or
None when it does not match. Rules see the graph as rewritten so far in this sweep (producers
of earlier nodes are already replaced), so one sweep can chain rewrites. Dead nodes left
behind are removed at the end of the sweep.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tdag.ir.record import REGISTRY
from tdag.ir.record import NoSpec
from tdag.errors import InvalidModelError, ShapeError
from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.types import TensorType
from tdag.refine.dataflow import prune

Rule = Callable[[Node, "Context"], "list[Node] | Alias | str | None"]


class Alias(str):
    """A rule's answer when the node's value already exists under another name: later
    readers (and the graph's outputs) read that name instead."""


class Context:
    """What a rule may ask about the graph being rewritten."""

    def __init__(self, graph: TDAG):
        self.graph = graph
        self.types: dict[str, TensorType] = graph.types()
        self.producers: dict[str, Node] = {n.name: n for n in graph.nodes}
        self.uses: dict[str, int] = {}
        for node in graph.nodes:
            for name in node.inputs:
                self.uses[name] = self.uses.get(name, 0) + 1
        for name in graph.outputs:
            self.uses[name] = self.uses.get(name, 0) + 1
        self._taken = set(self.types)
        self._counter = 0
        self._readers = None

    def producer(self, name: str) -> Node | None:
        """The node computing ``name``; None for inputs and weights."""
        return self.producers.get(name)

    def op(self, name: str) -> Op | None:
        node = self.producers.get(name)
        return node.op if node is not None else None

    def weight(self, name: str):
        return self.graph.weights.get(name)

    def type(self, name: str) -> TensorType:
        return self.types[name]

    def readers(self, name: str) -> list[Node]:
        """The nodes that read ``name`` in the graph as it was when the sweep began."""
        if self._readers is None:
            self._readers = self.graph.users()
        return self._readers.get(name, [])

    def single_use(self, name: str) -> bool:
        """Whether ``name`` feeds exactly one node and is not a graph output."""
        return self.uses.get(name, 0) == 1

    def fresh(self, hint: str) -> str:
        while True:
            name = f"{hint}_l{self._counter}"
            self._counter += 1
            if name not in self._taken:
                self._taken.add(name)
                return name

    def emitter(self, root: Node) -> "Emitter":
        return Emitter(self, root)

    def record(self, node: Node) -> None:
        self.types[node.name] = node.type
        self.producers[node.name] = node
        for name in node.inputs:
            self.uses[name] = self.uses.get(name, 0) + 1


class Emitter:
    """Builds the replacement of ``root``: ``e(op, spec, *inputs)`` returns the new name."""

    def __init__(self, ctx: Context, root: Node):
        self.ctx, self.root, self.nodes = ctx, root, []

    def __call__(self, op: Op, spec, *inputs: str) -> str:
        prim = REGISTRY[op]
        spec = NoSpec() if spec is None else spec
        in_types = [self.ctx.type(n) for n in inputs]
        try:
            out = prim.shape(spec, in_types)
        except ShapeError as exc:  # a rule built something ill-typed: a bug in the rule
            raise InvalidModelError(f"lowering built a bad {op.value}: {exc.args[0]}",
                                    node=self.root.name, origin=self.root.origin) from None
        node = Node(self.ctx.fresh(self.root.name), op, tuple(inputs), spec, out,
                    self.root.origin)
        self.nodes.append(node)
        self.ctx.types[node.name] = out
        return node.name

    def finish(self, value: str) -> "list[Node] | Alias":
        """The replacement nodes up to ``value``, renamed to the root's name; an Alias when
        ``value`` existed before (the rewrite found an identity)."""
        if not self.ctx.type(value).same_as(self.root.type):
            raise InvalidModelError(f"lowering changed the type of %{self.root.name} from "
                                    f"{self.root.type} to {self.ctx.type(value)}",
                                    node=self.root.name, origin=self.root.origin)
        names = [n.name for n in self.nodes]
        if value not in names:
            return Alias(value)
        nodes = self.nodes[:names.index(value) + 1]
        rename = {value: self.root.name}
        return [n.replace(name=rename.get(n.name, n.name),
                          inputs=tuple(rename.get(i, i) for i in n.inputs)) for n in nodes]


def rewrite_tdag(graph: TDAG, rules: Sequence[Rule]) -> tuple[TDAG, bool]:
    """One sweep of ``rules`` over ``graph`` in order; returns (new graph, changed)."""
    ctx = Context(graph)
    nodes: list[Node] = []
    alias: dict[str, str] = {}
    changed = False
    for node in graph.nodes:
        if any(i in alias for i in node.inputs):
            node = node.replace(inputs=tuple(alias.get(i, i) for i in node.inputs))
            ctx.producers[node.name] = node
        result = None
        for rule in rules:
            result = rule(node, ctx)
            if isinstance(result, (list, Alias)):
                break
        if isinstance(result, Alias):
            alias[node.name] = str(result)
            changed = True
        elif isinstance(result, list):
            changed = True
            for new in result:
                ctx.record(new)
            nodes.extend(result)
        else:
            nodes.append(node)
    if not changed:
        return graph, False
    outputs = tuple(alias.get(name, name) for name in graph.outputs)
    return graph.replace(nodes=tuple(nodes), outputs=outputs), True


def on_tdags(fn: Callable[[TDAG], tuple[TDAG, bool]]):
    """Lift a TDAG transformation to a pass over every TDAG of a Program."""
    def run(prog: Program) -> tuple[Program, bool]:
        changed = False
        graphs = {}
        for name, graph in prog.graphs.items():
            graphs[name], did = fn(graph)
            changed |= did
        return (prog.replace(graphs=graphs) if changed else prog), changed
    run.__name__ = getattr(fn, "__name__", "pass")
    return run


def rule_pass(*rules: Rule):
    """A pass that sweeps ``rules`` over every TDAG, then drops dead nodes."""
    def sweep(graph: TDAG) -> tuple[TDAG, bool]:
        graph, changed = rewrite_tdag(graph, rules)
        if changed:
            graph = prune(graph)  # every op is pure: unread nodes and consts go
        return graph, changed
    return on_tdags(sweep)
