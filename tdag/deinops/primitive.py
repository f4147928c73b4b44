"""The record every primitive fills in, and the registry of primitives.

A primitive is a name with its rules attached next to it (as in JAX): the spec type (static
arguments, a frozen dataclass), a shape rule, a reference evaluator on torch tensors, a cost
formula and a one-line reason to exist.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from tdag.ir.op import Op
from tdag.ir.symbols import Dim, as_dim
from tdag.ir.types import TensorType


@dataclass(frozen=True, slots=True)
class NoSpec:
    """The spec of an op that has no static arguments."""


@dataclass(frozen=True, slots=True)
class Cost:
    """Work of one node: flops and unfused memory traffic in bytes (may be symbolic)."""

    flops: Dim = 0
    bytes_read: Dim = 0
    bytes_written: Dim = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(as_dim(self.flops + other.flops), as_dim(self.bytes_read + other.bytes_read),
                    as_dim(self.bytes_written + other.bytes_written))


# resolve: maps a (possibly symbolic) Dim in a spec to an int, given the run's symbol bindings
Resolve = Callable[[Dim], int]
ShapeRule = Callable[[object, Sequence[TensorType]], TensorType]
Evaluator = Callable[[object, Sequence[torch.Tensor], Resolve], torch.Tensor]
CostRule = Callable[[object, Sequence[TensorType], TensorType], Cost]


@dataclass(frozen=True)
class Primitive:
    op: Op
    spec_type: type
    arity: int | range  # a range for kernels with optional operands (a conv's bias)
    shape: ShapeRule
    evaluate: Evaluator
    cost: CostRule
    reason: str

    def takes(self, count: int) -> bool:
        """Whether ``count`` operands are accepted."""
        return count in self.arity if isinstance(self.arity, range) else count == self.arity


REGISTRY: dict[Op, Primitive] = {}


def primitive(op: Op, spec_type: type, arity: int | range, shape: ShapeRule, evaluate: Evaluator,
              cost: CostRule, reason: str) -> Primitive:
    """Register a primitive; called once per op by the family modules."""
    assert op not in REGISTRY, f"{op} registered twice"
    prim = Primitive(op, spec_type, arity, shape, evaluate, cost, reason)
    REGISTRY[op] = prim
    return prim


def traffic(in_types: Sequence[TensorType], out: TensorType, flops: Dim = 0) -> Cost:
    """Unfused cost: every input is read once and the output written once."""
    read: Dim = 0
    for t in in_types:
        read = as_dim(read + t.nbytes)
    return Cost(as_dim(flops), read, out.nbytes)


def elementwise_cost(spec, in_types: Sequence[TensorType], out: TensorType) -> Cost:
    """One flop per output element (transcendentals included, as fvcore counts them)."""
    return traffic(in_types, out, out.numel)


def movement_cost(spec, in_types: Sequence[TensorType], out: TensorType) -> Cost:
    """No arithmetic; unfused, the output is materialised."""
    return traffic(in_types, out)
