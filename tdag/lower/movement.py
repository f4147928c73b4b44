"""Movement chains -> one reshape, one permute or one expand (a framework view each).

The rules keep values and only shorten chains, so a recognised kernel that left reshapes
around it (a conv's output split into groups and merged back) ends up with none. A permute of
a permute and a repeat to size 1 are simplify's rules (``tdag/refine/rules.py``), which every
lowering round runs first (``tdag/lower/pipeline.py``).
"""
from __future__ import annotations

import torch

from tdag.lower.kernels.layout import Concat, Expand, Reshape
from tdag.deinops.extent import Slice
from tdag.deinops.movement import Permute
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Alias, Context, NoMatch, Rule
from tdag.ir.symbols import as_dim, dims_equal
from tdag.ir.types import TensorKind
from tdag.lower.match import BROADCAST, is_unit, trace_axes

# ops that keep the row-major order of elements: any chain of them is one reshape. Not a
# trait query: it is what these rules (and the group-norm and window matchers) collapse, and
# a permute, a view that keeps values too, must not join the run
RESHAPES = frozenset({Op.group, Op.ungroup, Op.squeeze, Op.unsqueeze, Op.reshape})


def reshape_source(ctx: Context, name: str) -> str:
    """The first value before a run of reshape-like ops ending at ``name``."""
    node = ctx.producer(name)
    while node is not None and node.op in RESHAPES:
        name = node.inputs[0]
        node = ctx.producer(name)
    return name


def reshape_rule(node: Node, ctx: Context):
    """reshape-like(reshape-like(x)) -> reshape(x); reshape(x) to x's own shape -> x"""
    src = reshape_source(ctx, node.inputs[0]) if ctx.op(node.inputs[0]) in RESHAPES \
        else node.inputs[0]
    if ctx.type(src).same_as(node.type):
        return Alias(src)
    if node.op is Op.reshape and src == node.inputs[0]:
        return NoMatch("already one reshape")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.reshape, Reshape(node.type.shape), src))


_BROADCAST_ONLY = BROADCAST - {Op.permute}


def expand_rule(node: Node, ctx: Context):
    """unsqueeze/reshape/repeat/expand chain -> expand(x) (or reshape(x) + expand)"""
    src, mapping = trace_axes(ctx, node.name, _BROADCAST_ONLY, units=True)
    if src == node.name:
        return NoMatch("not a broadcast of a source")
    if ctx.type(src).same_as(node.type):
        return Alias(src)
    shown = [i for i, a in enumerate(mapping) if a is not None]
    rank = node.type.rank
    aligned = shown == list(range(rank - len(shown), rank))
    if aligned and node.op is Op.expand and node.inputs[0] == src:
        return NoMatch("already one expand")
    emit = ctx.emitter(node)
    base = src
    if not aligned:  # put size-1 axes where the broadcast ones go, then expand
        first = shown[0] if shown else rank
        src_shape = ctx.type(src).shape
        shape = tuple(1 if mapping[i] is None else src_shape[mapping[i]]
                      for i in range(first, rank))
        producer = ctx.producer(node.inputs[0])
        if node.op is Op.expand and producer is not None and producer.op is Op.reshape and \
                producer.inputs[0] == src and tuple(producer.type.shape) == shape:
            return NoMatch("already reshape + expand")
        base = emit(Op.reshape, Reshape(shape), src)
    return emit.finish(emit(Op.expand, Expand(node.type.shape), base))


def squeeze_permute_rule(node: Node, ctx: Context):
    """reshape dropping size-1 axes of permute(x) -> permute(reshape(x)), so the
    reshape joins the run of reshapes before the permute"""
    perm_node = ctx.producer(node.inputs[0])
    if perm_node is None or perm_node.op is not Op.permute or not ctx.single_use(perm_node.name):
        return NoMatch("not a reshape of a permute")
    shape, out = perm_node.type.shape, node.type.shape
    kept = [i for i, d in enumerate(shape) if not is_unit(d)]
    if [shape[i] for i in kept] != list(out) or len(kept) == len(shape):
        return NoMatch("not dropping size-1 axes only")
    src = perm_node.inputs[0]
    order = [perm_node.spec.perm[i] for i in kept]  # source axes that stay, in output order
    survivors = sorted(order)
    emit = ctx.emitter(node)
    squeezed = emit(Op.reshape, Reshape(tuple(ctx.type(src).shape[a] for a in survivors)), src)
    perm = tuple(survivors.index(a) for a in order)
    if perm == tuple(range(len(perm))):
        return emit.finish(squeezed)
    return emit.finish(emit(Op.permute, Permute(perm), squeezed))


def _pieces(ctx: Context, name: str, root: bool = True) -> list | None:
    """The leaves of a tree of adds (inner adds read only here): the pad nodes."""
    node = ctx.producer(name)
    if node is None:
        return None
    if node.op is Op.add and (root or ctx.single_use(name)):
        left, right = (_pieces(ctx, i, False) for i in node.inputs)
        return None if left is None or right is None else left + right
    return [node] if node.op is Op.pad and node.spec.value == 0.0 else None


def concat_rule(node: Node, ctx: Context):
    """pad(a, lo=0) + pad(b, lo=|a|) + ... tiling one axis -> concat(a, b, ...)"""
    pieces = _pieces(ctx, node.name)
    if not pieces or len(pieces) < 2:
        return NoMatch("not a sum of pads")
    padded = [[i for i, w in enumerate(p.spec.widths) if w != (0, 0)] for p in pieces]
    axes = {tuple(a) for a in padded}
    if len(axes) != 1 or len(next(iter(axes))) != 1:
        return NoMatch("pads on several axes")
    axis = padded[0][0]
    order, offset = [], 0
    remaining = list(pieces)
    while remaining:
        nxt = [p for p in remaining if dims_equal(p.spec.widths[axis][0], offset)]
        if not nxt:
            return NoMatch("pieces do not tile the axis")
        order.append(nxt[0])
        remaining.remove(nxt[0])
        offset = as_dim(offset + ctx.type(nxt[0].inputs[0]).shape[axis])
    if not dims_equal(offset, node.type.shape[axis]):
        return NoMatch("pieces do not cover the axis")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.concat, Concat(axis), *(p.inputs[0] for p in order)))


def gather_rule(node: Node, ctx: Context):
    """gather(x, const [a, a+s, a+2s, ...], axis) -> slice(x, a::s) (a view; the identity
    when it takes the whole axis in order, as nearest resizing to the same size does)"""
    weight = ctx.weight(node.inputs[1])
    if weight is None or weight.kind is not TensorKind.const or weight.value is None or \
            weight.value.dim() != 1 or weight.value.numel() < 1:
        return NoMatch("not a constant index vector")
    index = weight.value.long()
    start = int(index[0])
    step = int(index[1] - index[0]) if index.numel() > 1 else 1
    expect = start + step * torch.arange(index.numel())
    if start < 0 or step < 1 or not torch.equal(index, expect):
        return NoMatch("not an arithmetic progression")
    axis = node.spec.axis
    stop = start + step * (index.numel() - 1) + 1
    emit = ctx.emitter(node)
    if start == 0 and step == 1 and dims_equal(stop, ctx.type(node.inputs[0]).shape[axis]):
        return emit.finish(node.inputs[0])
    return emit.finish(emit(Op.slice, Slice((axis,), (start,), (stop,), (step,)), node.inputs[0]))


RULES = (
    Rule(Op.gather, gather_rule),            # gather(x, const a::s) -> slice(x, a::s)
    # reshape-like(permute(x)) dropping size-1 axes -> permute(reshape(x)), per reshape op
    Rule(Op.group, squeeze_permute_rule),      # group(permute(x)) -> permute(reshape(x))
    Rule(Op.ungroup, squeeze_permute_rule),    # ungroup(permute(x)) -> permute(reshape(x))
    Rule(Op.squeeze, squeeze_permute_rule),    # squeeze(permute(x)) -> permute(reshape(x))
    Rule(Op.unsqueeze, squeeze_permute_rule),  # unsqueeze(permute(x)) -> permute(reshape(x))
    Rule(Op.reshape, squeeze_permute_rule),    # reshape(permute(x)) -> permute(reshape(x))
    # reshape-like(reshape-like(x)) -> reshape(x), or x itself when the shape is x's
    Rule(Op.group, reshape_rule),            # group(reshape-like(x)) -> reshape(x)
    Rule(Op.ungroup, reshape_rule),          # ungroup(reshape-like(x)) -> reshape(x)
    Rule(Op.squeeze, reshape_rule),          # squeeze(reshape-like(x)) -> reshape(x)
    Rule(Op.unsqueeze, reshape_rule),        # unsqueeze(reshape-like(x)) -> reshape(x)
    Rule(Op.reshape, reshape_rule),          # reshape(reshape-like(x)) -> reshape(x)
    Rule(Op.repeat, expand_rule),            # repeat(unsqueeze(x)) -> expand(x)
    Rule(Op.expand, expand_rule),            # expand(reshape/repeat chain of x) -> expand(x)
    Rule(Op.add, concat_rule),               # pad(a, lo=0) + pad(b, lo=|a|) -> concat(a, b)
)
