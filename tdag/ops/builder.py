"""Building TDAGs: the Builder records nodes; a Tensor (``tdag.ops.tensor``) is a
symbolic value in it.

Every node is shape-checked as it is emitted, so an error names the node and the source
location (the origin set with ``Builder.scope``) at the point where it was made.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator, Sequence

import torch

from tdag.errors import TdagError
from tdag.ir.emit import typed_node
from tdag.ir.graph import TDAG, Node, Value, Weight, valid_name
from tdag.ir.names import FreshNames, literal
from tdag.ir.op import Op
from tdag.ir.types import DType, Origin, TensorKind, TensorType, fill_of, spec_of
from tdag.ops.tensor import Tensor

_ACTIVE: contextvars.ContextVar["Builder | None"] = contextvars.ContextVar("tdag_builder",
                                                                           default=None)


class Builder:
    """Collects inputs, weights and nodes; ``build`` returns the TDAG."""

    def __init__(self, prefix: str = ""):
        self.inputs: list[Value] = []
        self.weights: dict[str, Weight] = {}
        self.nodes: list[Node] = []
        self.origin = Origin()
        # node names count up across hints (%0, %c1, %2 ...), skipping names given or taken
        self.names = FreshNames(pattern=literal(prefix) + "{hint}{n}")
        self._scalar_consts: dict[tuple, Tensor] = {}
        self._reserved: set[str] = set()  # names a copied graph will give its nodes

    # -- names ------------------------------------------------------------------------------

    def fresh(self, hint: str = "") -> str:
        """A name no value has yet, claimed by the value it is given to."""
        return self.names.fresh(hint, take=False, avoid=self._reserved)

    def reserve(self, names) -> None:
        """Keep ``names`` for the values that will be given them by name: a pass that copies
        a graph node by node, and emits more nodes between, keeps the copied names."""
        self._reserved.update(names)

    def _claim(self, name: str) -> str:
        if not valid_name(name):
            raise TdagError(f"invalid tensor name {name!r}: use letters, digits, _ . :")
        self._reserved.discard(name)
        if not self.names.claim(name):
            raise TdagError(f"name %{name} is defined twice")
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
        name = self._claim(name) if name is not None else self._claim(self.fresh())
        for x in inputs:
            if not isinstance(x, Tensor) or x.builder is not self:
                raise TdagError(f"{op.value}: operand {x!r} is not a tensor of this graph",
                                node=name, origin=self.origin)
        node = typed_node(op, spec, [x.name for x in inputs], [x.type for x in inputs],
                          name=name, origin=self.origin)
        self.nodes.append(node)
        return Tensor(self, name, node.type)

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
