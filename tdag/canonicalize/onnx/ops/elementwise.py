"""ONNX elementwise ops: math functions (Neg, Abs, Sqrt, Reciprocal, Exp, Log, Tanh, Erf, Sin,
Cos, Tan, Asin, Acos, Atan, Sinh, Cosh, Asinh, Acosh, Atanh, Floor, Ceil, Round, Sign),
arithmetic (Add, Sub, Mul, Div, Pow, Mod, Max, Min, Sum, Mean, Clip), comparisons (Equal,
Less, Greater, LessOrEqual, GreaterOrEqual), logic (Not, And, Or, Xor), tests (IsNaN, IsInf),
Where, Cast and CastLike. Bit arithmetic is in onnx/ops/bitwise.py, activations (Relu,
Sigmoid, ...) in onnx/ops/activations.py.

Shape values (Knowns) fold here where both operands are ones: a count of axes negated, a
shape's entries multiplied (onnx/values.py).
"""
from __future__ import annotations

import math
import operator

import numpy as np
import sympy
import torch

from tdag import ops
from tdag.canonicalize.onnx import runtime
from tdag.canonicalize.onnx.ops.table import OPS, register
from tdag.canonicalize.onnx.values import (
    Known,
    absolute,
    cast_known,
    dim_max,
    dim_min,
    fits,
    fold_arith,
    fold_compare,
    logical,
    mod,
    trunc_div,
)
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType


# -- math functions --------------------------------------------------------------------------------

_UNARY = {
    "Neg": ops.neg, "Abs": ops.abs, "Sqrt": ops.sqrt, "Reciprocal": ops.reciprocal,
    "Exp": ops.exp, "Log": ops.log, "Tanh": ops.tanh, "Erf": ops.erf, "Sin": ops.sin,
    "Cos": ops.cos, "Tan": ops.tan, "Asin": ops.asin, "Acos": ops.acos, "Atan": ops.atan,
    "Sinh": ops.sinh, "Cosh": ops.cosh, "Asinh": ops.asinh, "Acosh": ops.acosh,
    "Atanh": ops.atanh, "Floor": ops.floor, "Ceil": ops.ceil,
    "Sign": ops.sign, "Not": ops.logical_not, "Round": ops.round, "IsNaN": ops.isnan,
}


# the unary ops shape arithmetic uses, on Dims (``Neg`` of a count of axes, ``Not`` of a
# decided comparison)
_UNARY_FOLDS = {"Neg": operator.neg, "Abs": absolute, "Not": logical(operator.not_)}


def unary(fn, fold=None):
    """The entry of a one-input op: ``fn`` on the tensor; ``fold`` on a shape value's Dims."""
    def convert(ctx, x):
        if fold is not None and isinstance(x, Known):
            folded = fold_arith(fold, [x], x.dtype)
            if folded is not None:
                return folded
        return fn(ctx.tensor(x))
    return convert


for _name, _fn in _UNARY.items():
    OPS.add(_name, unary(_fn, _UNARY_FOLDS.get(_name)))


@register("IsInf")
def _is_inf(ctx, x):
    x = ctx.tensor(x)
    pos, neg = ctx.flag("detect_positive", 1), ctx.flag("detect_negative", 1)
    hits = [ops.eq(x, v) for v, on in ((math.inf, pos), (-math.inf, neg)) if on]
    if not hits:
        return ops.full(tuple(x.shape), False, DType.bool, like=x)
    return hits[0] if len(hits) == 1 else ops.logical_or(*hits)


# -- arithmetic, logic and comparisons -------------------------------------------------------------

def _binary(fn, fold=None):
    """``fn`` on tensors; ``fold`` on Dims when both operands are shape values."""
    def convert(ctx, a, b):
        if fold is not None and isinstance(a, Known) and isinstance(b, Known):
            folded = fold_arith(fold, [a, b], a.dtype)
            if folded is not None:
                return folded
        return fn(*_operands(ctx, a, b))
    return convert


def _operands(ctx, *xs) -> list:
    """The inputs as tensors, broadcastable as ONNX broadcasts them at run time."""
    return runtime.broadcast_operands([ctx.tensor(x) for x in xs])


def _offset(fn, sign: int):
    """Add and Sub, noting an integer tensor a constant away from another (a loop counter
    plus one): a Slice between the two has a constant length."""
    def convert(ctx, a, b):
        out = fn(ctx, a, b)
        runtime.note_offset(ctx, out, a, b, sign)
        return out
    return convert


OPS.add("Add", _offset(_binary(ops.add, operator.add), 1))
OPS.add("Sub", _offset(_binary(ops.sub, operator.sub), -1))
OPS.add("Mul", _binary(ops.mul, operator.mul))
OPS.add("And", _binary(ops.logical_and, logical(operator.and_)))
OPS.add("Or", _binary(ops.logical_or, logical(operator.or_)))
OPS.add("Xor", _binary(ops.ne, logical(operator.xor)))


@register("Div")
def _div(ctx, a, b):
    if isinstance(a, Known) and isinstance(b, Known):
        folded = fold_arith(trunc_div, [a, b], a.dtype)
        if folded is not None:
            return folded
    a, b = _operands(ctx, a, b)
    return ops.div(a, b) if a.dtype.is_float else ops.trunc_divide(a, b)  # ints truncate


@register("Pow")
def _pow(ctx, a, b):
    """An exponent the file holds as one float (GELU's cube, an RMS norm's square: a Constant
    node that onnxslim or the dynamo exporter made an initializer) is that number, as in
    ``x ** 3``: not a weight the torch module makes a parameter, whose gradient x^3 log(x)
    is NaN wherever x is negative."""
    a = ctx.tensor(a)
    exponent = _float_scalar(ctx, b)
    out = ops.pow(a, exponent if exponent is not None else ctx.tensor(b))
    return ops.cast(out, a.dtype)  # ONNX keeps the base's type


def _float_scalar(ctx, value) -> float | None:
    """The number a one-element float initializer holds; None for anything else."""
    weight = None if isinstance(value, Known) else ctx.builder.weights.get(value.name)
    if weight is None or weight.value is None or weight.value.numel() != 1 or \
            not weight.value.is_floating_point():
        return None
    return float(weight.value.reshape(()).item())


@register("Mod")
def _mod(ctx, a, b):
    truncated = ctx.flag("fmod", 0)
    if isinstance(a, Known) and isinstance(b, Known):
        folded = fold_arith(lambda x, y: mod(x, y, truncated), [a, b], a.dtype)
        if folded is not None:
            return folded
    return (ops.fmod if truncated else ops.remainder)(ctx.tensor(a), ctx.tensor(b))


def _compare(fn, rel):
    def convert(ctx, a, b):
        if isinstance(a, Known) and isinstance(b, Known):
            folded = fold_compare(rel, a, b)
            if folded is not None:
                return folded
        return fn(*_operands(ctx, a, b))
    return convert


OPS.add("Equal", _compare(ops.eq, sympy.Eq))
OPS.add("Less", _compare(ops.lt, sympy.Lt))
OPS.add("Greater", _compare(ops.gt, sympy.Gt))
OPS.add("LessOrEqual", _compare(ops.le, sympy.Le))
OPS.add("GreaterOrEqual", _compare(ops.ge, sympy.Ge))


@register("Where")
def _where(ctx, cond, a, b):
    if all(isinstance(v, Known) for v in (cond, a, b)) and cond.static and \
            fits(np.broadcast_shapes(cond.shape, a.shape, b.shape)):
        return Known(np.where(cond.values.astype(bool), a.values, b.values), a.dtype)
    return ops.where(*_operands(ctx, cond, a, b))


def _variadic(fn, fold=None):
    def convert(ctx, *xs):
        if fold is not None and all(isinstance(x, Known) for x in xs):
            folded = fold_arith(fold, list(xs), xs[0].dtype)
            if folded is not None:
                return folded
        operands = _operands(ctx, *xs)
        result = operands[0]
        for x in operands[1:]:
            result = fn(result, x)
        return result
    return convert


OPS.add("Max", _variadic(ops.maximum, dim_max))
OPS.add("Min", _variadic(ops.minimum, dim_min))
OPS.add("Sum", _variadic(ops.add, operator.add))


@register("Mean")
def _mean(ctx, *xs):
    return ops.div(_variadic(ops.add)(ctx, *xs), float(len(xs)))


@register("Clip")
def _clip(ctx, x, lo=None, hi=None):
    x = ctx.tensor(x)
    if ctx.opset < 11:  # bounds were attributes
        lo, hi = ctx.attr("min"), ctx.attr("max")
        return ops.clamp(x, lo, hi)
    lo = ctx.tensor(lo) if lo is not None else None
    hi = ctx.tensor(hi) if hi is not None else None
    return ops.clamp(x, lo, hi)


# -- casts -----------------------------------------------------------------------------------------

@register("Cast")
def _cast(ctx, x):
    dtype = ctx.dtype(ctx.attr("to"))
    return _cast_to(ctx, x, dtype)


@register("CastLike")
def _cast_like(ctx, x, like):
    return _cast_to(ctx, x, like.dtype)


def _cast_to(ctx, x, dtype: DType):
    if isinstance(x, Known) and not dtype.is_float:
        folded = cast_known(x, dtype)
        if folded is not None:
            return folded
    x = ctx.tensor(x)
    if not dtype.is_float8 or x.dtype is DType.bool:
        return ops.cast(x, dtype)
    saturate = ctx.flag("saturate", 1)
    if dtype is DType.f8e8m0fnu and not saturate:
        raise UnsupportedOpError("Cast to float8e8m0 with saturate=0 (NaN for 0, negatives "
                                 "and values out of range; tdag's cast saturates below)")
    if not x.dtype.is_float:  # exact below 2**53; larger integers are out of range anyway
        x = ops.cast(x, DType.f64)
    if saturate:
        x = saturate_float8(x, dtype)
    if dtype is DType.f8e8m0fnu:
        return _round_power_of_two(x, ctx.choice("round_mode", "up", ("up", "down", "nearest")))
    return ops.cast(x, dtype)


def _round_power_of_two(x, mode: str):
    """A cast to float8_e8m0 (a power of two) rounding as ONNX's ``round_mode`` says. tdag's
    cast, as torch's, rounds to the nearest power; a power below (above) x, one step away at
    most, is doubled (halved) for ``up`` (``down``)."""
    near = ops.cast(x, DType.f8e8m0fnu)
    if mode == "nearest":
        return near
    wide = DType.f64 if x.dtype is DType.f64 else DType.f32
    x, value = ops.cast(x, wide), ops.cast(near, wide)
    if mode == "up":
        value = ops.where(ops.lt(value, x), ops.mul(value, 2.0), value)
    else:
        value = ops.where(ops.gt(value, x), ops.mul(value, 0.5), value)
    return ops.cast(value, DType.f8e8m0fnu)


def saturate_float8(x, dtype: DType):
    """ONNX's ``saturate=1`` on a cast to float8: a value past the type's largest finite one
    (an infinity too) becomes that one, NaN stays NaN. tdag's cast does not saturate (past
    the range it gives NaN, or inf for e5m2), as ONNX's ``saturate=0``."""
    top = torch.finfo(dtype.torch).max
    if dtype is DType.f8e8m0fnu:  # no sign: 0 and below become the least power of two
        return ops.clamp(x, 0.0, top)
    return ops.clamp(x, -top, top)
