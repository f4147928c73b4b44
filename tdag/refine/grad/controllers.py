"""Reverse mode over controllers: the gradient of a Program whose top level is Calls, counted
Loops and Ifs (a recurrent model, a model split at its control flow).

A block is differentiated step by step in reverse. Its forward steps run as they are, except
that each counted Loop also stacks the values it carries into every trip (the residuals its
backward pass reads). Then, last step first:

- a Call becomes a Call of its TDAG's backward graph (``vjp_graph``: the step's inputs and
  its outputs' cotangents in, its inputs' cotangents and its parameters' gradients out; the
  forward values it needs are recomputed inside it);
- a Loop becomes a Loop over the same count running the body's reverse from the last trip to
  the first: each trip takes the carried values of its forward trip from the stacks, reruns
  the body's forward steps, then their reverse; it carries the carried values' cotangents and
  the sums of the parameters' gradients;
- an If becomes an If on the same condition over the two branches' reverses (the branch its
  predicate chose).

State carries no gradient. A while loop (one with a condition) is reversed as many trips as
it took, the length of its stacks, under a condition of its own. Contributions
to one value's cotangent are summed by small add-graphs, as a TDAG's are by add nodes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from tdag import ops
from tdag.ir.graph import TDAG, Value
from tdag.ir.names import FreshNames
from tdag.ir.program import (
    Block, Call, If, Loop, Program, all_steps, nested_blocks, step_reads, with_blocks,
)
from tdag.ir.types import BACKWARD, DType, Origin, TensorType
from tdag.ir.verify import block_types
from tdag.ops.builder import Builder
from tdag.refine.grad.reverse import GradError, recomputed, vjp_graph

_I64 = TensorType((), DType.i64)


@dataclass
class Reversed:
    """A block's backward half: its steps, the cotangent (a name) of each block value that
    has one, and each parameter's gradient (a name)."""

    steps: list = field(default_factory=list)
    cotangents: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)


class Reverse:
    """Builds the backward steps of the blocks of ``prog`` for the parameters ``wrt``, adding
    the TDAGs they call to ``graphs``."""

    def __init__(self, prog: Program, wrt):
        self.prog, self.wrt = prog, set(wrt)
        self.graphs = dict(prog.graphs)
        self.names = FreshNames(_block_names(prog.main) | set(prog.state))
        self._adders: dict = {}  # (shape, dtype) -> the add graph; ("zeros", ...) zeros
        self._recomputed: dict = {}  # a forward TDAG's name -> its copy marked recompute

    # -- blocks ---------------------------------------------------------------------------

    def block(self, block: Block, seeds: dict) -> tuple[Block, Reversed]:
        """``block`` with its loops keeping residuals, and its reverse seeded by ``seeds``
        (block value -> the name of its cotangent)."""
        forward, stacks = [], []
        for step in block.steps:
            if isinstance(step, Loop):
                step, stacked = self._keep_carried(step)
                stacks.append(stacked)
            forward.append(step)
        types = self.types(Block(block.inputs, tuple(forward), ()))
        back = Reversed(cotangents=dict(seeds))
        for step in reversed(forward):
            if isinstance(step, Call):
                self._call(step, types, back)
            elif isinstance(step, Loop):
                self._loop(step, stacks.pop(), types, back)
            else:
                self._if(step, types, back)
        return Block(block.inputs, tuple(forward), block.outputs), back

    def types(self, block: Block) -> dict:
        """The type of every name a block defines (its inputs, its steps' outputs, state)."""
        named = tuple(n for step in block.steps for n in step.outputs)
        whole = Block(block.inputs, block.steps, named)
        env = {v.name: v.type for v in block.inputs}
        env.update((k, w.type) for k, w in self.prog.state.items())
        env.update(zip(named, block_types(Program(self.graphs, whole, self.prog.state), whole)))
        return env

    # -- steps ----------------------------------------------------------------------------

    def _call(self, step: Call, types: dict, back: Reversed) -> None:
        graph = self.graphs[step.graph]
        seeded = [k for k, o in enumerate(step.outputs) if o in back.cotangents]
        inputs = [(outer, v.name) for outer, v in zip(step.inputs, graph.inputs)
                  if self._differentiable(outer, v.type)]
        weights = [w for w in graph.weights if w in self.wrt]
        if not seeded or not (inputs or weights):
            return
        name = self.graph(f"{step.graph}_vjp", vjp_graph(
            graph, seeded, [inner for _, inner in inputs] + weights))
        outs = [self.fresh(f"d.{outer}") for outer, _ in inputs]
        parts = [self.fresh(f"grad.{w}") for w in weights]
        back.steps.append(Call(name, step.inputs + tuple(back.cotangents[step.outputs[k]]
                                                         for k in seeded), tuple(outs + parts)))
        for (outer, _), d in zip(inputs, outs):
            self._add(back.cotangents, outer, d, types[outer], back.steps)
        for w, d in zip(weights, parts):
            self._add(back.grads, w, d, graph.weights[w].type, back.steps)

    def _differentiable(self, name: str, type: TensorType) -> bool:
        return type.dtype.is_float and name not in self.prog.state

    def _if(self, step: If, types: dict, back: Reversed) -> None:
        seeds = [o for o in step.outputs if o in back.cotangents]
        if not seeds:
            return
        branches = (step.then_branch, step.else_branch)
        inputs = [k for k, o in enumerate(step.inputs) if self._differentiable(o, types[o])]
        params = sorted({p for branch in branches for s in all_steps(branch)
                         if isinstance(s, Call) for p in self.graphs[s.graph].weights
                         if p in self.wrt})
        then, other = (self._reverse_branch(b, step, seeds, inputs, params, types)
                       for b in branches)
        names = [self.fresh(f"d.{step.inputs[k]}") for k in inputs] + \
            [self.fresh(f"grad.{p}") for p in params]
        back.steps.append(If(step.cond, step.inputs + tuple(back.cotangents[o] for o in seeds),
                             then, other, tuple(names)))
        for k, d in zip(inputs, names):
            self._add(back.cotangents, step.inputs[k], d, types[step.inputs[k]], back.steps)
        for p, d in zip(params, names[len(inputs):]):
            self._add(back.grads, p, d, self._param_type(p), back.steps)

    def _reverse_branch(self, branch: Block, step: If, seeds, inputs, params, types) -> Block:
        """A branch's reverse: (the branch's inputs, the If outputs' cotangents) -> (the
        cotangents of the differentiable inputs, every parameter's gradient, zeros for those
        the branch does not use)."""
        ds = [Value(self.fresh(f"d.{o}"), types[o]) for o in seeds]
        fwd, rev = self.block(Block(branch.inputs, branch.steps, ()),
                              {branch.outputs[step.outputs.index(o)]: d.name
                               for o, d in zip(seeds, ds)})
        steps = [*fwd.steps, *rev.steps]
        outs = [self.or_zeros(rev.cotangents, branch.inputs[k], steps) for k in inputs]
        outs += [rev.grads[p] if p in rev.grads else self.zeros_of_param(p, steps)
                 for p in params]
        return Block(branch.inputs + tuple(ds), tuple(steps), tuple(outs))

    # -- loops ----------------------------------------------------------------------------

    def _keep_carried(self, loop: Loop) -> tuple[Loop, list]:
        """The loop, also stacking the values carried into each trip (its residuals): the
        name of each carried value's stack, None for a value every trip passes on unchanged
        (an LSTM's whole input sequence), which the reverse reads as it is: stacking it would
        keep a copy per trip, memory quadratic in the sequence."""
        if loop.cond is not None and not loop.inputs:
            raise GradError("grad: a while loop that carries nothing has no gradient to take")
        carried_in = tuple(v.name for v in loop.body.inputs[1:])
        go = loop.cond is not None
        passed = [not go and out == name for out, name in
                  zip(loop.body.outputs[go:go + len(carried_in)], carried_in)]
        if all(passed) and not loop.scanned:  # the reverse counts its trips on a stack
            passed = [False] * len(passed)
        kept = tuple(name for name, same in zip(carried_in, passed) if not same)
        body = replace(loop.body, outputs=loop.body.outputs + kept)
        stacked = [None if same else self.fresh(f"{name}.stack")
                   for name, same in zip(carried_in, passed)]
        out = replace(loop, body=body, outputs=loop.outputs + tuple(filter(None, stacked)),
                      scanned=loop.scanned + len(kept))
        return out, stacked

    def _loop(self, loop: Loop, stacked: list, types: dict, back: Reversed) -> None:
        n, k = len(loop.inputs), sum(1 for s in stacked if s)
        finals, scans = loop.outputs[:n], loop.outputs[n:n + loop.scanned - k]
        if not any(o in back.cotangents for o in finals + scans):
            return
        body = replace(loop.body, outputs=loop.body.outputs[:len(loop.body.outputs) - k])
        params = sorted({p for s in all_steps(body) if isinstance(s, Call)
                         for p in self.graphs[s.graph].weights if p in self.wrt})
        start = self._prelude(loop, finals, scans, stacked, params, types, back)
        inner, plan = self._reverse_body(body, loop, scans, stacked, params, types)
        names = [self.fresh(f"d.{x}") for x in loop.inputs] + \
            [self.fresh(f"grad.{p}") for p in params] + \
            [self.fresh("pass") for _ in range(len(plan))]
        if loop.cond is None:
            back.steps.append(Loop(tuple(start), inner, tuple(names), count=loop.count))
        else:  # as many trips as the forward loop took: the length of its stacks
            first = self.fresh("any_trips")
            back.steps.append(Call(self.graph("any_trips", _any_trips(types[stacked[0]])),
                                   (stacked[0],), (first,)))
            back.steps.append(Loop(tuple(start), inner, tuple(names), cond=first))
        for x, d in zip(loop.inputs, names):
            if self._differentiable(x, types[x]):
                self._add(back.cotangents, x, d, types[x], back.steps)
        for p, d in zip(params, names[n:]):
            self._add(back.grads, p, d, self._param_type(p), back.steps)

    def _prelude(self, loop, finals, scans, stacked, params, types, back) -> list[str]:
        """The reverse loop's initial carried values: the final values' cotangents, zero
        sums of the parameters' gradients, and (passed through) the stacks of the forward
        trips' carried values, the values no trip changes, and the scanned outputs'
        cotangents."""
        start = [self.or_zeros(back.cotangents, Value(f, types[f]), back.steps)
                 for f in finals]
        start += [self.zeros_of_param(p, back.steps) for p in params]
        start += [s for s in stacked if s] + [x for x, s in zip(loop.inputs, stacked) if not s]
        start += [self.or_zeros(back.cotangents, Value(s, types[s]), back.steps)
                  for s in scans]
        return start

    def _reverse_body(self, body: Block, loop: Loop, scans, stacked, params, types):
        """The reverse loop's body: (j, d carried..., grad sums..., stacks..., unchanged
        carried values..., d scans...); a while loop's reverse also says whether a trip is
        left (its first output)."""
        n = len(loop.inputs)
        go = loop.cond is not None  # a while body's first output is its condition
        next_carried, scanned = body.outputs[go:go + n], body.outputs[go + n:]
        carried = list(body.inputs[1:])
        d_in = [Value(self.fresh(f"d.{v.name}"), v.type) for v in carried]
        sums = [Value(self.fresh(f"sum.{p}"), self._param_type(p)) for p in params]
        stacks = [Value(self.fresh(f"{s}.in"), types[s]) for s in stacked if s]
        held = [v for v, s in zip(carried, stacked) if not s]  # under the body's own names
        d_scans = [Value(self.fresh(f"d.{s}.in"), types[s]) for s in scans]
        j = Value(self.fresh("j"), _I64)
        trip = self.graph("reverse_trip", _trip_graph([v.type for v in stacks],
                                                       [v.type for v in d_scans], go))
        picked = [self.fresh(f"d.{o}") for o in scanned]
        more = [self.fresh("more_trips")] if go else []
        pick = Call(trip, (j.name,) + tuple(v.name for v in stacks + d_scans),
                    tuple(more) + (body.inputs[0].name,) +
                    tuple(v.name for v, s in zip(carried, stacked) if s) + tuple(picked))
        seeds = {o: d.name for o, d in zip(next_carried, d_in)}
        seeds.update(zip(scanned, picked))
        fwd, rev = self.block(Block(body.inputs, body.steps, ()), seeds)
        steps = [pick, *fwd.steps, *rev.steps]
        outs = more + [self.or_zeros(rev.cotangents, v, steps) for v in carried]
        for p, s in zip(params, sums):
            if p in rev.grads:
                outs.append(self.sum(s.name, rev.grads[p], s.type, steps))
            else:
                outs.append(s.name)
        outs += [v.name for v in stacks + held + d_scans]
        inputs = (j,) + tuple(d_in + sums + stacks + held + d_scans)
        rerun = {id(step) for step in fwd.steps}
        kept = tuple(self._recomputing(step) if id(step) in rerun else step
                     for step in _needed(steps, outs))
        return Block(inputs, kept, tuple(outs)), stacks + held + d_scans

    def _recomputing(self, step):
        """``step`` calling copies of its TDAGs marked as recomputation (a reverse trip
        reruns its forward trip), so that cost reports tell that work from the forward's."""
        if not isinstance(step, Call):
            return with_blocks(step, [replace(b, steps=tuple(map(self._recomputing, b.steps)))
                                      for b in nested_blocks(step)])
        if step.graph not in self._recomputed:
            self._recomputed[step.graph] = self.graph(f"{step.graph}_recomputed",
                                                      recomputed(self.graphs[step.graph]))
        return replace(step, graph=self._recomputed[step.graph])

    # -- names, zeros and sums ------------------------------------------------------------

    def fresh(self, hint: str) -> str:
        return self.names.fresh(hint)

    def graph(self, hint: str, graph: TDAG) -> str:
        name = FreshNames().fresh(hint, avoid=self.graphs)
        self.graphs[name] = graph
        return name

    def _add(self, table: dict, key: str, name: str, type: TensorType, steps: list) -> None:
        table[key] = self.sum(table[key], name, type, steps) if key in table else name

    def sum(self, a: str, b: str, type: TensorType, steps: list) -> str:
        out = self.fresh("sum")
        steps.append(Call(self._adder(type), (a, b), (out,)))
        return out

    def _adder(self, type: TensorType) -> str:
        key = (type.shape, type.dtype)
        if key not in self._adders:
            b = Builder()
            x, y = b.input("a", type), b.input("b", type)
            self._adders[key] = self.graph("add", b.build([x + y]))
        return self._adders[key]

    def or_zeros(self, table: dict, value: Value, steps: list) -> str:
        """The cotangent of ``value`` in ``table``, or zeros shaped as it."""
        if value.name in table:
            return table[value.name]
        out = self.fresh("zeros")
        steps.append(Call(self._zeros_graph(value.type), (value.name,), (out,)))
        return out

    def _zeros_graph(self, type: TensorType) -> str:
        key = ("zeros", type.shape, type.dtype)
        if key not in self._adders:
            self._adders[key] = self.graph("zeros", filled_like(type, 0.0))
        return self._adders[key]

    def zeros_of_param(self, p: str, steps: list) -> str:
        b = Builder()
        w = self._param_weight(p)
        x = b.weight(p, w.kind, w.value, w.type)
        with b.active(), b.scope(_FILL):
            zero = ops.full(x.shape, 0.0, x.dtype, like=x)
        out = self.fresh(f"zero.{p}")
        steps.append(Call(self.graph("zeros", b.build([zero])), (), (out,)))
        return out

    def _param_weight(self, p: str):
        for graph in self.graphs.values():
            if p in graph.weights:
                return graph.weights[p]
        raise GradError(f"grad: no TDAG holds parameter {p!r}")

    def _param_type(self, p: str) -> TensorType:
        return self._param_weight(p).type


def _trip_graph(stacks: list[TensorType], d_scans: list[TensorType], go: bool) -> TDAG:
    """(j, stacks..., d scans...) -> ([more], t, each stack's row t..., each d scan's row
    t...), where t = trips - 1 - j counts the forward trips backwards and ``more`` (for a
    while loop's reverse) says whether a trip is left after this one."""
    b = Builder()
    j = b.input("j", _I64)
    tensors = [b.input(f"s{k}", t) for k, t in enumerate(stacks + d_scans)]
    with b.active():
        trips = ops.size_tensor(tensors[0], (0,), "i64")
        t = trips - 1 - j
        rows = [ops.squeeze(ops.gather(x, ops.reshape(t, (1,)), 0, wrap=False), 0)
                for x in tensors]
        more = [j + 1 < trips] if go else []
    return b.build(more + [t] + rows)


def _needed(steps: list, outputs) -> tuple:
    """The steps whose outputs the block's ``outputs`` depend on, in order: a reverse trip's
    backward steps recompute their own forward values, so a forward step whose outputs only
    the backward's inputs would have read (a single-Call body's rerun) is dropped."""
    needed, kept = set(outputs), []
    for step in reversed(steps):
        if needed & set(step.outputs):
            kept.append(step)
            needed |= step_reads(step)
    return tuple(reversed(kept))


def _any_trips(stack: TensorType) -> TDAG:
    """A stack of a while loop's trips -> whether it holds any (the reverse's first cond)."""
    b = Builder()
    x = b.input("stack", stack)
    with b.active():
        out = ops.size_tensor(x, (0,), "i64") > 0
    return b.build([out])


def filled_like(type: TensorType, value: float) -> TDAG:
    """The TDAG (like) -> ``value`` in like's shape: a seed, zeros for a missing cotangent
    (backward work: the cost reports' phases)."""
    b = Builder()
    x = b.input("like", type)
    with b.active(), b.scope(_FILL):
        out = ops.full(x.shape, value, x.dtype, like=x)
    return b.build([out])


_FILL = Origin(BACKWARD + "fill")


def _block_names(block: Block) -> set[str]:
    names = {v.name for v in block.inputs} | set(block.outputs)
    for step in block.steps:
        names |= set(step.inputs) | set(step.outputs)
        for inner in (getattr(step, "then_branch", None), getattr(step, "else_branch", None),
                      getattr(step, "body", None)):
            if inner is not None:
                names |= _block_names(inner)
    return names


__all__ = ["Reverse", "Reversed", "filled_like"]
