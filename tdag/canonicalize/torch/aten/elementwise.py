"""Elementwise ATen ops: arithmetic, comparisons, logic, math functions, activations."""
from __future__ import annotations

import math

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten, scalar
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType


def _scaled(y, alpha):
    return y if alpha == 1 else ops.mul(scalar(y), alpha)


# -- arithmetic ---------------------------------------------------------------------------------

@aten("add")
def add(x, y, alpha=1):
    return ops.add(scalar(x), _scaled(scalar(y), alpha))


@aten("sub")
def sub(x, y, alpha=1):
    return ops.sub(scalar(x), _scaled(scalar(y), alpha))


@aten("rsub")
def rsub(x, y, alpha=1):  # y - alpha * x
    return ops.sub(scalar(y), _scaled(x, alpha))


@aten("mul")
def mul(x, y):
    return ops.mul(scalar(x), scalar(y))


@aten("div")
def div(x, y, rounding_mode=None):
    x, y = scalar(x), scalar(y)
    if rounding_mode == "floor":
        return ops.floor_divide(x, y)
    if rounding_mode == "trunc":
        return ops.trunc_divide(x, y)
    return ops.div(x, y)


@aten("floor_divide")
def floor_divide(x, y):
    return ops.floor_divide(scalar(x), scalar(y))


@aten("remainder")
def remainder(x, y):
    return ops.remainder(scalar(x), scalar(y))


@aten("fmod")
def fmod(x, y):
    return ops.fmod(scalar(x), scalar(y))


@aten("pow")
def pow_(x, exponent):
    x, exponent = scalar(x), scalar(exponent)
    if isinstance(exponent, (int, float)) and exponent == 2 and hasattr(x, "dtype"):
        return ops.mul(x, x)  # exact, as torch computes x*x for pow(x, 2)
    return ops.pow(x, exponent)


@aten("neg")
def neg(x):
    return ops.neg(x)


@aten("reciprocal")
def reciprocal(x):
    return ops.reciprocal(x)


@aten("abs")
def abs_(x):
    return ops.abs(x)


@aten("sign", "sgn")
def sign(x):
    return ops.sgn(x) if x.dtype is not DType.bool else x


@aten("sqrt")
def sqrt(x):
    return ops.sqrt(x)


@aten("rsqrt")
def rsqrt(x):
    return ops.rsqrt(x)


@aten("square")
def square(x):
    return ops.mul(x, x)


def _unary(name: str, fn):
    aten(name)(lambda x: fn(x))


for _name in ("exp", "log", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
              "tanh", "asinh", "acosh", "atanh", "erf", "erfinv"):
    _unary(_name, getattr(ops, _name))
for _name in ("floor", "ceil", "trunc", "round"):
    _unary(_name, getattr(ops, _name))
_unary("fix", ops.trunc)
_unary("arcsin", ops.asin)
_unary("arccos", ops.acos)
_unary("arctan", ops.atan)


@aten("round.decimals")
def round_decimals(x, decimals=0):
    scale = 10.0 ** decimals
    return ops.div(ops.round(ops.mul(x, scale)), scale)


@aten("exp2")
def exp2(x):
    return ops.pow(2.0, ops.cast(x, "f32") if not x.dtype.is_float else x)


@aten("expm1")
def expm1(x):
    return ops.expm1(x)


@aten("log1p")
def log1p(x):
    return ops.log1p(x)


@aten("log2")
def log2(x):
    return ops.div(ops.log(x), math.log(2.0))


@aten("log10")
def log10(x):
    return ops.div(ops.log(x), math.log(10.0))


@aten("erfc")
def erfc(x):
    return ops.sub(1.0, ops.erf(x))


@aten("frac")
def frac(x):
    return ops.sub(x, ops.trunc(x))


@aten("atan2")
def atan2(y, x):
    if not y.dtype.is_float:
        y = ops.cast(y, "f32")
    return ops.atan2(y, x)


@aten("hypot")
def hypot(x, y):
    return ops.hypot(x, y)


@aten("copysign")
def copysign(x, y):
    negative = ops.logical_or(ops.lt(y, 0.0), ops.logical_and(ops.eq(y, 0.0),
                                                              ops.lt(ops.div(1.0, y), 0.0)))
    magnitude = ops.abs(x)
    return ops.where(negative, ops.neg(magnitude), magnitude)


@aten("lerp")
def lerp(start, end, weight):
    return ops.add(start, ops.mul(scalar(weight), ops.sub(end, start)))


@aten("xlogy")
def xlogy(x, y):
    x, y = scalar(x), scalar(y)
    return ops.where(ops.eq(x, 0.0), 0.0, ops.mul(x, ops.log(y)))


@aten("addcmul")
def addcmul(x, a, b, value=1):
    return ops.add(x, _scaled(ops.mul(a, b), value))


@aten("addcdiv")
def addcdiv(x, a, b, value=1):
    return ops.add(x, _scaled(ops.div(a, b), value))


# -- min / max / clamp ---------------------------------------------------------------------------

@aten("maximum", "max.other")
def maximum(x, y):
    return ops.maximum(x, y)


@aten("minimum", "min.other")
def minimum(x, y):
    return ops.minimum(x, y)


@aten("fmax")
def fmax(x, y):  # nan loses, unlike maximum
    return ops.where(ops.isnan(y), x, ops.where(ops.isnan(x), y, ops.maximum(x, y)))


@aten("fmin")
def fmin(x, y):
    return ops.where(ops.isnan(y), x, ops.where(ops.isnan(x), y, ops.minimum(x, y)))


@aten("clamp", "clip")
def clamp(x, min=None, max=None):
    return ops.clamp(x, scalar(min), scalar(max))


@aten("clamp_min")
def clamp_min(x, min):
    return ops.clamp(x, min=scalar(min))


@aten("clamp_max")
def clamp_max(x, max):
    return ops.clamp(x, max=scalar(max))


# -- comparisons and logic -----------------------------------------------------------------------

def _compare(name: str):
    fn = getattr(ops, name)
    aten(name)(lambda x, y: fn(scalar(x), scalar(y)))


for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _compare(_name)
aten("greater")(lambda x, y: ops.gt(x, scalar(y)))
aten("less")(lambda x, y: ops.lt(x, scalar(y)))


def _bool(x):
    return ops.cast(x, DType.bool) if hasattr(x, "dtype") else bool(x)


@aten("logical_not")
def logical_not(x):
    return ops.logical_not(x)


@aten("logical_and")
def logical_and(x, y):
    return ops.logical_and(_bool(x), _bool(y))


@aten("logical_or")
def logical_or(x, y):
    return ops.logical_or(_bool(x), _bool(y))


@aten("logical_xor")
def logical_xor(x, y):
    return ops.ne(_bool(x), _bool(y))


def _bool_only(name: str, fn):
    """Bitwise ops are mapped on bool tensors (masks), where they are logic."""
    def entry(x, y=None):
        if x.dtype is not DType.bool or (hasattr(y, "dtype") and y.dtype is not DType.bool):
            raise UnsupportedOpError(f"aten.{name} on integers (tdag has no bitwise primitive)")
        return fn(x) if y is None else fn(x, _bool(y))
    aten(name)(entry)


for _names, _fn in ((("bitwise_and", "__and__"), ops.logical_and),
                    (("bitwise_or", "__or__"), ops.logical_or),
                    (("bitwise_xor", "__xor__"), ops.ne),
                    (("bitwise_not",), ops.logical_not)):
    for _name in _names:
        _bool_only(_name, _fn)


@aten("isnan")
def isnan(x):
    return ops.isnan(x)


@aten("isinf")
def isinf(x):
    return ops.eq(ops.abs(x), math.inf)


@aten("isfinite")
def isfinite(x):
    return ops.logical_not(ops.logical_or(ops.isnan(x), ops.eq(ops.abs(x), math.inf)))


@aten("isposinf")
def isposinf(x):
    return ops.eq(x, math.inf)


@aten("isneginf")
def isneginf(x):
    return ops.eq(x, -math.inf)


@aten("signbit")
def signbit(x):
    return ops.signbit(x)


@aten("nan_to_num")
def nan_to_num(x, nan=0.0, posinf=None, neginf=None):
    return ops.nan_to_num(x, nan, posinf, neginf)


aten("logaddexp")(ops.logaddexp)


@aten("where")
def where(cond, x=None, y=None):
    if x is None and y is None:  # torch.where(cond): nonzero's columns, one per axis
        found = ops.nonzero(cond)
        return [ops.select(found, 1, k) for k in range(cond.ndim)]
    return ops.where(cond, scalar(x), scalar(y))


@aten("masked_fill")
def masked_fill(x, mask, value):
    return ops.where(mask, scalar(value), x)


# -- casts and copies ----------------------------------------------------------------------------

@aten("_to_copy", "to", "type_as")
def to(x, *args, dtype=None, **kwargs):
    """Device, layout and memory format do not exist in tdag; only the dtype matters, and the
    converter casts every result to the dtype torch recorded."""
    return x


@aten("copy")
def copy(x, src, non_blocking=False):
    """The functional ``x.copy_(src)``: src, broadcast to x's shape and cast to x's dtype."""
    return ops.broadcast_to(ops.cast(src, x.dtype), x.shape)


@aten("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range",
      "sym_constrain_range_for_size", "_functional_assert_async", "_functional_assert_scalar")
def assertion(*args, **kwargs):
    """Runtime checks of shapes and values that torch.export proved or recorded."""
    return None


@aten("clone", "contiguous", "alias", "lift_fresh_copy", "detach", "resolve_conj",
      "resolve_neg", "positive", "lift_fresh")
def identity(x, **kwargs):
    """Copies and memory-format changes: tdag values are immutable and have no layout."""
    return x


@aten("dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout")
def dropout(x, p=0.5, train=False):
    if train and p > 0:
        raise UnsupportedOpError("dropout in training mode is random: call module.eval()")
    return x
