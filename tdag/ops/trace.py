"""The tracer: run a Python function on symbolic Tensors and record a Program (as a jaxpr)."""
from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass
from typing import Callable

import torch

from tdag.ops.builder import Builder, active_builder
from tdag.ops.tensor import Tensor
from tdag.errors import TdagError
from tdag.ir.graph import valid_name
from tdag.ir.program import Program
from tdag.ir.types import DType, TensorKind, TensorType

# einops is optional: where it is installed, einops' functions work on traced tensors
_HAS_EINOPS = importlib.util.find_spec("einops") is not None


@dataclass(frozen=True)
class TensorSpec:
    """The type of a traced input: ``TensorSpec(("b", 3, 32, 32), "float32")``."""

    shape: tuple
    dtype: str | DType | torch.dtype = "float32"

    @property
    def type(self) -> TensorType:
        return TensorType(tuple(self.shape), DType.of(self.dtype))


def trace(fn: Callable, *specs: TensorSpec | TensorType, names=None) -> Program:
    """Trace ``fn`` (written with ``tdag.ops``) into a Program.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.exp(x) + 1.0, tdag.TensorSpec(("b", 4)))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[b,4]']
    """
    names = list(names) if names is not None else _parameter_names(fn, len(specs))
    if _HAS_EINOPS:  # defining tdag's einops backend registers it (see einops_backend)
        import tdag.ops.einops_backend  # noqa: F401, PLC0415  (einops only if installed)
    builder = Builder()
    with builder.active():
        args = [builder.input(name, spec.type if isinstance(spec, TensorSpec) else spec)
                for name, spec in zip(names, specs)]
        result = fn(*args)
    outputs = _flatten_outputs(result)
    return Program.from_tdag(builder.build(outputs))


def _parameter_names(fn: Callable, count: int) -> list[str]:
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = params[:count] if len(params) >= count else []
    if len(set(names)) != count or not all(valid_name(n) for n in names):
        names = [f"x{i}" for i in range(count)]
    return names


def _flatten_outputs(result) -> list[Tensor]:
    if isinstance(result, Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        out = []
        for item in result:
            out += _flatten_outputs(item)
        return out
    if isinstance(result, dict):
        return _flatten_outputs(list(result.values()))
    raise TdagError(f"traced function returned {type(result).__name__}; return tdag Tensors")


def param(name: str, value: torch.Tensor) -> Tensor:
    """A named parameter (learnable weight) in the graph being traced."""
    return active_builder().weight(name, TensorKind.parameter, value.detach())


def buffer(name: str, value: torch.Tensor) -> Tensor:
    """A named buffer (non-learnable state such as running statistics)."""
    return active_builder().weight(name, TensorKind.buffer, value.detach())


def const(value, dtype=None) -> Tensor:
    """A constant: a Python scalar or a torch tensor."""
    return active_builder().const(value, dtype)
