"""Small helpers the records' emitters share.

Torch emitters return one Python expression (``(node, args, code) -> str``): these format
literals, dtypes and tuples. ONNX emitters build nodes through the GraphBuilder they are
given (``g.node``, ``g.const``, ``g.cast``, ``g.filled``), so they need no helper here.
"""
from __future__ import annotations

import math

import torch

from tdag.ir.types import DType


def literal(value, dtype: DType | None = None) -> str:
    """A Python literal for a scalar (inf and nan included) that reads back exactly.

    With a float ``dtype`` (the tensor's the scalar meets) a float is first rounded to it, as
    torch rounds a scalar operand, but without torch's overflow check: a value kept as its
    shortest float32 decimal, such as -3.4028235e+38 for float32's lowest, lies past float32's
    range as a Python float and torch refuses it; its float32 value is exact and in range.

    >>> literal(-3.4028235e+38, DType.f32), literal(0.1), literal(float("-inf"), DType.f16)
    ('-3.4028234663852886e+38', '0.1', "float('-inf')")
    """
    if isinstance(value, float) and dtype is not None and dtype.is_float:
        value = torch.tensor(value, dtype=torch.float64).to(dtype.torch).item()
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
