"""``to_jax(prog)``: a Program as a jittable JAX function, its weights a pytree.

Each op's JAX emitter lives in its record (``jax=`` in ``tdag/deinops``); the controllers
become JAX control flow (``tdag/reify/jax/control.py``). This module is imported only by
``tdag.to_jax`` (lazily): ``import tdag`` never imports jax.

Symbolic sizes specialise under jit: ``fn(*inputs)`` compiles once per signature of input
shapes and dtypes (``jax.jit``'s own cache), each symbol bound to a Python int from the
shapes. A program with a size that only data decides (``nonzero``, ``arange`` of a value: the
FRESH_SIZE trait; the trip count of a while loop that stacks its trips' outputs) cannot be one
trace: it runs its controllers in Python, jitting each TDAG that has no run-time size on its
own, and ``fn.staged`` is False with ``fn.unstaged_because`` saying why; ``fn.apply`` of it
runs but cannot be jitted as a whole.

64-bit types (tdag's i64 indices, f64) need ``jax_enable_x64``: ``fn(...)`` turns it on for
its own run; trace ``fn.apply`` under ``with jax.enable_x64(True):`` (it raises otherwise,
rather than compute in 32 bits).
"""
from __future__ import annotations

import contextlib
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tdag.errors import TdagError, UnsupportedOpError
from tdag.ir.graph import TDAG, Weight
from tdag.ir.interpreter import bind
from tdag.ir.program import Loop, Program, all_steps
from tdag.ir.types import DType, TensorKind
from tdag.lower.pipeline import lower as lower_program
from tdag.lower.kernels.qlinear import F64_WORK
from tdag.reify.jax.context import NO_JAX, jax_dtype, needs_x64, tdag_dtype
from tdag.reify.jax.control import Runner, staging_problem

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def to_jax(prog: Program | TDAG, lower: bool = True) -> "JaxFunction":
    """A JAX function computing ``prog``; one output returns an array, several a tuple.

    >>> import numpy as np, tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.softmax(x, -1), tdag.TensorSpec(("b", 4)))
    >>> fn = tdag.to_jax(prog)
    >>> x = np.random.rand(2, 4).astype(np.float32)
    >>> bool(np.allclose(fn(x), np.exp(x) / np.exp(x).sum(-1, keepdims=True), rtol=1e-5))
    True
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    _refuse_untyped(prog)
    if lower:  # folding consts only: ``params`` stay the source's, to train or to swap
        prog = lower_program(prog, final=("fold_consts",))
    return JaxFunction(prog)


class JaxFunction:
    """A Program as a JAX function.

    - ``fn(*inputs)``: the outputs, run by a ``jax.jit``-compiled ``apply`` (inputs are
      checked against the Program's types first: a ShapeError names a wrong one);
      ``fn(*inputs, state=s)`` returns ``(outputs, new_state)`` as ``tdag.run(...,
      return_state=True)`` does, ``s`` overriding entries of the initial ``fn.state``;
    - ``fn.apply(params, *inputs, state=None)``: the same, pure: jittable and differentiable
      with respect to ``params``;
    - ``fn.params``: parameters and buffers by their source names (a dict of arrays);
      ``fn.consts``: the constants, ``fn.state``: the program state's initial values.
    """

    def __init__(self, prog: Program):
        self.program = prog
        self.x64 = needs_x64(_dtypes(prog))
        with self._precision():
            self.params, self.consts = _weights(prog)
            self.state = {name: _array(name, w) for name, w in prog.state.items()}
        self.unstaged_because = staging_problem(prog)
        self.staged = self.unstaged_because is None
        self._calls: dict = {}  # per-TDAG jitted functions of an unstaged program
        self._jitted = jax.jit(self._run) if self.staged else self._run
        self._accepted: set = set()  # input signatures the guard has passed

    def __call__(self, *inputs, state: Mapping | None = None, return_state: bool | None = None):
        with self._precision():
            arrays = self._guard(inputs)
            outs, new_state = self._jitted(self.params, self.consts, self._state(state), *arrays)
        keep = state is not None if return_state is None else return_state
        return (outs, new_state) if keep else outs

    def apply(self, params: Mapping, *inputs, state: Mapping | None = None):
        """The outputs for ``params`` (a dict like ``fn.params``); with ``state``, the pair
        ``(outputs, new_state)``."""
        if self.x64 and not jax.config.jax_enable_x64:
            raise TdagError("to_jax: the program has 64-bit types; call apply under "
                            "`with jax.enable_x64(True):` (JAX computes in 32 bits otherwise)")
        outs, new_state = self._run(params, self.consts, self._state(state), *inputs)
        return outs if state is None else (outs, new_state)

    def _run(self, params: Mapping, consts: Mapping, state: Mapping, *inputs):
        def weight(gname: str, name: str):
            if self.program.graphs[gname].weights[name].kind is TensorKind.const:
                return consts[_const_key(gname, name)]
            return params[name]

        runner = Runner(self.program, weight, self.staged, self._calls)
        outs, store = runner.block(self.program.main, list(inputs), state, {})
        return (outs[0] if len(outs) == 1 else tuple(outs)), store

    def _precision(self):
        """64-bit types on for a program that has them (else left as the caller set them)."""
        return jax.enable_x64(True) if self.x64 else contextlib.nullcontext()

    def _state(self, state: Mapping | None) -> dict:
        return {**self.state, **(state or {})}

    def _guard(self, inputs) -> list:
        """The inputs as arrays, checked against the Program's input types (rank, dtype,
        static sizes, one value per symbol) once per signature: the interpreter's check,
        on meta tensors of the same shapes and dtypes, words a mismatch. An i64 (f64) input
        given in 32 bits, as JAX holds it without x64, is widened."""
        try:  # arrays (numpy's or JAX's): a few attribute reads, the common case
            signature = tuple((tuple(x.shape), x.dtype) for x in inputs)
        except AttributeError:  # Python scalars and lists
            signature = tuple((np.shape(x), np.asarray(x).dtype) for x in inputs)
        values = self.program.main.inputs
        wide = [_widened(v.type.dtype, dtype) for v, (_, dtype) in zip(values, signature)]
        if signature not in self._accepted:
            metas = [torch.empty(shape, device="meta", dtype=(
                         w or tdag_dtype(dtype, f"to_jax: input %{v.name}")).torch)
                     for v, (shape, dtype), w in zip(values, signature, wide)]
            if len(metas) == len(values):
                bind(values, metas, {}, "to_jax")
            else:
                bind(values, list(inputs), {}, "to_jax")  # says how many were expected
            self._accepted.add(signature)
        return [jnp.asarray(x, dtype=jax_dtype(w)) if w is not None
                else x if isinstance(x, jax.Array) else jnp.asarray(x)
                for x, w in zip(inputs, wide)]  # bind has checked the count


# what JAX makes of a 64-bit value without x64 (its default): widened back, exactly
_NARROWED = {DType.i64: np.dtype(np.int32), DType.f64: np.dtype(np.float32)}


def _widened(expected: DType, given) -> DType | None:
    """``expected`` where ``given`` is its 32-bit form as JAX holds it without x64 (an i64
    index as int32), else None: the input is taken as it is."""
    narrow = _NARROWED.get(expected)  # (np.dtype(None) is float64: no == against None)
    return expected if narrow is not None and narrow == np.dtype(given) else None


def _const_key(gname: str, name: str) -> str:
    return f"{gname}/{name}"  # consts are per TDAG: two may share a name


def _weights(prog: Program) -> tuple[dict, dict]:
    params, consts = {}, {}
    for gname, graph in prog.graphs.items():
        for name, weight in graph.weights.items():
            if weight.kind is TensorKind.const:
                consts[_const_key(gname, name)] = _array(name, weight)
            elif name not in params:
                params[name] = _array(name, weight)
    return params, consts


def _array(name: str, weight: Weight) -> jax.Array:
    """A weight's torch value as a JAX array, bit for bit (through an integer view, so
    bfloat16 and the float8 kinds, which numpy lacks, convert too)."""
    if weight.value is None:
        raise TdagError(f"to_jax: weight %{name} has no value (a shape-only or meta program "
                        "cannot run); load real weights first")
    value = weight.value.detach().cpu().contiguous()
    bits = value.view(_INT_OF_SIZE[value.element_size()]).numpy()
    return jnp.asarray(bits.view(jax_dtype(weight.type.dtype)))


def _refuse_untyped(prog: Program) -> None:
    """The first value whose dtype JAX has no type for (NO_JAX), named: JAX would refuse
    it later, at trace time, without saying which node made it."""
    for graph in prog.graphs.values():
        values = [(v.name, v.type, None) for v in graph.inputs]
        values += [(name, w.type, None) for name, w in graph.weights.items()]
        values += [(n.name, n.type, n.origin) for n in graph.nodes]
        for name, t, origin in values:
            if t.dtype in NO_JAX:
                raise UnsupportedOpError(f"to_jax: a value of type {t}: {NO_JAX[t.dtype]}",
                                         node=name, origin=origin)


def _dtypes(prog: Program):
    """Every dtype the program computes in; a loop's trip number is an i64."""
    if any(isinstance(s, Loop) for s in all_steps(prog.main)):
        yield DType.i64
    for graph in prog.graphs.values():
        yield from (v.type.dtype for v in graph.inputs)
        yield from (w.type.dtype for w in graph.weights.values())
        yield from (n.type.dtype for n in graph.nodes)
        yield from (DType.f64 for n in graph.nodes if n.op in F64_WORK)
    yield from (w.type.dtype for w in prog.state.values())
