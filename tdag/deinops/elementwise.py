"""Elementwise primitives. Operands of binary ops have equal shapes and dtypes: broadcasting
is explicit (unsqueeze + repeat), so a pass never has to reason about implicit broadcast."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from tdag.deinops.primitive import NoSpec, elementwise_cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait
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


def _unary_shape_rule(op: Op, float_only: bool):
    def rule(spec, ins):
        (x,) = ins
        if float_only and not x.dtype.is_float:
            raise ShapeError(f"{op.value}: needs a floating-point operand, got {x.dtype.value}")
        if x.dtype is DType.bool:
            raise ShapeError(f"{op.value}: not defined on bool")
        return x
    return rule


def _unary_evaluator(fn):
    return lambda spec, xs, resolve: fn(xs[0])


for _op, (_fn, _float_only, _reason) in _UNARY.items():
    primitive(_op, NoSpec, 1, _unary_shape_rule(_op, _float_only), _unary_evaluator(_fn),
              elementwise_cost, _reason,
              traits=Trait.ELEMENTWISE | Trait.UNARY | Trait.POINTWISE)


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


primitive(Op.add, NoSpec, 2, _binary_shape_rule(Op.add), lambda s, xs, r: xs[0] + xs[1],
          elementwise_cost, "addition; with neg, subtraction; with pad, concat",
          traits=Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.COMMUTATIVE | Trait.SCALAR_OPERAND)
primitive(Op.multiply, NoSpec, 2, _binary_shape_rule(Op.multiply),
          lambda s, xs, r: xs[0] * xs[1] if xs[0].dtype != torch.bool else xs[0] & xs[1],
          elementwise_cost, "multiplication; with repeat and reduce-sum, every contraction",
          traits=Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.COMMUTATIVE | Trait.SCALAR_OPERAND)


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
    if spec.mode is DivideMode.true and not out.dtype.is_float:
        raise ShapeError("divide: true division needs floats; cast first or use mode=floor")
    return out


def _divide_eval(spec: Divide, xs, resolve):
    if spec.mode is DivideMode.remainder:
        return torch.remainder(xs[0], xs[1])
    if spec.mode is DivideMode.fmod:
        return torch.fmod(xs[0], xs[1])
    mode = None if spec.mode is DivideMode.true else spec.mode.value
    return torch.div(xs[0], xs[1], rounding_mode=mode)


primitive(Op.divide, Divide, 2, _divide_shape, _divide_eval, elementwise_cost,
          "a*(1/b) rounds twice in float32 and is wrong for integer floor division; "
          "a - b*floor(a/b) is not an exact remainder in floats",
          traits=Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.SCALAR_OPERAND)
primitive(Op.pow, NoSpec, 2, _binary_shape_rule(Op.pow), lambda s, xs, r: torch.pow(xs[0], xs[1]),
          elementwise_cost, "exp(y*log x) is inexact and fails for negative bases; sqrt = x^0.5",
          traits=Trait.ELEMENTWISE | Trait.BINARY | Trait.POINTWISE | Trait.SCALAR_OPERAND)


# -- beyond exact compositions ----------------------------------------------------------------

def _where_shape(spec, ins):
    cond, a, b = ins
    if cond.dtype is not DType.bool:
        raise ShapeError(f"where: condition must be bool, got {cond.dtype.value}")
    same_operands("where", [a, b])
    if not cond.with_dtype(a.dtype).same_as(a):
        raise ShapeError(f"where: condition {cond} and values {a} differ in shape")
    return a


primitive(Op.where, NoSpec, 3, _where_shape, lambda s, xs, r: torch.where(xs[0], xs[1], xs[2]),
          elementwise_cost, "select by mask; c*a + (1-c)*b is wrong when a or b is inf (-inf masks)",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE | Trait.SCALAR_OPERAND)


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
    return ins[0].with_dtype(DType.bool)


primitive(Op.compare, Compare, 2, _compare_shape,
          lambda s, xs, r: _COMPARE[s.kind](xs[0], xs[1]), elementwise_cost,
          "comparisons make masks; no arithmetic composition yields a bool exactly",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE | Trait.SCALAR_OPERAND)


@dataclass(frozen=True, slots=True)
class Cast:
    dtype: DType


primitive(Op.cast, Cast, 1, lambda s, ins: ins[0].with_dtype(s.dtype),
          lambda s, xs, r: xs[0].to(s.dtype.torch), lambda s, ins, out: traffic(ins, out),
          "changes the element type; no arithmetic composition does",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE)
