"""Peephole rewrite rules, as data: ``Rule(op, fn)`` with the algebra in a comment.

A rule looks at one node (its inputs already rewritten) and its producers, and returns the
name of an existing value the node equals, a replacement node (same name and type), or None.
``rewrite`` applies the rules in one forward sweep, so a chain (permute of permute of
permute) collapses in a single pass.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tdag.deinops.elementwise import DivideMode
from tdag.deinops.movement import Permute, Slice, Squeeze, Unsqueeze, ungroup_sizes
from tdag.errors import ShapeError
from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.symbols import dims_equal, is_static
from tdag.refine.constants import Constants
from tdag.refine.dataflow import renamed


class Context:
    """What a rule may look at: producers and types in the graph being rebuilt, constants."""

    def __init__(self, graph: TDAG):
        self.types = graph.types()
        self.producer: dict[str, Node] = {}
        self.consts = Constants(graph.weights)

    def made(self, name: str, op: Op) -> Node | None:
        """The node that produced ``name`` if its op is ``op``."""
        node = self.producer.get(name)
        return node if node is not None and node.op is op else None

    def add(self, node: Node) -> None:
        self.producer[node.name] = node
        self.types[node.name] = node.type
        self.consts.add(node)


@dataclass(frozen=True)
class Rule:
    op: Op
    fn: Callable[[Node, Context], object]


def _is(value, scalar) -> bool:
    return value is not None and value == scalar


# -- movement ---------------------------------------------------------------------------------

def _identity_permute(node, ctx):
    return node.inputs[0] if node.spec.perm == tuple(range(len(node.spec.perm))) else None


def _permute_permute(node, ctx):
    inner = ctx.made(node.inputs[0], Op.permute)
    if inner is None:
        return None
    perm = tuple(inner.spec.perm[q] for q in node.spec.perm)
    return node.replace(inputs=inner.inputs, spec=Permute(perm))


def _group_ungroup(node, ctx):
    inner = ctx.made(node.inputs[0], Op.ungroup)
    if inner and inner.spec.axis == node.spec.axis and len(inner.spec.sizes) == node.spec.count:
        return inner.inputs[0]
    return None


def _ungroup_group(node, ctx):
    inner = ctx.made(node.inputs[0], Op.group)
    if not inner or inner.spec.axis != node.spec.axis or len(node.spec.sizes) != inner.spec.count:
        return None
    source = ctx.types[inner.inputs[0]].shape[inner.spec.axis:inner.spec.axis + inner.spec.count]
    try:
        sizes = ungroup_sizes(node.spec, ctx.types[node.inputs[0]].shape[node.spec.axis])
    except ShapeError:
        return None
    return inner.inputs[0] if all(dims_equal(a, b) for a, b in zip(sizes, source)) else None


def _squeeze_unsqueeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.unsqueeze)
    if not inner or not set(node.spec.axes) <= set(inner.spec.axes):
        return None
    if set(node.spec.axes) == set(inner.spec.axes):
        return inner.inputs[0]
    left = [a - sum(1 for b in node.spec.axes if b < a)
            for a in inner.spec.axes if a not in node.spec.axes]
    return node.replace(op=Op.unsqueeze, inputs=inner.inputs, spec=Unsqueeze(tuple(left)))


def _unsqueeze_squeeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.squeeze)
    if inner and sorted(inner.spec.axes) == sorted(node.spec.axes):
        return inner.inputs[0]
    return None


def _unsqueeze_unsqueeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.unsqueeze)
    if inner is None:
        return None
    kept = [i for i in range(node.type.rank) if i not in node.spec.axes]
    axes = tuple(sorted(set(node.spec.axes) | {kept[a] for a in inner.spec.axes}))
    return node.replace(inputs=inner.inputs, spec=Unsqueeze(axes))


def _squeeze_squeeze(node, ctx):
    inner = ctx.made(node.inputs[0], Op.squeeze)
    if inner is None:
        return None
    remaining = [i for i in range(ctx.types[inner.inputs[0]].rank) if i not in inner.spec.axes]
    axes = tuple(sorted(set(inner.spec.axes) | {remaining[a] for a in node.spec.axes}))
    return node.replace(inputs=inner.inputs, spec=Squeeze(axes))


def _slice_pad(node, ctx):
    pad = ctx.made(node.inputs[0], Op.pad)
    if pad is None:
        return None
    x_shape = ctx.types[pad.inputs[0]].shape
    cut = set(node.spec.axes)
    for axis, (lo, hi) in enumerate(pad.spec.widths):
        if axis not in cut and not (is_static(lo) and lo == 0 and is_static(hi) and hi == 0):
            return None  # padding on an axis the slice keeps whole
    starts, stops = [], []
    for axis, start, stop in zip(node.spec.axes, node.spec.starts, node.spec.stops):
        lo = pad.spec.widths[axis][0]
        if not all(is_static(v) for v in (lo, start, stop, x_shape[axis])):
            return None
        if start < lo or stop > lo + x_shape[axis]:
            return None  # the slice keeps some padding
        starts.append(start - lo)
        stops.append(stop - lo)
    spec = Slice(node.spec.axes, tuple(starts), tuple(stops), node.spec.steps)
    return node.replace(inputs=pad.inputs, spec=spec)


def _identity_slice(node, ctx):
    shape = ctx.types[node.inputs[0]].shape
    full = all(is_static(a) and a == 0 and dims_equal(b, shape[axis]) and step == 1
               for axis, a, b, step in zip(node.spec.axes, node.spec.starts, node.spec.stops,
                                           node.spec.steps))
    return node.inputs[0] if full else None


def _identity_pad(node, ctx):
    zero = all(is_static(w) and w == 0 for pair in node.spec.widths for w in pair)
    return node.inputs[0] if zero else None


def _identity_repeat(node, ctx):
    return node.inputs[0] if all(is_static(s) and s == 1 for s in node.spec.sizes) else None


def _same_type(node, ctx):
    """A node whose output has exactly its input's type and layout."""
    return node.inputs[0] if ctx.types[node.inputs[0]] == node.type else None


def _no_axes(node, ctx):
    return node.inputs[0] if not node.spec.axes else None


# -- algebra ----------------------------------------------------------------------------------

def _mul_one(node, ctx):
    a, b = node.inputs
    if _is(ctx.consts.scalar(b), 1):
        return a
    return b if _is(ctx.consts.scalar(a), 1) else None


def _add_zero(node, ctx):
    a, b = node.inputs
    if _is(ctx.consts.scalar(b), 0):
        return a
    return b if _is(ctx.consts.scalar(a), 0) else None


def _div_one(node, ctx):
    ok = node.spec.mode is DivideMode.true or not node.type.dtype.is_float
    return node.inputs[0] if ok and _is(ctx.consts.scalar(node.inputs[1]), 1) else None


def _pow_one(node, ctx):
    return node.inputs[0] if _is(ctx.consts.scalar(node.inputs[1]), 1) else None


def _neg_neg(node, ctx):
    inner = ctx.made(node.inputs[0], Op.neg)
    return inner.inputs[0] if inner else None


def _where_same(node, ctx):
    _, a, b = node.inputs
    return a if a == b else None


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
]


def rewrite(graph: TDAG, rules=RULES) -> tuple[TDAG, bool]:
    """Apply ``rules`` to every node in one forward sweep; (graph, whether it changed)."""
    by_op: dict[Op, list] = {}
    for rule in rules:
        by_op.setdefault(rule.op, []).append(rule.fn)
    ctx = Context(graph)
    env: dict[str, str] = {}
    nodes, changed = [], False
    for node in graph.nodes:
        node = renamed(node, env)
        result = _apply(node, by_op, ctx)
        if isinstance(result, str):
            env[node.name] = result
            changed = True
            continue
        changed |= result is not node
        nodes.append(result)
        ctx.add(result)
    if not changed:
        return graph, False
    outputs = tuple(env.get(n, n) for n in graph.outputs)
    return graph.replace(nodes=tuple(nodes), outputs=outputs), True


def _apply(node: Node, by_op: dict, ctx: Context, budget: int = 16):
    """Rules applied until none matches: the final node, or the name it reduces to."""
    for _ in range(budget):
        for fn in by_op.get(node.op, ()):
            result = fn(node, ctx)
            if result is None:
                continue
            if isinstance(result, str):
                if ctx.types[result].same_as(node.type):
                    return result
                continue
            node = result
            break
        else:
            return node
    return node


__all__ = ["Context", "RULES", "Rule", "rewrite"]
