"""Elementwise primitives. Operands of binary ops have equal shapes and dtypes: broadcasting
is explicit (unsqueeze + repeat), so a pass never has to reason about implicit broadcast."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from tdag.deinops import inplace, pairs
from tdag.deinops.approximations import erfinv_onnx
from tdag.deinops.codegen import dtype_expr
from tdag.deinops.primitive import NoSpec, elementwise_cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import (
    UNKNOWN,
    Affine,
    Aligned,
    Pick,
    nonnegative,
    plus,
    span,
    times,
    union,
)
from tdag.ir.op import Op
from tdag.ir.record import Trait, no_gradient
from tdag.ir.types import DType

_UNARY = {
    Op.neg: (torch.neg, False, "negation; exact, kept for subtraction a + (-b)"),
    Op.reciprocal: (torch.reciprocal, True, "1/x; division by a constant, sigmoid, softmax"),
    Op.exp: (torch.exp, True, "transcendental; softmax, sigmoid, silu"),
    Op.log: (torch.log, True, "transcendental; log-softmax, losses"),
    Op.sin: (torch.sin, True, "transcendental; rotary and sinusoidal embeddings"),
    Op.cos: (torch.cos, True, "transcendental; rotary and sinusoidal embeddings"),
    Op.tan: (torch.tan, True, "transcendental; sin/cos is not exact in float32"),
    Op.asin: (torch.asin, True, "inverse trigonometric; no exact composition"),
    Op.acos: (torch.acos, True, "inverse trigonometric; no exact composition"),
    Op.atan: (torch.atan, True, "inverse trigonometric; atan2, angles"),
    Op.sinh: (torch.sinh, True, "hyperbolic; (e^x - e^-x)/2 loses precision near 0"),
    Op.cosh: (torch.cosh, True, "hyperbolic; no exact composition"),
    Op.tanh: (torch.tanh, True, "hyperbolic; gelu-tanh, RNN cells"),
    Op.asinh: (torch.asinh, True, "inverse hyperbolic; no exact composition"),
    Op.acosh: (torch.acosh, True, "inverse hyperbolic; no exact composition"),
    Op.atanh: (torch.atanh, True, "inverse hyperbolic; no exact composition"),
    Op.erf: (torch.erf, True, "error function; exact gelu"),
    Op.erfinv: (torch.erfinv, True, "inverse error function; no exact composition"),
    Op.sign: (torch.sign, False, "-1/0/1; abs = x*sign(x), relu = (x+|x|)/2 exactly"),
}


# complex values: torch's arithmetic, with the few functions complex code uses
_COMPLEX_UNARY = frozenset({Op.neg, Op.exp})


def _unary_shape_rule(op: Op, float_only: bool):
    def rule(spec, ins):
        (x,) = ins
        if x.dtype.is_complex and op not in _COMPLEX_UNARY:
            raise ShapeError(f"{op.value}: takes no complex operand (got {x}); of the unary "
                             "ops only neg and exp do")
        if float_only and not (x.dtype.is_float or x.dtype.is_complex):
            raise ShapeError(f"{op.value}: needs a floating-point operand, got {x.dtype.value}")
        if x.dtype is DType.bool:
            raise ShapeError(f"{op.value}: not defined on bool")
        return x
    return rule


def _unary_evaluator(fn):
    return lambda spec, xs, resolve: fn(xs[0])


_TORCH_UNARY = {Op.neg: "torch.neg", Op.reciprocal: "torch.reciprocal", Op.exp: "torch.exp",
                Op.log: "torch.log", Op.sin: "torch.sin", Op.cos: "torch.cos",
                Op.tan: "torch.tan", Op.asin: "torch.asin", Op.acos: "torch.acos",
                Op.atan: "torch.atan", Op.sinh: "torch.sinh", Op.cosh: "torch.cosh",
                Op.tanh: "torch.tanh", Op.asinh: "torch.asinh", Op.acosh: "torch.acosh",
                Op.atanh: "torch.atanh", Op.erf: "torch.erf", Op.erfinv: "torch.erfinv",
                Op.sign: "torch.sign"}


def _unary_torch(node, a, code):
    return f"{_TORCH_UNARY[node.op]}({a[0]})"


# erfinv has no ONNX op: approximations.erfinv_onnx composes it
_ONNX_UNARY = {Op.neg: "Neg", Op.reciprocal: "Reciprocal", Op.exp: "Exp", Op.log: "Log",
               Op.sin: "Sin", Op.cos: "Cos", Op.tan: "Tan", Op.asin: "Asin", Op.acos: "Acos",
               Op.atan: "Atan", Op.sinh: "Sinh", Op.cosh: "Cosh", Op.tanh: "Tanh",
               Op.asinh: "Asinh", Op.acosh: "Acosh", Op.atanh: "Atanh", Op.erf: "Erf",
               Op.sign: "Sign"}

# onnxruntime implements these for float32 only
_ONNX_F32_ONLY = frozenset({Op.tan, Op.asin, Op.acos, Op.atan, Op.sinh, Op.cosh, Op.asinh,
                            Op.acosh, Op.atanh, Op.erf})


def _unary_onnx(node, ins, g, cx):
    dtype = node.type.dtype
    if dtype.is_complex:  # exp; neg runs on the pair as it is (reify/onnx/complex.py)
        return pairs.exp(g, ins[0])
    if node.op in _ONNX_F32_ONLY and dtype is not DType.f32:
        return g.cast(g.node(_ONNX_UNARY[node.op], [g.cast(ins[0], DType.f32)]), dtype)
    if node.op is Op.sign and dtype.is_float:  # torch: sign(nan) = 0
        zero = g.const(0.0, dtype)
        return g.node("Where", [g.node("IsNaN", ins), zero, g.node("Sign", ins)])
    return g.node(_ONNX_UNARY[node.op], ins)


# lax's elementwise functions by name; sign is torch's (sign(nan) = 0)
_JAX_UNARY = {Op.neg: "neg", Op.reciprocal: "reciprocal", Op.exp: "exp", Op.log: "log",
              Op.sin: "sin", Op.cos: "cos", Op.tan: "tan", Op.asin: "asin", Op.acos: "acos",
              Op.atan: "atan", Op.sinh: "sinh", Op.cosh: "cosh", Op.tanh: "tanh",
              Op.asinh: "asinh", Op.acosh: "acosh", Op.atanh: "atanh", Op.erf: "erf",
              Op.erfinv: "erf_inv", Op.sign: "sign"}


def _unary_jax(node, a, cx):
    out = getattr(cx.lax, _JAX_UNARY[node.op])(a[0])
    if node.op is Op.sign and node.type.dtype.is_float:
        return cx.jnp.where(cx.jnp.isnan(a[0]), cx.jnp.zeros_like(out), out)
    return out


def _neg_values(spec, facts, batch, types) -> Affine:
    return times(facts[0], -1)  # -(s*i + r) = -s*i + (-r)


# d/dx of each unary op as (x, y, dy, ops) -> dx; ``y`` is the op's output (torch's formulas)
_UNARY_VJP = {
    Op.neg: lambda x, y, dy, ops: -dy,
    Op.reciprocal: lambda x, y, dy, ops: -dy * y * y,
    Op.exp: lambda x, y, dy, ops: dy * conj(y, ops),
    Op.log: lambda x, y, dy, ops: dy / x,
    Op.sin: lambda x, y, dy, ops: dy * ops.cos(x),
    Op.cos: lambda x, y, dy, ops: -dy * ops.sin(x),
    Op.tan: lambda x, y, dy, ops: dy * (y * y + 1.0),
    Op.asin: lambda x, y, dy, ops: dy * ops.rsqrt(1.0 - x * x),
    Op.acos: lambda x, y, dy, ops: -dy * ops.rsqrt(1.0 - x * x),
    Op.atan: lambda x, y, dy, ops: dy / (x * x + 1.0),
    Op.sinh: lambda x, y, dy, ops: dy * ops.cosh(x),
    Op.cosh: lambda x, y, dy, ops: dy * ops.sinh(x),
    Op.tanh: lambda x, y, dy, ops: dy * (1.0 - y * y),
    Op.asinh: lambda x, y, dy, ops: dy * ops.rsqrt(x * x + 1.0),
    Op.acosh: lambda x, y, dy, ops: dy * ops.rsqrt((x - 1.0) * (x + 1.0)),
    Op.atanh: lambda x, y, dy, ops: dy / (1.0 - x * x),
    Op.erf: lambda x, y, dy, ops: dy * ops.exp(-x * x) * (2.0 / math.sqrt(math.pi)),
    Op.erfinv: lambda x, y, dy, ops: dy * ops.exp(y * y) * (math.sqrt(math.pi) / 2.0),
    Op.sign: None,  # piecewise constant: torch's gradient is zero
}


def conj(t, ops):
    """``t``'s complex conjugate, ``t`` itself when real: the cotangent of a complex product
    is the cotangent times the other factor's conjugate (torch's convention)."""
    return ops.conj(t) if t.dtype.is_complex else t


def _unary_vjp(op: Op):
    rule = _UNARY_VJP[op]
    if rule is None:
        return no_gradient
    return lambda spec, xs, y, dy, ops: (rule(xs[0], y, dy, ops),)


for _op, (_fn, _float_only, _reason) in _UNARY.items():
    primitive(_op, NoSpec, 1, _unary_shape_rule(_op, _float_only), _unary_evaluator(_fn),
              elementwise_cost, _reason,
              traits=Trait.ELEMENTWISE | Trait.UNARY | Trait.POINTWISE,
              batch=Aligned(values=_neg_values if _op is Op.neg else None),
              torch=_unary_torch, onnx=erfinv_onnx if _op is Op.erfinv else _unary_onnx,
              jax=_unary_jax, vjp=_unary_vjp(_op), complex_values=_op in _COMPLEX_UNARY,
              complex_half=_op is Op.neg)  # torch has no complex32 exp on CPU


def same_operands(op: str, ins) -> None:
    first = ins[0]
    for other in ins[1:]:
        if not first.same_as(other):
            raise ShapeError(f"{op}: operands must have equal types (broadcast explicitly), got "
                             + ", ".join(str(t) for t in ins))


def _binary_shape_rule(op: Op):
    def rule(spec, ins):
        same_operands(op.value, ins)
        if ins[0].dtype is DType.bool and op is not Op.multiply:
            raise ShapeError(f"{op.value}: not defined on bool")
        return ins[0]
    return rule


def _add_torch(node, a, code):
    return inplace.binary(node, a, code, f"{a[0]} + {a[1]}", "add_")


def _add_onnx(node, ins, g, cx):
    return g.node("Add", ins)


def _add_values(spec, facts, batch, types) -> Affine:
    return plus(*facts)  # (s*i + r) + (t*i + q) = (s+t)*i + (r+q)


def _multiply_torch(node, a, code):
    if node.type.dtype is DType.bool:
        return f"{a[0]} & {a[1]}"
    return inplace.binary(node, a, code, f"{a[0]} * {a[1]}", "mul_")


def _multiply_onnx(node, ins, g, cx):
    if node.type.dtype is DType.c32:  # torch multiplies complex32 in float32, then rounds:
        wide = [g.cast(x, DType.f32) for x in ins]  # so does the graph, on any runtime
        return g.cast(pairs.product(g, *wide), DType.f16)
    if node.type.dtype.is_complex:
        return pairs.product(g, *ins)
    return g.node("And" if node.type.dtype is DType.bool else "Mul", ins)


def _multiply_values(spec, facts, batch, types) -> Affine | None:
    """(s*i + r) * k = s*k*i + r*k for a known integer k; the product of two unknowns with
    a stride is no affine form (None)."""
    for x, y in (facts, facts[::-1]):
        k = y.constant
        if k is not None and isinstance(k, int):
            return times(x, k)
    if any(f.stride for f in facts):
        return None
    bounds = [f.lo for f in facts] + [f.hi for f in facts]
    if not all(isinstance(b, int) for b in bounds):
        return UNKNOWN
    (a, b), (c, d) = [(f.lo, f.hi) for f in facts]
    products = (a * c, a * d, b * c, b * d)
    return Affine(0, min(products), max(products))


primitive(Op.add, NoSpec, 2, _binary_shape_rule(Op.add), lambda s, xs, r: xs[0] + xs[1],
          elementwise_cost, "addition; with neg, subtraction; with pad, concat",
          traits=(Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.COMMUTATIVE
                  | Trait.SCALAR_OPERAND),
          batch=Aligned(values=_add_values),
          torch=_add_torch, onnx=_add_onnx, jax=lambda node, a, cx: a[0] + a[1],
          vjp=lambda spec, xs, y, dy, ops: (dy, dy), complex_values=True, complex_half=True,
          in_place=inplace.overwritten_operand)
primitive(Op.multiply, NoSpec, 2, _binary_shape_rule(Op.multiply),
          lambda s, xs, r: xs[0] * xs[1] if xs[0].dtype != torch.bool else xs[0] & xs[1],
          elementwise_cost, "multiplication; with repeat and reduce-sum, every contraction",
          traits=(Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.COMMUTATIVE
                  | Trait.SCALAR_OPERAND),
          batch=Aligned(values=_multiply_values),
          torch=_multiply_torch, onnx=_multiply_onnx,
          jax=lambda node, a, cx: a[0] & a[1] if node.type.dtype is DType.bool else a[0] * a[1],
          vjp=lambda spec, xs, y, dy, ops: (dy * conj(xs[1], ops), dy * conj(xs[0], ops)),
          complex_values=True, complex_half=True, in_place=inplace.overwritten_operand)


class DivideMode(enum.Enum):
    """The quotient rounded three ways, or one of the two remainders that go with them."""

    true = "true"
    floor = "floor"
    trunc = "trunc"
    remainder = "remainder"  # a - b*floor(a/b), the sign of b (Python %, torch.remainder)
    fmod = "fmod"            # a - b*trunc(a/b), the sign of a (C fmod, torch.fmod)


@dataclass(frozen=True, slots=True)
class Divide:
    mode: DivideMode = DivideMode.true


def _divide_shape(spec: Divide, ins):
    out = _binary_shape_rule(Op.divide)(spec, ins)
    if out.dtype.is_complex and spec.mode is not DivideMode.true:
        raise ShapeError(f"divide: mode {spec.mode.value} takes no complex operand (got {out})")
    if spec.mode is DivideMode.true and not (out.dtype.is_float or out.dtype.is_complex):
        raise ShapeError("divide: true division needs floats; cast first or use mode=floor")
    return out


def _divide_eval(spec: Divide, xs, resolve):
    if spec.mode is DivideMode.remainder:
        return torch.remainder(xs[0], xs[1])
    if spec.mode is DivideMode.fmod:
        return torch.fmod(xs[0], xs[1])
    mode = None if spec.mode is DivideMode.true else spec.mode.value
    return torch.div(xs[0], xs[1], rounding_mode=mode)


def _divide_torch(node, a, code):
    if node.spec.mode is DivideMode.true:
        return f"{a[0]} / {a[1]}"
    if node.spec.mode in (DivideMode.remainder, DivideMode.fmod):
        return f"torch.{node.spec.mode.value}({a[0]}, {a[1]})"
    return f"torch.div({a[0]}, {a[1]}, rounding_mode={node.spec.mode.value!r})"


def _divide_onnx(node, ins, g, cx):
    a, b = ins
    mode, dtype = node.spec.mode, node.type.dtype
    if dtype.is_complex:
        return pairs.quotient(g, a, b)
    if mode is DivideMode.true:
        return g.node("Div", ins)
    if mode is DivideMode.fmod:
        return g.node("Mod", ins, fmod=1)
    if mode is DivideMode.remainder:
        if not dtype.is_float:
            return g.node("Mod", ins, fmod=0)
        # fmod, then b added where the remainder's sign differs from b's (ONNX float Mod is fmod)
        zero = g.const(0.0, dtype)
        r = g.node("Mod", ins, fmod=1)
        fix = g.node("And", [g.node("Not", [g.node("Equal", [r, zero])]),
                             g.node("Xor", [g.node("Less", [b, zero]), g.node("Less", [r, zero])])])
        return g.node("Where", [fix, g.node("Add", [r, b]), r])
    if not dtype.is_float:
        if mode is DivideMode.trunc:
            return g.node("Div", ins)  # integer Div truncates
        return g.node("Div", [g.node("Sub", [a, g.node("Mod", [a, b])]), b])  # exact
    if mode is DivideMode.floor:
        return _floor_divide_float(g, a, b, dtype)
    q = g.node("Div", ins)
    return g.node("Mul", [g.node("Sign", [q]), g.node("Floor", [g.node("Abs", [q])])])


def _floor_divide_float(g, a: str, b: str, dtype: DType) -> str:
    """torch's div_floor for floats: (a - fmod(a, b)) / b, one less when the remainder's
    sign differs from b's, then rounded to the nearest integer."""
    zero = g.const(0.0, dtype)
    mod = g.node("Mod", [a, b], fmod=1)
    div = g.node("Div", [g.node("Sub", [a, mod]), b])
    fix = g.node("And", [g.node("Not", [g.node("Equal", [mod, zero])]),
                         g.node("Xor", [g.node("Less", [b, zero]), g.node("Less", [mod, zero])])])
    div = g.node("Where", [fix, g.node("Sub", [div, g.const(1.0, dtype)]), div])
    floor = g.node("Floor", [div])
    up = g.node("Greater", [g.node("Sub", [div, floor]), g.const(0.5, dtype)])
    floor = g.node("Where", [up, g.node("Add", [floor, g.const(1.0, dtype)]), floor])
    # a zero quotient keeps the sign of a / b; b == 0 gives a / b (inf or nan)
    true = g.node("Div", [a, b])
    signed_zero = g.node("Mul", [g.node("Sign", [true]), zero])
    floor = g.node("Where", [g.node("Equal", [div, zero]), signed_zero, floor])
    return g.node("Where", [g.node("Equal", [b, zero]), true, floor])


def _divide_jax(node, a, cx):
    x, y = a
    mode, jnp = node.spec.mode, cx.jnp
    if mode is DivideMode.true:
        return x / y
    if mode is DivideMode.floor:
        return jnp.floor_divide(x, y)
    if mode is DivideMode.trunc:  # lax.div truncates integers, as C does
        return jnp.trunc(x / y) if node.type.dtype.is_float else cx.lax.div(x, y)
    return getattr(jnp, mode.value)(x, y)  # remainder (sign of b) or fmod (sign of a)


def _divide_vjp(spec: Divide, xs, y, dy, ops):
    """True division: (dy/b, -dy*a/b^2); a remainder moves with its dividend and against the
    divisor times the rounded quotient (torch's rules); a rounded quotient is piecewise
    constant, so no cotangent flows through it."""
    a, b = xs
    if spec.mode is DivideMode.true:
        return dy / conj(b, ops), -dy * conj(y / b, ops)
    if spec.mode is DivideMode.remainder:
        return dy, -dy * ops.floor_divide(a, b)
    if spec.mode is DivideMode.fmod:
        return dy, -dy * ops.trunc(a / b)
    return None, None


primitive(Op.divide, Divide, 2, _divide_shape, _divide_eval, elementwise_cost,
          "a*(1/b) rounds twice in float32 and is wrong for integer floor division; "
          "a - b*floor(a/b) is not an exact remainder in floats",
          traits=Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.SCALAR_OPERAND,
          batch=Aligned(),
          torch=_divide_torch, onnx=_divide_onnx, jax=_divide_jax, vjp=_divide_vjp,
          complex_values=True)


def _pow_torch(node, a, code):
    return f"torch.pow({a[0]}, {a[1]})"


def _pow_onnx(node, ins, g, cx):
    return g.node("Pow", ins)


def _pow_vjp(spec, xs, y, dy, ops):
    """torch's rules: the base's term is 0 where the exponent is 0 (0^0 has no slope), the
    exponent's is 0 where the base is 0 and the exponent non-negative (log 0 would be -inf)."""
    a, b = xs
    da = ops.where(b == 0.0, 0.0, dy * b * ops.pow(a, b - 1.0))
    db = ops.where(ops.logical_and(a == 0.0, b >= 0.0), 0.0, dy * y * ops.log(a))
    return da, db


primitive(Op.pow, NoSpec, 2, _binary_shape_rule(Op.pow), lambda s, xs, r: torch.pow(xs[0], xs[1]),
          elementwise_cost, "exp(y*log x) is inexact and fails for negative bases; sqrt = x^0.5",
          traits=Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.SCALAR_OPERAND,
          batch=Aligned(),
          torch=_pow_torch, onnx=_pow_onnx, jax=lambda node, a, cx: cx.jnp.power(a[0], a[1]),
          vjp=_pow_vjp)


# -- beyond exact compositions ----------------------------------------------------------------

def _where_shape(spec, ins):
    cond, a, b = ins
    if cond.dtype is not DType.bool:
        raise ShapeError(f"where: condition must be bool, got {cond.dtype.value}")
    same_operands("where", [a, b])
    if not cond.with_dtype(a.dtype).same_as(a):
        raise ShapeError(f"where: condition {cond} and values {a} differ in shape")
    return a


def _where_torch(node, a, code):
    return f"torch.where({a[0]}, {a[1]}, {a[2]})"


def _where_values(spec, facts, batch, types) -> Affine | Pick | None:
    """A known condition picks a branch (the other need not exist per sample: the
    negative-index wrap ``where(i < 0, i + n, i)``); else both branches share a stride."""
    cond, a, b = facts
    known = cond.constant
    if known is not None:
        return Pick(1 if known else 2)
    return None if cond.stride else union(a, b)


def _where_onnx(node, ins, g, cx):
    if node.type.dtype.is_complex:
        return pairs.select(g, *ins)
    if node.type.dtype is DType.bool:  # onnxruntime has no bool Where: c & a | !c & b
        c, a, b = ins
        return g.node("Or", [g.node("And", [c, a]), g.node("And", [g.node("Not", [c]), b])])
    return g.node("Where", ins)


primitive(Op.where, NoSpec, 3, _where_shape,
          lambda s, xs, r: torch.where(xs[0], xs[1], xs[2]), elementwise_cost,
          "select by mask; c*a + (1-c)*b is wrong when a or b is inf (-inf masks)",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE | Trait.SCALAR_OPERAND,
          batch=Aligned(values=_where_values),
          torch=_where_torch, onnx=_where_onnx,
          jax=lambda node, a, cx: cx.jnp.where(a[0], a[1], a[2]),
          vjp=lambda spec, xs, y, dy, ops: (None, ops.where(xs[0], dy, 0.0),
                                            ops.where(xs[0], 0.0, dy)),
          complex_values=True, complex_half=True)


class CompareKind(enum.Enum):
    eq = "eq"
    ne = "ne"
    lt = "lt"
    le = "le"
    gt = "gt"
    ge = "ge"


_COMPARE = {CompareKind.eq: torch.eq, CompareKind.ne: torch.ne, CompareKind.lt: torch.lt,
            CompareKind.le: torch.le, CompareKind.gt: torch.gt, CompareKind.ge: torch.ge}


@dataclass(frozen=True, slots=True)
class Compare:
    kind: CompareKind


def _compare_shape(spec: Compare, ins):
    same_operands("compare", ins)
    if ins[0].dtype.is_complex and spec.kind not in (CompareKind.eq, CompareKind.ne):
        raise ShapeError(f"compare[{spec.kind.value}]: complex values have no order "
                         f"(got {ins[0]})")
    return ins[0].with_dtype(DType.bool)


_TORCH_COMPARE = {CompareKind.eq: "==", CompareKind.ne: "!=", CompareKind.lt: "<",
                  CompareKind.le: "<=", CompareKind.gt: ">", CompareKind.ge: ">="}


def _compare_torch(node, a, code):
    return f"{a[0]} {_TORCH_COMPARE[node.spec.kind]} {a[1]}"


# ne is Not(Equal): ONNX has no NotEqual
_JAX_COMPARE = {CompareKind.eq: "equal", CompareKind.ne: "not_equal", CompareKind.lt: "less",
                CompareKind.le: "less_equal", CompareKind.gt: "greater",
                CompareKind.ge: "greater_equal"}


def _compare_jax(node, a, cx):
    return getattr(cx.jnp, _JAX_COMPARE[node.spec.kind])(a[0], a[1])


_ONNX_COMPARE = {CompareKind.eq: "Equal", CompareKind.lt: "Less", CompareKind.le: "LessOrEqual",
                 CompareKind.gt: "Greater", CompareKind.ge: "GreaterOrEqual"}


def _decide(kind: CompareKind, lo, hi) -> bool | None:
    """``d <kind> 0`` for every ``lo <= d <= hi`` (None: a bound unknown), or None."""
    def le(a, b):  # a <= b provably
        return a is not None and b is not None and nonnegative(b - a)

    below, above, zero = le(hi, -1), le(1, lo), le(0, lo) and le(hi, 0)
    facts = {CompareKind.lt: (below, le(0, lo)), CompareKind.le: (le(hi, 0), above),
             CompareKind.gt: (above, le(hi, 0)), CompareKind.ge: (le(0, lo), below),
             CompareKind.eq: (zero, below or above), CompareKind.ne: (below or above, zero)}
    true, false = facts[kind]
    return True if true else False if false else None


def _compare_values(spec: Compare, facts, batch, types) -> Affine | None:
    """Decided where the bounds of a - b over every sample allow (an index known >= 0 is
    not < 0); with equal strides the sample index cancels, so the per-sample compare is
    exact anyway; with different strides only a decided compare has a per-sample form."""
    a, b = facts
    known = _decide(spec.kind, *span(plus(a, times(b, -1)), batch))
    if known is not None:
        return Affine(0, int(known), int(known))
    return Affine(0, 0, 1) if a.stride == b.stride else None


def _compare_onnx(node, ins, g, cx):
    if cx.type(node.inputs[0]).dtype.is_complex:  # eq or ne
        same = pairs.equal(g, *ins)
        return same if node.spec.kind is CompareKind.eq else g.node("Not", [same])
    if node.spec.kind is CompareKind.ne:
        return g.node("Not", [g.node("Equal", ins)])
    if cx.type(node.inputs[0]).dtype is DType.bool and node.spec.kind is not CompareKind.eq:
        ins = [g.cast(i, DType.i32) for i in ins]  # ONNX orders no bools
    return g.node(_ONNX_COMPARE[node.spec.kind], ins)


primitive(Op.compare, Compare, 2, _compare_shape,
          lambda s, xs, r: _COMPARE[s.kind](xs[0], xs[1]), elementwise_cost,
          "comparisons make masks; no arithmetic composition yields a bool exactly",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE | Trait.SCALAR_OPERAND,
          batch=Aligned(values=_compare_values),
          torch=_compare_torch, onnx=_compare_onnx, jax=_compare_jax, vjp=no_gradient,
          complex_values=True, complex_half=True)


@dataclass(frozen=True, slots=True)
class Cast:
    dtype: DType


def _cast_torch(node, a, code):
    if code.ctx.type(node.inputs[0]).dtype.is_complex and not node.spec.dtype.is_complex:
        return f"{a[0]}.real.to({dtype_expr(node.spec.dtype)})"  # torch's cast, no warning
    return f"{a[0]}.to({dtype_expr(node.spec.dtype)})"


def _cast_onnx(node, ins, g, cx):
    source = cx.type(node.inputs[0])
    if source.dtype.is_complex or node.spec.dtype.is_complex:
        return pairs.cast(g, ins[0], source.dtype, node.spec.dtype, source.rank)
    return g.cast(ins[0], node.spec.dtype)


def _cast_values(spec: Cast, facts, batch, types) -> Affine | None:
    """Wide integers keep the value; bools and floats keep no stride (a float sum of the
    per-sample part and s*i rounds otherwise)."""
    (a,) = facts
    if spec.dtype in (DType.i64, DType.i32):
        return a
    if a.stride:
        return None
    if spec.dtype is DType.bool:
        known = _decide(CompareKind.ne, a.lo, a.hi)
        return Affine(0, 0, 1) if known is None else Affine(0, int(known), int(known))
    return UNKNOWN


def _cast_eval(spec: Cast, xs, resolve):
    """torch's cast; complex to real keeps the real part (torch warns that it does)."""
    (x,) = xs
    return (x.real if x.is_complex() and not spec.dtype.is_complex else x).to(spec.dtype.torch)


def _cast_jax(node, a, cx):
    x = cx.jnp.real(a[0]) if cx.jnp.iscomplexobj(a[0]) and not node.spec.dtype.is_complex \
        else a[0]
    return x.astype(cx.dtype(node.spec.dtype))


def _cast_vjp(spec: Cast, xs, y, dy, ops):
    """Between float and complex types the cotangent is cast back (complex to real keeps the
    real part, as torch's cast does); to or from an integer, none flows."""
    (x,) = xs
    inexact = (x.dtype.is_float or x.dtype.is_complex, spec.dtype.is_float or spec.dtype.is_complex)
    if not all(inexact):
        return (None,)
    if dy.dtype.is_complex and not x.dtype.is_complex:
        dy = ops.real(dy)
    return (ops.cast(dy, x.dtype),)


primitive(Op.cast, Cast, 1, lambda s, ins: ins[0].with_dtype(s.dtype),
          _cast_eval, lambda s, ins, out: traffic(ins, out),
          "changes the element type; no arithmetic composition does",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE,
          batch=Aligned(values=_cast_values),
          torch=_cast_torch, onnx=_cast_onnx,
          jax=_cast_jax, vjp=_cast_vjp, complex_values=True, complex_half=True)
