"""add_batch, the inverse of strip_batch: every input, and every value computed from one,
gains a leading batch axis of symbolic size ``name``; weights stay as they are.

Every batched value holds the batch at axis 0: an ``AxisRule`` gives the op's spec with an
axis inserted at 0, ``Aligned`` operands that are free are broadcast over the batch
(unsqueeze + repeat), and an ``OperandRule`` says where the op puts the batch (a permute moves
it to the front). A gather that ``strip_batch`` read as each sample's own rows of a table
with the batch folded in is folded back: its indices move on by ``n * i`` for sample ``i``.
Through a loop, a carried value that starts free but that the body makes batched is widened.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.exp(x) + 1.0, tdag.TensorSpec((4,)))
>>> [str(t) for t in tdag.add_batch(prog).input_types]
['f32[b,4]']
"""
from __future__ import annotations

from tdag.deinops.extent import Repeat, Select
from tdag.deinops.indexing import Iota
from tdag.deinops.movement import Permute, Ungroup, Unsqueeze
from tdag.errors import ShapeError
from tdag.ir.batching import Aligned, AxisRule, Batched, Mixes, OperandRule
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.passes import gc_paused
from tdag.ir.program import Call, Loop, Program
from tdag.ir.record import NoSpec
from tdag.ir.symbols import Dim, as_dim, free_symbols, is_static, symbol
from tdag.ir.types import TensorType
from tdag.ir.verify import block_types
from tdag.refine.batch.program import ProgramRewrite, rewrite_program
from tdag.refine.batch.rewriter import BatchError, Rewriter


@gc_paused()  # many small objects, no cycles: see tdag.ir.passes
def add_batch(prog: Program, name: str = "b") -> Program:
    """The inverse of ``strip_batch``: every input, and every value computed from one, gains
    a leading batch axis of symbolic size ``name``; weights stay as they are."""
    if name in _program_symbols(prog):
        raise ShapeError(f"add_batch: the symbol {name!r} is already a dimension of the "
                         "program; pass another name")
    batch = symbol(name)
    states = [Batched(0)] * len(prog.inputs)
    return rewrite_program(prog, states, lambda g, s: _Add(g, s, batch).run(),
                           lambda t, s: t if s is None else t.with_shape((batch,) + t.shape),
                           "add_batch", _loop)


def _program_symbols(prog: Program) -> set[str]:
    """The names of the symbols in the sizes of the program's values."""
    names: set[str] = set()
    for graph in prog.graphs.values():
        for t in graph.types().values():
            for d in t.shape:
                names |= free_symbols(d)
    return names


class _Add(Rewriter):
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


def _loop(rewrite: ProgramRewrite, step: Loop, given) -> tuple:
    """add_batch through a loop: ``(steps before, loop, steps after, output states)``.

    A carried value that starts free (a zero initial state) but that the body makes batched
    is widened, broadcast over the batch before the loop, and the body rewritten for it; a
    scanned value is stacked in front of its batch axis, which a permute moves back to 0."""
    block, adapter, fresh, retype = rewrite.block, rewrite.adapter, rewrite.names, rewrite.retype
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
    old_types = block_types(rewrite.prog, step.body)
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


__all__ = ["add_batch"]
