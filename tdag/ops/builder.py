"""Building TDAGs: the Builder records nodes; a Tensor is a symbolic value in it.

Every node is shape-checked as it is emitted, so an error names the node and the source
location (the origin set with ``Builder.scope``) at the point where it was made.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator, Sequence

import torch

from tdag.errors import ShapeError, TdagError
from tdag.ir.graph import TDAG, Node, Value, Weight, valid_name
from tdag.ir.op import Op
from tdag.ir.record import REGISTRY, NoSpec
from tdag.ir.types import DType, Origin, TensorKind, TensorType, fill_of, spec_of

_ACTIVE: contextvars.ContextVar["Builder | None"] = contextvars.ContextVar("tdag_builder",
                                                                           default=None)


class Tensor:
    """A value in a TDAG under construction. Arithmetic operators emit nodes (see tdag.ops)."""

    __slots__ = ("builder", "name", "type")

    def __init__(self, builder: "Builder", name: str, type: TensorType):
        self.builder, self.name, self.type = builder, name, type

    @property
    def shape(self) -> tuple:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return self.type.rank

    def __repr__(self) -> str:
        return f"Tensor(%{self.name}: {self.type})"

    # == and != compare elementwise (as torch); without them a mask would silently be a bool
    def __eq__(self, other): return _ops().eq(self, other)
    def __ne__(self, other): return _ops().ne(self, other)
    __hash__ = object.__hash__

    # Python operators delegate to tdag.ops, which handles broadcasting and scalars.
    def __add__(self, other): return _ops().add(self, other)
    def __radd__(self, other): return _ops().add(other, self)
    def __sub__(self, other): return _ops().sub(self, other)
    def __rsub__(self, other): return _ops().sub(other, self)
    def __mul__(self, other): return _ops().mul(self, other)
    def __rmul__(self, other): return _ops().mul(other, self)
    def __truediv__(self, other): return _ops().div(self, other)
    def __rtruediv__(self, other): return _ops().div(other, self)
    def __floordiv__(self, other): return _ops().floor_divide(self, other)
    def __pow__(self, other): return _ops().pow(self, other)
    def __rpow__(self, other): return _ops().pow(other, self)
    def __neg__(self): return _ops().neg(self)
    def __abs__(self): return _ops().abs(self)
    def __matmul__(self, other): return _ops().matmul(self, other)
    def __rmatmul__(self, other): return _ops().matmul(other, self)
    def __lt__(self, other): return _ops().lt(self, other)
    def __le__(self, other): return _ops().le(self, other)
    def __gt__(self, other): return _ops().gt(self, other)
    def __ge__(self, other): return _ops().ge(self, other)
    def __getitem__(self, index): return _ops().index(self, index)

    def __bool__(self):
        raise TdagError("a traced tensor has no truth value: data-dependent control flow "
                        "belongs in a controller (an If or Loop of tdag.Program), not in "
                        "Python `if`")

    def reshape(self, *shape): return _ops().reshape(self, *shape)
    def permute(self, *perm): return _ops().permute(self, *perm)
    def transpose(self, a, b): return _ops().transpose(self, a, b)
    def sum(self, axis=None, keepdim=False): return _ops().sum(self, axis, keepdim)
    def mean(self, axis=None, keepdim=False): return _ops().mean(self, axis, keepdim)
    def max(self, axis=None, keepdim=False): return _ops().amax(self, axis, keepdim)
    def min(self, axis=None, keepdim=False): return _ops().amin(self, axis, keepdim)
    def exp(self): return _ops().exp(self)
    def log(self): return _ops().log(self)
    def astype(self, dtype): return _ops().cast(self, dtype)

    @property
    def T(self):
        return _ops().permute(self, *reversed(range(self.ndim)))


def _ops():
    # tdag.ops gathers core, arrays, nn and einops; imported late (it imports this module)
    import tdag.ops  # noqa: PLC0415
    return tdag.ops


class Builder:
    """Collects inputs, weights and nodes; ``build`` returns the TDAG."""

    def __init__(self, prefix: str = ""):
        self.inputs: list[Value] = []
        self.weights: dict[str, Weight] = {}
        self.nodes: list[Node] = []
        self.origin = Origin()
        self._taken: set[str] = set()
        self._counter = 0
        self._prefix = prefix
        self._scalar_consts: dict[tuple, Tensor] = {}

    # -- names ------------------------------------------------------------------------------

    def fresh(self, hint: str = "") -> str:
        while True:
            name = f"{self._prefix}{hint}{self._counter}"
            self._counter += 1
            if name not in self._taken:
                return name

    def _claim(self, name: str) -> str:
        if not valid_name(name):
            raise TdagError(f"invalid tensor name {name!r}: use letters, digits, _ . :")
        if name in self._taken:
            raise TdagError(f"name %{name} is defined twice")
        self._taken.add(name)
        return name

    # -- values -----------------------------------------------------------------------------

    def input(self, name: str, type: TensorType) -> Tensor:
        self.inputs.append(Value(self._claim(name), type))
        return Tensor(self, name, type)

    def weight(self, name: str, kind: TensorKind, value: torch.Tensor | None,
               type: TensorType | None = None) -> Tensor:
        """A parameter, buffer or const; ``value`` may be None (shape only) or on meta."""
        if type is None:
            type = spec_of(value)
        if value is not None and value.device.type == "meta":
            value = None
        self.weights[self._claim(name)] = Weight(kind, type, value)
        return Tensor(self, name, type)

    def const(self, value, dtype=None) -> Tensor:
        """A constant tensor; Python scalars are shared by (value, dtype)."""
        if isinstance(value, torch.Tensor):
            tensor = value.detach()
            if dtype is not None:
                tensor = tensor.to(DType.of(dtype).torch)
            fill = fill_of(tensor)
            owned = tensor.clone(memory_format=torch.contiguous_format) if fill is None else \
                fill.clone().expand(tensor.shape)
            return self.weight(self.fresh("c"), TensorKind.const, owned)
        dtype = DType.of(dtype if dtype is not None else _scalar_dtype(value))
        key = (repr(value), dtype)
        if key not in self._scalar_consts:
            tensor = torch.tensor(value, dtype=dtype.torch)
            self._scalar_consts[key] = self.weight(self.fresh("c"), TensorKind.const, tensor)
        return self._scalar_consts[key]

    def emit(self, op: Op, spec: object, *inputs: Tensor, name: str | None = None) -> Tensor:
        """Append ``op[spec](inputs)`` after checking it with the op's shape rule."""
        prim = REGISTRY[op]
        name = self._claim(name) if name is not None else self._claim(self.fresh())
        if spec is None:
            spec = NoSpec()
        if not isinstance(spec, prim.spec_type) or not prim.takes(len(inputs)):
            raise ShapeError(f"{op.value}: expected {prim.arity} inputs and a "
                             f"{prim.spec_type.__name__} spec", node=name, origin=self.origin)
        for x in inputs:
            if not isinstance(x, Tensor) or x.builder is not self:
                raise TdagError(f"{op.value}: operand {x!r} is not a tensor of this graph",
                                node=name, origin=self.origin)
        try:
            out_type = prim.shape(spec, [x.type for x in inputs])
        except ShapeError as exc:
            raise ShapeError(f"{exc.args[0]} (operands: "
                             f"{', '.join(f'%{x.name}: {x.type}' for x in inputs)})",
                             node=name, origin=self.origin) from None
        self.nodes.append(Node(name, op, tuple(x.name for x in inputs), spec, out_type,
                               self.origin))
        return Tensor(self, name, out_type)

    @contextlib.contextmanager
    def scope(self, origin: Origin) -> Iterator[None]:
        """Nodes emitted inside carry ``origin`` as their provenance."""
        saved, self.origin = self.origin, origin
        try:
            yield
        finally:
            self.origin = saved

    @contextlib.contextmanager
    def active(self) -> Iterator["Builder"]:
        """Make this the builder that value-less ops (``ops.arange``) emit into."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def build(self, outputs: Sequence[Tensor]) -> TDAG:
        for x in outputs:
            if not isinstance(x, Tensor) or x.builder is not self:
                raise TdagError(f"output {x!r} is not a tensor of this graph")
        used = {name for node in self.nodes for name in node.inputs} | {x.name for x in outputs}
        weights = {k: w for k, w in self.weights.items()
                   if w.kind is not TensorKind.const or k in used}
        return TDAG(tuple(self.inputs), weights, tuple(self.nodes),
                    tuple(x.name for x in outputs))


def active_builder() -> Builder:
    builder = _ACTIVE.get()
    if builder is None:
        raise TdagError("no graph is being built: call this inside tdag.trace")
    return builder


def _scalar_dtype(value) -> DType:
    if isinstance(value, bool):
        return DType.bool
    if isinstance(value, int):
        return DType.i64
    if isinstance(value, float) or math.isinf(value):
        return DType.f32
    raise TdagError(f"not a scalar: {value!r}")
