"""A scatter-add of ones -> torch's bincount; bincount's range check -> one min.

    scatter[add](t, index, 1, axis 0), t an integer vector   -> bincount(t, index)
    max(x < c) over every axis, x integer, c one number      -> min(x) < c

The second is the check the bincount front end makes (no negative index): ``x < 0`` and an
``any`` are two passes and a bool tensor as large as x, the min one pass (for integers the
two agree; a float min would be NaN where x holds one, so floats keep theirs; an x that may
be empty too, as torch's min of nothing fails).
"""
from __future__ import annotations

from tdag.deinops.elementwise import Compare
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import is_static
from tdag.lower.match import scalar


def bincount_rule(node: Node, ctx: Context):
    """scatter[add](t, index, ones) along the only axis of an integer t -> bincount"""
    target, index, values = node.inputs
    if node.spec.combine != "add" or ctx.type(target).rank != 1 or \
            not ctx.type(target).dtype.is_integer:
        return NoMatch("not an add into an integer vector")
    if scalar(ctx, values) != 1:
        return NoMatch("adds values other than ones")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.bincount, NoSpec(), target, index))


def any_below_rule(node: Node, ctx: Context):
    """max(x < c) over all of x's axes -> min(x) < c, for an integer x"""
    lt = ctx.made(node.inputs[0], Op.compare)
    if node.spec.kind is not ReduceKind.max or lt is None or lt.spec.kind.value != "lt" \
            or len(node.spec.axes) != ctx.type(lt.name).rank:
        return NoMatch("not an any of x < c over every axis")
    x, bound = lt.inputs
    spread = ctx.made(bound, Op.expand)
    if not ctx.type(x).dtype.is_integer or spread is None or \
            ctx.type(spread.inputs[0]).rank != 0:
        return NoMatch("not an integer x below one number")
    if not is_static(ctx.type(x).numel) or ctx.type(x).numel == 0:
        return NoMatch("x may be empty: its any is False where a min fails")
    emit = ctx.emitter(node)
    low = emit(Op.reduce, Reduce(ReduceKind.min, node.spec.axes), x)
    return emit.finish(emit(Op.compare, Compare(lt.spec.kind), low, spread.inputs[0]))


RULES = (
    Rule(Op.scatter, bincount_rule),  # scatter[add](t, i, 1) -> bincount(t, i)
    Rule(Op.reduce, any_below_rule),  # any(x < c) -> min(x) < c
)
