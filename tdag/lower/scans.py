"""Running extremes -> torch's cummax / cummin (values and indices from one call).

    scan[max|min](x, a)                                   -> cum_extreme(x, a)
    scan[max](cast[i64](x == v [| isnan(x)]) * positions, a), v = the above
                                                          -> cum_extreme[indices](x, a)

The second is ``tdag.ops.scans.cummax``'s indices (forward only: torch has no reverse
cummax); both nodes become one ``torch.cummax`` call when reified.
"""
from __future__ import annotations

from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.types import DType
from tdag.lower.kernels.scans import CumExtreme
from tdag.lower.match import scalar
from tdag.lower.sorting import positions_along


def values_rule(node: Node, ctx: Context):
    """scan[max|min](x, a), from the start -> cum_extreme(x, a)"""
    s = node.spec
    if s.reverse or s.combine not in ("max", "min") or node.type.dtype is DType.bool:
        return NoMatch("not a forward running max or min of numbers")
    if _indices_of(ctx, node) is not None:
        return NoMatch("the running max of a cummax's positions: indices_rule's")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.cum_extreme, CumExtreme(s.axis, s.combine), node.inputs[0]))


def indices_rule(node: Node, ctx: Context):
    """scan[max](cast(x == running extreme of x [| isnan(x)]) * positions) -> indices"""
    found = _indices_of(ctx, node)
    if found is None:
        return NoMatch("not the running max of the positions holding a running extreme")
    x, combine = found
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.cum_extreme, CumExtreme(node.spec.axis, combine, True), x))


def _indices_of(ctx: Context, node: Node):
    """(x, combine) where ``node`` is the running max of the positions at which x equals
    its running ``combine`` (or is NaN), else None."""
    s = node.spec
    product = ctx.made(node.inputs[0], Op.multiply)
    if s.reverse or s.combine != "max" or product is None:
        return None
    for held, positions in (product.inputs, tuple(reversed(product.inputs))):
        mark = ctx.made(held, Op.cast)
        if mark is None or not positions_along(ctx, positions, s.axis):
            continue
        found = _held(ctx, mark.inputs[0], s.axis)
        if found is not None:
            return found
    return None


def _held(ctx: Context, name: str, axis: int):
    """(x, combine) where ``name`` is ``x == running combine of x``, or that or isnan(x)
    for a float x."""
    where = ctx.made(name, Op.where)
    nan = None
    if where is not None and scalar(ctx, where.inputs[1]) == 1.0:  # a | b as where(a, T, b)
        nan = ctx.made(where.inputs[2], Op.compare)
        if nan is None or nan.spec.kind.value != "ne" or nan.inputs[0] != nan.inputs[1]:
            return None
        name = where.inputs[0]
    eq = ctx.made(name, Op.compare)
    if eq is None or eq.spec.kind.value != "eq":
        return None
    for x, running in (eq.inputs, tuple(reversed(eq.inputs))):
        combine = _running(ctx, running, x, axis)
        float_x = ctx.type(x).dtype.is_float
        if combine is not None and (nan.inputs[0] == x if nan is not None else not float_x):
            return x, combine
    return None


def _running(ctx: Context, name: str, x: str, axis: int) -> str | None:
    """The combine of ``name`` if it is x's forward running max or min along ``axis``."""
    node = ctx.producer(name)
    if node is None or node.inputs[0] != x:
        return None
    if node.op is Op.scan and not node.spec.reverse and node.spec.axis == axis:
        return node.spec.combine if node.spec.combine in ("max", "min") else None
    if node.op is Op.cum_extreme and not node.spec.indices and node.spec.axis == axis:
        return node.spec.combine
    return None


RULES = (
    Rule(Op.scan, indices_rule),  # scan[max](cast(x == cummax(x)) * pos) -> cummax indices
    Rule(Op.scan, values_rule),   # scan[max](x) -> cummax values
)
