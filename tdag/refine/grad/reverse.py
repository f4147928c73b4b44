"""Reverse mode on one TDAG: the joint graph that computes the graph's outputs, then the
gradient of one scalar output with respect to chosen inputs and weights.

The forward nodes are copied under their own names (a kernel is replaced by its
composition, which is what gets differentiated), the scalar is seeded with a one, and the
nodes are walked back: each node's record gives the cotangents of its operands from its
output's (``OpRecord.vjp``), and the contributions of every use of a value are summed. Only
the nodes between the chosen values and the scalar are differentiated, and only
floating-point values carry cotangents: the gradient of an integer or a bool is absent, not
a zero tensor. A value the scalar does not depend on gets a gradient of zeros.

Every backward node carries its forward node's provenance, marked ``vjp:`` (its op reads
``vjp:aten.mm``), so cost reports and the page tell the backward pass from the forward.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from tdag import ops
from tdag.errors import ShapeError, TdagError, UnsupportedOpError
from tdag.ir.graph import TDAG, Node
from tdag.ir.record import Trait, record
from tdag.ir.symbols import is_static
from tdag.ir.types import BACKWARD, RECOMPUTE, Origin, TensorType
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.refine.dataflow import prune



class GradError(TdagError):
    """A program tdag cannot differentiate, or a gradient rule that broke its contract."""


def joint_graph(graph: TDAG, output: int, wrt: Sequence[str],
                tied: Mapping[str, Sequence[str]] | None = None) -> TDAG:
    """``graph``'s outputs, then d ``graph.outputs[output]`` / d ``w`` for each name in
    ``wrt`` (inputs or weights of ``graph``, each of a floating-point type). ``tied`` maps a
    name to every weight that holds the same tensor (a language model's embedding and output
    projection): the gradient of the one tensor is the sum over its uses under all names."""
    tied = tied or {}
    builder, values = _copy(graph, wrt)
    groups = {w: tuple(tied.get(w, (w,))) for w in wrt}
    with builder.active():
        loss = values[graph.outputs[output]]
        _check_loss(loss)
        seed = ops.full(loss.shape, 1.0, loss.dtype, like=loss)
        cotangents = _backward(builder, {loss.name: seed},
                               {n for group in groups.values() for n in group})
        grads = [_total([cotangents[n] for n in groups[w] if n in cotangents], values[w])
                 for w in wrt]
    return prune(builder.build([values[o] for o in graph.outputs] + grads))


def vjp_graph(graph: TDAG, seeded: Sequence[int], wrt: Sequence[str]) -> TDAG:
    """The backward TDAG of one step of a program: its inputs are ``graph``'s, then the
    cotangents of the outputs at positions ``seeded`` (each named ``d.<output>``); its
    outputs are the cotangents of the names in ``wrt`` (inputs or weights; zeros where none
    flows). The forward values the backward reads are recomputed inside it (their origin
    marked ``recompute:``, so cost reports count that work apart from the forward's)."""
    builder, values = _copy(graph, wrt, RECOMPUTE)
    seeds: dict[str, Tensor] = {}
    with builder.active(), builder.scope(Origin(BACKWARD + "cotangents")):
        for k in seeded:  # an output named twice (the next state and a scanned copy) sums
            name = graph.outputs[k]
            seed = builder.input(builder.fresh(f"d.{name}"), values[name].type)
            seeds[name] = seeds[name] + seed if name in seeds else seed
        cotangents = _backward(builder, seeds, set(wrt))
        grads = [_total([cotangents[w]] if w in cotangents else [], values[w]) for w in wrt]
    return prune(builder.build(grads))


def recomputed(graph: TDAG) -> TDAG:
    """``graph`` with every node's origin marked ``recompute:``: the forward steps a
    reverse loop's trip runs again, counted apart from the forward pass."""
    return graph.replace(nodes=tuple(n.replace(origin=_marked(n, RECOMPUTE)) for n in graph.nodes))


def _marked(node: Node, mark: str) -> Origin:
    origin = node.origin
    return Origin(mark + (origin.op or node.op.value), origin.scope, origin.location)


def _copy(graph: TDAG, wrt: Sequence[str], mark: str = "") -> tuple[Builder, dict[str, Tensor]]:
    """A builder holding ``graph``'s forward nodes (kernels as their compositions), each
    origin's op prefixed with ``mark``."""
    builder = Builder()
    builder.reserve(n.name for n in graph.nodes)
    values = _leaves(builder, graph)
    for name in wrt:
        if name not in values:
            raise GradError(f"grad: {name!r} is not an input or a weight of the graph")
        if not values[name].dtype.is_float:
            raise GradError(f"grad: {name!r} is {values[name].type}; only floating-point "
                            "values have gradients")
    with builder.active():
        for node in graph.nodes:
            values[node.name] = _replay(builder, node, values, mark)
    return builder, values


def _check_loss(loss: Tensor) -> None:
    if not loss.dtype.is_float:
        raise GradError(f"grad: the output is {loss.type}; it must be a floating-point scalar")
    if not all(is_static(d) and d == 1 for d in loss.shape):
        raise GradError(f"grad: the output is {loss.type}, not a scalar: reduce it to one "
                        "value (a loss) first")


def _total(parts: list[Tensor], value: Tensor) -> Tensor:
    if not parts:
        return ops.full(value.shape, 0.0, value.dtype, like=value)
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


def _leaves(builder: Builder, graph: TDAG) -> dict[str, Tensor]:
    values = {v.name: builder.input(v.name, v.type) for v in graph.inputs}
    for name, w in graph.weights.items():
        values[name] = builder.weight(name, w.kind, w.value, w.type)
    return values


def _replay(builder: Builder, node: Node, values: dict[str, Tensor], mark: str) -> Tensor:
    """The forward node, copied; a kernel as its composition (the kernel's output name then
    names nothing: the composition's last node holds the value)."""
    operands = [values[name] for name in node.inputs]
    rec = record(node.op)
    with builder.scope(_marked(node, mark) if mark else node.origin):
        if rec.has(Trait.KERNEL) and rec.vjp is None:
            out = rec.decompose(node.spec, *operands)
            if not isinstance(out, Tensor):
                raise UnsupportedOpError(f"grad: the composition of {node.op.value} gives "
                                         "several values", node=node.name, origin=node.origin)
            return out
        return builder.emit(node.op, node.spec, *operands, name=node.name)


def _backward(builder: Builder, seeds: dict[str, Tensor], wrt: set[str]) -> dict[str, Tensor]:
    """The cotangent of every value between ``wrt`` and the seeded values."""
    tape = list(builder.nodes)
    active = _active(tape, wrt)
    types = _types(builder)
    cotangents = dict(seeds)
    for node in reversed(tape):
        dout = cotangents.get(node.name)
        if dout is None or not any(name in active for name in node.inputs):
            continue
        operands = [Tensor(builder, name, types[name]) for name in node.inputs]
        output = Tensor(builder, node.name, node.type)
        with builder.scope(_backward_origin(node)):
            contributions = record(node.op).vjp(node.spec, operands, output, dout, ops)
            for name, part in zip(node.inputs, contributions):
                if part is None or name not in active:
                    continue
                _check(node, name, part, types[name])
                cotangents[name] = cotangents[name] + part if name in cotangents else part
    return cotangents


def _active(tape: list[Node], wrt: set[str]) -> set[str]:
    """The floating-point (and complex) values that depend on ``wrt``: the ones cotangents
    flow to."""
    active = set(wrt)
    for node in tape:
        inexact = node.type.dtype.is_float or node.type.dtype.is_complex
        if inexact and any(name in active for name in node.inputs):
            active.add(node.name)
    return active


def _types(builder: Builder) -> dict[str, TensorType]:
    types = {v.name: v.type for v in builder.inputs}
    types.update((name, w.type) for name, w in builder.weights.items())
    types.update((n.name, n.type) for n in builder.nodes)
    return types


def _backward_origin(node: Node) -> Origin:
    source = node.origin.op.removeprefix(RECOMPUTE) or node.op.value
    return Origin(BACKWARD + source, node.origin.scope, node.origin.location)


def _check(node: Node, name: str, part: Tensor, expected: TensorType) -> None:
    if not part.type.same_as(expected):
        raise ShapeError(f"{node.op.value}: its gradient rule gave {part.type} for operand "
                         f"%{name} of type {expected} (a bug in the rule)", node=node.name,
                         origin=node.origin)



__all__ = ["BACKWARD", "GradError", "joint_graph", "recomputed", "vjp_graph"]
