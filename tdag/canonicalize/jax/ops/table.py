"""The table from JAX primitives to tdag: its registry, what an entry sees, and elementwise math.

An entry is ``fn(ctx, *operands) -> Tensor | list[Tensor]``, operands already tensors of the
segment being built; ``ctx.params`` are the equation's params. The walker (jax/walker.py)
casts a result to the dtype jax gives it (jax's own promotion has run before the jaxpr), and
a result of another shape is a ShapeError naming the primitive. The other families live in
jax/ops/shape.py (movement), jax/ops/nn.py (contractions, reductions, windows) and
jax/ops/index.py (gather, scatter, sorting).
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.common.registry import Registry
from tdag.canonicalize.jax.trace import Eqn, type_of
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType, TensorType

OPS = Registry("the JAX primitive table")
op = OPS.register  # ``@op("add", "sub")``: the decorated function converts those primitives


class EqnContext:
    """What an entry sees of its equation: params, operand and result types, literals."""

    def __init__(self, eqn: Eqn, builder: Builder, literals: list):
        self.eqn, self.builder, self.params = eqn, builder, eqn.params
        self.literals = literals  # per operand: its value where known at import time, or None

    @property
    def prim(self) -> str:
        return self.eqn.prim

    def out_type(self, i: int = 0) -> TensorType:
        return type_of(self.eqn.outs[i].aval)

    @property
    def out_dtype(self) -> DType:
        return self.out_type().dtype

    def literal(self, i: int):
        """Operand ``i`` as a numpy array when it is known at import time, else None."""
        return self.literals[i]

    def unsupported(self, what: str) -> UnsupportedOpError:
        return UnsupportedOpError(f"{self.prim}: {what}")


def dtype_of_np(dtype) -> DType:
    return DType.of(np.dtype(dtype).name)


# -- elementwise ---------------------------------------------------------------------------------

def _binary(fn):
    return lambda ctx, a, b: fn(a, b)


def _unary(fn):
    return lambda ctx, x: fn(x)


# jax's max and min propagate nan, as ops.maximum and ops.minimum do
for _name, _fn in {"add": ops.add, "sub": ops.sub, "mul": ops.mul, "pow": ops.pow,
                   "max": ops.maximum, "min": ops.minimum, "eq": ops.eq, "ne": ops.ne,
                   "lt": ops.lt, "le": ops.le, "gt": ops.gt, "ge": ops.ge}.items():
    OPS.add(_name, _binary(_fn))

for _name, _fn in {"exp": ops.exp, "log": ops.log, "tanh": ops.tanh, "erf": ops.erf,
                   "erf_inv": ops.erfinv, "sqrt": ops.sqrt, "rsqrt": ops.rsqrt,
                   "sign": ops.sign, "neg": ops.neg, "sin": ops.sin, "cos": ops.cos,
                   "tan": ops.tan, "asin": ops.asin, "acos": ops.acos, "atan": ops.atan,
                   "sinh": ops.sinh, "cosh": ops.cosh, "asinh": ops.asinh, "acosh": ops.acosh,
                   "atanh": ops.atanh, "logistic": ops.sigmoid, "floor": ops.floor,
                   "ceil": ops.ceil, "square": ops.square}.items():
    OPS.add(_name, _unary(_fn))


@op("div")
def _div(ctx, a, b):
    # lax.div on integers rounds toward zero (C), not down as torch's //
    return ops.div(a, b) if a.dtype.is_float else ops.trunc_divide(a, b)


@op("rem")
def _rem(ctx, a, b):
    return ops.fmod(a, b)  # the sign of the dividend, as C and lax.rem


@op("abs")
def _abs(ctx, x):
    return ops.abs(x)


@op("integer_pow")
def _integer_pow(ctx, x):
    """x**y by repeated squaring: exact products, as XLA expands it."""
    y = ctx.params["y"]
    result, base, k = None, x, abs(y)
    while k:
        if k & 1:
            result = base if result is None else ops.mul(result, base)
        k >>= 1
        if k:
            base = ops.mul(base, base)
    if result is None:
        result = ops.full(x.shape, 1, x.dtype, like=x)
    return ops.reciprocal(result) if y < 0 else result


@op("atan2")
def _atan2(ctx, y, x):
    """atan(y / x) moved to the quadrant of (x, y); on the y axis +-pi/2 (0 at the origin)."""
    base = ops.atan(ops.div(y, x))
    turned = ops.add(base, ops.where(ops.ge(y, 0), np.pi, -np.pi))
    axis = ops.mul(ops.sign(y), np.pi / 2)
    return ops.where(ops.gt(x, 0), base, ops.where(ops.lt(x, 0), turned, axis))


@op("cbrt")
def _cbrt(ctx, x):
    return ops.mul(ops.sign(x), ops.pow(ops.abs(x), 1.0 / 3.0))


@op("exp2")
def _exp2(ctx, x):
    return ops.exp(ops.mul(x, float(np.log(2.0))))


@op("log1p")
def _log1p(ctx, x):
    return ops.log1p(x)  # log(x + 1) loses every digit of x below float's step at 1


@op("expm1")
def _expm1(ctx, x):
    return ops.expm1(x)


@op("round")
def _round(ctx, x):
    # rounding_method 0 is half away from zero, 1 half to even (torch's)
    if int(ctx.params.get("rounding_method", 0)) == 1:
        return ops.round(x)
    return ops.mul(ops.sign(x), ops.floor(ops.add(ops.abs(x), 0.5)))


@op("is_finite")
def _is_finite(ctx, x):
    return ops.logical_not(ops.logical_or(ops.isnan(x), ops.eq(ops.abs(x), float("inf"))))


@op("not")
def _not(ctx, x):
    if x.dtype is DType.bool:
        return ops.logical_not(x)
    raise ctx.unsupported("bitwise not of integers")


@op("and", "or", "xor")
def _logical(ctx, a, b):
    if a.dtype is not DType.bool:
        raise ctx.unsupported("bitwise arithmetic on integers")
    if ctx.prim == "and":
        return ops.logical_and(a, b)
    if ctx.prim == "or":
        return ops.logical_or(a, b)
    return ops.ne(a, b)


@op("select_n")
def _select_n(ctx, which, *cases):
    """``cases[which]``: a bool picks between two, an integer among many (nested wheres)."""
    if len(cases) == 1:
        return cases[0]
    if which.dtype is DType.bool:
        return ops.where(which, cases[1], cases[0])
    result = cases[-1]
    for k in range(len(cases) - 2, -1, -1):
        result = ops.where(ops.eq(which, k), cases[k], result)
    return result


@op("clamp")
def _clamp(ctx, low, x, high):
    return ops.minimum(ops.maximum(x, low), high)


@op("convert_element_type")
def _convert(ctx, x):
    target = dtype_of_np(ctx.params["new_dtype"])
    if x.dtype.is_float and not (target.is_float or target.is_complex or target is DType.bool):
        x = ops.trunc(x)  # lax rounds toward zero: explicit, so no backend's cast decides
    return ops.cast(x, target)


@op("stop_gradient", "optimization_barrier", "copy", "sharding_constraint")
def _identity(ctx, *xs):
    """Primitives that only matter to differentiation, scheduling or placement."""
    return list(xs) if len(xs) != 1 else xs[0]


__all__ = ["OPS", "EqnContext", "Tensor", "dtype_of_np", "op"]
