"""Stacked capture: the Program of a model with N repeated layers, in time independent of N.

torch.export's time grows with the depth of the model; a 7B Llama's 32 layers take seconds
to trace, each the same ops on other weights. ``from_torch_stacked`` exports a *probe*, the
same architecture built with one layer, converts it, and repeats the layer's nodes N times,
as torch.compile's regional compilation traces a repeated block once; then it checks the
repeat against a probe built with two layers (below). The result is the program
``from_torch`` gives for the full model: the same nodes in the same order with the same
names, the same weights and state; the weights' values come from the full model.

How the repeat is exact:

- the layer is the block of nodes the converter emitted for the ATen ops in scope
  ``<layers>.0``; copy k reads copy k-1's output where copy 0 read the hidden state from
  before the stack; every other value from outside (rotary cos/sin, masks, positions) is
  shared, as the full model computes it once;
- weights ``<layers>.0.*`` become ``<layers>.k.*``; buffers the layer reads or writes (a
  static cache's ``key_cache_0``) become each layer's own (``key_cache_k``); a write into
  one of them made before the stack (transformers' static cache resets each layer's
  ``cumulative_length`` from ``cache_position[0]`` before the model runs) is repeated per
  layer with the ops that compute the written value and feed nothing else, as the full
  model's loop over its cache layers does;
- node names: the converter names nodes by one counter (``%0``, ``%c1`` ...); the probe's
  conversion is recorded (which ops named what, which constants are the scalars the
  builder shares), and the counter is replayed for N copies of the layer, so every node
  gets the name the full conversion gives it.

Before it trusts the probe, it checks the model (``layers.py``): every layer of the full
ModuleList equals the probe's layer but for its index, and the stacked program's weights
and state are the full model's, with their shapes and dtypes. A probe whose layer is not
one block with one hidden-state input and output is refused, never stacked otherwise.

What one layer cannot show is which code outside the layer the loop runs per layer: code
before or after each layer (``x = layer(f(x))``, ``x = relu(layer(x))``) looks like code
before or after the loop, a
value computed once and written into every layer's buffer like a per-layer write, a
constant that counts the layers like any constant. So the one-layer program stacked to two
layers must equal (``==``, and the constants' values) the two-layer probe's own program, or
the model is refused, the first node where they part named. Why two suffice, by induction:
the forward is the code before the loop, the loop's body once per layer, the code after;
every layer is the probe's but for its index. The two-layer export shows what the body runs
besides layer 1 (between layers 0 and 1) and what runs once: its equality with the stack
says the body is the layer alone and the rest runs as the stack repeats it. So adding a
layer adds its nodes alone, from N layers to N+1 as from one to two, and the stack to N is
the N-layer export. What the induction assumes and nothing checks: a body that runs other
code only at some index past the second (``if i % 4 == 3``); transformers' decoder loops
hand each layer the one before's output.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.export.graph_signature import OutputKind

from tdag.canonicalize.torch.aten.registry import is_inplace
from tdag.canonicalize.torch.control import has_control_flow
from tdag.canonicalize.torch.converter import Converter
from tdag.canonicalize.torch.export import convert, converting, exported, program_of
from tdag.canonicalize.torch.inplace import alias_root, buffer_placeholders
from tdag.canonicalize.torch.layers import (
                                            check_state_names,
                                            check_two_layers,
                                            full_tensors,
                                            layer_count,
                                            per_layer_names,
                                            probe_layer,
                                            transient_buffers,
                                            weight_of,
)
from tdag.errors import ConversionError, InvalidModelError
from tdag.ir.graph import TDAG, Node, Value, Weight
from tdag.ir.names import FreshNames
from tdag.ir.program import Program
from tdag.ir.record import Trait, has
from tdag.ir.types import TensorKind
from tdag.ops.builder import Builder

_PATTERN = "{hint}{n}"  # the converter's Builder names nodes so (no prefix)
_COPY = torch.ops.aten.copy.default  # ``buffer.copy_(x)`` once functionalized


def from_torch_stacked(full: torch.nn.Module, probe: Callable[[int], torch.nn.Module],
                       example_args=(), example_kwargs=None, *, layers: str = "model.layers",
                       dynamic_batch: bool = False, dynamic_shapes=None) -> Program:
    """``tdag.from_torch(full, example_args, ...)``, captured from ``probe(1)`` and checked
    against ``probe(2)``: ``probe(k)`` builds the same architecture with ``k`` layers in the
    ModuleList at ``layers`` (for Hugging Face, ``lambda k: build(num_hidden_layers=k)``).
    ``full`` may be on the meta device; its weights are the program's, the probes' are not
    read.

    Refused with an ``InvalidModelError`` naming the layer and attribute: a full model
    whose layers differ from the probe's but for their index; with a ``ConversionError``: a
    probe whose layer's nodes are not one block with one hidden-state input and output, and
    a model whose one-layer program stacked to two layers is not ``probe(2)``'s (the first
    node where they part named).

    >>> import torch, tdag
    >>> class Net(torch.nn.Module):
    ...     def __init__(self, depth):
    ...         super().__init__()
    ...         self.layers = torch.nn.ModuleList(
    ...             torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    ...             for _ in range(depth))
    ...         self.head = torch.nn.Linear(4, 1)
    ...     def forward(self, x):
    ...         for layer in self.layers:
    ...             x = layer(x)
    ...         return self.head(x)
    >>> x = torch.randn(2, 4)
    >>> prog = tdag.from_torch_stacked(Net(3), Net, (x,), layers="layers")
    >>> prog == tdag.from_torch(Net(3), (x,))
    True
    >>> [name for name in prog.graph.weights if name.startswith("layers.2")]
    ['layers.2.0.weight', 'layers.2.0.bias']
    """
    if not isinstance(full, torch.nn.Module):
        raise InvalidModelError("from_torch_stacked takes the full model as an nn.Module, not "
                                f"{type(full).__name__}")
    capture = Probe(probe, layers, example_args, example_kwargs, dynamic_batch, dynamic_shapes)
    one = capture.record(full)
    prog = one.stacked(full)
    capture.check(one)
    return prog


@dataclass(frozen=True)
class Probe:
    """The model at a layer count (``build(k)``) and how ``from_torch`` exports it. The three
    steps of ``from_torch_stacked``: ``record`` the one-layer probe's conversion, stack it
    (``Recorded.stacked``), ``check`` it against the two-layer probe."""

    build: Callable[[int], torch.nn.Module]
    layers: str = "model.layers"
    args: tuple = ()
    kwargs: dict | None = None
    dynamic_batch: bool = False
    dynamic_shapes: object = None

    def __post_init__(self):
        if isinstance(self.build, torch.nn.Module) or not callable(self.build):
            raise InvalidModelError("the probe builds the model at a layer count: a function "
                                    "k -> nn.Module (lambda k: build(num_hidden_layers=k)), "
                                    f"not a {type(self.build).__name__}")

    def model(self, count: int) -> tuple[torch.nn.Module, torch.nn.Module]:
        """``build(count)``, checked to hold ``count`` layers, and its first layer."""
        model = self.build(count)
        return model, probe_layer(model, self.layers, count)

    def export(self, model: torch.nn.Module):
        ep, names = exported(model, self.args, self.kwargs, self.dynamic_batch,
                             self.dynamic_shapes)
        if has_control_flow(ep):
            raise ConversionError("stacked capture takes a straight-line program; this one "
                                  "has torch.cond or while_loop")
        return ep, names

    def record(self, full: torch.nn.Module) -> "Recorded":
        """The one-layer probe's conversion, recorded to be stacked; ``full``'s layers are
        checked against the probe's first, so that a refusal costs no export."""
        model, layer = self.model(1)
        layer_count(full, layer, self.layers)
        ep, names = self.export(model)
        with converting():
            converter = _Recording(ep, names, buffer_placeholders(ep))
            with converter.builder.active():
                converter.run()
        return Recorded(converter, layer, self.layers)

    def check(self, one: "Recorded") -> None:
        """``one`` stacked to two layers is the two-layer probe's program, or a
        ConversionError: the induction step that makes the stack to N exact (module
        docstring)."""
        model, _ = self.model(2)
        stacked = one.stacked(model)
        ep, names = self.export(model)
        with converting():
            check_two_layers(stacked, convert(ep, names))


@dataclass(frozen=True)
class Recorded:
    """The one-layer probe's conversion and its layer, ready to stack to any depth."""

    converter: "_Recording"
    layer: torch.nn.Module
    layers: str

    def stacked(self, full: torch.nn.Module) -> Program:
        """The program of ``full`` (its layers checked equal to the probe's): the probe's
        layer repeated once per layer of ``full``, the weights and state ``full``'s."""
        count = layer_count(full, self.layer, self.layers)
        tensors, conv = full_tensors(full), self.converter
        with converting():
            stack = _Stack.of(conv, self.layers, count, tensors, transient_buffers(full))
            graph, state, written = stack.build(conv.graph, conv.state, conv.state_outputs,
                                                tensors)
            prog = program_of(graph, state, written, conv.output_fields)
        check_state_names(prog, full)
        return prog


# -- recording the probe's conversion -------------------------------------------------------------

@dataclass
class _Log:
    """What the probe's conversion named: each name the counter gave, in order, with its
    hint; which of them are scalar constants the builder shares (later copies of the layer
    reuse them, and the counter skips them); the names each ATen node's conversion gave."""

    mints: list[tuple[str, str]] = field(default_factory=list)   # (hint, name)
    shared: set[int] = field(default_factory=set)                # indices into mints
    spans: list[tuple[object, str, int, int]] = field(default_factory=list)


class _LoggedNames(FreshNames):
    def __init__(self, log: _Log):
        super().__init__(pattern=_PATTERN)
        self.log = log

    def fresh(self, hint: str = "", *, avoid=(), take: bool = True) -> str:
        name = super().fresh(hint, avoid=avoid, take=take)
        self.log.mints.append((hint, name))
        return name

    __call__ = fresh


class _LoggedBuilder(Builder):
    def __init__(self, log: _Log):
        super().__init__()
        self.names = _LoggedNames(log)
        self.log = log

    def const(self, value, dtype=None):
        before = len(self.log.mints)
        result = super().const(value, dtype)
        if not isinstance(value, torch.Tensor) and len(self.log.mints) > before:
            self.log.shared.add(before)  # a Python scalar: the builder shares it by value
        return result


class _Recording(Converter):
    """The converter, recording the names each ATen node's conversion gave."""

    def __init__(self, ep, names, writable):
        super().__init__(ep, names, writable)
        self.log = _Log()
        self.builder = _LoggedBuilder(self.log)

    def _call(self, node) -> None:
        start = len(self.log.mints)
        super()._call(node)
        self.log.spans.append((node, self._origin(node).scope, start, len(self.log.mints)))

    def scope_of(self, node) -> str:
        return self._origin(node).scope or "the top level"


# -- the plan: which names repeat, and how ---------------------------------------------------------

@dataclass(frozen=True)
class _Run:
    """A block of the probe's names (indices ``start`` to ``end`` into the log) that the
    full model's conversion makes once per layer: the layer, or the writes before the stack
    into the layer's buffers."""

    start: int
    end: int
    in_layer: bool

    def __contains__(self, index: int) -> bool:
        return self.start <= index < self.end


@dataclass
class _Stack:
    layers: str
    count: int
    runs: list[_Run]
    index: dict[str, int]            # minted name -> its place in the log
    names: dict[tuple, str]          # (index, copy or None) -> the full conversion's name
    shared: set[int]                 # the scalar constants the builder shares
    hidden_in: str
    hidden_out: str
    state_names: dict[str, list[str]]  # the layer's buffers -> each layer's own
    transient: frozenset[str]        # the full model's non-persistent buffers: consts
    # buffers written in place -> where the full conversion first writes them (its written
    # state comes in that order; functionalized writes come first, in input order)
    first_writes: dict[str, tuple[int, int]] = field(default_factory=dict)

    @staticmethod
    def of(conv: _Recording, layers: str, count: int, tensors: dict,
           transient: frozenset[str]) -> "_Stack":
        scope = f"{layers}.0"
        mine = {node for node, where, _, _ in conv.log.spans if _under(where, scope)}
        if not mine:
            raise ConversionError(f"no op of the probe's program is in scope {scope}: is "
                                  f"{layers!r} the path of the repeated layers?")
        graph, log = conv.graph, conv.log
        index = {name: i for i, (_, name) in enumerate(log.mints)}
        _refuse_fresh_sizes(graph)
        layer = _run_of(log, mine, True, f"the ops of {scope}")
        touched = _layer_state(graph, conv, index, layer)
        before = _writes_before(conv, mine, touched, scope)
        runs = ([_run_of(log, before, False, f"the writes into {scope}'s buffers")]
                if before else []) + [layer]
        if len(runs) == 2 and runs[0].end > layer.start:
            raise ConversionError(f"the writes into {scope}'s buffers come after its ops")
        _refuse_outside_reads(graph, index, layer, scope, transient)
        hidden_in, hidden_out = _hidden(graph, conv, index, layer, touched, scope)
        state_names = {s: per_layer_names(s, layers, count, tensors) for s in touched}
        if _replay(log, runs, 1, _claimed(graph, index)) != \
                {(i, 0 if _find(runs, i) else None): n for i, (_, n) in enumerate(log.mints)}:
            raise ConversionError("the probe's node names cannot be replayed (a name hint "
                                  "collides): stacking would misname the full program")
        names = _replay(log, runs, count, _claimed(graph, index))
        return _Stack(layers, count, runs, index, names, log.shared, hidden_in, hidden_out,
                      state_names, transient, _first_writes(conv, mine, before))

    # -- renaming -------------------------------------------------------------------------------

    def run_of(self, name: str) -> _Run | None:
        i = self.index.get(name)
        return None if i is None else _find(self.runs, i)

    def name(self, name: str, copy: int | None) -> str:
        """The full program's name for the probe's ``name`` in layer ``copy``. Outside the
        stack (``copy`` None) a layer's value is layer 0's (its buffers, which the probe's
        model reads as the full one reads layer 0's), but for the hidden state: the last's."""
        i = self.index.get(name)
        if i is not None:
            if _find(self.runs, i) is None:
                return self.names[(i, None)]
            if copy is None:
                copy = self.count - 1 if name == self.hidden_out else 0
            return self.names[(i, copy)]
        if copy is None:
            return name
        prefix = f"{self.layers}.0."
        if name.startswith(prefix):
            return f"{self.layers}.{copy}.{name[len(prefix):]}"
        return self.state_names[name][copy] if name in self.state_names else name

    def node(self, node: Node, copy: int | None) -> Node:
        run = self.run_of(node.name)
        inputs = tuple(self.name(self.hidden_out, copy - 1) if copy and x == self.hidden_in
                       and run is not None and run.in_layer else self.name(x, copy)
                       for x in node.inputs)
        origin = node.origin
        if run is not None and run.in_layer:
            origin = dataclasses.replace(origin, scope=self._scope(origin.scope, copy))
        return node.replace(name=self.name(node.name, copy), inputs=inputs, origin=origin)

    def _scope(self, scope: str, copy: int) -> str:
        return f"{self.layers}.{copy}" + scope[len(f"{self.layers}.0"):]

    # -- building -------------------------------------------------------------------------------

    def build(self, graph: TDAG, state: dict, written: list[str], tensors: dict):
        """The full model's TDAG, state and written state names (what ``program_of`` takes)."""
        nodes = self._repeat(graph.nodes, lambda n: self.run_of(n.name), self.node)
        inputs = self._repeat(graph.inputs, lambda v: v.name in self.state_names,
                              lambda v, k: Value(self.name(v.name, k), v.type))
        weights = self._repeat(list(graph.weights.items()), self._weight_group,
                               lambda item, k: (self.name(item[0], k), item[1]))
        weights = {name: self._valued(name, w, tensors) for name, w in weights}
        n_user = len(graph.outputs) - len(written)
        outputs = [self.name(o, None) for o in graph.outputs[:n_user]]
        pairs = self._written(dict(zip(written, graph.outputs[n_user:])))
        states = self._repeat(list(state.items()), lambda item: item[0] in self.state_names,
                              lambda item, k: (self.name(item[0], k), item[1]))
        new_state = {name: self._state_value(name, w, tensors) for name, w in states}
        return TDAG(inputs, weights, nodes, outputs + [v for _, v in pairs]), new_state, \
            [s for s, _ in pairs]

    def _written(self, values: dict) -> list[tuple[str, str]]:
        """(state name, value) for each buffer written, in the full conversion's order."""
        def pair(name, k):
            return self.name(name, k), self.name(values[name], k)
        functional = [s for s in values if s not in self.first_writes]
        pairs = self._repeat(functional, lambda s: s in self.state_names, pair)
        keyed = [((start, k or 0, at), pair(s, k)) for s, (start, at) in self.first_writes.items()
                 if s in values
                 for k in (range(self.count) if s in self.state_names else [None])]
        return pairs + [p for _, p in sorted(keyed, key=lambda item: item[0])]

    def _repeat(self, items, group_of, copy) -> list:
        """``items`` with each maximal block of the same group (a run, the layer's weights)
        repeated once per layer, layer by layer, as the full model's conversion orders them;
        the others renamed once (``copy(item, None)``)."""
        out, i = [], 0
        while i < len(items):
            group = group_of(items[i])
            if not group:
                out.append(copy(items[i], None))
                i += 1
                continue
            j = i
            while j < len(items) and group_of(items[j]) == group:
                j += 1
            out.extend(copy(item, k) for k in range(self.count) for item in items[i:j])
            i = j
        return out

    def _weight_group(self, item):
        """The layer's weights repeat; so do constants its ops made (a shared scalar does
        not: copies reuse it)."""
        name, weight = item
        if weight.kind is TensorKind.const and name not in self.transient:
            i = self.index.get(name)
            run = None if i is None else _find(self.runs, i)
            return run if run is not None and i not in self.shared else None
        return "layer" if name.startswith(f"{self.layers}.0.") else None

    def _valued(self, name: str, weight: Weight, tensors: dict) -> Weight:
        if weight.kind is TensorKind.const and name not in self.transient:
            return weight
        kind, value = weight_of(name, weight.type, tensors, self.transient)
        return Weight(kind, weight.type, None if value.device.type == "meta" else value)

    def _state_value(self, name: str, weight: Weight, tensors: dict) -> Weight:
        _, value = weight_of(name, weight.type, tensors)
        return Weight(weight.kind, weight.type, value)


# -- finding the layer's parts ---------------------------------------------------------------------

def _under(scope: str, prefix: str) -> bool:
    return scope == prefix or scope.startswith(prefix + ".")


def _find(runs: list[_Run], index: int) -> _Run | None:
    return next((run for run in runs if index in run), None)


def _run_of(log: _Log, nodes: set, in_layer: bool, what: str) -> _Run:
    """The block of names the conversion of ``nodes`` (ATen nodes) gave: one, with no other
    node's names inside it."""
    spans = [(start, end) for node, _, start, end in log.spans if node in nodes and end > start]
    if not spans:
        return _Run(0, 0, in_layer)
    start, end = min(s for s, _ in spans), max(e for _, e in spans)
    for node, where, s, e in log.spans:
        if node not in nodes and e > s and s < end and e > start:
            raise ConversionError(f"{what} are not one block: {node.target} @ "
                                  f"{where or 'the top level'} is converted between them")
    return _Run(start, end, in_layer)


def _refuse_fresh_sizes(graph: TDAG) -> None:
    for node in graph.nodes:
        if has(node.op, Trait.FRESH_SIZE):
            raise ConversionError(f"%{node.name} ({node.origin}) makes a size only data "
                                  "decides: stacked capture does not rename sizes")


def _refuse_outside_reads(graph: TDAG, index: dict, layer: _Run, scope: str,
                          transient: frozenset[str]) -> None:
    """The layer's weights are read by the layer alone, and the layer reads no constant
    that torch lifted (a per-layer one would be named per layer in the full program) but
    for its non-persistent buffers (``transient``), which have its own names."""
    for node in graph.nodes:
        inside = index.get(node.name, -1) in layer
        for x in node.inputs:
            weight = graph.weights.get(x)
            if weight is None:
                continue
            if not inside and x.startswith(scope + "."):
                raise ConversionError(f"%{node.name} ({node.origin}) outside {scope} reads "
                                      f"its weight {x}")
            if inside and weight.kind is TensorKind.const and x not in index \
                    and x not in transient:
                raise ConversionError(f"%{node.name} ({node.origin}) reads the lifted "
                                      f"constant {x}: stacked capture cannot name it per layer")


def _layer_state(graph: TDAG, conv: _Recording, index: dict, layer: _Run) -> list[str]:
    """The state the layer reads or writes, in the program's order."""
    read = {x for n in graph.nodes if index.get(n.name, -1) in layer for x in n.inputs}
    values = dict(zip(conv.state_outputs, graph.outputs[len(graph.outputs) -
                                                         len(conv.state_outputs):]))
    return [s for s in conv.state if s in read or index.get(values.get(s), -1) in layer]


def _writes_before(conv: _Recording, mine: set, touched: list[str], scope: str) -> set:
    """The ATen nodes outside the layer that write into the layer's buffers (``copy_``, in
    place or functionalized), with the nodes that feed only them: each layer has its own in
    the full model. Any other op outside the layer that reads one of its buffers is refused:
    a one-layer probe cannot tell whether the full model runs it for every layer."""
    buffers = {p: t for p, t in buffer_placeholders(conv.ep).items() if t in touched}
    chosen = set()
    for node in conv.ep.graph.nodes:
        if node.op != "call_function" or node in mine:
            continue
        if (_inplace(node) or node.target is _COPY and isinstance(node.args[0], torch.fx.Node))\
                and alias_root(node.args[0]).name in buffers:
            chosen.add(node)
            continue
        read = [a.name for a in node.args if isinstance(a, torch.fx.Node) and a.name in buffers]
        if read:
            raise ConversionError(f"{node.target} @ {conv.scope_of(node)} reads "
                                  f"{buffers[read[0]]}, a buffer of {scope}, outside the "
                                  "layer: a one-layer probe cannot tell whether the full "
                                  "model does so for every layer")
    for node in reversed(list(conv.ep.graph.nodes)):
        if node.op == "call_function" and node not in mine and node.users and \
                all(user in chosen for user in node.users):
            chosen.add(node)
    return chosen


def _inplace(node) -> bool:
    """An ATen op writing into its first argument (``index_copy_``)."""
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and is_inplace(node.target) and bool(node.args) and \
        isinstance(node.args[0], torch.fx.Node)


def _first_writes(conv: _Recording, mine: set, before: set) -> dict[str, tuple[int, int]]:
    """Each buffer written in place -> (where the block of its first write starts, where
    the write is), in the probe's graph: a write in the layer or before it is made once per
    layer in the full model, copies in block order."""
    order = {node: i for i, node in enumerate(conv.ep.graph.nodes)}
    starts = {id(group): min((order[n] for n in group), default=0) for group in (mine, before)}
    functional = {s.target for s in conv.ep.graph_signature.output_specs
                  if s.kind is OutputKind.BUFFER_MUTATION}
    written = {p.name: t for p, t in conv.written_in_place.items() if t not in functional}
    out: dict[str, tuple[int, int]] = {}
    for node in conv.ep.graph.nodes:
        if not _inplace(node):
            continue
        target = written.get(alias_root(node.args[0]).name)
        if target is not None and target not in out:
            group = mine if node in mine else before if node in before else None
            out[target] = (order[node] if group is None else starts[id(group)], order[node])
    return out


def _hidden(graph: TDAG, conv: _Recording, index: dict, layer: _Run, touched: list[str],
            scope: str) -> tuple[str, str]:
    """The hidden state the layer reads from before the stack and the one it gives."""
    types = graph.types()
    inside = {n.name for n in graph.nodes if index.get(n.name, -1) in layer}
    n_user = len(graph.outputs) - len(conv.state_outputs)
    state_values = set(graph.outputs[n_user:])
    outside_reads = {x for n in graph.nodes if n.name not in inside for x in n.inputs}
    given = sorted((inside & outside_reads) | (inside & set(graph.outputs[:n_user])))
    given += [v for v in inside & state_values if v not in given and
              conv.state_outputs[graph.outputs[n_user:].index(v)] not in touched]
    where = f"the layer {scope}"
    if len(given) != 1:
        raise ConversionError(f"{where} gives {len(given)} values to the rest of the model "
                              f"({', '.join('%' + g for g in given[:4])}); stacking needs one, "
                              "the hidden state")
    (out,) = given
    reads = {x for n in graph.nodes if n.name in inside for x in n.inputs} - inside
    candidates = sorted(x for x in reads if x not in graph.weights and x not in touched
                        and types[x] == types[out])
    if len(candidates) != 1:
        raise ConversionError(f"{where} reads {len(candidates)} values of its output's type "
                              f"{types[out]} from before it "
                              f"({', '.join('%' + c for c in candidates[:4])}); stacking "
                              "needs one, the hidden state")
    return candidates[0], out


def _claimed(graph: TDAG, index: dict) -> set[str]:
    """The names taken by name, not by the counter: inputs, weights, state."""
    return ({v.name for v in graph.inputs} | set(graph.weights)) - set(index)


def _replay(log: _Log, runs: list[_Run], count: int, taken: set[str]) -> dict:
    """(log index, copy) -> the name the full conversion's counter gives it: the names
    outside the runs once (copy None), each run's ``count`` times over, a shared scalar
    constant only in the first copy (later copies reuse it)."""
    names = FreshNames(taken, pattern=_PATTERN)
    out: dict[tuple, str] = {}
    i = 0
    while i < len(log.mints):
        run = _find(runs, i)
        if run is None:
            out[(i, None)] = names.fresh(log.mints[i][0])
            i += 1
            continue
        for k in range(count):
            for j in range(run.start, run.end):
                out[(j, k)] = out[(j, 0)] if k and j in log.shared else \
                    names.fresh(log.mints[j][0])
        i = run.end
    return out
