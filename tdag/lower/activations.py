"""Elementwise chains -> the framework's fused activations (sigmoid, silu, gelu, relu), a
clamp, and torch.maximum / torch.minimum of two tensors (the composition's compare, nan
test, or and select: four passes and two bool tensors where the kernel makes one pass),
|x| (``tdag.ops.abs``'s x * sign(x), a float's zero made +0.0: torch.abs, ONNX Abs), and
torch.nn.functional's leaky_relu, elu (selu, celu), hardsigmoid, softplus, mish, logsigmoid,
hardshrink and softshrink.

Constants are matched by value (a broadcast scalar const), operands of add and multiply in
either order, and products are flattened so ``x * 0.5 * (1 + erf(x / sqrt 2))`` matches in
any association.
"""
from __future__ import annotations

import math

from tdag.deinops.elementwise import CompareKind
from tdag.lower.kernels.activations import (Clamp, Elu, Gelu, LeakyRelu, NanToNum, Rounding,
                                            Shrink, Softplus)
from tdag.ir.carriers import CARRIER
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.types import DType
from tdag.lower.match import close, is_scalar, matches_kernel, scalar


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
    if ctx.type(x) != node.type:  # a constant broadcast wider than x (clamp(x + 3) / 6[M, N])
        return NoMatch(f"{x} is not of the result's type {node.type}")
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


def _times_scalar(ctx: Context, name: str) -> tuple[str, float]:
    """``name`` as ``(y, k)`` with name = y * k (a multiply by a number, either side, or a
    divide by one), else ``(name, 1.0)``; one level only: y may itself be a product."""
    node = ctx.producer(name)
    if node is not None and node.op is Op.multiply:
        for y, k in (node.inputs, reversed(node.inputs)):
            value = scalar(ctx, k)
            if value is not None:
                return y, value
    if node is not None and node.op is Op.divide and node.spec.mode.value == "true":
        value = scalar(ctx, node.inputs[1])
        if value:
            return node.inputs[0], 1.0 / value
    return name, 1.0


def _positive_test(ctx: Context, cond: str) -> str | None:
    """``cond`` is ``x > 0`` or ``x >= 0`` (jax.nn's leaky_relu) -> x."""
    test = ctx.made(cond, Op.compare)
    if test is None or test.spec.kind not in _ABOVE or not is_scalar(ctx, test.inputs[1], 0.0):
        return None
    return test.inputs[0]


def _safe_argument(ctx: Context, name: str, cond: str) -> str:
    """``where(cond, 0, x)`` (jax.nn.elu's guard of expm1's argument, read only where
    ``cond`` fails) -> x; else ``name``."""
    node = ctx.made(name, Op.where)
    if node is not None and node.inputs[0] == cond and is_scalar(ctx, node.inputs[1], 0.0):
        return node.inputs[2]
    return name


def leaky_elu_rule(node: Node, ctx: Context):
    """where(x > 0, x, x * slope) -> leaky_relu(x, slope);
    where(x > 0, x, (exp(x) - 1) [* alpha]) -> elu(x, alpha)  (both keep nan: x > 0 is
    false there and the other side is nan; x >= 0 gives the same, both sides being x at
    +-0; expm1(where(x > 0, 0, x)), jax's, is expm1(x) wherever it is read)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    cond, x, other = node.inputs
    if _positive_test(ctx, cond) != x:
        return NoMatch("not where(x > 0, x, ...)")
    y, coef = _times_scalar(ctx, other)
    if y == x and other != x:
        return _unary(node, ctx, Op.leaky_relu, x, LeakyRelu(coef))
    argument = _exp_minus_one(ctx, y)
    argument = _safe_argument(ctx, argument, cond) if argument is not None else None
    z, input_scale = _times_scalar(ctx, argument) if argument is not None else (None, 1.0)
    if z == x:
        return _unary(node, ctx, Op.elu, x, Elu(coef, 1.0, input_scale))
    return NoMatch("not x * slope or alpha (exp(input_scale x) - 1)")


def _exp_minus_one(ctx: Context, name: str) -> str | None:
    """``exp(a) - 1`` or the expm1 kernel -> a."""
    made = ctx.made(name, Op.expm1) or \
        ctx.made(_minus_scalar_op(ctx, name, Op.add, -1.0) or "", Op.exp)
    return made.inputs[0] if made is not None else None


def elu_scale_rule(node: Node, ctx: Context):
    """elu(x) * scale -> elu(x, scale)  (selu: aten.elu's scale, outside the composition's
    where)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    for name, k in (node.inputs, reversed(node.inputs)):
        elu, value = ctx.made(name, Op.elu), scalar(ctx, k)
        if elu is not None and value is not None and ctx.single_use(name):
            spec = Elu(elu.spec.alpha, elu.spec.scale * value, elu.spec.input_scale)
            return _unary(node, ctx, Op.elu, elu.inputs[0], spec)
    return NoMatch("not a number times an elu")


def shrink_rule(node: Node, ctx: Context):
    """where(x >= -lambd, where(x <= lambd, 0, x), x) -> hardshrink(x, lambd);
    where(x > lambd, x - lambd, where(x < -lambd, x + lambd, x * 0)) -> softshrink(x, lambd)
    (checked node for node against the kernel's decomposition)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    test = ctx.made(node.inputs[0], Op.compare)
    bound = scalar(ctx, test.inputs[1]) if test is not None else None
    if bound is None:
        return NoMatch("not a test of x against a number")
    x = test.inputs[0]
    for spec in (Shrink(-bound, soft=False), Shrink(bound, soft=True)):
        if spec.lambd >= 0 and matches_kernel(ctx, node, Op.shrink, spec, (x,)):
            return _unary(node, ctx, Op.shrink, x, spec)
    return NoMatch("not hardshrink's or softshrink's composition")


def hardsigmoid_rule(node: Node, ctx: Context):
    """clamp(x + 3, 0, 6) / 6 -> hardsigmoid(x)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    y, coef = _times_scalar(ctx, node.name)
    c = ctx.made(y, Op.clamp) if close(coef, 1 / 6) else None
    if c is None or c.spec.lo != 0.0 or c.spec.hi != 6.0:
        return NoMatch("not a sixth of clamp(..., 0, 6)")
    x = _minus_scalar_op(ctx, c.inputs[0], Op.add, 3.0)
    return _unary(node, ctx, Op.hardsigmoid, x) if x is not None else NoMatch("not x + 3")


def softplus_rule(node: Node, ctx: Context):
    """where(beta x > threshold, x, log(exp(beta x) + 1) [/ beta]) -> softplus(x, beta,
    threshold)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    cond, x, soft = node.inputs
    test = ctx.made(cond, Op.compare)
    threshold = scalar(ctx, test.inputs[1]) if test is not None else None
    if threshold is None or test.spec.kind is not CompareKind.gt:
        return NoMatch("not where(beta x > threshold, ...)")
    y, beta = _times_scalar(ctx, test.inputs[0])
    if y != x or beta <= 0:
        return NoMatch("the test is not on beta x")
    logged, k = _times_scalar(ctx, soft)
    log = ctx.made(logged, Op.log) if close(k * beta, 1.0) else None
    e = _minus_scalar_op(ctx, log.inputs[0], Op.add, 1.0) if log is not None else None
    exp = ctx.made(e, Op.exp) if e is not None else None
    if exp is None or exp.inputs[0] != test.inputs[0]:
        return NoMatch("not log(exp(beta x) + 1) / beta")
    return _unary(node, ctx, Op.softplus, x, Softplus(beta, threshold))


def mish_rule(node: Node, ctx: Context):
    """x * tanh(softplus(x)) -> mish(x)  (torch's softplus: beta 1, threshold 20)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    for x, t in (node.inputs, reversed(node.inputs)):
        tanh = ctx.made(t, Op.tanh)
        soft = ctx.made(tanh.inputs[0], Op.softplus) if tanh is not None else None
        if soft is not None and soft.inputs[0] == x and soft.spec == Softplus():
            return _unary(node, ctx, Op.mish, x)
    return NoMatch("not x * tanh(softplus(x))")


def _rounded(ctx: Context, name: str, mode: str) -> str | None:
    """``name`` is the rounding kernel in ``mode`` -> its operand."""
    node = ctx.made(name, Op.rounding)
    return node.inputs[0] if node is not None and node.spec.mode == mode else None


def rounding_rule(node: Node, ctx: Context):
    """where(x < trunc(x), trunc(x) - 1, trunc(x)) -> floor(x);  -floor(-x) -> ceil(x);
    where(x - floor(x) > 0.5 or (== 0.5 and floor(x) odd), floor(x) + 1, floor(x)) ->
    round(x) (half to even)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    if node.op is Op.neg:
        inner = _rounded(ctx, node.inputs[0], "floor")
        x = _negated(ctx, inner) if inner is not None else None
        return _unary(node, ctx, Op.rounding, x, Rounding("ceil")) if x is not None else \
            NoMatch("not -floor(-x)")
    cond, up, low = node.inputs
    t = ctx.made(low, Op.divide)
    if t is not None and t.spec.mode.value == "trunc" and is_scalar(ctx, t.inputs[1], 1.0):
        test = ctx.made(cond, Op.compare)
        x = t.inputs[0]
        if test is not None and test.spec.kind is CompareKind.lt and test.inputs == (x, low) \
                and _minus_scalar_op(ctx, up, Op.add, -1.0) == low:
            return _unary(node, ctx, Op.rounding, x, Rounding("floor"))
        return NoMatch("not trunc(x) corrected down")
    x = _rounded(ctx, low, "floor")
    if x is None or _minus_scalar_op(ctx, up, Op.add, 1.0) != low or \
            not _rounds_half_to_even(ctx, cond, x, low):
        return NoMatch("not floor(x) + 1 where its fraction rounds up")
    return _unary(node, ctx, Op.rounding, x, Rounding("half_even"))


def _rounds_half_to_even(ctx: Context, cond: str, x: str, low: str) -> bool:
    """``cond`` is (x - low > 0.5) or (x - low == 0.5 and low % 2 == 1), as ops.round
    writes it (or as where(a, True, b), and as where(a, b, False))."""
    either = ctx.made(cond, Op.where)
    if either is None or not is_scalar(ctx, either.inputs[1], 1.0):
        return False
    above, tie = ctx.made(either.inputs[0], Op.compare), ctx.producer(either.inputs[2])
    if above is None or above.spec.kind is not CompareKind.gt or \
            not is_scalar(ctx, above.inputs[1], 0.5) or tie is None:
        return False
    if tie.op is Op.multiply:  # a bool and
        both = tie.inputs
    elif tie.op is Op.where and is_scalar(ctx, tie.inputs[2], 0.0):
        both = tie.inputs[:2]
    else:
        return False
    frac = above.inputs[0]
    half, odd = (ctx.made(b, Op.compare) for b in both)
    if half is not None and half.inputs[0] != frac:
        half, odd = odd, half
    if half is None or odd is None or half.inputs[0] != frac or \
            half.spec.kind is not CompareKind.eq or odd.spec.kind is not CompareKind.eq or \
            not is_scalar(ctx, half.inputs[1], 0.5) or not is_scalar(ctx, odd.inputs[1], 1.0):
        return False
    rem = ctx.made(odd.inputs[0], Op.divide)
    return rem is not None and rem.spec.mode.value == "remainder" and \
        rem.inputs[0] == low and is_scalar(ctx, rem.inputs[1], 2.0) and \
        _difference(ctx, frac) == (x, low)


def _beside(ctx: Context, name: str, op: Op, inner: Op, same: bool = False) -> tuple | None:
    """``name = op(a, inner(b))`` in either order -> (a, b); with ``same``, only a == b."""
    node = ctx.made(name, op)
    for a, b in (node.inputs, reversed(node.inputs)) if node is not None else ():
        made = ctx.made(b, inner)
        if made is not None and (not same or made.inputs[0] == a):
            return a, made.inputs[0]
    return None


def _difference(ctx: Context, name: str) -> tuple | None:
    """``name`` is a - b (as sub writes it: a + neg(b), either order) -> (a, b)."""
    return _beside(ctx, name, Op.add, Op.neg)


def precise_rule(node: Node, ctx: Context):
    """where(u - 1 == 0, x, ...) as ops.log1p or ops.expm1 writes it -> log1p(x), expm1(x)
    (checked node for node against the kernel's decomposition)"""
    cond, x, rest = node.inputs
    test = ctx.made(cond, Op.compare)
    if not node.type.dtype.is_float or test is None or test.spec.kind is not CompareKind.eq \
            or not is_scalar(ctx, test.inputs[1], 0.0) or ctx.made(rest, Op.where) is None \
            or ctx.type(x) != node.type:
        return NoMatch("not where(u - 1 == 0, x, where(...))")
    for op in (Op.log1p, Op.expm1):
        if matches_kernel(ctx, node, op, NoSpec(), (x,)):
            return _unary(node, ctx, op, x)
    return NoMatch("neither log1p's nor expm1's composition")


def logsigmoid_rule(node: Node, ctx: Context):
    """min(x, 0) - log1p(exp(-|x|)) -> logsigmoid(x)  (its abs and log1p kernels already;
    the min as where(x > 0 or 0 < x, 0, x), torch.export's where(c, True, False) around the
    test seen through)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    for low, tail in (node.inputs, reversed(node.inputs)):
        log = ctx.made(_negated(ctx, tail) or "", Op.log1p)
        exp = ctx.made(log.inputs[0], Op.exp) if log is not None else None
        magnitude = ctx.made(_negated(ctx, exp.inputs[0]) or "", Op.abs) if exp else None
        if magnitude is not None and _min_zero(ctx, low) == magnitude.inputs[0]:
            return _unary(node, ctx, Op.logsigmoid, magnitude.inputs[0])
    return NoMatch("not min(x, 0) - log1p(exp(-|x|))")


def _min_zero(ctx: Context, name: str) -> str | None:
    """``where(x > 0, 0, x)`` (or ``0 < x``, or that test as where(c, True, False)) -> x."""
    node = ctx.made(name, Op.where)
    if node is None or not is_scalar(ctx, node.inputs[1], 0.0):
        return None
    x, cond = node.inputs[2], node.inputs[0]
    wrapped = ctx.made(cond, Op.where)
    if wrapped is not None and is_scalar(ctx, wrapped.inputs[1], 1.0) and \
            is_scalar(ctx, wrapped.inputs[2], 0.0):
        cond = wrapped.inputs[0]
    test = ctx.made(cond, Op.compare)
    if test is None:
        return None
    if test.spec.kind is CompareKind.gt and test.inputs[0] == x and \
            is_scalar(ctx, test.inputs[1], 0.0):
        return x
    if test.spec.kind is CompareKind.lt and test.inputs[1] == x and \
            is_scalar(ctx, test.inputs[0], 0.0):
        return x
    return None


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


def nan_to_num_rule(node: Node, ctx: Context):
    """where(y == -inf, n, y), y = where(z == inf, p, z), z = where(isnan(x), v, x) ->
    nan_to_num(x, v, p, n)  (checked node for node against the kernel's decomposition)"""
    cond, low, y = node.inputs
    test = ctx.made(cond, Op.compare)
    if not node.type.dtype.is_float or test is None or test.inputs[0] != y or \
            scalar(ctx, test.inputs[1]) != -math.inf:
        return NoMatch("not where(y == -inf, n, y)")
    upper = ctx.made(y, Op.where)
    inner = ctx.made(upper.inputs[2], Op.where) if upper is not None else None
    if inner is None:
        return NoMatch("not three selects")
    values = tuple(scalar(ctx, n) for n in (inner.inputs[1], upper.inputs[1], low))
    x = inner.inputs[2]
    if None in values or not matches_kernel(ctx, node, Op.nan_to_num, NanToNum(*values), (x,)):
        return NoMatch("not nan_to_num's composition")
    return _unary(node, ctx, Op.nan_to_num, x, NanToNum(*values))


def _times_own_sign(ctx: Context, name: str) -> str | None:
    """``x * sign(x)`` (either order) -> x."""
    found = _beside(ctx, name, Op.multiply, Op.sign, same=True)
    return found[0] if found is not None else None


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
    Rule(Op.where, leaky_elu_rule),     # where(x > 0, x, x * slope) -> leaky_relu(x, slope)
    Rule(Op.multiply, elu_scale_rule),  # elu(x) * scale -> elu(x, scale): selu
    Rule(Op.where, shrink_rule),        # where(x > l, x - l, where(x < -l, ...)) -> softshrink
    Rule(Op.divide, hardsigmoid_rule),  # clamp(x + 3, 0, 6) / 6 -> hardsigmoid(x)
    Rule(Op.multiply, hardsigmoid_rule),  # clamp(x + 3, 0, 6) * (1/6) -> hardsigmoid(x)
    Rule(Op.where, softplus_rule),      # where(x > 20, x, log(exp(x) + 1)) -> softplus(x)
    Rule(Op.multiply, mish_rule),       # x * tanh(softplus(x)) -> mish(x)
    Rule(Op.where, rounding_rule),      # where(x < trunc(x), trunc(x) - 1, trunc(x)) -> floor
    Rule(Op.neg, rounding_rule),        # -floor(-x) -> ceil(x)
    Rule(Op.where, precise_rule),       # Kahan's log(u) x / (u - 1), u = 1 + x -> log1p(x)
    Rule(Op.where, abs_rule),           # where(x == 0, 0, x * sign(x)) -> abs(x)
    Rule(Op.where, nan_to_num_rule),    # where(x == -inf, n, where(x == inf, ...)) -> nan_to_num
    Rule(Op.add, logsigmoid_rule),      # min(x, 0) - log1p(exp(-|x|)) -> logsigmoid(x)
    Rule(Op.multiply, abs_rule),        # x * sign(x) -> abs(x), a signed integer's
)
