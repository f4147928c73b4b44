"""strip_batch: the per-sample Program (``add_batch``, in ``add.py``, is its inverse).

Each value is tracked in one of three states while the nodes are rewritten in order
(``rewriter.py`` holds the walk that add_batch shares):

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

Integer values also carry an ``Affine`` fact (``affine.py``), by their rules' ``values``
hooks: bounds, and a stride in the sample index for values computed from ``arange(batch)``
(the per-sample program holds what is left beside ``stride * i``). Bounds decide
comparisons, so a ``where`` on a known condition is its chosen operand (the other branch,
often a size that depends on the batch, goes); a gather's rule reads ``inner * i + j`` into a
table with the batch folded in as each sample's own rows.

>>> import tdag, torch
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.exp(x) + 1.0, tdag.TensorSpec(("b", 4)))
>>> [str(t) for t in tdag.strip_batch(prog).input_types]
['f32[4]']
"""
from __future__ import annotations

from dataclasses import replace

import torch

from tdag.deinops.extent import Repeat, Select
from tdag.deinops.movement import Squeeze, Unsqueeze
from tdag.ir.batching import (
    UNKNOWN,
    Aligned,
    AxisRule,
    Batched,
    Folded,
    Mixes,
    OperandRule,
    Pick,
    SampleCount,
    divide,
    same_values,
)
from tdag.ir.graph import TDAG, Node, Weight
from tdag.ir.op import Op
from tdag.ir.passes import gc_paused
from tdag.ir.program import Call, Loop, Program, all_steps
from tdag.ir.record import record
from tdag.ir.symbols import Dim, dims_equal, format_dim, free_symbols, is_static
from tdag.ir.types import TensorKind, TensorType
from tdag.ir.verify import block_types
from tdag.refine.batch.affine import INTEGRAL, SampleFacts
from tdag.refine.constants import Constants
from tdag.refine.batch.program import ProgramRewrite, rewrite_program
from tdag.refine.batch.rewriter import BatchError, Rewriter, describe, fits, is_broadcast


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
    return rewrite_program(prog, states, lambda g, s: _Strip(g, s, batch).run(),
                           lambda t, s: _strip_type(t, s, batch), "strip_batch",
                           lambda r, step, given: _loop(r, step, given, batch))


def _loop(rewrite: ProgramRewrite, step: Loop, given, batch: Dim) -> tuple:
    """strip_batch through a loop: ``(steps before, loop, [], output states)``.

    A carried value that starts free but that the body makes batched is the same for every
    sample where it starts as a constant repeated over the batch (the zero first state of an
    ONNX LSTM exported at batch 2, ``[1, 2, h]``; at batch 1, any value): its first row
    goes before the loop. Any other is refused, naming the node: the samples would start
    from different rows of it."""
    try:
        return _carry(rewrite, step, given, list(given))
    except BatchError as refused:
        starts = _repeated_starts(rewrite.prog, step, given, batch)
        try:
            if starts is None:
                raise
            return _carry(rewrite, step, given, starts)
        except BatchError:
            raise BatchError(f"{refused.message}; a loop carries it from a first value that "
                             "has one row per sample and is not the same row repeated: "
                             "export the model with a dynamic batch axis (torch.onnx.export's "
                             "dynamic_axes) or at batch 1", node=refused.node,
                             origin=refused.origin) from None


def _carry(rewrite: ProgramRewrite, step: Loop, given, args) -> tuple:
    """The loop with its carried values starting in ``args``' states."""
    offset = 1 if step.cond is not None else 0
    while True:  # each round makes at least one carried value batched, so it ends
        _, outs = rewrite.block(step.body, [None, *args])
        found = {k: c for k, (a, c) in enumerate(zip(args, outs[offset:offset + len(args)]))
                 if a is None and c is not None}
        if not found:
            break
        args = [found.get(k, a) for k, a in enumerate(args)]
    before, inputs = [], list(step.inputs)
    types = block_types(rewrite.prog, step.body)
    for k, (a, g) in enumerate(zip(args, given)):
        if g is None and isinstance(a, Batched):  # a Folded axis of a batch of one: as it is
            graph = rewrite.adapter("one_sample", types[offset + k],
                                    ((Op.select, Select(a.axis, 0)),))
            inputs[k] = rewrite.names.fresh(f"{step.inputs[k]}.sample")
            before.append(Call(graph, (step.inputs[k],), (inputs[k],)))
    loop, outs = rewrite.step(replace(step, inputs=tuple(inputs)), args)
    return before, loop, [], outs


def _repeated_starts(prog: Program, step: Loop, given, batch: Dim) -> list | None:
    """``given`` with each free carried value that starts as a constant repeated over its one
    batch-long axis read as a broadcast there; None where there is none."""
    if not is_static(batch):
        return None
    starts, changed = list(given), False
    for k, (name, g) in enumerate(zip(step.inputs, given)):
        value = _constant_start(prog, name) if g is None else None
        axes = [] if value is None else [a for a, d in enumerate(value.shape) if d == batch]
        if len(axes) == 1 and bool((value == value.narrow(axes[0], 0, 1)).all()):
            starts[k], changed = Batched(axes[0], broadcast=True), True
    return starts if changed else None


def _constant_start(prog: Program, name: str) -> torch.Tensor | None:
    """The value of block value ``name`` where a call computes it from consts alone."""
    for step in all_steps(prog.main):
        if isinstance(step, Call) and name in step.outputs:
            graph = prog.graphs[step.graph]
            known = Constants(graph.weights)
            for node in graph.nodes:
                known.add(node)
            out = graph.outputs[step.outputs.index(name)]
            return known.value(out)
    return None


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


class _Strip(Rewriter):
    """Also tracks each integer value's ``Affine`` (``affine.py``): its bounds, and its
    stride in the sample index where it is computed from ``arange(batch)``."""

    pass_name = "strip_batch"

    def __init__(self, graph: TDAG, states, batch: Dim):
        super().__init__(graph, states, batch)
        self.facts = SampleFacts(graph.weights, batch)
        self.deferred: dict[str, BatchError] = {}

    def new_type(self, t: TensorType, state) -> TensorType:
        return _strip_type(t, state, self.batch)

    def visit(self, node: Node, states) -> object:
        """The node by its rule's kind, after its ``values`` hook: a picked operand stands
        for it; a strided operand needs the hook (the per-sample program holds only the part
        beside ``stride * i``), and a known result computed from one is built as a constant."""
        known = [self.facts.known.get(n) for n in node.inputs]
        if not any(known) and node.type.dtype not in INTEGRAL:
            return super().visit(node, states)  # nothing known, nothing to learn
        facts = [UNKNOWN if f is None else f for f in known]
        strided = any(f.stride for f in facts)
        fact = self.facts.derive(node, facts, strided, self.in_types(node))
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
        self.facts.learn(node.name, fact)
        return state

    def in_types(self, node: Node) -> list[TensorType]:
        return [self.old_types[n] for n in node.inputs]

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
                target = self.sized(node, a, size)
                x = None if target is None else self.per_sample(node, target)
                if x is not None:
                    self.env[node.name] = x
                    return replace(target, broadcast=True) if isinstance(target, Batched) \
                        else target
        return super().free(node)

    def sized(self, node: Node, a: int, size: Dim):
        """The state a free node's axis ``a`` would hold the batch in: ``Batched(a)`` where
        it is the batch long; ``Folded(a, k)`` where it is ``k`` times as long and the node
        differs per sample (a flat arange over ``[batch * heads, q]``: a broadcast to such a
        length stays free, read per sample by its users); None where neither."""
        stride = self.facts.derive(node, self.facts.of(node.inputs), False,
                                   self.in_types(node)).stride
        if dims_equal(size, self.batch):
            return Batched(a) if stride else Batched(a, broadcast=True)
        inner = divide(size, self.batch)
        return Folded(a, inner) if stride and inner is not None and stride == inner else None

    def per_sample(self, node: Node, target) -> str | None:
        """The free node ``node`` read per sample as a broadcast in state ``target``, by its
        rule's ``broadcast`` hook; None where it is no broadcast over the batch."""
        key = (node.name, target)
        if key not in self.cache:
            rule = record(node.op).batch
            hook = rule.broadcast if isinstance(rule, (AxisRule, Aligned)) else None
            steps = self.call(node, hook, node.spec, target, self.batch)
            if steps is not None:
                self.cache[key] = self.emit_steps(node, steps,
                                                  [self.env[n] for n in node.inputs], None)
            else:
                self.cache[key] = self.elementwise_of_broadcasts(node, rule, target)
        return self.cache[key]

    def elementwise_of_broadcasts(self, node: Node, rule, target) -> str | None:
        """An elementwise op of broadcasts over the batch is one (batch norm's ``-mean``
        repeated to a batch-merged axis): the op on its operands read per sample."""
        if not isinstance(rule, Aligned) or not node.inputs:
            return None
        inputs = []
        for name in node.inputs:
            producer = self.producer.get(name)
            x = None if producer is None else self.per_sample(producer, target)
            if x is None:
                return None
            inputs.append(x)
        return self.emit(node, node.op, node.spec, inputs)

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
        if self.facts.get(x).stride and rule.values is not same_values:
            # an op that only moves values keeps each sample's ``r`` where it was
            raise self.error(node, "works along the batch axis of a value computed from the "
                                   "sample index (an arange over the batch)")
        done = self.call(node, rule.along, node.spec, in_type, state, self.batch)
        if done is not None:
            steps, out = done
            self.env[node.name] = self.emit_steps(node, steps, [self.env[x]], node.name)
            return out
        if is_broadcast(state):  # the same per sample: run it on the full-size value
            return self.as_free(node, [state])
        raise self.mixes(node, rule.mixing)

    def aligned(self, node: Node, rule: Aligned, states) -> object:
        layouts = {s for s in states if s is not None and not is_broadcast(s)}
        if len(layouts) > 1:
            raise self.mixes(node, f"{rule.mixing} ("
                             + ", ".join(sorted(map(describe, layouts))) + ")")
        if layouts:
            target = layouts.pop()
        else:
            spread = {s.axis for s in states if s is not None}
            if len(spread) > 1:
                return self.as_free(node, states)
            target = Batched(spread.pop(), broadcast=True)
        inputs = [self.env[n] if fits(s, target) else self.adapt(n, target, node)
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
        if not is_broadcast(state):
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
                if not any(map(is_broadcast, states)):
                    raise self.mixes(node, str(exc)) from None
            # it mixes samples only through broadcasts, which are the same per sample:
            # rebuild those at full size, free, and ask again
            inputs = [self.materialize(n, s, node) if is_broadcast(s) else x
                      for n, s, x in zip(node.inputs, states, inputs)]
            states = [None if is_broadcast(s) else s for s in states]
        self.emit(node, node.op, spec, inputs, node.name)
        return out

    def ask(self, node: Node, rule: OperandRule, states) -> tuple:
        """The rule's spec and output state; with no batched operand, the node as it is."""
        if all(s is None for s in states):
            return node.spec, None
        return rule.strip(node.spec, self.in_types(node), states,
                          self.facts.of(node.inputs))

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


__all__ = ["strip_batch"]
