"""Running a Program on JAX arrays: TDAGs through their records' JAX emitters, controllers as
JAX control flow (``staged``) or as Python control flow.

A staged program traces into one jittable function: If -> ``lax.cond``, a counted Loop ->
``lax.scan`` (its scanned outputs are the scan's), a while Loop -> ``lax.while_loop``, Call ->
inlined; the state dict rides along as a pytree. A program with a size only data decides
(``staging_problem`` says which) runs its controllers in Python, as ``tdag.run`` does, and
jits each TDAG without such a size on its own.
Both mirror ``tdag/ir/interpreter.py``: the state a step writes is visible to the steps after
it, a block's inputs shadow state of the same name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from tdag.errors import InvalidModelError, TdagError
from tdag.ir.graph import TDAG
from tdag.ir.interpreter import bind_fresh
from tdag.ir.program import Block, Call, If, Loop, Program, all_steps
from tdag.ir.record import REGISTRY, Trait
from tdag.ir.symbols import evaluate, is_static
from tdag.ir.types import DType
from tdag.ir.verify import block_types
from tdag.reify.jax.context import JaxContext, jax_dtype

# weights of one TDAG by name: (graph name, weight name) -> array
Weights = Callable[[str, str], jax.Array]


def staging_problem(prog: Program) -> str | None:
    """Why ``prog`` cannot trace into one jitted function, or None when it can. Carried
    values, branch results and state keep their types (the verifier checks it), so only a
    size that data decides stands in the way: a fresh size, or a while loop's trip count
    where it stacks its trips' outputs."""
    for gname, graph in prog.graphs.items():
        for node in graph.nodes:
            if REGISTRY[node.op].has(Trait.FRESH_SIZE):
                return (f"node %{node.name} ({node.op.value}) of TDAG {gname!r} makes a size "
                        "that only data decides")
    if any(isinstance(s, Loop) and s.cond is not None and s.scanned for s in all_steps(prog.main)):
        return "a while loop stacks its trips' outputs: data decides how many"
    return None


def bind_shapes(values, arrays, bound: Mapping) -> dict:
    """The bindings extended by the symbols of ``values``' shapes, read from ``arrays`` (the
    types were checked at the program's boundary and by the verifier)."""
    out = dict(bound)
    for value, array in zip(values, arrays):
        for dim, size in zip(value.type.shape, array.shape):
            if not is_static(dim) and dim.is_Symbol:
                out[dim.name] = int(size)
    return out


def run_graph(graph: TDAG, args: Sequence, weights: Mapping, bindings: Mapping,
              where: str) -> list:
    """Every node of ``graph`` through its record's JAX emitter; each result's dtype and
    shape are checked against the node's type at trace time (free under jit)."""
    bound = bind_shapes(graph.inputs, args, bindings)
    cx = JaxContext(lambda dim: evaluate(dim, bound))
    env = dict(weights)
    env.update((v.name, a) for v, a in zip(graph.inputs, args))
    for node in graph.nodes:
        rec = REGISTRY[node.op]
        try:
            out = rec.jax(node, [env[n] for n in node.inputs], cx)
        except TdagError:
            raise
        except jax.errors.ConcretizationTypeError as exc:
            raise TdagError(f"{node.op.value} needs a concrete value under jit "
                            f"({where}): {exc}", node=node.name, origin=node.origin) from None
        except (TypeError, ValueError, IndexError) as exc:
            raise TdagError(f"{node.op.value} failed in JAX ({where}): {exc}",
                            node=node.name, origin=node.origin) from exc
        if rec.has(Trait.FRESH_SIZE):
            bind_fresh(node, out, bound)
        _check_result(node, out, cx)
        env[node.name] = out
    return [env[name] for name in graph.outputs]


def _check_result(node, out, cx: JaxContext) -> None:
    want = (cx.shape(node.type.shape), jax_dtype(node.type.dtype))
    if (tuple(out.shape), out.dtype) != want:
        raise TdagError(f"{node.op.value}: the JAX emitter gave {out.dtype}{list(out.shape)}, "
                        f"the node's type is {node.type} = {want[1]}{list(want[0])}",
                        node=node.name, origin=node.origin)


@dataclass
class Runner:
    """Runs the blocks of one Program with ``weights``; ``staged``: JAX control flow (the
    whole run is one trace), else Python control flow with each TDAG called through
    ``call_cache`` (a jitted function per TDAG that has no run-time size)."""

    prog: Program
    weights: Weights
    staged: bool
    call_cache: dict = field(default_factory=dict)

    def block(self, block: Block, args: list, store: Mapping, bound: Mapping) -> tuple:
        """``(outputs, new store)``; the store is copied, never changed in place."""
        bound = bind_shapes(block.inputs, args, bound)
        store = dict(store)
        env = dict(store)
        env.update((v.name, a) for v, a in zip(block.inputs, args))
        inputs = {v.name for v in block.inputs}
        for step in block.steps:
            outs, store = self.step(step, [env[n] for n in step.inputs], env, store, bound)
            if not isinstance(step, Call):  # a branch or loop body may have written state
                env.update((k, store[k]) for k in self.prog.state if k in store
                           and k not in inputs)
            for name, value in zip(step.outputs, outs):
                env[name] = value
                if name in self.prog.state:
                    store[name] = value
        return [env[name] for name in block.outputs], store

    def step(self, step, args: list, env: Mapping, store: dict, bound: Mapping) -> tuple:
        if isinstance(step, Call):
            return self.call(step, args, bound), store
        if isinstance(step, If):
            return self.branch(step, args, env[step.cond], store, bound)
        if isinstance(step, Loop):
            return self.loop(step, args, env, store, bound)
        raise InvalidModelError(f"unknown controller {type(step).__name__}")

    def call(self, step: Call, args: list, bound: Mapping) -> list:
        graph = self.prog.graphs[step.graph]
        weights = {name: self.weights(step.graph, name) for name in graph.weights}
        where = f"call {step.graph}"
        if self.staged or _has_fresh_size(graph):
            return run_graph(graph, args, weights, bound, where)
        if step.graph not in self.call_cache:
            self.call_cache[step.graph] = jax.jit(
                lambda w, a, b, g=graph, at=where: run_graph(g, a, w, dict(b), at),
                static_argnums=2)
        return self.call_cache[step.graph](weights, args, tuple(sorted(bound.items())))

    def branch(self, step: If, args: list, cond, store: dict, bound: Mapping) -> tuple:
        if not self.staged:
            taken = step.then_branch if bool(cond) else step.else_branch
            return self.block(taken, args, store, bound)
        then, other = ((lambda ops, b=b: self.block(b, ops[0], ops[1], bound))
                       for b in (step.then_branch, step.else_branch))
        return lax.cond(jnp.reshape(cond, ()).astype(bool), then, other, (args, store))

    def loop(self, loop: Loop, carried: list, env: Mapping, store: dict, bound: Mapping):
        count = evaluate(loop.count, bound) if loop.count is not None else None
        if not self.staged:
            return self.python_loop(loop, carried, env, store, bound, count)
        if loop.cond is None:
            return self.scan(loop, carried, store, bound, count)
        return self.while_loop(loop, carried, env[loop.cond], store, bound, count)

    def scan(self, loop: Loop, carried: list, store: dict, bound: Mapping, count: int):
        """A counted loop: its scanned outputs are the scan's stacked ones."""
        kept = len(carried)

        def trip(carry, i):
            outs, new_store = self.block(loop.body, [i, *carry[0]], carry[1], bound)
            return (outs[:kept], new_store), outs[kept:]

        (carried, store), stacked = lax.scan(trip, (carried, store), _trips(count))
        return [*carried, *stacked], store

    def while_loop(self, loop: Loop, carried: list, keep, store: dict, bound: Mapping,
                   count: int | None):
        def going(carry):
            i, keep = carry[0], carry[1]
            return keep if count is None else keep & (i < count)

        def trip(carry):
            i, _, values, old_store = carry
            outs, new_store = self.block(loop.body, [i, *values], old_store, bound)
            return i + 1, _scalar_bool(outs[0]), outs[1:], new_store

        start = (_index(0), _scalar_bool(keep), carried, store)
        _, _, carried, store = lax.while_loop(going, trip, start)
        return list(carried), store

    def python_loop(self, loop: Loop, carried: list, env: Mapping, store: dict,
                    bound: Mapping, count: int | None):
        """The interpreter's loop on JAX arrays: any carried shape, any trip count."""
        going = loop.cond is None or bool(env[loop.cond])
        trips: list[list] = []  # the scanned outputs of each trip
        while going and (count is None or len(trips) < count):
            outs, store = self.block(loop.body, [_index(len(trips)), *carried], store, bound)
            if loop.cond is not None:
                going, outs = bool(outs[0]), outs[1:]
            carried, scans = list(outs[:len(carried)]), outs[len(carried):]
            trips.append(scans)
        columns = zip(*trips) if trips else [None] * loop.scanned
        return carried + [self.empty_scan(loop, j, bound) if column is None
                          else jnp.stack(column) for j, column in enumerate(columns)], store

    def empty_scan(self, loop: Loop, j: int, bound: Mapping):
        """A scanned output of a loop that ran no trip: empty, of the body's type."""
        k = (1 if loop.cond else 0) + len(loop.inputs) + j
        t = block_types(self.prog, loop.body)[k]
        shape = tuple(evaluate(d, bound) for d in t.shape)
        return jnp.zeros((0, *shape), jax_dtype(t.dtype))


def _has_fresh_size(graph: TDAG) -> bool:
    return any(REGISTRY[n.op].has(Trait.FRESH_SIZE) for n in graph.nodes)


def _index(i) -> jax.Array:
    """A loop body's trip number: an i64 scalar, as the body's first input declares."""
    return jnp.asarray(i, jax_dtype(DType.i64))


def _trips(count: int) -> jax.Array:
    return jnp.arange(count, dtype=jax_dtype(DType.i64))


def _scalar_bool(value) -> jax.Array:
    return jnp.reshape(value, ()).astype(bool)
