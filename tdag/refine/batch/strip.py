"""Batch stripping: ``strip_batch`` gives the per-sample Program, ``add_batch`` its inverse.

Each value is tracked in one of three states while the nodes are rewritten in order:

- free (``None``): it does not depend on the batch (weights and what is computed from them);
  the node is copied as it is;
- ``Batched(p)``: axis ``p`` is the batch; the per-sample value is the value without it, so
  the node's spec loses axis ``p`` (reduce axes shift, a permutation loses an entry). A
  free value repeated to the batch size (a bias, a zero initial state) is a *broadcast*
  ``Batched(p)``: the same per sample, so it may also take part in ops along ``p``, rebuilt
  at full size, when the batch is static;
- ``Folded(p, inner)``: a reshape merged the batch into axis ``p`` (torch's
  ``[b, s, d] -> [b*s, d]`` around a matmul, ``inner`` = s); the per-sample axis is ``1/b``
  as long, and the reshape that splits the batch back out returns the value to Batched.

A node with a batched operand is rewritten by its op's batch rule (``tdag.ir.batching``),
chosen by the rule's kind only: an ``AxisRule`` moves the batch through a one-input op (or
its ``along`` hook gives the op a per-sample form on the batch axis), ``Aligned`` keeps
elementwise operands on one batch axis, an ``OperandRule`` is asked for the spec and the
output's state, and ``Refuse`` refuses. A free operand of an elementwise op with a batched
one is a broadcast (an explicit repeat over the batch axis): the ``broadcast`` hook of its
producer's rule rebuilds it without the batch axis. An op that works along the batch axis (a
reduction over it, a gather along it, a slice of it) mixes samples and raises ``BatchError``
naming the node and its module path.

Integer values also carry an ``Affine`` fact, by their rules' ``values`` hooks: bounds, and a
stride in the sample index for values computed from ``arange(batch)`` (the per-sample program
holds what is left beside ``stride * i``). Bounds decide comparisons, so a ``where`` on a
known condition is its chosen operand (the other branch, often a size that depends on the
batch, goes); a gather's rule reads ``inner * i + j`` into a table with the batch folded in as
each sample's own rows. ``add_batch`` folds such a gather back (rows moved on by ``n * i``).

>>> import tdag, torch
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.exp(x) + 1.0, tdag.TensorSpec(("b", 4)))
>>> [str(t) for t in tdag.strip_batch(prog).input_types]
['f32[4]']
"""
from __future__ import annotations

from dataclasses import replace

import torch

from tdag.deinops.indexing import Iota
from tdag.deinops.movement import Permute, Repeat, Select, Squeeze, Ungroup, Unsqueeze
from tdag.errors import ShapeError, TdagError
from tdag.ir.batching import (
    UNKNOWN,
    Affine,
    Aligned,
    AxisRule,
    Batched,
    Folded,
    Mixes,
    OperandRule,
    Pick,
    Refuse,
    SampleCount,
    divide,
)
from tdag.ir.graph import TDAG, Node, Value, Weight
from tdag.ir.op import Op
from tdag.ir.passes import gc_paused
from tdag.ir.program import Block, Call, If, Loop, Program, all_steps, called_graphs
from tdag.ir.record import NoSpec, record
from tdag.ir.symbols import Dim, as_dim, dims_equal, format_dim, free_symbols, is_static, symbol
from tdag.ir.types import DType, TensorKind, TensorType
from tdag.ir.verify import block_types
from tdag.refine.dataflow import Names, all_names, prune


class BatchError(TdagError):
    """A batch axis that cannot be removed or added: the op mixes samples."""


@gc_paused()  # many small objects, no cycles: see tdag.ir.passes
def strip_batch(prog: Program, axis: int = 0) -> Program:
    """The per-sample Program: every input loses axis ``axis``, the batch.

    Running it on each sample and stacking the results reproduces ``prog``; an output that
    has its batch axis elsewhere is stacked there.
    """
    if not prog.inputs:
        raise BatchError("strip_batch: the program has no inputs, so no batch axis")
    batch = _batch_size(prog.inputs, axis)
    try:
        return _strip(prog, axis, batch)
    except BatchError as positions:
        if not is_static(batch) or batch < 2:
            raise
        # a static batch: an iota of its length read as the sample index instead (a
        # transformers mask's arange(batch)); either reading that strips is exact
        try:
            return _strip(prog, axis, SampleCount(batch))
        except BatchError:
            raise positions from None


def _strip(prog: Program, axis: int, batch: Dim) -> Program:
    states = [Batched(axis)] * len(prog.inputs)
    return _rewrite_program(prog, states, lambda g, s: _Strip(g, s, batch).run(),
                            lambda t, s: _strip_type(t, s, batch), "strip_batch")


@gc_paused()  # many small objects, no cycles: see tdag.ir.passes
def add_batch(prog: Program, name: str = "b") -> Program:
    """The inverse of ``strip_batch``: every input, and every value computed from one, gains
    a leading batch axis of symbolic size ``name``; weights stay as they are."""
    if name in _program_symbols(prog):
        raise ShapeError(f"add_batch: the symbol {name!r} is already a dimension of the "
                         "program; pass another name")
    batch = symbol(name)
    states = [Batched(0)] * len(prog.inputs)
    return _rewrite_program(prog, states, lambda g, s: _Add(g, s, batch).run(),
                            lambda t, s: t if s is None else t.with_shape((batch,) + t.shape),
                            "add_batch")


def _batch_size(inputs, axis: int) -> Dim:
    sizes = []
    for value in inputs:
        if value.type.rank <= axis:
            raise BatchError(f"strip_batch: input %{value.name}: {value.type} has no axis {axis}")
        sizes.append(value.type.shape[axis])
    if not all(dims_equal(s, sizes[0]) for s in sizes):
        raise BatchError("strip_batch: inputs disagree on the batch size: "
                         + ", ".join(f"%{v.name}: {v.type}" for v in inputs))
    return sizes[0]


def _strip_type(t: TensorType, state, batch: Dim) -> TensorType:
    if state is None:
        return t
    shape = list(t.shape)
    if isinstance(state, Batched):
        del shape[state.axis]
    else:
        shape[state.axis] = divide(shape[state.axis], batch)
    return t.with_shape(shape)


def _program_symbols(prog: Program) -> set[str]:
    names: set[str] = set()
    for graph in prog.graphs.values():
        for t in graph.types().values():
            for d in t.shape:
                names |= free_symbols(d)
    return names


# -- one TDAG ---------------------------------------------------------------------------------

class _Rewriter:
    """Shared machinery: the new nodes, their types, and a state per old name."""

    def __init__(self, graph: TDAG, states, batch: Dim):
        self.graph, self.batch = graph, batch
        self.old_types = graph.types()
        self.producer = {n.name: n for n in graph.nodes}
        self.state = {v.name: s for v, s in zip(graph.inputs, states)}
        self.env = {name: name for name in self.old_types}  # old name -> new name
        self.types: dict[str, TensorType] = {}
        self.nodes: list[Node] = []
        self.names = Names(all_names(graph))
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
        in_types = tuple(self.types[n] for n in inputs)
        key = (op, spec, in_types)
        out = self.shape_cache.get(key)
        if out is None:
            try:
                out = self.shape_cache[key] = record(op).shape(spec, in_types)
            except ShapeError as exc:
                raise self.error(origin, f"cannot be rewritten: {exc.args[0]}") from None
        self.nodes.append(Node(name, op, tuple(inputs), spec, out, origin.origin))
        self.types[name] = out
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


class _Strip(_Rewriter):
    """Also tracks each integer value's ``Affine`` (``tdag.ir.batching``): its bounds, and
    its stride in the sample index where it is computed from ``arange(batch)``."""

    pass_name = "strip_batch"

    def __init__(self, graph: TDAG, states, batch: Dim):
        super().__init__(graph, states, batch)
        self.facts: dict[str, Affine] = {}
        for name, w in graph.weights.items():
            if w.kind is TensorKind.const and w.value is not None and w.value.numel() \
                    and w.type.dtype in _INTEGRAL:
                self.facts[name] = Affine(0, int(w.value.min()), int(w.value.max()))
        self.deferred: dict[str, BatchError] = {}

    def new_type(self, t: TensorType, state) -> TensorType:
        return _strip_type(t, state, self.batch)

    def visit(self, node: Node, states) -> object:
        """The node by its rule's kind, after its ``values`` hook: a picked operand stands
        for it; a strided operand needs the hook (the per-sample program holds only the part
        beside ``stride * i``), and a known result computed from one is built as a constant."""
        known = [self.facts.get(n) for n in node.inputs]
        if not any(known) and node.type.dtype not in _INTEGRAL:
            return super().visit(node, states)  # nothing known, nothing to learn
        facts = [UNKNOWN if f is None else f for f in known]
        strided = any(f.stride for f in facts)
        fact = self.values(node, facts, strided)
        if isinstance(fact, Pick):
            k = fact.operand
            self.env[node.name] = self.env[node.inputs[k]]
            fact, state = facts[k], states[k]
        elif fact is None:
            raise self.error(node, "reads the sample index (an arange over the batch) in a "
                                   "way that has no per-sample form")
        else:
            state = super().visit(node, states)
            if strided and fact.constant is not None:
                self.env[node.name] = self.constant(node, fact.constant, state)
                state = replace(state, broadcast=True) if isinstance(state, Batched) else state
        if fact != UNKNOWN:
            self.facts[node.name] = fact
        return state

    def values(self, node: Node, facts, strided: bool):
        """The node's ``Affine`` (or ``Pick``) by its rule's hook; None where a strided
        operand has no hook to read it."""
        rule = record(node.op).batch
        hook = rule.values if isinstance(rule, (AxisRule, Aligned, OperandRule)) else None
        if hook is not None and (strided or node.type.dtype in _INTEGRAL
                                 or any(f != UNKNOWN for f in facts)):
            return hook(node.spec, facts, self.batch)
        return None if strided else UNKNOWN

    def constant(self, origin: Node, value, state) -> str:
        """A per-sample value known to be ``value`` everywhere: a scalar const, broadcast."""
        t = self.new_type(origin.type, state)
        name = self.names.fresh(f"{origin.name}_known")
        self.weights[name] = Weight(TensorKind.const, TensorType((), t.dtype),
                                    torch.tensor(value, dtype=t.dtype.torch))
        self.types[name] = self.weights[name].type
        x = name
        if t.rank:
            x = self.emit(origin, Op.unsqueeze, Unsqueeze(tuple(range(t.rank))), [x])
        axes = tuple(a for a, d in enumerate(t.shape) if not (is_static(d) and d == 1))
        if axes:
            x = self.emit(origin, Op.repeat, Repeat(axes, tuple(t.shape[a] for a in axes)), [x])
        return x

    def free(self, node: Node) -> object:
        """A free node that broadcasts a value to the batch size (a repeat of a bias, of
        zeros) is a broadcast over the batch: per sample, its rule's hook drops that axis.
        An iota over the batch is read the same way, but differs per sample: its ``Affine``
        has a stride."""
        rule = record(node.op).batch
        if isinstance(rule, (AxisRule, Aligned)) and rule.broadcast is not None:
            for a, size in enumerate(node.type.shape):
                x = self.per_sample(node, Batched(a)) if dims_equal(size, self.batch) else None
                if x is not None:
                    self.env[node.name] = x
                    stride = self.values(node, [self.facts.get(n, UNKNOWN)
                                                for n in node.inputs], False).stride
                    return Batched(a, broadcast=not stride)
        return super().free(node)

    def per_sample(self, node: Node, target) -> str | None:
        """The free node ``node`` read per sample as a broadcast in state ``target``, by its
        rule's ``broadcast`` hook; None where it is no broadcast over the batch."""
        key = (node.name, target)
        if key not in self.cache:
            rule = record(node.op).batch
            hook = rule.broadcast if isinstance(rule, (AxisRule, Aligned)) else None
            steps = self.call(node, hook, node.spec, target, self.batch)
            self.cache[key] = None if steps is None else \
                self.emit_steps(node, steps, [self.env[n] for n in node.inputs], None)
        return self.cache[key]

    def call(self, node: Node, hook, *args):
        """A rule's hook on ``node`` (None where the rule has none); its ``Mixes`` become
        this node's BatchError."""
        try:
            return None if hook is None else hook(*args)
        except Mixes as exc:
            raise self.mixes(node, str(exc)) from None

    def one_input(self, node: Node, rule: AxisRule, state) -> object:
        x = node.inputs[0]
        in_type, p = self.old_types[x], state.axis
        if p not in rule.touched(node.spec, in_type):
            respec = rule.drop if isinstance(state, Batched) else rule.folded
            self.emit(node, node.op, respec(node.spec, in_type, p), [self.env[x]], node.name)
            return replace(state, axis=rule.out_axis(node.spec, in_type, p))
        if self.facts.get(x, UNKNOWN).stride:
            raise self.error(node, "works along the batch axis of a value computed from the "
                                   "sample index (an arange over the batch)")
        done = self.call(node, rule.along, node.spec, in_type, state, self.batch)
        if done is not None:
            steps, out = done
            self.env[node.name] = self.emit_steps(node, steps, [self.env[x]], node.name)
            return out
        if _is_broadcast(state):  # the same per sample: run it on the full-size value
            return self.as_free(node, [state])
        raise self.mixes(node, rule.mixing)

    def aligned(self, node: Node, rule: Aligned, states) -> object:
        layouts = {s for s in states if s is not None and not _is_broadcast(s)}
        if len(layouts) > 1:
            raise self.mixes(node, f"{rule.mixing} ("
                             + ", ".join(sorted(map(_describe, layouts))) + ")")
        if layouts:
            target = layouts.pop()
        else:
            spread = {s.axis for s in states if s is not None}
            if len(spread) > 1:
                return self.as_free(node, states)
            target = Batched(spread.pop(), broadcast=True)
        inputs = [self.env[n] if _fits(s, target) else self.adapt(n, target, node)
                  for n, s in zip(node.inputs, states)]
        self.emit(node, node.op, node.spec, inputs, node.name)
        return target

    def adapt(self, name: str, target, user: Node) -> str:
        """A free operand next to a batched one: it must be a broadcast over the batch (its
        producer's rule rebuilds it per sample)."""
        rep = self.producer.get(name)
        x = None if rep is None else self.per_sample(rep, target)
        if x is None and dims_equal(self.batch, 1):
            x = self.single_sample(name, target, user)
        if x is None:
            raise self.error(user, f"mixes samples: operand %{name} does not depend on the "
                                   f"batch yet has a batch-sized axis {target.axis} that is not "
                                   "a broadcast")
        return x

    def single_sample(self, name: str, target, user: Node) -> str:
        """A batch of one: a free value is trivially the same for every sample, so its axis
        of size 1 at the batch's place goes (a Folded axis is its per-sample length)."""
        if isinstance(target, Folded):
            return self.env[name]
        key = (name, "one", target.axis)
        if key not in self.cache:
            self.cache[key] = self.emit(user, Op.squeeze, Squeeze((target.axis,)),
                                        [self.env[name]])
        return self.cache[key]

    def as_free(self, node: Node, states) -> None:
        """Run ``node`` on full-size values: a broadcast over the batch is rebuilt as it was
        (possible only for a static batch)."""
        inputs = [self.materialize(n, s, node) for n, s in zip(node.inputs, states)]
        self.emit(node, node.op, node.spec, inputs, node.name)
        return None

    def materialize(self, name: str, state, user: Node) -> str:
        if state is None:
            return self.env[name]
        error = self.error(user, f"mixes samples or depends on the batch size "
                                 f"{format_dim(self.batch)}")
        if not _is_broadcast(state):
            raise error
        key = (name, "full")
        if key not in self.cache:
            x = self.emit(user, Op.unsqueeze, Unsqueeze((state.axis,)), [self.env[name]])
            size = int(self.batch) if is_static(self.batch) else self.batch  # no SampleCount
            self.cache[key] = self.emit(user, Op.repeat, Repeat((state.axis,), (size,)), [x])
            # at a symbolic batch, the node is refused where it is live in the end (not a
            # dead branch: the size n of the negative-index wrap where(i < 0, i + n, i))
            self.deferred[self.cache[key]] = error
        return self.cache[key]

    def operands(self, node: Node, rule: OperandRule, states) -> object:
        inputs = [self.env[n] for n in node.inputs]
        while True:  # twice at most: the second time, no operand is a broadcast
            try:
                spec, out = self.ask(node, rule, states)
                break
            except Mixes as exc:
                if not any(map(_is_broadcast, states)):
                    raise self.mixes(node, str(exc)) from None
            # it mixes samples only through broadcasts, which are the same per sample:
            # rebuild those at full size, free, and ask again
            inputs = [self.materialize(n, s, node) if _is_broadcast(s) else x
                      for n, s, x in zip(node.inputs, states, inputs)]
            states = [None if _is_broadcast(s) else s for s in states]
        self.emit(node, node.op, spec, inputs, node.name)
        return out

    def ask(self, node: Node, rule: OperandRule, states) -> tuple:
        """The rule's spec and output state; with no batched operand, the node as it is."""
        if all(s is None for s in states):
            return node.spec, None
        return rule.strip(node.spec, [self.old_types[n] for n in node.inputs], states,
                          [self.facts.get(n, UNKNOWN) for n in node.inputs])

    def check(self, graph: TDAG) -> None:
        """A symbolic batch must be gone: a surviving node that still mentions it depends on
        the batch size itself (an iota over it, a broadcast to it)."""
        if is_static(self.batch) or not self.batch.is_Symbol:
            return
        name = self.batch.name
        for node in graph.nodes:
            if node.name in self.deferred:
                raise self.deferred[node.name]
            if any(name in free_symbols(d) for d in node.type.shape):
                raise self.error(node, f"depends on the batch size {name}: {node.type}")


_INTEGRAL = frozenset((DType.i64, DType.i32, DType.i16, DType.i8, DType.u8, DType.bool))


def _is_broadcast(state) -> bool:
    return isinstance(state, Batched) and state.broadcast


def _describe(state) -> str:
    if isinstance(state, Folded):
        return f"folded into axis {state.axis} with {format_dim(state.inner)} after it"
    return f"axis {state.axis}"


def _fits(state, target) -> bool:
    """An operand in ``state`` can be used as it is next to ``target``."""
    return state == target or (_is_broadcast(state) and isinstance(target, Batched)
                               and state.axis == target.axis)


def _layout(state):
    """Where a value holds the batch, whether or not it is a broadcast."""
    return replace(state, broadcast=False) if isinstance(state, Batched) else state


class _Add(_Rewriter):
    """Inserts a batch axis at 0 in every value that depends on the inputs."""

    pass_name = "add_batch"

    def new_type(self, t: TensorType, state) -> TensorType:
        return t if state is None else t.with_shape((self.batch,) + t.shape)

    def one_input(self, node: Node, rule: AxisRule, state) -> object:
        self.emit(node, node.op, rule.insert0(node.spec), [self.env[node.inputs[0]]], node.name)
        return Batched(0)

    def aligned(self, node: Node, rule: Aligned, states) -> object:
        inputs = [self.env[n] if s is not None else self.broadcast(n, node)
                  for n, s in zip(node.inputs, states)]
        self.emit(node, node.op, node.spec, inputs, node.name)
        return Batched(0)

    def sample_offsets(self, user: Node, like: str, stride: Dim) -> str:
        """``stride * i`` for the sample index i along axis 0, shaped like ``like``: the rows
        ``0, stride, 2*stride, ...`` of an iota over ``batch * stride``."""
        t = self.types[like]
        x = self.emit(user, Op.iota, Iota(as_dim(self.batch * stride), t.dtype), [])
        x = self.emit(user, Op.ungroup, Ungroup(0, (self.batch, stride)), [x])
        x = self.emit(user, Op.select, Select(1, 0), [x])
        if t.rank > 1:
            x = self.emit(user, Op.unsqueeze, Unsqueeze(tuple(range(1, t.rank))), [x])
        axes = tuple(a for a in range(1, t.rank) if not (is_static(t.shape[a]) and t.shape[a] == 1))
        if axes:
            x = self.emit(user, Op.repeat, Repeat(axes, tuple(t.shape[a] for a in axes)), [x])
        return x

    def broadcast(self, name: str, user: Node) -> str:
        """A free operand next to a batched one: unsqueeze + repeat over the batch."""
        if name not in self.cache:
            x = self.emit(user, Op.unsqueeze, Unsqueeze((0,)), [self.env[name]])
            self.cache[name] = self.emit(user, Op.repeat, Repeat((0,), (self.batch,)), [x])
        return self.cache[name]

    def operands(self, node: Node, rule: OperandRule, states) -> object:
        try:
            spec, axis, prep = rule.insert(node.spec, [self.old_types[n] for n in node.inputs],
                                           [s is not None for s in states])
        except Mixes as exc:
            raise self.mixes(node, str(exc)) from None
        inputs = [self.env[n] for n in node.inputs]
        for k, (steps, stride) in enumerate(prep or ()):
            inputs[k] = self.emit_steps(node, steps, [inputs[k]], None)
            if not (is_static(stride) and stride == 0):
                inputs[k] = self.emit(node, Op.add, NoSpec(),
                                      [inputs[k], self.sample_offsets(node, inputs[k], stride)])
        if axis == 0:
            self.emit(node, node.op, spec, inputs, node.name)
            return Batched(0)
        # every batched value holds the batch at 0 here: move it to the front
        out = self.emit(node, node.op, spec, inputs)
        perm = (axis,) + tuple(a for a in range(self.types[out].rank) if a != axis)
        self.emit(node, Op.permute, Permute(perm), [out], node.name)
        return Batched(0)


# -- the program ------------------------------------------------------------------------------

def _rewrite_program(prog: Program, states, rewrite_graph, retype, what: str) -> Program:
    """Rewrite every TDAG for the states its callers give it (one copy per distinct set of
    argument states) and retype the blocks' values."""
    graphs: dict[str, TDAG] = {}
    made: dict = {}

    def call(name: str, arg_states) -> tuple:
        key = (name, tuple(arg_states))
        if key not in made:
            graph, outs = rewrite_graph(prog.graphs[name], arg_states)
            new_name, k = name, 0
            while new_name in graphs or (new_name != name and new_name in prog.graphs):
                k += 1
                new_name = f"{name}_{k}"  # a second batch layout: a second copy
            graphs[new_name] = graph
            made[key] = (new_name, outs)
        return made[key]

    taken = {name for step in all_steps(prog.main) for name in step.outputs}
    taken |= {v.name for v in prog.main.inputs} | set(prog.graphs) | set(prog.state)

    def fresh(name: str) -> str:
        k, out = 0, name
        while out in taken:
            k += 1
            out = f"{name}_{k}"
        taken.add(out)
        return out

    def adapter(hint: str, in_type: TensorType, steps) -> str:
        """A new TDAG that applies ``steps`` (``(op, spec)`` pairs) to one value."""
        name = fresh(hint)
        graphs[name] = _steps_graph(in_type, steps)
        return name

    def block(blk: Block, arg_states) -> tuple:
        env = {name: None for name in prog.state}
        env.update((v.name, s) for v, s in zip(blk.inputs, arg_states))
        steps = []
        for step in blk.steps:
            args = [env[n] for n in step.inputs]
            if isinstance(step, Loop) and what == "add_batch":
                before, step, after, outs = _add_batch_loop(prog, step, args, block, adapter,
                                                            fresh, retype)
                steps += before
            else:
                step, outs = _step(step, args, call, block, what)
                after = []
            for name, s in zip(step.outputs, outs):
                if name in prog.state and s is not None:
                    raise BatchError(f"{what}: writes state %{name} with a batch-dependent "
                                     "value; state is shared by every sample")
                env[name] = s
            steps.append(step)
            for extra in after:  # a permute of a stacked value: batch at axis 0 again
                env[extra.outputs[0]] = env[extra.inputs[0]]
                steps.append(extra)
        inputs = tuple(Value(v.name, retype(v.type, s)) for v, s in zip(blk.inputs, arg_states))
        return Block(inputs, tuple(steps), blk.outputs), [env[n] for n in blk.outputs]

    main, _ = block(prog.main, states)
    used = called_graphs(main)  # a loop rewritten twice leaves its first try's copies
    return Program({k: g for k, g in graphs.items() if k in used}, main, prog.state)


def _add_batch_loop(prog: Program, step: Loop, given, block, adapter, fresh, retype) -> tuple:
    """add_batch through a loop: ``(steps before, loop, steps after, output states)``.

    A carried value that starts free (a zero initial state) but that the body makes batched
    is widened, broadcast over the batch before the loop, and the body rewritten for it; a
    scanned value is stacked in front of its batch axis, which a permute moves back to 0."""
    args, offset = list(given), 1 if step.cond is not None else 0
    while True:  # each round widens at least one carried value, so it ends
        body, outs = block(step.body, [None, *args])
        carried = outs[offset:offset + len(args)]
        widen = {k for k, (a, o) in enumerate(zip(args, carried)) if a is None and o is not None}
        if not widen:
            break
        args = [Batched(0) if k in widen else a for k, a in enumerate(args)]
    if any(a is not None and c is None for a, c in zip(args, carried)):
        raise BatchError("add_batch: a loop's body makes a carried batched value free")
    old_types = block_types(prog, step.body)
    before, inputs = [], list(step.inputs)
    for k, (a, g) in enumerate(zip(args, given)):
        if a is not None and g is None:
            t = old_types[offset + k]
            batch = retype(t, Batched(0)).shape[0]
            graph = adapter("broadcast", t, ((Op.unsqueeze, Unsqueeze((0,))),
                                              (Op.repeat, Repeat((0,), (batch,)))))
            inputs[k] = fresh(f"{step.inputs[k]}.batched")
            before.append(Call(graph, (step.inputs[k],), (inputs[k],)))
    scanned = outs[offset + len(args):]
    after, outputs = [], list(step.outputs)
    for k, s in enumerate(scanned, start=len(args)):
        if s is None:
            continue
        if step.cond is not None:  # the stacked length is a fresh symbol of the loop's own
            raise BatchError("add_batch: a loop with a condition scans a batched value")
        t = retype(old_types[offset + k], Batched(0))
        stacked = t.with_shape((step.count,) + t.shape)
        perm = (1, 0) + tuple(range(2, stacked.rank))
        graph = adapter("batch_first", stacked, ((Op.permute, Permute(perm)),))
        outputs[k] = fresh(f"{step.outputs[k]}.stacked")
        after.append(Call(graph, (outputs[k],), (step.outputs[k],)))
    loop = Loop(tuple(inputs), body, tuple(outputs), step.count, step.cond, step.scanned)
    return before, loop, after, args + [None if s is None else Batched(0) for s in scanned]


def _steps_graph(in_type: TensorType, steps) -> TDAG:
    """A TDAG of one input ``x`` and one output: ``steps`` applied in turn."""
    nodes, x, t = [], "x", in_type
    for k, (op, spec) in enumerate(steps):
        t = record(op).shape(spec, (t,))
        nodes.append(Node(f"y{k}", op, (x,), spec, t))
        x = f"y{k}"
    return TDAG((Value("x", in_type),), {}, nodes, (x,))


def _step(step, args, call, block, what: str) -> tuple:
    if isinstance(step, Call):
        name, outs = call(step.graph, args)
        return Call(name, step.inputs, step.outputs), outs
    if isinstance(step, If):
        then_branch, outs = block(step.then_branch, args)
        else_branch, else_outs = block(step.else_branch, args)
        if list(map(_layout, outs)) != list(map(_layout, else_outs)):
            raise BatchError(f"{what}: the branches of an if put the batch on different axes")
        return If(step.cond, step.inputs, then_branch, else_branch, step.outputs), outs
    if isinstance(step, Loop):
        body, outs = block(step.body, [None, *args])
        offset = 1 if step.cond is not None else 0
        if list(map(_layout, outs[offset:offset + len(args)])) != list(map(_layout, args)):
            raise BatchError(f"{what}: a loop changes where its carried values hold the batch")
        scanned = [None if s is None else replace(s, axis=s.axis + 1)
                   for s in outs[offset + len(args):]]
        return Loop(step.inputs, body, step.outputs, step.count, step.cond, step.scanned), \
            list(args) + scanned
    raise BatchError(f"{what}: unknown controller {type(step).__name__}")


__all__ = ["BatchError", "add_batch", "strip_batch"]
