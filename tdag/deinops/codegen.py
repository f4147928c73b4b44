"""Small helpers the records' emitters share.

Torch emitters return one Python expression (``(node, args, code) -> str``): these format
literals, dtypes and tuples. ONNX emitters build nodes through the GraphBuilder they are
given (``g.node``, ``g.const``, ``g.cast``, ``g.filled``), so they need no helper here.
"""
from __future__ import annotations

import math

from tdag.ir.types import DType


def literal(value) -> str:
    """A Python literal for a scalar (inf and nan included)."""
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
    return repr(value)


def dtype_expr(dtype: DType) -> str:
    """``torch.float32`` for DType.f32."""
    return f"torch.{str(dtype.torch).split('.')[-1]}"


def tuple_expr(values) -> str:
    """A Python tuple literal: ``(3,)``, ``(1, 2)``."""
    values = list(values)
    return f"({values[0]},)" if len(values) == 1 else f"({', '.join(str(v) for v in values)})"


def last_two(rank: int) -> list[int]:
    """The permutation that swaps the last two of ``rank`` axes (a matrix transpose)."""
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return perm


__all__ = ["dtype_expr", "last_two", "literal", "tuple_expr"]
