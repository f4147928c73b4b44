"""Two-operand functions torch runs as one kernel, their compositions after the activations
pass (which has made their maximum, abs and log1p kernels):

    where(a == b == +-inf, a, max(a, b) + log1p(exp(-|a - b|)))   -> logaddexp(a, b)
    where(signbit(x), atan(r) + pi with y's sign, atan(r)),
        r = y / x, y at 0/0, sign(y) sign(x) at inf/inf           -> atan2(y, x)
    where(|x| or |y| is inf, inf, max(|x|, |y|) sqrt((min / max)^2 + 1)) -> hypot(x, y)

Each is checked node for node against the kernel's decomposition as that pass leaves it.
"""
from __future__ import annotations

from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ir.rewrite import Context, NoMatch, Rule, RuleSet, rewrite
from tdag.lower import activations
from tdag.lower.match import kernel_template, matches_kernel
from tdag.refine.dataflow import prune

_ACTIVATIONS = RuleSet(activations.RULES)


def _activations_template(op: Op, spec, types: tuple) -> TDAG:
    """The kernel's template as the activations pass leaves it (its maximum, abs and log1p
    kernels made)."""
    graph, _ = rewrite(kernel_template(op, spec, types), _ACTIVATIONS)
    return prune(graph)


def logaddexp_rule(node: Node, ctx: Context):
    """where(a == b and |a| == inf, a, max(a, b) + log1p(exp(-|a - b|))) -> logaddexp(a, b)
    (checked node for node against the kernel's decomposition, its kernels made)"""
    cond, a, total = node.inputs
    both = ctx.made(total, Op.add)
    if not node.type.dtype.is_float or both is None:
        return NoMatch("not where(..., a, max(a, b) + ...)")
    for m in both.inputs:
        top = ctx.made(m, Op.maximum)
        if top is not None and top.inputs[0] == a and \
                matches_kernel(ctx, node, Op.logaddexp, NoSpec(), top.inputs,
                               _activations_template):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.logaddexp, NoSpec(), *top.inputs))
    return NoMatch("not logaddexp's composition")


def atan2_rule(node: Node, ctx: Context):
    """where(signbit(x), atan(r) + shift, atan(r)), r = y / x with the limits of 0/0 and
    inf/inf -> atan2(y, x)  (checked node for node against the kernel's decomposition, its
    kernels made)"""
    base = ctx.made(node.inputs[2], Op.atan)
    ratio = ctx.made(base.inputs[0], Op.where) if base is not None else None
    inner = ctx.made(ratio.inputs[2], Op.where) if ratio is not None else None
    quotient = ctx.made(inner.inputs[2], Op.divide) if inner is not None else None
    if not node.type.dtype.is_float or quotient is None:
        return NoMatch("not where(..., atan(where(..., y / x)))")
    if not matches_kernel(ctx, node, Op.atan2, NoSpec(), quotient.inputs,
                          _activations_template):
        return NoMatch("not atan2's composition")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.atan2, NoSpec(), *quotient.inputs))


def hypot_rule(node: Node, ctx: Context):
    """where(|x| == inf or |y| == inf, inf, max(|x|, |y|) sqrt(r^2 + 1)), r = min / max ->
    hypot(x, y)  (checked node for node against the kernel's decomposition, its kernels
    made)"""
    product = ctx.made(node.inputs[2], Op.multiply)
    for big in (ctx.made(n, Op.maximum) for n in (product.inputs if product else ())):
        magnitudes = [ctx.made(n, Op.abs) for n in big.inputs] if big is not None else [None]
        if None in magnitudes or not node.type.dtype.is_float:
            continue
        operands = tuple(m.inputs[0] for m in magnitudes)
        if matches_kernel(ctx, node, Op.hypot, NoSpec(), operands, _activations_template):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.hypot, NoSpec(), *operands))
    return NoMatch("not hypot's composition")


RULES = (
    Rule(Op.where, logaddexp_rule),  # max(a, b) + log1p(exp(-|a - b|)) -> logaddexp(a, b)
    Rule(Op.where, atan2_rule),      # atan(y / x) shifted by pi where x < 0 -> atan2(y, x)
    Rule(Op.where, hypot_rule),      # max(|x|, |y|) sqrt((min / max)^2 + 1) -> hypot(x, y)
)
