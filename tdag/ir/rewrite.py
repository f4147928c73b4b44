"""The rewrite engine of refine (simplify) and lower: rules are data, indexed by root op.

A rule is ``Rule(op, fn)``: ``fn(node, ctx)`` is only ever called on nodes of ``op`` (a rule
for several ops is listed once per op), and every rule answers in one of three typed ways:

- ``Replace(nodes)``: ``nodes`` replace ``node``; the last takes its name and type (built
  with ``ctx.emitter(node)``, or ``node.replace(...)`` for a one-node rewrite);
- ``Alias(name)``: ``node`` equals the existing value ``name``; later readers and the graph's
  outputs read ``name`` instead (taken only where the types agree, else a non-match);
- ``NoMatch(reason)``: the rule does not apply, and ``reason`` says why in a few words.

Anything else (None, a bare string, a Node) raises ``RuleError`` at once: a rule written for
another convention must fail loudly, not become a silent no-op.

Rules are listed as data, one line each with the pattern it rewrites:
``Rule(Op.permute, _permute_permute),  # permute(permute(x, p), q) -> permute(x, p[q])``.

``rewrite(graph, rules)`` sweeps the nodes once, forward. Rules see the graph as rewritten so
far (inputs already renamed through aliases, producers already replaced), so one sweep
collapses a chain. ``RuleSet(rules, budget)`` says how often one node is rewritten in place:
simplify re-applies its rules to the replacement (up to a budget), lowering stops at the
first rewrite. Nodes a rewrite leaves unread stay; the caller prunes.

Reasons cost nothing in a normal run: they are kept only inside ``explaining(trace)``, where
the engine records, per node, every rule that looked at it and its reason or what the node
became (``tdag.lower.explain`` is built on it).
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol, Union

from tdag.errors import InvalidModelError, TdagError
from tdag.ir.emit import typed_node
from tdag.ir.graph import TDAG, Node, Weight
from tdag.ir.names import FreshNames
from tdag.ir.op import Op
from tdag.ir.types import TensorType

# -- what a rule returns ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Replace:
    """New nodes for the rule's node; the last one has its name and type."""

    nodes: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alias:
    """The rule's node equals the existing value ``name``."""

    name: str


@dataclass(frozen=True, slots=True)
class NoMatch:
    """The rule does not apply to this node, and why."""

    reason: str


Rewrite = Union[Replace, Alias]
Result = Union[Replace, Alias, NoMatch]


class RuleError(TdagError, TypeError):
    """A rule broke the engine's contract (a wrong return type, a replacement that renames
    or retypes its node): a bug in the rule."""


@dataclass(frozen=True)
class Rule:
    """A rewrite rule for nodes of ``op``."""

    op: Op
    fn: Callable[[Node, "Context"], Result]

    @property
    def name(self) -> str:
        return self.fn.__name__


class RuleSet:
    """Rules indexed by root op (in their listed order), and how many rewrites in place one
    node may take in a sweep (1: the first rule that fires wins)."""

    def __init__(self, rules: Iterable[Rule], budget: int = 1):
        self.rules = tuple(rules)
        self.budget = budget
        by_op: dict[Op, list[Rule]] = {}
        for rule in self.rules:
            if not isinstance(rule, Rule):
                raise RuleError(f"a rule set takes Rule(op, fn), got {rule!r}")
            by_op.setdefault(rule.op, []).append(rule)
        self.by_op: dict[Op, tuple[Rule, ...]] = {op: tuple(rs) for op, rs in by_op.items()}


# -- what a rule may ask ----------------------------------------------------------------------

class Constants(Protocol):
    """Constant values known as the sweep goes (``tdag.refine.constants.Constants``)."""

    def add(self, node: Node) -> None: ...

    def scalar(self, name: str) -> float | None: ...


class Context:
    """The graph being rewritten, as rewritten so far: producers, types, uses, readers,
    constants (when the caller tracks them), fresh names and an emitter of typed nodes."""

    def __init__(self, graph: TDAG, consts: Constants | None = None):
        self.graph = graph
        self.types: dict[str, TensorType] = graph.types()
        self.producers: dict[str, Node] = {n.name: n for n in graph.nodes}
        self.consts = consts
        # built on first use: simplify never asks, and must stay cheap per node
        self._uses: dict[str, int] | None = None
        self._new: list[Node] = []  # nodes recorded before uses were first counted
        self._readers: dict[str, list[Node]] | None = None
        self._names: FreshNames | None = None
        self._kinds: set[tuple] | None = None  # (op, spec, dtype) of every node, on first ask
        self._ops: set[Op] | None = None  # the ops of those kinds

    def producer(self, name: str) -> Node | None:
        """The node computing ``name``; None for inputs and weights."""
        return self.producers.get(name)

    def made(self, name: str, op: Op) -> Node | None:
        """The node computing ``name`` if its op is ``op``."""
        node = self.producers.get(name)
        return node if node is not None and node.op is op else None

    def op(self, name: str) -> Op | None:
        node = self.producers.get(name)
        return node.op if node is not None else None

    def weight(self, name: str) -> Weight | None:
        return self.graph.weights.get(name)

    def type(self, name: str) -> TensorType:
        return self.types[name]

    def readers(self, name: str) -> list[Node]:
        """The nodes that read ``name`` in the graph as it was when the sweep began."""
        if self._readers is None:
            self._readers = self.graph.users()
        return self._readers.get(name, [])

    def single_use(self, name: str) -> bool:
        """Whether ``name`` feeds exactly one node and is not a graph output (counting the
        nodes of the original graph and every node a rewrite made since)."""
        if self._uses is None:
            self._uses = _count_uses(self.graph, self._new)
        return self._uses.get(name, 0) == 1

    def has_kinds(self, kinds: frozenset) -> bool:
        """Whether every ``(op, spec, dtype)`` of ``kinds`` is some node's of the graph as
        rewritten so far (nodes since replaced still count): a cheap necessary condition for
        a template of such nodes to match anywhere, so a rule skips its search where it fails."""
        return kinds <= self._known_kinds()

    def has_ops(self, ops: frozenset) -> bool:
        """Whether every op of ``ops`` is some node's of the graph as rewritten so far: as
        ``has_kinds``, for a check that need not know the specs and dtypes."""
        if self._ops is None:
            self._ops = {kind[0] for kind in self._known_kinds()}
        return ops <= self._ops

    def _known_kinds(self) -> set[tuple]:
        if self._kinds is None:
            self._kinds = {node_kind(n) for n in self.producers.values()}
        return self._kinds

    def saw(self, node: Node) -> None:
        """``node`` is in the graph now: its kind counts for ``has_kinds`` and ``has_ops``."""
        if self._kinds is not None:
            self._kinds.add(node_kind(node))
        if self._ops is not None:
            self._ops.add(node.op)

    def fresh(self, hint: str) -> str:
        """A new name ``<hint>_l<n>``, one counter for the sweep."""
        if self._names is None:
            self._names = FreshNames(self.types, pattern="{hint}_l{n}")
        return self._names.fresh(hint)

    def emitter(self, root: Node) -> "Emitter":
        return Emitter(self, root)

    def keep(self, node: Node) -> None:
        """``node`` stays (its inputs perhaps renamed)."""
        self.producers[node.name] = node
        if self.consts is not None:
            self.consts.add(node)

    def record(self, node: Node) -> None:
        """``node`` is new: a rewrite made it."""
        self.types[node.name] = node.type
        self.producers[node.name] = node
        self.saw(node)
        if self._uses is None:
            self._new.append(node)
        else:
            for name in node.inputs:
                self._uses[name] = self._uses.get(name, 0) + 1
        if self.consts is not None:
            self.consts.add(node)


def node_kind(node: Node) -> tuple:
    """What a template node must share with the graph node it matches, exactly: op, spec
    and dtype (shapes compare up to symbolic algebra, so they are left out)."""
    return node.op, node.spec, node.type.dtype


def _count_uses(graph: TDAG, new: list[Node]) -> dict[str, int]:
    uses: dict[str, int] = {}
    for nodes in (graph.nodes, new):
        for node in nodes:
            for name in node.inputs:
                uses[name] = uses.get(name, 0) + 1
    for name in graph.outputs:
        uses[name] = uses.get(name, 0) + 1
    return uses


class Emitter:
    """Builds the replacement of ``root``: ``e(op, spec, *inputs)`` returns the new name,
    typed by the op record's shape rule."""

    def __init__(self, ctx: Context, root: Node):
        self.ctx, self.root, self.nodes = ctx, root, []

    def __call__(self, op: Op, spec, *inputs: str) -> str:
        root = self.root

        def refused(reason: str) -> InvalidModelError:  # a bug in the rule
            return InvalidModelError(f"a rewrite built a bad {op.value}: {reason}",
                                     node=root.name, origin=root.origin)

        node = typed_node(op, spec, inputs, [self.ctx.type(n) for n in inputs],
                          name=self.ctx.fresh(root.name), origin=root.origin, refused=refused)
        self.nodes.append(node)
        self.ctx.types[node.name] = node.type
        return node.name

    def finish(self, value: str) -> Rewrite:
        """The replacement nodes up to ``value``, renamed to the root's name; an Alias when
        ``value`` existed before (the rewrite found an identity)."""
        if not self.ctx.type(value).same_as(self.root.type):
            raise InvalidModelError(f"a rewrite changed the type of %{self.root.name} from "
                                    f"{self.root.type} to {self.ctx.type(value)}",
                                    node=self.root.name, origin=self.root.origin)
        names = [n.name for n in self.nodes]
        if value not in names:
            return Alias(value)
        nodes = self.nodes[:names.index(value) + 1]
        rename = {value: self.root.name}
        return Replace(tuple(n.replace(name=rename.get(n.name, n.name),
                                       inputs=tuple(rename.get(i, i) for i in n.inputs))
                             for n in nodes))


# -- the sweep --------------------------------------------------------------------------------

def rewrite(graph: TDAG, rules: RuleSet, ctx: Context | None = None) -> tuple[TDAG, bool]:
    """One forward sweep of ``rules`` over ``graph``: (new graph, whether it changed)."""
    ctx = Context(graph) if ctx is None else ctx
    trace = _TRACE.get()
    by_op, budget = rules.by_op, rules.budget
    alias: dict[str, str] = {}
    out: list[Node] = []
    changed = False
    for node in graph.nodes:
        if alias and not alias.keys().isdisjoint(node.inputs):
            node = node.replace(inputs=tuple(alias.get(i, i) for i in node.inputs))
        found = by_op.get(node.op)
        if found is None:
            ctx.keep(node)
            out.append(node)
            continue
        ctx.producers[node.name] = node  # rules may look at the node itself
        watch = trace if trace is not None and trace.wants(node.name) else None
        result = _apply(node, found, by_op, ctx, budget, out, watch)
        if result is node:
            ctx.keep(node)
            out.append(node)
        elif type(result) is Alias:
            alias[node.name] = result.name
            changed = True
        else:
            changed = True
            ctx.record(result)
            out.append(result)
    if not changed:
        return graph, False
    outputs = tuple(alias.get(name, name) for name in graph.outputs)
    return graph.replace(nodes=tuple(out), outputs=outputs), True


def _apply(node: Node, rules: tuple[Rule, ...], by_op: dict[Op, tuple[Rule, ...]],
           ctx: Context, budget: int, out: list[Node], trace: "Trace | None") -> Node | Alias:
    """``node`` after up to ``budget`` rewrites in place, or the Alias it reduces to; a
    replacement is rewritten by the rules of its own op. Nodes a replacement puts before the
    node go to ``out`` (and into ``ctx``)."""
    for _ in range(budget):
        for rule in rules:
            result = rule.fn(node, ctx)
            kind = type(result)
            if kind is NoMatch:
                if trace is not None:
                    trace.look(node, rule, False, result.reason)
            elif kind is Alias:
                if ctx.types[result.name].same_as(node.type):
                    if trace is not None:
                        trace.look(node, rule, True, f"%{result.name}", gone=True)
                    return result
                if trace is not None:  # x * 1 broadcasting x is not x
                    trace.look(node, rule, False, f"%{result.name} has another type")
            elif kind is Replace:
                if trace is not None:
                    trace.look(node, rule, True, _became(result))
                node = _replaced(node, result, rule, ctx, out)
                rules = by_op.get(node.op, ())
                break
            else:
                raise RuleError(f"rule {rule.name} for {rule.op.value} returned {result!r}: "
                                "a rule returns Replace, Alias or NoMatch", node=node.name)
        else:
            return node
    return node


def _replaced(node: Node, result: Replace, rule: Rule, ctx: Context, out: list[Node]) -> Node:
    """The last node of ``result``, after checking it stands for ``node``; the others are
    recorded and emitted before it."""
    *before, last = result.nodes
    if last.name != node.name or not last.type.same_as(node.type):
        raise RuleError(f"rule {rule.name} replaced %{node.name}: {node.type} by "
                        f"%{last.name}: {last.type}", node=node.name)
    for new in before:
        ctx.record(new)
        out.append(new)
    ctx.producers[last.name] = last  # the rules of the next round may look at it
    ctx.saw(last)
    return last


def _became(result: Replace) -> str:
    return " then ".join(f"{n.op.value}" for n in result.nodes)


# -- explain mode -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Look:
    """One rule looking at one node: where (the pass path), what it said or made."""

    where: tuple[tuple[str, int], ...]  # (pass name, round) from the outermost pass manager
    graph: str
    node: str
    op: Op | None                       # the node's op when the rule looked
    rule: str
    fired: bool
    outcome: str                        # the reason it did not fire, or what the node became


@dataclass
class Trace:
    """What the rules said while ``explaining(trace)`` is active: every Look, or only those
    at the node ``focus`` = (graph, node) when given."""

    focus: tuple[str, str] | None = None
    looks: list[Look] = field(default_factory=list)
    where: list[tuple[str, int]] = field(default_factory=list)
    graph: str = "main"
    gone: bool = False

    def wants(self, node: str) -> bool:
        return self.focus is None or self.focus == (self.graph, node)

    def look(self, node: Node, rule: Rule, fired: bool, outcome: str, gone: bool = False):
        self.looks.append(Look(tuple(self.where), self.graph, node.name, node.op, rule.name,
                               fired, outcome))
        self.gone |= gone

    def by_node(self) -> dict[tuple[str, str], list[Look]]:
        """The looks per (graph, node)."""
        table: dict[tuple[str, str], list[Look]] = {}
        for look in self.looks:
            table.setdefault((look.graph, look.node), []).append(look)
        return table

    @contextlib.contextmanager
    def within(self, name: str, round_: int) -> Iterator[None]:
        """Inside pass ``name`` of round ``round_`` (pass managers nest)."""
        self.where.append((name, round_))
        try:
            yield
        finally:
            self.where.pop()

    def after_pass(self, graphs: dict[str, TDAG]) -> None:
        """Note once when the focus node leaves the program (dead after a rewrite of its
        readers, or merged into another node)."""
        if self.focus is None or self.gone or self.focus[0] not in graphs:
            return
        graph, name = self.focus
        if all(n.name != name for n in graphs[graph].nodes):
            self.gone = True
            self.looks.append(Look(tuple(self.where), graph, name, None, "", True,
                                   "left the program here (unread now, or merged into a reader)"))


_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("tdag_trace",
                                                                      default=None)


def current_trace() -> Trace | None:
    """The active trace, or None in a normal run."""
    return _TRACE.get()


@contextlib.contextmanager
def explaining(trace: Trace) -> Iterator[Trace]:
    """Run rewrites in explain mode: every sweep records into ``trace``."""
    token = _TRACE.set(trace)
    try:
        yield trace
    finally:
        _TRACE.reset(token)


__all__ = ["Alias", "Context", "Emitter", "Look", "NoMatch", "Replace", "Result", "Rewrite",
           "Rule", "RuleError", "RuleSet", "Trace", "current_trace", "explaining", "node_kind",
           "rewrite"]
