"""Nodes and TDAGs: straight-line tensor DAGs in SSA form."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Iterator, Mapping

import torch

from tdag.ir.op import Op
from tdag.ir.types import Origin, TensorKind, TensorType

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:]*\Z")


def valid_name(name: str) -> bool:
    """Names print as ``%name``: letters, digits, ``_``, ``.`` and ``:``."""
    return bool(_NAME.match(name))


@dataclass(frozen=True, slots=True)
class Node:
    """One SSA equation: ``name = op[spec](inputs)`` with its result type and provenance."""

    name: str
    op: Op
    inputs: tuple
    spec: object
    type: TensorType
    origin: Origin = Origin()

    def replace(self, **changes) -> "Node":
        return replace(self, **changes)


@dataclass(frozen=True, slots=True)
class Value:
    """A named tensor at a graph boundary."""

    name: str
    type: TensorType


@dataclass(frozen=True, slots=True)
class Weight:
    """A parameter, buffer or const. ``value`` is None for shape-only (meta) programs;
    it does not take part in equality, which compares structure."""

    kind: TensorKind
    type: TensorType
    value: torch.Tensor | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TDAG:
    """A straight-line tensor DAG: inputs, weights, nodes in topological order, outputs."""

    inputs: tuple  # tuple[Value, ...]
    weights: Mapping[str, Weight]
    nodes: tuple  # tuple[Node, ...]
    outputs: tuple  # tuple[str, ...]

    def __post_init__(self):
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "weights", dict(self.weights))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "outputs", tuple(self.outputs))

    def __hash__(self):
        return id(self)

    def replace(self, **changes) -> "TDAG":
        return replace(self, **changes)

    def types(self) -> dict[str, TensorType]:
        """The type of every name defined in this TDAG."""
        env = {v.name: v.type for v in self.inputs}
        env.update((k, w.type) for k, w in self.weights.items())
        env.update((n.name, n.type) for n in self.nodes)
        return env

    @property
    def output_types(self) -> tuple:
        env = self.types()
        return tuple(env[name] for name in self.outputs)

    def users(self) -> dict[str, list[Node]]:
        """For each name, the nodes that read it."""
        result: dict[str, list[Node]] = {}
        for node in self.nodes:
            for name in node.inputs:
                result.setdefault(name, []).append(node)
        return result

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    # str(graph) is its text form: tdag.ir.printer installs __str__ (it imports this module)
