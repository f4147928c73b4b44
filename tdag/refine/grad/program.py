"""``tdag.grad``: a Program that computes a program's outputs and the gradient of one of
them with respect to its parameters (or the inputs and weights named in ``wrt``).

The straight-line runs of Calls are joined first (``join_calls``), so a program that is one
run of TDAGs becomes one joint graph (``joint_graph``): its forward values feed its backward
nodes directly, and lowering and the cost report see the whole training computation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from tdag.ir.graph import TDAG
from tdag.ir.program import Block, Call, Program
from tdag.ir.symbols import is_static
from tdag.ir.types import TensorKind, TensorType
from tdag.ops.builder import Builder
from tdag.refine.grad.controllers import Reverse, filled_like
from tdag.refine.grad.reverse import GradError, joint_graph
from tdag.refine.join_calls import join_calls

GRAD_PREFIX = "grad."  # the output holding d(output)/d(w) is named "grad.<w>"


@dataclass(frozen=True)
class GradProgram(Program):
    """A Program from ``tdag.grad``: its outputs are the source program's outputs, then one
    gradient per name of ``wrt``, in order (output ``grad.<name>``)."""

    wrt: tuple = ()
    output: str = ""


def grad(prog: Program, wrt: Sequence[str] | None = None, output: int | str = 0) -> GradProgram:
    """The gradient of output ``output`` (an index or a name; it must hold one floating-point
    value, a loss) with respect to ``wrt``: names of the program's inputs or of its TDAG's
    weights; by default every floating-point parameter, in the graph's order.

    >>> import tdag, torch
    >>> from tdag import ops
    >>> p = tdag.trace(lambda x: ops.sum(x * x), tdag.TensorSpec((3,)))
    >>> g = tdag.grad(p, wrt=[p.inputs[0].name])
    >>> tdag.run(g, torch.tensor([1.0, 2.0, 3.0]))[1]
    tensor([2., 4., 6.])
    """
    joined, _ = join_calls(prog)
    loss = _output_name(joined, output)
    steps = joined.main.steps
    if len(steps) == 1 and isinstance(steps[0], Call):
        return _one_graph(joined, steps[0], loss, wrt)
    return _through_controllers(joined, loss, wrt)


def _one_graph(joined: Program, call: Call, loss: str, wrt) -> GradProgram:
    """A program that is one TDAG: forward and backward in one joint TDAG."""
    graph = joined.graphs[call.graph]
    if loss not in call.outputs:
        raise GradError(f"grad: output {loss!r} is not computed by the program's graph")
    inner = dict(zip(call.inputs, (v.name for v in graph.inputs)))
    tied = tied_weights(graph.weights)
    names = tuple(wrt) if wrt is not None else _parameters(graph.weights, tied)
    targets = [inner.get(name, name) for name in names]
    joint = joint_graph(graph, call.outputs.index(loss), targets, tied)
    outs = tuple(GRAD_PREFIX + name for name in names)
    step = Call(call.graph, call.inputs, call.outputs + outs)
    main = Block(joined.main.inputs, (step,), joined.main.outputs + outs)
    return GradProgram({call.graph: joint}, main, joined.state, joined.class_labels,
                       wrt=names, output=loss)


def _through_controllers(joined: Program, loss: str, wrt) -> GradProgram:
    """A program with Loops or Ifs: the block reversed step by step (``controllers``)."""
    weights = _all_weights(joined)
    tied = tied_weights(weights)
    inputs = {v.name: v for v in joined.main.inputs}
    names = tuple(wrt) if wrt is not None else _parameters(weights, tied)
    for name in names:
        if name not in weights and name not in inputs:
            raise GradError(f"grad: {name!r} is not an input or a weight of the program")
    params = {m for n in names if n in weights for m in tied.get(n, (n,))}
    reverse = Reverse(joined, params)
    types = reverse.types(joined.main)
    _check_scalar(loss, types[loss])
    seed = reverse.fresh(f"d.{loss}")
    forward, back = reverse.block(joined.main, {loss: seed})
    steps = list(forward.steps)
    steps.append(Call(reverse.graph("ones", filled_like(types[loss], 1.0)), (loss,), (seed,)))
    steps += back.steps
    grads, grad_types = [], []
    for name in names:
        if name in inputs:
            grads.append(reverse.or_zeros(back.cotangents, inputs[name], steps))
            grad_types.append(inputs[name].type)
            continue
        parts = [back.grads[m] for m in tied.get(name, (name,)) if m in back.grads]
        total = parts[0] if parts else reverse.zeros_of_param(name, steps)
        for part in parts[1:]:
            total = reverse.sum(total, part, weights[name].type, steps)
        grads.append(total)
        grad_types.append(weights[name].type)
    outs = tuple(GRAD_PREFIX + name for name in names)
    steps.append(Call(reverse.graph("gradients", _identity(grad_types)), tuple(grads), outs))
    main = Block(joined.main.inputs, tuple(steps), joined.main.outputs + outs)
    return GradProgram(reverse.graphs, main, joined.state, joined.class_labels,
                       wrt=names, output=loss)


def _all_weights(prog: Program) -> dict:
    weights: dict = {}
    for graph in prog.graphs.values():
        for name, w in graph.weights.items():
            weights.setdefault(name, w)
    return weights


def _check_scalar(loss: str, type: TensorType) -> None:
    if not type.dtype.is_float or not all(is_static(d) and d == 1 for d in type.shape):
        raise GradError(f"grad: the output {loss!r} is {type}; it must be a floating-point "
                        "scalar (a loss)")


def _identity(types) -> TDAG:
    b = Builder()
    xs = [b.input(f"g{k}", t) for k, t in enumerate(types)]
    return b.build(xs)


def _output_name(prog: Program, output: int | str) -> str:
    outputs = prog.main.outputs
    if isinstance(output, str):
        if output not in outputs:
            raise GradError(f"grad: no output {output!r} (outputs: {', '.join(outputs)})")
        return output
    if not -len(outputs) <= output < len(outputs):
        raise GradError(f"grad: output {output} out of range ({len(outputs)} outputs)")
    return outputs[output]


def tied_weights(weights: dict) -> dict[str, tuple[str, ...]]:
    """Each weight that shares its tensor with others (same storage, offset, shape and
    strides: a tied embedding and output projection) -> all their names, in graph order."""
    groups: dict[tuple, list[str]] = {}
    for name, w in weights.items():
        if w.kind is TensorKind.parameter and w.value is not None:
            v = w.value
            key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape),
                   v.stride(), v.dtype)
            groups.setdefault(key, []).append(name)
    return {n: tuple(names) for names in groups.values() if len(names) > 1 for n in names}


def _parameters(weights: dict, tied: dict) -> tuple[str, ...]:
    """The floating-point parameters, a tied group named once (by its first name, as torch's
    ``named_parameters`` names it)."""
    names = tuple(name for name, w in weights.items()
                  if w.kind is TensorKind.parameter and w.type.dtype.is_float
                  and tied.get(name, (name,))[0] == name)
    if not names:
        raise GradError("grad: the program has no floating-point parameters; name the "
                        "inputs or weights to differentiate with wrt=[...]")
    return names


__all__ = ["GRAD_PREFIX", "GradProgram", "grad", "tied_weights"]
