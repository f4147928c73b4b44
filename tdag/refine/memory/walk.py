"""The run of a reified torch module, replayed on storages: what is live after each node.

The replay mirrors the generated code (tdag/reify/torch), not an ideal schedule:
- in a TDAG's method, a node's value is bound when it runs and deleted after the node that
  reads it last (``liveness``: the code generator's own dying sets); inputs, weights and
  outputs stay bound to the end of the method, as do values nothing reads;
- a view shares its input's storage (``views.Views``);
- ``forward`` binds each controller's outputs to locals it never deletes; a state output
  replaces its buffer (the old value goes when nothing else holds it);
- a Loop rebinds its carried values and its steps' outputs every trip (the previous trip's
  are freed at the rebinding), keeps every scanned value in a list, and stacks a list anew
  at each place the stacked output is read (``_rt.stack``: a fresh tensor each time);
- an If runs one branch: the replay takes the branch whose peak is larger;
- a torch call's own scratch tensors count at its node alone (its record's ``workspace``);
- a node the code writes over its operands holds no new storage (``liveness``'s overwrites:
  an optimizer update, a scatter into a KV cache the call consumes, ``consumed_inputs``);
- a method may copy inputs channels-last at its start (the copy held to its end) and return
  (N, C, H, W) copies of outputs (``liveness``'s ``ChannelsLast``), and a value it computes
  channels-last has those strides (``views.Views``: which reshapes copy).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.record import record
from tdag.ir.symbols import Dim, evaluate, free_symbols, symbol
from tdag.ir.types import TensorKind
from tdag.ir.verify import block_types, trips_name
from tdag.refine.consumed import consumed_inputs
from tdag.refine.memory.heap import Heap, Storage, Tally
from tdag.refine.memory.kinds import NodeKinds, state_kinds
from tdag.refine.memory.views import Views

INDEX_BYTES = 8  # a Loop's trip number: torch.tensor(it), one int64


@dataclass(frozen=True, slots=True)
class ChannelsLast:
    """A TDAG method's channels-last values (``tdag.reify.torch.layout``): the inputs it
    copies so at its start (the copy stands for the input to the end of the method), the
    outputs it returns a (N, C, H, W) copy of, and every value computed channels-last."""

    inputs: frozenset = frozenset()
    outputs: frozenset = frozenset()
    values: frozenset = frozenset()


# the generated code's schedule of one TDAG, given the inputs its code may write over
# (``consumed_inputs``): the nodes written, the values deleted after each, the nodes that
# write over their operands (node -> the operands: one, the result is that operand written
# over; several, the result stands for them stacked, read by selects: an optimizer update),
# and its channels-last values
Liveness = Callable[[TDAG, frozenset],
                    "tuple[set[str], dict[str, list[str]], dict[str, tuple], ChannelsLast]"]


@dataclass(frozen=True, slots=True)
class Event:
    """The bytes live right after one scheduled node (before the deletions that follow it)."""

    label: str
    total: Tally
    phase: str = "forward"  # the training-step part of the node (``Origin.phase``)


@dataclass(frozen=True, slots=True)
class Stack:
    """A Loop's stacked output: each read stacks the list again into a fresh tensor."""

    bytes: Dim
    kind: str
    name: str


@dataclass
class _Graph:
    """What the replay needs of one TDAG, computed once."""

    live: set
    dying: dict
    views: Views
    kinds: NodeKinds
    types: dict
    overwrites: dict  # an in-place node -> the operands it writes over
    slices: dict      # a select of a stacked in-place result -> the operand it is
    layout: ChannelsLast


@dataclass
class Walk:
    """One replay; ``capture`` names the events whose live storages to keep."""

    prog: Program
    liveness: Liveness
    sizes: dict          # the bindings the caller gave
    probe: dict          # ``sizes`` plus a value for every other symbol (view decisions)
    capture: frozenset = frozenset()
    choices: list = field(default_factory=list)  # the If branches taken, in visiting order
    graphs: dict = field(default_factory=dict)  # gname -> _Graph, shareable by replays
    heap: Heap = field(default_factory=Heap)
    events: list = field(default_factory=list)
    captured: dict = field(default_factory=dict)  # event index -> the live storage ids
    _vars: dict = field(default_factory=dict)
    _buffers: dict = field(default_factory=dict)
    _weights: dict = field(default_factory=dict)
    _bytes: dict = field(default_factory=dict)
    _ifs: int = 0
    _owned: dict = field(default_factory=dict)  # gname -> the inputs its code writes over

    def run(self) -> "Walk":
        self._owned = consumed_inputs(self.prog)
        kinds = state_kinds(self.prog)
        for name, weight in self.prog.state.items():
            self._buffers[name] = self._hold_new(Storage(self.nbytes(weight.type), kinds[name],
                                                         name))
        env = {}
        for value in self.prog.main.inputs:
            env[value.name] = self._hold_new(Storage(self.nbytes(value.type), "inputs",
                                                     value.name))
        self._weights_of_graphs()
        self._mark("start")
        outs = self.block(self.prog.main, env)
        for i, out in enumerate(outs):
            if isinstance(out, Stack):
                self._bind(("return", i), self._stacked(out))
                self._mark(f"return {out.name}")
        return self

    # -- sizes ----------------------------------------------------------------------------

    def nbytes(self, t) -> Dim:
        if t not in self._bytes:
            self._bytes[t] = self.bind(t.nbytes)
        return self._bytes[t]

    def bind(self, value: Dim) -> Dim:
        """``value`` with the given sizes substituted (an int once none is left free)."""
        names = free_symbols(value)
        bound = {k: v for k, v in self.sizes.items() if k in names}
        if bound and len(bound) == len(names):
            return evaluate(value, bound)
        if bound:
            return value.subs({s: bound[s.name] for s in value.free_symbols if s.name in bound})
        return value

    # -- storages and references ----------------------------------------------------------

    def _hold_new(self, storage: Storage) -> int:
        return self.heap.hold(self.heap.new(storage))

    def _bind(self, key, sid: int) -> None:
        """A Python variable of ``forward`` (re)bound: the old value loses a reference."""
        self.heap.hold(sid)
        old = self._vars.get(key)
        self._vars[key] = sid
        if old is not None:
            self.heap.drop(old)

    def _mark(self, label: str, phase: str | None = None) -> None:
        """An event; a controller's own (no node) keeps the phase of the one before."""
        if len(self.events) in self.capture:
            self.captured[len(self.events)] = self.heap.live()
        if phase is None:
            phase = self.events[-1].phase if self.events else "forward"
        self.events.append(Event(label, self.heap.total.copy(), phase))

    def _weights_of_graphs(self) -> None:
        """Parameters and buffers by name, consts per TDAG: what the module registers for
        the weights a graph's code reads."""
        for gname, graph in self.prog.graphs.items():
            info = self.graph(gname)
            for name, weight in graph.weights.items():
                if name not in info.live:  # the code reads only the weights live nodes read
                    continue
                key = (gname, name) if weight.kind is TensorKind.const else name
                if key in self._weights or name in self._buffers:
                    continue
                kind = "state" if weight.kind is TensorKind.buffer else "weights"
                self._weights[key] = self._hold_new(Storage(self.nbytes(weight.type), kind,
                                                            name, graph=gname))

    def _weight(self, gname: str, name: str, graph: TDAG) -> int:
        if name in self._buffers:
            return self._buffers[name]
        weight = graph.weights[name]
        return self._weights[(gname, name) if weight.kind is TensorKind.const else name]

    # -- one TDAG -------------------------------------------------------------------------

    def graph(self, gname: str) -> _Graph:
        if gname not in self.graphs:
            graph = self.prog.graphs[gname]
            live, dying, overwrites, layout = self.liveness(graph,
                                                            self._owned.get(gname, frozenset()))
            types = {v.name: v.type for v in graph.inputs}
            types.update((n, w.type) for n, w in graph.weights.items())
            types.update((n.name, n.type) for n in graph.nodes)
            slices = {n.name: overwrites[n.inputs[0]][n.spec.index] for n in graph.nodes
                      if n.op is Op.select and len(overwrites.get(n.inputs[0], ())) > 1}
            self.graphs[gname] = _Graph(live, dying, Views(graph, self.probe, layout.values),
                                         NodeKinds(graph), types, overwrites, slices, layout)
        return self.graphs[gname]

    def call(self, gname: str, args: list[int]) -> list[int]:
        """The method ``_g_<gname>``: returns the outputs, one reference each for the caller."""
        graph, info = self.prog.graphs[gname], self.graph(gname)
        sid_of, bound = {}, set()
        for value, sid in zip(graph.inputs, args):
            if value.name in info.layout.inputs:
                sid = self.heap.new(Storage(self.nbytes(value.type), "activations",
                                            f"{value.name} copy", graph=gname))
            sid_of[value.name] = self.heap.hold(sid)
            bound.add(value.name)
        for name in graph.weights:
            if name in info.live:
                sid_of[name] = self._weight(gname, name, graph)
        for node in graph.nodes:
            if node.name not in info.live:
                continue
            into = info.overwrites.get(node.name, ())
            if len(into) == 1:  # its operand, written over
                sid = self.heap.hold(sid_of[into[0]])
            elif into:  # the operands' storage, written over, standing for their stack
                sid = self._hold_new(Storage(0, info.kinds(node), node.name, node.name,
                                             node.origin.scope, gname))
            elif node.name in info.slices:  # a slice of that stack: the operand it is
                sid = self.heap.hold(sid_of[info.slices[node.name]])
            elif node.name in info.views.base:
                sid = self.heap.hold(sid_of[node.inputs[0]])
            else:
                sid = self._hold_new(Storage(self.nbytes(node.type), info.kinds(node),
                                             node.name, node.name, node.origin.scope, gname))
            sid_of[node.name] = sid
            bound.add(node.name)
            scratch = self._workspace(node, info)
            if scratch:
                scratch = self._hold_new(Storage(scratch, "workspace", f"{node.name} scratch",
                                                 node.name, node.origin.scope, gname))
            self._mark(f"{gname}:{node.name}", node.origin.phase)
            if scratch:
                self.heap.drop(scratch)
            for name in info.dying.get(node.name, ()):
                self.heap.drop(sid_of[name])
                bound.remove(name)
        outs = [self._hold_new(Storage(self.nbytes(info.types[o]), "activations", f"{o} copy",
                                       o, graph=gname))
                if o in info.layout.outputs else self.heap.hold(sid_of[o])
                for o in graph.outputs]
        if info.layout.outputs:
            self._mark(f"{gname}: return")
        for name in bound:
            self.heap.drop(sid_of[name])
        return outs

    def _workspace(self, node, info: _Graph) -> Dim:
        """The scratch bytes ``node``'s torch call allocates and frees inside itself (its
        record's ``workspace``), 0 for most."""
        rule = record(node.op).workspace
        if rule is None:
            return 0
        contiguous = tuple(info.views.is_contiguous(n) for n in node.inputs)
        return self.bind(rule(node.spec, [info.types[n] for n in node.inputs], node.type,
                              contiguous))

    # -- controllers ----------------------------------------------------------------------

    def block(self, block: Block, env: dict) -> list:
        for step in block.steps:
            if isinstance(step, Call):
                outs = self._call_step(step, env)
            elif isinstance(step, If):
                outs = self._if(step, env)
            elif isinstance(step, Loop):
                outs = self._loop(step, env)
            else:
                raise UnsupportedOpError(f"memory: unknown controller {type(step).__name__}")
            for name, out in zip(step.outputs, outs):
                if name in self.prog.state:  # _rt.set_state: the buffer now holds the new value
                    sid = self._stacked(out) if isinstance(out, Stack) else out
                    self.heap.hold(sid)
                    self.heap.drop(self._buffers[name])
                    self._buffers[name] = sid
                    env.pop(name, None)
                else:
                    env[name] = out
        return [self._read(env, n) for n in block.outputs]

    def _read(self, env: dict, name: str):
        """A value by name: a state entry is not in ``env`` (unless a block input shadows
        it) but read from the module's buffer as it is now, as the generated code reads
        ``self.<name>`` (a loop's later trips see the buffer its earlier ones wrote)."""
        return env[name] if name in env else self._buffers[name]

    def _stacked(self, stack: Stack) -> int:
        """A fresh stack of a Loop's list, not yet referenced (its reader holds it)."""
        return self.heap.new(Storage(stack.bytes, stack.kind, stack.name, stack.name))

    def _call_step(self, step: Call, env: dict) -> list[int]:
        args, temps = [], []
        for name in step.inputs:
            value = self._read(env, name)
            if isinstance(value, Stack):  # the stack expression, evaluated as an argument
                value = self.heap.hold(self._stacked(value))
                temps.append(value)
            args.append(value)
        outs = self.call(step.graph, args)
        for i, sid in enumerate(outs):
            self._bind((id(step), i), sid)
            self.heap.drop(sid)  # the call's reference passes to the local
        for sid in temps:
            self.heap.drop(sid)
        return outs

    def _enter(self, block: Block, values: list, env: dict) -> dict:
        inner = dict(env)
        for i, (value, arg) in enumerate(zip(block.inputs, values)):
            sid = self._stacked(arg) if isinstance(arg, Stack) else arg
            self._bind((id(block), i), sid)
            inner[value.name] = sid
        return inner

    def _if(self, step: If, env: dict) -> list:
        args = [self._read(env, n) for n in step.inputs]
        visit = self._ifs
        self._ifs += 1
        if visit < len(self.choices):
            branch = step.then_branch if self.choices[visit] else step.else_branch
            return self.block(branch, self._enter(branch, args, env))
        saved = (self.heap.copy(), dict(self._vars), dict(self._buffers), len(self.events))
        runs = []
        for branch in (step.then_branch, step.else_branch):
            self.heap, self._vars, self._buffers = saved[0].copy(), dict(saved[1]), dict(saved[2])
            del self.events[saved[3]:]
            outs = self.block(branch, self._enter(branch, args, env))
            runs.append((self.heap, dict(self._vars), dict(self._buffers),
                         self.events[saved[3]:], outs))
        take = 0 if self._larger(runs[0][3], runs[1][3]) else 1
        self.choices.append(take == 0)
        self.heap, self._vars, self._buffers, events, outs = runs[take]
        del self.events[saved[3]:]
        self.events.extend(events)
        return outs

    def _larger(self, a: list, b: list) -> bool:
        def top(events):
            return max((e.total.at(self.probe) for e in events), default=0)
        return top(a) >= top(b)

    def _trips(self, step: Loop) -> int:
        """The trips to replay: the count; a while loop's bound ``trips_<first output>``
        (its most trips, as ``tdag.cost`` names it) given as a size: the peak of a run
        that goes the whole way."""
        count = step.count if step.count is not None else symbol(trips_name(step))
        try:
            return evaluate(count, self.sizes)
        except ShapeError as e:
            what = "runs while its condition holds, with no count" if step.count is None \
                else f"runs {step.count} trips"
            raise ShapeError(f"memory: the loop -> {', '.join(step.outputs)} {what}: pass "
                             f"its bound as a size, e.g. {sorted(free_symbols(count))[0]}=N "
                             f"({e})") from None

    def _loop(self, step: Loop, env: dict) -> list:
        trips = self._trips(step)
        carried = len(step.inputs)
        for i, name in enumerate(step.inputs):
            value = self._read(env, name)
            self._bind((id(step), "carry", i), self._stacked(value) if isinstance(value, Stack)
                       else value)
        scans: list[list[int]] = [[] for _ in range(step.scanned)]
        lead = 1 if step.cond is not None else 0
        for trip in range(trips):
            index = self.heap.new(Storage(INDEX_BYTES, "activations", "it"))
            values = [index] + [self._vars[(id(step), "carry", i)] for i in range(carried)]
            results = self.block(step.body, self._enter(step.body, values, env))[lead:]
            for i in range(carried):
                self._bind((id(step), "carry", i), results[i])
            for j, sid in enumerate(results[carried:]):
                scans[j].append(self.heap.hold(sid))
        types = block_types(self.prog, step.body)[lead + carried:]
        stacks = [Stack(self.nbytes(t) * trips, self.heap.storages[s[0]].kind if s else
                        "activations", f"{step.outputs[carried + j]}")
                  for j, (t, s) in enumerate(zip(types, scans))]
        return [self._vars[(id(step), "carry", i)] for i in range(carried)] + stacks


__all__ = ["ChannelsLast", "Event", "Liveness", "Walk"]
