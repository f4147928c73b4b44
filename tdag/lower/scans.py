"""Running extremes -> torch's cummax / cummin (values and indices from one call).

    scan[max|min](x, a)                                   -> cum_extreme(x, a)
    scan[max](cast[i64](x == v [| isnan(x)]) * positions, a), v = the above
                                                          -> cum_extreme[indices](x, a)
    the shifted f64 form of tdag.ops.scans.logcumsumexp   -> logcumsumexp(x, a)

The second is ``tdag.ops.scans.cummax``'s indices (forward only: torch has no reverse
cummax); both nodes become one ``torch.cummax`` call when reified.
"""
from __future__ import annotations

from functools import lru_cache

from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule, RuleSet, rewrite
from tdag.ir.types import DType
from tdag.lower.activations import extremum_rule
from tdag.lower.kernels.scans import CumExtreme, LogCumSumExp
from tdag.lower.match import kernel_template, matches_kernel, scalar
from tdag.lower.sorting import ancestors, positions_along


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


def logcumsumexp_rule(node: Node, ctx: Context):
    """the last node of ``tdag.ops.scans.logcumsumexp`` (its cast back, or for f64 its floor
    at the running max) -> logcumsumexp(x): the axis from its sum's scan, x among the
    tensors just above that scan, the whole composition checked against the kernel's"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float result")
    readers = ctx.readers(node.name)
    if node.op in (Op.where, Op.maximum) and len(readers) == 1 and readers[0].op is Op.cast:
        return NoMatch("its cast back is the composition's last node")
    for scan in ancestors(ctx, node.name, 4):
        if scan.op is not Op.scan or scan.spec.combine != "add":
            continue
        spec = LogCumSumExp(scan.spec.axis, scan.spec.reverse)
        for x in dict.fromkeys(i for n in ancestors(ctx, scan.name, 4) for i in n.inputs):
            if ctx.type(x).same_as(node.type) and \
                    matches_kernel(ctx, node, Op.logcumsumexp, spec, (x,), _lcse_template):
                emit = ctx.emitter(node)
                return emit.finish(emit(Op.logcumsumexp, spec, x))
    return NoMatch("not the end of a logcumsumexp")


@lru_cache(maxsize=64)
def _lcse_template(op: Op, spec, types) -> TDAG:
    """The decomposition as the rule meets it: its running max already values_rule's
    cum_extreme (the sweep reaches that scan before the composition's last node), its
    maximum of two tensors the "activations" pass's kernel."""
    graph = kernel_template(op, spec, types)
    return rewrite(graph, RuleSet((Rule(Op.scan, values_rule),
                                   Rule(Op.where, extremum_rule))))[0]


RULES = (
    Rule(Op.cast, logcumsumexp_rule),   # cast(m + log(cumsum(exp(x - m)))) -> logcumsumexp
    Rule(Op.where, logcumsumexp_rule),    # (f64: its final maximum, as a select
    Rule(Op.maximum, logcumsumexp_rule),  # or as the "activations" pass's kernel)
    Rule(Op.scan, indices_rule),  # scan[max](cast(x == cummax(x)) * pos) -> cummax indices
    Rule(Op.scan, values_rule),   # scan[max](x) -> cummax values
)
