"""The symbolic value of a TDAG under construction: its builder, its name and its type.

This module holds the data only. The operators (``x + y``, ``x[i]``, ``x.reshape(...)``,
``x.T``) are compositions, so the package that defines them installs them on the class
(``tdag/ops/tensor_methods.py``, run by ``tdag/ops/__init__.py``): nothing here imports up.
"""
from __future__ import annotations

from tdag.errors import TdagError
from tdag.ir.types import DType, TensorType


class Tensor:
    """A value in a TDAG under construction. Arithmetic operators emit nodes (see tdag.ops)."""

    __slots__ = ("builder", "name", "type")

    def __init__(self, builder, name: str, type: TensorType):
        # builder: the tdag.ops.builder.Builder that made it (not imported: it imports this)
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

    # == compares elementwise (installed with the operators), so hashing is by identity
    __hash__ = object.__hash__

    def __bool__(self):
        raise TdagError("a traced tensor has no truth value: data-dependent control flow "
                        "belongs in a controller (an If or Loop of tdag.Program), not in "
                        "Python `if`")
