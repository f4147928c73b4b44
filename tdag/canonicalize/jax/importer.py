"""``from_jax``: a JAX function, traced to a jaxpr and walked equation by equation.

The flat equation list (jax/trace.py) is walked by jax/walker.py: each straight run of
equations becomes a TDAG ("segment") through the primitive table (jax/ops/); ``cond``,
``while`` and ``scan`` become If and Loop controllers (jax/control.py) whose bodies are
walked by nested walkers. Unsupported primitives are collected over the whole program (inside
control-flow bodies too) before converting anything, and reported in one
UnsupportedOpError, each with its source line.
"""
from __future__ import annotations

import tdag.canonicalize.jax.control  # noqa: F401  (registers cond, while and scan in CONTROL)
from tdag.canonicalize.common.segments import Boundary, finished_program
from tdag.canonicalize.jax.ops import OPS  # the package imports every family: the table is full
from tdag.canonicalize.jax.trace import INLINED, source_line, trace, type_of
from tdag.canonicalize.jax.walker import CONTROL, Holes, Shared, Walker
from tdag.errors import UnsupportedOpError
from tdag.ir.program import Program


def from_jax(fn, *example_args, dynamic_shapes: dict | None = None) -> Program:
    """Canonicalize a JAX function, traced on ``example_args``, into a tdag Program.

    Each argument that is an array (numpy, jax, or a ``jax.ShapeDtypeStruct``) is an input
    of the Program, named after ``fn``'s parameter. Any other argument is a pytree of
    weights: each leaf becomes a weight named by its dotted tree path. In a flax
    ``variables`` dict (a tree with a ``params`` key) the leaves under ``params`` are
    parameters (``params.Dense_0.kernel``) and those of any other collection buffers
    (``batch_stats.BatchNorm_0.mean``); in any other tree they are parameters, under the
    argument's name where the root is not keyed by name (``weights.0``). Arrays ``fn``
    closes over are consts. The outputs are the leaves of
    ``fn``'s result, in pytree order.

    ``dynamic_shapes`` maps an input's index to ``{axis: "name"}``: the axis is traced as a
    ``jax.export`` symbolic dimension and stays a symbol in the Program. Control flow
    becomes controllers: ``lax.cond`` an If, ``lax.while_loop`` a Loop with a condition,
    ``lax.scan`` a counted Loop with stacked outputs; ``jit``, ``custom_jvp``/``custom_vjp``
    (their primal function) and ``remat`` are inlined.

    >>> import jax.numpy as jnp, numpy as np, tdag
    >>> prog = tdag.from_jax(lambda x: jnp.tanh(x) * 2, np.ones((2, 3), np.float32))
    >>> [str(t) for t in prog.input_types], [str(t) for t in prog.graph.output_types]
    (['f32[2,3]'], ['f32[2,3]'])
    """
    traced = trace(fn, example_args, dynamic_shapes)
    shared = Shared(traced)
    _precheck(traced.eqns, shared)
    walker = Walker(shared, "main", dict(traced.held))
    inputs = []
    for name, ref in traced.inputs:
        walker.env[ref] = Boundary(shared.fresh(name), type_of(ref.aval))
        inputs.append(walker.env[ref])
    try:
        block = walker.block(inputs, traced.eqns, traced.outs)
    except Holes:  # an output tdag could not compute: the problems say why
        pass
    if shared.problems:
        raise unsupported_error(shared.problems)
    return finished_program(shared.graphs, block, "the jaxpr")


def _precheck(eqns: list, shared: Shared) -> None:
    """Report every primitive the table lacks (inside control-flow bodies too) before
    converting anything."""
    for prim, where in _all_prims(eqns):
        if prim not in OPS and prim not in CONTROL and prim not in INLINED:
            shared.problems.append((prim, where, "no tdag mapping"))
    if shared.problems:
        raise unsupported_error(shared.problems)


def _all_prims(eqns: list):
    """(primitive, source line) of every flat equation and of those in control-flow bodies."""
    for eqn in eqns:
        yield eqn.prim, eqn.where
        if eqn.prim in CONTROL:
            yield from _body_prims(eqn.params, eqn.where)


def _body_prims(params: dict, outer: str):
    for value in params.values():
        for inner in value if isinstance(value, (tuple, list)) else (value,):
            for raw in getattr(getattr(inner, "jaxpr", inner), "eqns", ()):
                where = source_line(raw.source_info) or outer
                yield raw.primitive.name, where
                if raw.primitive.name in CONTROL or raw.primitive.name in INLINED:
                    yield from _body_prims(raw.params, where)


def unsupported_error(problems) -> UnsupportedOpError:
    """One error naming every unsupported primitive use with its source line."""
    lines = [f"  {prim} at {where}: {what}" for prim, where, what in problems]
    kinds = sorted({prim for prim, _, _ in problems})
    error = UnsupportedOpError(f"{len(problems)} unsupported JAX primitive use(s) "
                               f"({', '.join(kinds)}):\n" + "\n".join(lines))
    error.problems = list(problems)
    return error
