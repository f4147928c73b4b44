"""Elementwise chains -> the framework's fused activations (sigmoid, silu, gelu, relu), a
clamp, and torch.maximum / torch.minimum of two tensors (the composition's compare, nan
test, or and select: four passes and two bool tensors where the kernel makes one pass), and
|x| (``tdag.ops.abs``'s x * sign(x), a float's zero made +0.0: torch.abs, ONNX Abs).

Constants are matched by value (a broadcast scalar const), operands of add and multiply in
either order, and products are flattened so ``x * 0.5 * (1 + erf(x / sqrt 2))`` matches in
any association.
"""
from __future__ import annotations

import math

from tdag.deinops.elementwise import CompareKind
from tdag.lower.kernels.activations import Clamp, Gelu
from tdag.ir.carriers import CARRIER
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.types import DType
from tdag.lower.match import close, is_scalar, scalar


def _minus_scalar_op(ctx: Context, name: str, op: Op, value: float) -> str | None:
    """``name = op(y, value)`` with the scalar on either side -> y."""
    node = ctx.made(name, op)
    if node is None:
        return None
    a, b = node.inputs
    if is_scalar(ctx, b, value):
        return a
    if is_scalar(ctx, a, value) and op in (Op.add, Op.multiply):
        return b
    return None


def _negated(ctx: Context, name: str) -> str | None:
    """-y as neg(y) or y * -1 -> y."""
    node = ctx.made(name, Op.neg)
    return node.inputs[0] if node is not None else _minus_scalar_op(ctx, name, Op.multiply, -1.0)


def sigmoid_denominator(ctx: Context, name: str) -> str | None:
    """``1 + exp(-x)`` -> x."""
    e = _minus_scalar_op(ctx, name, Op.add, 1.0)
    exp = ctx.made(e, Op.exp) if e is not None else None
    return _negated(ctx, exp.inputs[0]) if exp is not None else None


def _sigmoid_of(ctx: Context, name: str) -> str | None:
    """sigmoid(x) as a kernel, 1/(1 + exp(-x)) or reciprocal(1 + exp(-x)) -> x."""
    node = ctx.producer(name)
    if node is None:
        return None
    if node.op is Op.sigmoid:
        return node.inputs[0]
    if node.op is Op.reciprocal:
        return sigmoid_denominator(ctx, node.inputs[0])
    if node.op is Op.divide and node.spec.mode.value == "true" and \
            is_scalar(ctx, node.inputs[0], 1.0):
        return sigmoid_denominator(ctx, node.inputs[1])
    return None


def _unary(node: Node, ctx: Context, op: Op, x: str, spec=None):
    emit = ctx.emitter(node)
    return emit.finish(emit(op, spec if spec is not None else NoSpec(), x))


def sigmoid_rule(node: Node, ctx: Context):
    """1 / (1 + exp(-x)) -> sigmoid(x)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    x = _sigmoid_of(ctx, node.name)
    return _unary(node, ctx, Op.sigmoid, x) if x is not None else NoMatch("not a sigmoid")


def silu_rule(node: Node, ctx: Context):
    """x / (1 + exp(-x)) -> silu(x);  x * sigmoid(x) -> silu(x)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    if node.op is Op.divide and node.spec.mode.value == "true":
        x, den = node.inputs
        if sigmoid_denominator(ctx, den) == x:
            return _unary(node, ctx, Op.silu, x)
    if node.op is Op.multiply:
        for x, s in (node.inputs, reversed(node.inputs)):
            if _sigmoid_of(ctx, s) == x:
                return _unary(node, ctx, Op.silu, x)
    return NoMatch("not a silu")


def factors(ctx: Context, name: str, depth: int = 4) -> tuple[float, list[str]]:
    """``name`` as ``coef * prod(terms)`` through nested multiplies by scalars and tensors."""
    value = scalar(ctx, name)
    if value is not None:
        return value, []
    node = ctx.producer(name)
    if node is not None and node.op is Op.divide and node.spec.mode.value == "true" and depth:
        d = scalar(ctx, node.inputs[1])
        if d:
            coef, terms = factors(ctx, node.inputs[0], depth - 1)
            return coef / d, terms
    if node is None or node.op is not Op.multiply or depth == 0:
        return 1.0, [name]
    coef, terms = 1.0, []
    for operand in node.inputs:
        c, t = factors(ctx, operand, depth - 1)
        coef, terms = coef * c, terms + t
    return coef, terms


_SQRT_HALF = math.sqrt(0.5)
_TANH_SCALE = math.sqrt(2.0 / math.pi)


def gelu_rule(node: Node, ctx: Context):
    """x * 0.5 * (1 + erf(x / sqrt 2)) -> gelu(x);  the tanh form -> gelu(x, 'tanh')"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    coef, terms = factors(ctx, node.name)
    if len(terms) != 2 or not close(coef, 0.5):
        return NoMatch("not half a product of two terms")
    for x, t in (terms, reversed(terms)):
        inner = _minus_scalar_op(ctx, t, Op.add, 1.0)
        fn = ctx.producer(inner) if inner is not None else None
        if fn is None:
            continue
        if fn.op is Op.erf and _scaled(ctx, fn.inputs[0], x, _SQRT_HALF):
            return _unary(node, ctx, Op.gelu, x, Gelu("none"))
        if fn.op is Op.tanh and _tanh_argument(ctx, fn.inputs[0], x):
            return _unary(node, ctx, Op.gelu, x, Gelu("tanh"))
    return NoMatch("not a gelu")


def _scaled(ctx: Context, name: str, x: str, k: float) -> bool:
    """Whether ``name`` is ``k * x`` (a multiply by k or a divide by 1/k)."""
    coef, terms = factors(ctx, name)
    if terms == [x] and close(coef, k):
        return True
    node = ctx.made(name, Op.divide)
    if node is not None and node.inputs[0] == x:
        d = scalar(ctx, node.inputs[1])
        return d is not None and d != 0 and close(1.0 / d, k)
    return False


def _tanh_argument(ctx: Context, name: str, x: str) -> bool:
    """sqrt(2/pi) * (x + 0.044715 x^3)."""
    coef, terms = factors(ctx, name)
    if len(terms) != 1 or not close(coef, _TANH_SCALE):
        return False
    add = ctx.made(terms[0], Op.add)
    if add is None:
        return False
    for a, b in (add.inputs, reversed(add.inputs)):
        c, cube = factors(ctx, b)
        if a == x and close(c, 0.044715) and _is_cube(ctx, cube, x):
            return True
    return False


def _is_cube(ctx: Context, terms: list, x: str) -> bool:
    if terms == [x, x, x]:
        return True
    if len(terms) == 1:
        node = ctx.made(terms[0], Op.pow)
        return node is not None and node.inputs[0] == x and is_scalar(ctx, node.inputs[1], 3.0)
    return False


_BELOW = {CompareKind.lt, CompareKind.le}
_ABOVE = {CompareKind.gt, CompareKind.ge}


def relu_rule(node: Node, ctx: Context):
    """where(x < 0, 0, x) -> relu(x);  clamp(x, lo=0) -> relu(x)  (both keep nan)"""
    if node.op is Op.clamp:
        if node.spec.lo == 0.0 and node.spec.hi is None:
            return _unary(node, ctx, Op.relu, node.inputs[0])
        return NoMatch("bounds other than lo=0")
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    cond, a, b = node.inputs
    test = ctx.made(cond, Op.compare)
    if test is None:
        return NoMatch("condition is not a comparison")
    lhs, rhs = test.inputs
    kind = test.spec.kind
    if is_scalar(ctx, lhs, 0.0):  # 0 > x is x < 0
        lhs, rhs = rhs, lhs
        kind = {CompareKind.gt: CompareKind.lt, CompareKind.ge: CompareKind.le}.get(kind)
    # where(x > 0, x, 0) is not a relu: it maps nan to 0
    if kind in _BELOW and is_scalar(ctx, rhs, 0.0) and is_scalar(ctx, a, 0.0) and b == lhs:
        return _unary(node, ctx, Op.relu, lhs)
    return NoMatch("not a relu")


def _bound(ctx: Context, cond: str, x: str):
    """``cond`` is ``x > s or isnan(x)`` (as maximum and minimum write it, so that nan
    passes through as in torch.clamp): ``(kind, s)``."""
    node = _or_nan(ctx, cond, x)
    if node is None or node.op is not Op.compare or node.inputs[0] != x:
        return None
    value = scalar(ctx, node.inputs[1])
    return None if value is None else (node.spec.kind, value)


def clamp_rule(node: Node, ctx: Context):
    """maximum(x, lo) -> clamp(x, lo);  minimum(x, hi) -> clamp(x, hi=hi);
    clamp(clamp(x, lo), hi=hi) -> clamp(x, lo, hi)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    if node.op is Op.clamp:  # relu is clamp(lo=0)
        inner = ctx.producer(node.inputs[0])
        if inner is None or inner.op not in (Op.clamp, Op.relu) or node.spec.lo is not None or \
                (inner.op is Op.clamp and inner.spec.hi is not None) or \
                not ctx.single_use(inner.name):
            return NoMatch("not nested bounds")
        lo = 0.0 if inner.op is Op.relu else inner.spec.lo
        return _unary(node, ctx, Op.clamp, inner.inputs[0], Clamp(lo, node.spec.hi))
    cond, x, y = node.inputs  # a where
    bound, value = _bound(ctx, cond, x), scalar(ctx, y)
    if bound is None or value is None or bound[1] != value:
        return NoMatch("not a bound")
    if bound[0] in _ABOVE:
        return _unary(node, ctx, Op.clamp, x, Clamp(lo=value))
    if bound[0] in _BELOW:
        return _unary(node, ctx, Op.clamp, x, Clamp(hi=value))
    return NoMatch("not a bound")


def extremum_rule(node: Node, ctx: Context):
    """where(a > b or isnan(a), a, b) -> maximum(a, b); < -> minimum (an integer's without
    the isnan), a and b two tensors of the result's type (a number bound is a clamp)"""
    cond, a, b = node.inputs
    if node.type.dtype in CARRIER or node.type.dtype is DType.bool:
        return NoMatch("a type torch carries in another (uint64: on int64 an order differs)")
    if not ctx.type(a) == ctx.type(b) == node.type or scalar(ctx, b) is not None:
        return NoMatch("not two tensors of one type")
    test = ctx.producer(cond)
    if node.type.dtype.is_float:
        test = _or_nan(ctx, cond, a)
    if test is None or test.op is not Op.compare or test.inputs != (a, b):
        return NoMatch("not a compare of the two operands")
    op = {CompareKind.gt: Op.maximum, CompareKind.ge: Op.maximum,
          CompareKind.lt: Op.minimum, CompareKind.le: Op.minimum}.get(test.spec.kind)
    if op is None:
        return NoMatch("not an order")
    emit = ctx.emitter(node)
    return emit.finish(emit(op, NoSpec(), a, b))


def _or_nan(ctx: Context, cond: str, x: str):
    """The compare ``c`` where ``cond`` is ``c or isnan(x)`` (as ops.maximum writes it:
    where(c, True, x != x)), else None."""
    node = ctx.producer(cond)
    if node is None or node.op is not Op.where or not is_scalar(ctx, node.inputs[1], 1.0):
        return None
    nan = ctx.made(node.inputs[2], Op.compare)
    if nan is None or nan.spec.kind is not CompareKind.ne or nan.inputs != (x, x):
        return None
    return ctx.producer(node.inputs[0])


def hardswish_rule(node: Node, ctx: Context):
    """x * clamp(x + 3, 0, 6) / 6 -> hardswish(x)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    coef, terms = factors(ctx, node.name)
    if len(terms) != 2 or not close(coef, 1 / 6):
        return NoMatch("not a sixth of a product")
    for x, t in (terms, reversed(terms)):
        c = ctx.made(t, Op.clamp)
        if c is not None and c.spec.lo == 0.0 and c.spec.hi == 6.0 and \
                _minus_scalar_op(ctx, c.inputs[0], Op.add, 3.0) == x:
            return _unary(node, ctx, Op.hardswish, x)
    return NoMatch("not a hardswish")


def abs_rule(node: Node, ctx: Context):
    """where(x == 0, 0, x * sign(x)) -> abs(x) (a float's: |-0.0| is 0.0);
    x * sign(x) -> abs(x) (a signed integer's)"""
    dtype = node.type.dtype
    if node.op is Op.where:
        cond, zero, product = node.inputs
        test = ctx.made(cond, Op.compare)
        if not dtype.is_float or test is None or test.spec.kind is not CompareKind.eq or \
                not is_scalar(ctx, test.inputs[1], 0.0) or not is_scalar(ctx, zero, 0.0):
            return NoMatch("not where(x == 0, 0, ...)")
        x = _times_own_sign(ctx, product)
        return _unary(node, ctx, Op.abs, x) if x == test.inputs[0] else NoMatch("not |x|")
    if dtype.is_float or dtype.is_unsigned or dtype is DType.bool or dtype.is_complex:
        return NoMatch("x * sign(x) is |x| for a signed integer only (a float's -0.0 stays)")
    x = _times_own_sign(ctx, node.name)
    return _unary(node, ctx, Op.abs, x) if x is not None else NoMatch("not x * sign(x)")


def _times_own_sign(ctx: Context, name: str) -> str | None:
    """``x * sign(x)`` (either order) -> x."""
    node = ctx.made(name, Op.multiply)
    if node is None:
        return None
    for x, s in (node.inputs, reversed(node.inputs)):
        sign = ctx.made(s, Op.sign)
        if sign is not None and sign.inputs[0] == x:
            return x
    return None


RULES = (
    Rule(Op.reciprocal, sigmoid_rule),  # reciprocal(1 + exp(-x)) -> sigmoid(x)
    Rule(Op.divide, sigmoid_rule),      # 1 / (1 + exp(-x)) -> sigmoid(x)
    Rule(Op.divide, silu_rule),         # x / (1 + exp(-x)) -> silu(x)
    Rule(Op.multiply, silu_rule),       # x * sigmoid(x) -> silu(x)
    Rule(Op.multiply, gelu_rule),       # x * 0.5 * (1 + erf(x / sqrt 2)) -> gelu(x)
    Rule(Op.clamp, relu_rule),          # clamp(x, lo=0) -> relu(x)
    Rule(Op.where, relu_rule),          # where(x < 0, 0, x) -> relu(x)
    Rule(Op.clamp, clamp_rule),         # clamp(clamp(x, lo), hi=hi) -> clamp(x, lo, hi)
    Rule(Op.where, clamp_rule),         # where(x > lo or isnan(x), x, lo) -> clamp(x, lo)
    Rule(Op.where, extremum_rule),      # where(a > b or isnan(a), a, b) -> maximum(a, b)
    Rule(Op.multiply, hardswish_rule),  # x * clamp(x + 3, 0, 6) * (1/6) -> hardswish(x)
    Rule(Op.divide, hardswish_rule),    # x * clamp(x + 3, 0, 6) / 6 -> hardswish(x)
    Rule(Op.where, abs_rule),           # where(x == 0, 0, x * sign(x)) -> abs(x)
    Rule(Op.multiply, abs_rule),        # x * sign(x) -> abs(x), a signed integer's
)
