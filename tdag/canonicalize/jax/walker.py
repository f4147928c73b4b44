"""The JAX walker: a flat equation list (jax/trace.py) converted into a Block.

Each straight run of equations becomes a TDAG ("segment"), built with tdag's Builder
through the primitive table (jax/ops/); an equation whose primitive is in ``CONTROL``
(``cond``, ``while``, ``scan``: jax/control.py registers them) becomes a controller whose
bodies are walked by nested walkers. A value in the walker's environment is a Tensor of the
current segment, a Boundary (a value of the enclosing Block: one of its inputs or an
earlier step's output), a Held weight, a Lit, or _POISONED (the result of an equation tdag
could not convert).
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.common.registry import Registry
from tdag.canonicalize.common.segments import Boundary, SegmentEnv
from tdag.canonicalize.jax.ops.table import OPS, EqnContext
from tdag.canonicalize.jax.trace import Eqn, Held, Lit, Ref, as_torch, type_of
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.errors import (
    ConversionError,
    InvalidModelError,
    ShapeError,
    TdagError,
    UnsupportedOpError,
)
from tdag.ir.graph import Value
from tdag.ir.names import FreshNames
from tdag.ir.program import Block, Call
from tdag.ir.types import DType, Origin, TensorType
from tdag.refine.dataflow import prune

# primitive -> fn(walker, eqn, index): binds the equation's outputs to the controller's
CONTROL = Registry("the JAX control-flow table")


class _Poisoned:
    """The result of an equation that could not be converted; its users are skipped."""


_POISONED = _Poisoned()
_FOREVER = 1 << 62  # the last use of a block output: after every equation


class Shared:
    """What the walkers of a program share: its TDAGs, block-level names and problems."""

    def __init__(self, traced):
        self.traced = traced
        self.graphs: dict = {}
        self.problems: list = []  # (primitive, source line, what)
        # block-level names (inputs, controllers' outputs) never a weight's: a TDAG has both
        self.names = FreshNames(h.name for h in traced.held.values())
        self.graph_names = FreshNames()

    def fresh(self, hint: str = "v") -> str:
        return self.names.fresh(hint)

    def graph_name(self, hint: str) -> str:
        return self.graph_names.fresh(hint)


class Walker:
    """Converts a flat equation list into a Block: segments joined by controllers."""

    def __init__(self, shared: Shared, prefix: str, env: dict):
        self.shared, self.prefix, self.env = shared, prefix, SegmentEnv(env)
        self.builder, self.local = Builder(), {}
        self.steps: list = []
        self.last: dict = {}

    def block(self, inputs: list, eqns: list, outs: list) -> Block:
        self.last = _last_uses(eqns, outs)
        for value in inputs:  # the first segment takes the block's inputs in their order
            self.read_outer(value)
        for index, eqn in enumerate(eqns):
            if eqn.prim in CONTROL:
                self._controller(eqn, index)
            else:
                self._convert(eqn)
        names = [self._output(o) for o in outs]
        self.close(len(eqns))
        names = [self.env[k].name if isinstance(k, Ref) and isinstance(self.env[k], Boundary)
                 else None for k in names]
        if any(n is None for n in names):  # a body with holes (reported already)
            raise Holes()
        return Block(tuple(Value(v.name, v.type) for v in inputs), tuple(self.steps),
                     tuple(names))

    def _output(self, operand):
        """The Ref an output reads, made a value of this segment if it is a weight or a
        literal (a block returns names, so these become tensors of the last segment)."""
        value = self.env.get(operand) if isinstance(operand, Ref) else operand
        if isinstance(value, (Tensor, Boundary)) or value is _POISONED:
            return operand
        ref = Ref(None)
        self.env[ref] = self.read(operand)
        self.last[ref] = _FOREVER  # read by the block's outputs
        return ref

    # -- segments ---------------------------------------------------------------------------------

    def close(self, index: int, keep=()) -> None:
        """End the current segment: its tensors read at ``index`` or later (or in ``keep``)
        become its TDAG's outputs, named in the block."""
        keep = set(keep)
        made = [(ref, self.env[ref]) for ref in self.env.take_recent()]
        live = [(ref, value) for ref, value in made
                if isinstance(value, Tensor) and value.builder is self.builder and
                (self.last.get(ref, -1) >= index or ref in keep)]
        outs = list({value.name: value for _, value in live}.values())  # each tensor once
        if outs or self.builder.nodes:
            graph = prune(self.builder.build(outs))
            name = self.shared.graph_name(self.prefix)
            self.shared.graphs[name] = graph
            block_names = {t.name: self.shared.fresh() for t in outs}
            self.steps.append(Call(name, tuple(v.name for v in graph.inputs),
                                   tuple(block_names[t.name] for t in outs)))
            for ref, value in live:
                self.env[ref] = Boundary(block_names[value.name], value.type)
        self.env.take_recent()  # the Outers just bound belong to no segment
        self.builder, self.local = Builder(), {}

    def read(self, operand) -> Tensor:
        """An operand as a tensor of the current segment."""
        value = self.env.get(operand, _POISONED) if isinstance(operand, Ref) else operand
        if isinstance(value, Tensor):
            return value
        if isinstance(value, Boundary):
            return self.read_outer(value)
        if isinstance(value, Held):
            if value.name not in self.local:
                self.local[value.name] = self.builder.weight(value.name, value.kind,
                                                             value.value)
            return self.local[value.name]
        if isinstance(value, Lit):
            return self._literal(value.value)
        raise Holes()

    def read_outer(self, value: Boundary) -> Tensor:
        if value.name not in self.local:
            self.local[value.name] = self.builder.input(value.name, value.type)
        return self.local[value.name]

    def _literal(self, array: np.ndarray) -> Tensor:
        if array.ndim == 0:
            return self.builder.const(array.item(), DType.of(array.dtype.name))
        return self.builder.const(as_torch(array))

    def pin(self, operand) -> Ref:
        """A Ref whose value is a Tensor or a Boundary (a weight or literal made a tensor of
        the segment), so that the next ``close`` hands it to the block."""
        value = self.env.get(operand) if isinstance(operand, Ref) else None
        if isinstance(value, (Tensor, Boundary)):
            return operand
        ref = Ref(operand.aval if isinstance(operand, Ref) else None)
        with self.builder.active():
            self.env[ref] = self.read(operand)
        return ref

    def known(self, operand):
        """An operand's value as a numpy array where it is known at import time."""
        value = self.env.get(operand) if isinstance(operand, Ref) else operand
        if isinstance(value, Lit):
            return value.value
        if isinstance(value, Held) and value.value.numel() <= 64:
            return value.value.numpy()
        return None

    # -- equations --------------------------------------------------------------------------------

    def _convert(self, eqn: Eqn) -> None:
        if any(isinstance(x, Ref) and self.env.get(x) is _POISONED for x in eqn.ins):
            self._poison(eqn)
            return
        origin = Origin(op=f"jax.{eqn.prim}", scope=eqn.scope, location=eqn.where)
        try:
            with self.builder.active(), self.builder.scope(origin):
                inputs = [self.read(x) for x in eqn.ins]
                ctx = EqnContext(eqn, self.builder, [self.known(x) for x in eqn.ins])
                result = OPS[eqn.prim](ctx, *inputs)
                results = list(result) if isinstance(result, (list, tuple)) else [result]
                for k, (ref, value) in enumerate(zip(eqn.outs, results)):
                    self.env[ref] = _checked(eqn, k, value)
        except (UnsupportedOpError, NotImplementedError, ShapeError) as exc:
            self.report(eqn, exc)
        except TdagError as exc:
            raise InvalidModelError(f"jax.{eqn.prim} at {eqn.where}: {exc.message}") from exc
        except Exception as exc:  # a gap in tdag's table, not in the function
            raise ConversionError(f"jax.{eqn.prim} at {eqn.where}: {type(exc).__name__}: "
                                  f"{exc}") from exc

    def report(self, eqn: Eqn, exc: Exception) -> None:
        what = exc.message if isinstance(exc, TdagError) else str(exc)
        self.shared.problems.append((eqn.prim, eqn.where, what))
        self._poison(eqn)

    def _poison(self, eqn: Eqn) -> None:
        for ref in eqn.outs:
            self.env[ref] = _POISONED

    def _controller(self, eqn: Eqn, index: int) -> None:
        if any(isinstance(x, Ref) and self.env.get(x) is _POISONED for x in eqn.ins):
            self._poison(eqn)
            return
        try:
            CONTROL[eqn.prim](self, eqn, index)
        except Holes:
            self.report(eqn, UnsupportedOpError("its body holds the unsupported uses listed"))
        except (UnsupportedOpError, ShapeError) as exc:
            self.report(eqn, exc)

    def nested(self, hint: str, env: dict) -> "Walker":
        """A walker for a body, seeing the weights and literals of this one."""
        passed = {k: v for k, v in self.env.items() if isinstance(v, (Held, Lit))}
        return Walker(self.shared, self.shared.graph_name(f"{self.prefix}_{hint}"),
                      {**passed, **env})


class Holes(Exception):
    """A body or output that reads a value tdag could not compute (reported already)."""


def _checked(eqn: Eqn, k: int, value: Tensor) -> Tensor:
    """The result in jax's dtype; another shape is a ShapeError naming the primitive."""
    want = type_of(eqn.outs[k].aval)
    if not isinstance(value, Tensor):
        raise UnsupportedOpError(f"{eqn.prim}: result {k} is not computed")
    if len(want.shape) != value.ndim or not TensorType(value.shape, want.dtype).same_as(want):
        raise ShapeError(f"{eqn.prim}: computed {value.type}, jax says {want}")
    return ops.cast(value, want.dtype)


def _last_uses(eqns: list, outs: list) -> dict:
    last: dict = {}
    for index, eqn in enumerate(eqns):
        for x in eqn.ins:
            if isinstance(x, Ref):
                last[x] = index
    for x in outs:
        if isinstance(x, Ref):
            last[x] = len(eqns)
    return last
