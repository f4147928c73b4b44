"""The tree ensemble's walk -> the tree_sum kernel; a row's scaling by its norm -> the
normalize_rows kernel.

The ONNX importer writes the classic ai.onnx.ml tree ops as ``tdag.ops.ml.tree_sum``, which
is also the kernel's ``decompose``. The rule proposes the operands from the walk's landmarks
(the sum of the gathered leaf rows, the chain of ``where(go, true[at], false[at])`` down to
the broadcast roots, the first level's gathers of the node tables), then checks the proposal
by matching: the kernel's decomposition of those operands, traced and simplified as lowering
simplifies the program, must be the subgraph under the node, node for node. Only then is the
node replaced, so a near miss stays the exact composition it was.

    sum_T(leaves[walk^depth(roots)])      -> tree_sum(x, tables..., leaves)
    where(norm(x) != 0, x / norm(x), x)   -> normalize_rows(x)   (MAX, L1; L2 signed sqrt)
"""
from __future__ import annotations

from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.types import DType
from tdag.lower.kernels.ml import Normalize, TreeSum
from tdag.lower.match import matches_kernel
from tdag.ops.ml import COMPARE, NORMS

_VIEWS = frozenset({Op.unsqueeze, Op.repeat})
_MODE = {fn.__name__: mode for mode, fn in COMPARE.items()}  # compare kind -> mode
_CONE = 48  # nodes between a level's go and the roots: a dozen per mode


def _roots(ctx: Context, at: str) -> str | None:
    """The i64 [T] tensor that ``at`` broadcasts to [N, T]."""
    while ctx.type(at).rank != 1:
        node = ctx.producer(at)
        if node is None or node.op not in _VIEWS:
            return None
        at = node.inputs[0]
    return at if ctx.type(at).dtype is DType.i64 else None


def _level(ctx: Context, go: str, at: str):
    """The first level's (x, features, thresholds, {mode: mask}, tracks) read off the nodes
    between its ``go`` and ``at``, or None."""
    tables, pairs, x, tracks = {}, {}, None, None
    seen, frontier = {go}, [go]
    while frontier and len(seen) < _CONE:
        node = ctx.producer(frontier.pop())
        if node is None:
            continue
        if node.op is Op.gather and node.inputs[1] == at:
            tables.setdefault(ctx.type(node.inputs[0]).dtype, []).append(node.inputs[0])
            continue
        if node.op is Op.gather and ctx.type(node.inputs[0]).rank == 1:  # x's flat rows
            flat = ctx.producer(node.inputs[0])
            x = flat.inputs[0] if flat is not None and flat.op is Op.group else x
        if node.op is Op.multiply and node.type.dtype is DType.bool:
            pairs[node.name] = node.inputs
        for name in node.inputs:
            if name not in seen and name != at:
                seen.add(name)
                frontier.append(name)
    floats, ints = tables.get(ctx.type(x).dtype, []) if x else [], tables.get(DType.i64, [])
    if x is None or len(floats) != 1 or len(ints) != 1:
        return None
    masks = {}
    for a, b in pairs.values():  # mask[at] & compare, or isnan & tracks[at]
        for mask, other in ((a, b), (b, a)):
            source = ctx.made(mask, Op.gather)
            compare = ctx.made(other, Op.compare)
            if source is None or source.inputs[1] != at or compare is None:
                continue
            if compare.inputs[0] == compare.inputs[1]:
                tracks = source.inputs[0]
            else:
                masks[_MODE[compare.spec.kind.value]] = source.inputs[0]
    return x, ints[0], floats[0], masks, tracks


def _kinds(ctx: Context, go: str) -> list[str]:
    """The modes of the compares (not isnan's) between ``go`` and the level's gathers."""
    out, frontier = [], [go]
    for _ in range(_CONE):
        if not frontier:
            break
        node = ctx.producer(frontier.pop())
        if node is None or node.op is Op.gather:
            continue
        if node.op is Op.compare and node.inputs[0] != node.inputs[1]:
            out.append(_MODE[node.spec.kind.value])
            continue
        frontier += node.inputs
    return out


def tree_sum_rule(node: Node, ctx: Context):
    """sum_T(leaves[walk^depth(roots)]) -> tree_sum(x, tables..., leaves)"""
    pick = ctx.made(node.inputs[0], Op.gather)
    if node.spec.kind.value != "sum" or node.spec.axes != (1,) or pick is None or \
            node.type.rank != 2 or ctx.type(pick.inputs[0]).rank != 2:
        return NoMatch("not a sum over trees of gathered leaf rows")
    leaves, at, depth, step = pick.inputs[0], pick.inputs[1], 0, None
    while (where := ctx.made(at, Op.where)) is not None:
        true, false = (ctx.made(n, Op.gather) for n in where.inputs[1:])
        if true is None or false is None or true.inputs[1] != false.inputs[1]:
            return NoMatch("a step of the walk is not where(go, true[at], false[at])")
        step, at, depth = (where.inputs[0], true.inputs[0], false.inputs[0]), true.inputs[1], \
            depth + 1
    roots = _roots(ctx, at)
    if step is None or roots is None:
        return NoMatch("no walk from broadcast roots")
    go, true, false = step
    level = _level(ctx, go, at)
    if level is None:
        return NoMatch("the first step reads no rows, features and thresholds")
    x, features, thresholds, masks, tracks = level
    modes = tuple(m for m in COMPARE if m in masks) if len(masks) > 1 else \
        tuple(dict.fromkeys(_kinds(ctx, go)))
    spec = TreeSum(depth, modes, tracks is not None)
    operands = (x, features, thresholds, true, false, roots, leaves) + \
        ((tracks,) if tracks else ()) + (tuple(masks[m] for m in modes) if len(modes) > 1 else ())
    if len(modes) != 1 and len(modes) != len(masks) or \
            not matches_kernel(ctx, node, Op.tree_sum, spec, operands):
        return NoMatch("not the walk tree_sum decomposes to")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.tree_sum, spec, *operands))


def normalize_rule(node: Node, ctx: Context):
    """where(norm(x) != 0, x / norm(x), x) -> normalize_rows(x): the guard's copy of x is the
    operand, the norm the one whose decomposition is the subgraph."""
    x = node.inputs[2]
    for norm in NORMS:
        if matches_kernel(ctx, node, Op.normalize_rows, Normalize(norm), (x,)):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.normalize_rows, Normalize(norm), x))
    return NoMatch("not a row scaled by its MAX, L1 or L2 norm")


RULES = (
    Rule(Op.reduce, tree_sum_rule),  # sum_T(leaves[walk^depth(roots)]) -> tree_sum
    Rule(Op.where, normalize_rule),  # where(norm != 0, x / norm, x) -> normalize_rows
)
