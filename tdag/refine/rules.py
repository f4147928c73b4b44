"""Peephole rewrite rules, as data: ``Rule(op, fn)`` with the algebra in a comment.

A rule looks at one node (its inputs already rewritten) and its producers, and answers as
every rule of the engine does (``tdag/ir/rewrite.py``): ``Alias(name)`` of an existing value
the node equals, ``Replace((node',))`` with a node of the same name and type, or
``NoMatch(reason)``. ``rewrite`` applies the rules in one forward sweep, re-applying them to a
replaced node, so a chain (permute of permute of permute) collapses in a single pass.
"""
from __future__ import annotations

from tdag.deinops.elementwise import DivideMode
from tdag.deinops.extent import Slice
from tdag.deinops.movement import Permute, Squeeze, Unsqueeze, ungroup_sizes
from tdag.errors import ShapeError
from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.record import Trait, has, ops_with
from tdag.ir.rewrite import Alias, Context, NoMatch, Replace, Rule, RuleSet
from tdag.ir.rewrite import rewrite as sweep
from tdag.ir.symbols import dims_equal, is_static
from tdag.refine.constants import Constants

BUDGET = 16  # rewrites in place of one node per sweep: chains are short, cycles are bugs


def _is(value, scalar) -> bool:
    return value is not None and value == scalar


# -- movement ---------------------------------------------------------------------------------

def _identity_permute(node, ctx):
    if node.spec.perm != tuple(range(len(node.spec.perm))):
        return NoMatch("not the identity permutation")
    return Alias(node.inputs[0])


def _permute_permute(node, ctx):
    inner = ctx.made(node.inputs[0], Op.permute)
    if inner is None:
        return NoMatch("input is not a permute")
    perm = tuple(inner.spec.perm[q] for q in node.spec.perm)
    return Replace((node.replace(inputs=inner.inputs, spec=Permute(perm)),))


def _group_ungroup(node, ctx):
    inner = ctx.made(node.inputs[0], Op.ungroup)
    if inner and inner.spec.axis == node.spec.axis and len(inner.spec.sizes) == node.spec.count:
        return Alias(inner.inputs[0])
    return NoMatch("input is not an ungroup of the same axes")


def _ungroup_group(node, ctx):
    inner = ctx.made(node.inputs[0], Op.group)
    if not inner or inner.spec.axis != node.spec.axis or len(node.spec.sizes) != inner.spec.count:
        return NoMatch("input is not a group of as many axes")
    source = ctx.types[inner.inputs[0]].shape[inner.spec.axis:inner.spec.axis + inner.spec.count]
    try:
        sizes = ungroup_sizes(node.spec, ctx.types[node.inputs[0]].shape[node.spec.axis])
    except ShapeError:
        return NoMatch("ungroup sizes do not resolve")
    if not all(dims_equal(a, b) for a, b in zip(sizes, source)):
        return NoMatch("splits into other sizes than the group merged")
    return Alias(inner.inputs[0])


def _squeeze_unsqueeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.unsqueeze)
    if not inner or not set(node.spec.axes) <= set(inner.spec.axes):
        return NoMatch("input is not an unsqueeze of these axes")
    if set(node.spec.axes) == set(inner.spec.axes):
        return Alias(inner.inputs[0])
    left = [a - sum(1 for b in node.spec.axes if b < a)
            for a in inner.spec.axes if a not in node.spec.axes]
    return Replace((node.replace(op=Op.unsqueeze, inputs=inner.inputs,
                                 spec=Unsqueeze(tuple(left))),))


def _unsqueeze_squeeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.squeeze)
    if inner and sorted(inner.spec.axes) == sorted(node.spec.axes):
        return Alias(inner.inputs[0])
    return NoMatch("input is not a squeeze of the same axes")


def _unsqueeze_unsqueeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.unsqueeze)
    if inner is None:
        return NoMatch("input is not an unsqueeze")
    kept = [i for i in range(node.type.rank) if i not in node.spec.axes]
    axes = tuple(sorted(set(node.spec.axes) | {kept[a] for a in inner.spec.axes}))
    return Replace((node.replace(inputs=inner.inputs, spec=Unsqueeze(axes)),))


def _squeeze_squeeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.squeeze)
    if inner is None:
        return NoMatch("input is not a squeeze")
    remaining = [i for i in range(ctx.types[inner.inputs[0]].rank) if i not in inner.spec.axes]
    axes = tuple(sorted(set(inner.spec.axes) | {remaining[a] for a in node.spec.axes}))
    return Replace((node.replace(inputs=inner.inputs, spec=Squeeze(axes)),))


def _slice_pad(node, ctx):
    pad = ctx.made(node.inputs[0], Op.pad)
    if pad is None:
        return NoMatch("input is not a pad")
    x_shape = ctx.types[pad.inputs[0]].shape
    cut = set(node.spec.axes)
    for axis, (lo, hi) in enumerate(pad.spec.widths):
        if axis not in cut and not (is_static(lo) and lo == 0 and is_static(hi) and hi == 0):
            return NoMatch("pads an axis the slice keeps whole")
    starts, stops = [], []
    for axis, start, stop in zip(node.spec.axes, node.spec.starts, node.spec.stops):
        lo = pad.spec.widths[axis][0]
        if not all(is_static(v) for v in (lo, start, stop, x_shape[axis])):
            return NoMatch("symbolic bounds")
        if start < lo or stop > lo + x_shape[axis]:
            return NoMatch("the slice keeps some padding")
        starts.append(start - lo)
        stops.append(stop - lo)
    spec = Slice(node.spec.axes, tuple(starts), tuple(stops), node.spec.steps)
    return Replace((node.replace(inputs=pad.inputs, spec=spec),))


def _identity_slice(node, ctx):
    shape = ctx.types[node.inputs[0]].shape
    full = all(is_static(a) and a == 0 and dims_equal(b, shape[axis]) and step == 1
               for axis, a, b, step in zip(node.spec.axes, node.spec.starts, node.spec.stops,
                                           node.spec.steps))
    return Alias(node.inputs[0]) if full else NoMatch("does not keep every axis whole")


def _identity_pad(node, ctx):
    zero = all(is_static(w) and w == 0 for pair in node.spec.widths for w in pair)
    return Alias(node.inputs[0]) if zero else NoMatch("pads something")


def _identity_repeat(node, ctx):
    if all(is_static(s) and s == 1 for s in node.spec.sizes):
        return Alias(node.inputs[0])
    return NoMatch("repeats to a size other than 1")


def _same_type(node, ctx):
    """A node whose output has exactly its input's type and layout."""
    if ctx.types[node.inputs[0]] == node.type:
        return Alias(node.inputs[0])
    return NoMatch("changes the type")


def _no_axes(node, ctx):
    return Alias(node.inputs[0]) if not node.spec.axes else NoMatch("has axes")


# -- algebra ----------------------------------------------------------------------------------

def _mul_one(node, ctx):
    a, b = node.inputs
    if _is(ctx.consts.scalar(b), 1):
        return Alias(a)
    return Alias(b) if _is(ctx.consts.scalar(a), 1) else NoMatch("no operand is a constant 1")


def _add_zero(node, ctx):
    a, b = node.inputs
    if _is(ctx.consts.scalar(b), 0):
        return Alias(a)
    return Alias(b) if _is(ctx.consts.scalar(a), 0) else NoMatch("no operand is a constant 0")


def _div_one(node, ctx):
    if node.spec.mode in (DivideMode.remainder, DivideMode.fmod):
        return NoMatch("a remainder")  # x % 1 is 0, not x
    if node.spec.mode is not DivideMode.true and node.type.dtype.is_float:
        return NoMatch("a rounding division of floats")  # floor(x / 1) is not x
    if not _is(ctx.consts.scalar(node.inputs[1]), 1):
        return NoMatch("the divisor is not a constant 1")
    return Alias(node.inputs[0])


def _pow_one(node, ctx):
    if _is(ctx.consts.scalar(node.inputs[1]), 1):
        return Alias(node.inputs[0])
    return NoMatch("the exponent is not a constant 1")


def _neg_neg(node, ctx):
    inner = ctx.made(node.inputs[0], Op.neg)
    return Alias(inner.inputs[0]) if inner else NoMatch("input is not a neg")


def _where_same(node, ctx):
    _, a, b = node.inputs
    return Alias(a) if a == b else NoMatch("the branches differ")


def _sink_repeat(node, ctx):
    """Pointwise math on broadcast operands runs on the operands before the broadcast: the
    work shrinks to the small tensor, and a framework that broadcasts implicitly (ONNX,
    torch) never materialises the repeat (BatchNorm's per-channel terms, a mask's fill)."""
    sources = [ctx.made(name, Op.repeat) for name in node.inputs]
    if any(s is None for s in sources):
        return NoMatch("an operand is not a repeat")
    first = sources[0]
    shape = ctx.type(first.inputs[0]).shape
    for s in sources[1:]:
        other = ctx.type(s.inputs[0]).shape
        if s.spec != first.spec or len(other) != len(shape) or \
                not all(dims_equal(a, b) for a, b in zip(other, shape)):
            return NoMatch("the operands repeat differently")
    emit = ctx.emitter(node)
    small = emit(node.op, node.spec, *(s.inputs[0] for s in sources))
    return emit.finish(emit(Op.repeat, first.spec, small))


# every pointwise primitive (not the kernels: lowering made those on purpose)
_POINTWISE = sorted((op for op in ops_with(Trait.POINTWISE) if not has(op, Trait.KERNEL)),
                    key=lambda op: op.value)

RULES = [
    Rule(Op.permute, _identity_permute),     # permute(x, identity) -> x
    Rule(Op.permute, _permute_permute),      # permute(permute(x, p), q) -> permute(x, p[q])
    Rule(Op.group, _group_ungroup),          # group(ungroup(x, a, s), a, len(s)) -> x
    Rule(Op.ungroup, _ungroup_group),        # ungroup(group(x, a, n), a, x.shape[a:a+n]) -> x
    Rule(Op.squeeze, _squeeze_unsqueeze),    # squeeze(unsqueeze(x, A), B <= A) -> unsqueeze(x, A-B)
    Rule(Op.unsqueeze, _unsqueeze_squeeze),  # unsqueeze(squeeze(x, A), A) -> x
    Rule(Op.unsqueeze, _unsqueeze_unsqueeze),  # unsqueeze(unsqueeze(x, A), B) -> unsqueeze(x, A+B)
    Rule(Op.squeeze, _squeeze_squeeze),      # squeeze(squeeze(x, A), B) -> squeeze(x, A+B)
    Rule(Op.slice, _slice_pad),              # slice(pad(x, w), inside x) -> slice(x, shifted)
    Rule(Op.slice, _identity_slice),         # x[0:n] -> x
    Rule(Op.pad, _identity_pad),             # pad(x, 0) -> x
    Rule(Op.repeat, _identity_repeat),       # repeat(x, to size 1) -> x
    Rule(Op.group, _same_type),              # group(x, a, 1) -> x
    Rule(Op.ungroup, _same_type),            # ungroup(x, a, (n,)) -> x
    Rule(Op.cast, _same_type),               # cast(x: T, T) -> x
    Rule(Op.squeeze, _no_axes),              # squeeze(x, ()) -> x
    Rule(Op.unsqueeze, _no_axes),            # unsqueeze(x, ()) -> x
    Rule(Op.reduce, _no_axes),               # reduce(x, ()) -> x
    Rule(Op.multiply, _mul_one),             # x * 1 -> x, 1 * x -> x
    Rule(Op.add, _add_zero),                 # x + 0 -> x, 0 + x -> x
    Rule(Op.divide, _div_one),               # x / 1 -> x
    Rule(Op.pow, _pow_one),                  # x ** 1 -> x
    Rule(Op.neg, _neg_neg),                  # -(-x) -> x
    Rule(Op.where, _where_same),             # where(c, x, x) -> x
    *[Rule(op, _sink_repeat) for op in _POINTWISE],  # f(repeat(x), repeat(y)) -> repeat(f(x, y))
]


RULE_SET = RuleSet(RULES, BUDGET)


def rewrite(graph: TDAG, rules=RULES) -> tuple[TDAG, bool]:
    """Apply ``rules`` to every node in one forward sweep; (graph, whether it changed)."""
    ruleset = RULE_SET if rules is RULES else RuleSet(rules, BUDGET)
    return sweep(graph, ruleset, Context(graph, Constants(graph.weights)))


__all__ = ["BUDGET", "RULES", "RULE_SET", "Rule", "rewrite"]
