"""Creation: tensors made from sizes and values rather than from an operand.

``iota`` (the primitive), ``arange`` (iota scaled and shifted, as torch rounds it), ``full``,
``zeros`` and ``ones`` (a const broadcast), and sizes as scalar tensors: ``size_tensor`` (the
element count over some axes of a tensor) and ``dim_tensor`` (a symbolic size expression
computed at run time). They build on the primitive wrappers of ``core``; ``core`` does not
import this module (``core.axis_length``, which ``gather`` needs, stays there).
"""
from __future__ import annotations

import builtins
import math

import sympy

from tdag.ops.builder import Builder, active_builder
from tdag.ops.core import (
    add,
    axis_length,
    broadcast_to,
    cast,
    ceil,
    floor,
    mul,
    pow,
    remainder,
    sum,
)
from tdag.ops.tensor import Tensor
from tdag.deinops.indexing import Iota
from tdag.errors import UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.symbols import Dim, as_dim, floordiv, is_static, product
from tdag.ir.types import DType


def iota(length: Dim, dtype="i64", builder: Builder | None = None) -> Tensor:
    return (builder or active_builder()).emit(Op.iota, Iota(as_dim(length), DType.of(dtype)))


def arange(start, stop=None, step=1, dtype=None, like: Tensor | None = None) -> Tensor:
    """``torch.arange``; the length may be symbolic."""
    if stop is None:
        start, stop = 0, start
    builder = like.builder if like is not None else active_builder()
    floats = any(isinstance(v, float) for v in (start, stop, step))
    dtype = DType.of(dtype if dtype is not None else (DType.f32 if floats else DType.i64))
    if floats:
        length = builtins.max(0, math.ceil((stop - start) / step))
    elif isinstance(step, int) and step > 0:  # symbolic bounds: ceil((stop - start) / step)
        length = as_dim(floordiv(as_dim(stop - start + step - 1), step))
        if is_static(length):
            length = builtins.max(0, length)
    else:
        length = builtins.max(0, -(-(stop - start) // step))
    if not dtype.is_float:
        x = iota(length, dtype, builder)
        x = mul(x, step) if step != 1 else x
        return add(x, start) if start != 0 else x
    # as torch: start + step * i in double, then rounded once to dtype
    x = iota(length, DType.f64, builder)
    x = mul(x, float(step)) if step != 1 else x
    x = add(x, float(start)) if start != 0 else x
    return cast(x, dtype)


def full(shape, value, dtype=None, like: Tensor | None = None) -> Tensor:
    builder = like.builder if like is not None else active_builder()
    return broadcast_to(builder.const(value, dtype), shape)


def zeros(shape, dtype="f32", like=None) -> Tensor:
    return full(shape, 0, dtype, like)


def ones(shape, dtype="f32", like=None) -> Tensor:
    return full(shape, 1, dtype, like)


def size_tensor(x: Tensor, axes, dtype="f32") -> Tensor:
    """The number of elements over ``axes`` as a scalar tensor (symbolic sizes included)."""
    count = product(x.shape[a] for a in axes)
    if is_static(count):
        return x.builder.const(count, dtype)
    result = None
    for a in axes:
        d = axis_length(x, a, dtype)
        result = d if result is None else mul(result, d)
    return result


def dim_tensor(expr: sympy.Expr) -> Tensor:
    """A scalar i64 tensor equal to the symbolic size ``expr`` at run time."""
    builder = active_builder()
    if expr.is_Integer:
        return builder.const(int(expr))
    if expr.is_Number:
        return builder.const(float(expr))
    if expr.is_Symbol:
        return sum(full((expr,), 1, "i64", like=None))
    parts = [dim_tensor(a) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return _fold_left(add, parts)
    if isinstance(expr, sympy.Mul):
        return _fold_left(mul, parts)
    if isinstance(expr, sympy.Pow):
        return pow(cast(parts[0], "f32"), parts[1])
    if isinstance(expr, sympy.floor):
        return floor(parts[0])
    if isinstance(expr, sympy.ceiling):
        return ceil(parts[0])
    if isinstance(expr, sympy.Mod):
        return remainder(*parts)
    raise UnsupportedOpError(f"a size expression tdag cannot compute: {expr}")


def _fold_left(fn, parts):
    result = parts[0]
    for p in parts[1:]:
        result = fn(result, p)
    return result
