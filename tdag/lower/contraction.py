"""Contractions: reduce-sum of a product of broadcast operands -> einsum, whatever the order.

``sum_K(bcast(A) * bcast(B))`` where each operand is a source viewed through permutes,
unsqueezes and repeats is ``einsum("<A>,<B>-><out>", A, B)``: every axis of the product gets
a letter; each source axis takes the letter of the product axis it shows on. Matmul, bmm,
linear, attention scores and the windowed product of a convolution all take this form.
"""
from __future__ import annotations

import string

from tdag.lower.kernels.contraction import Einsum, parse_equation
from tdag.lower.kernels.layout import Reshape
from tdag.deinops.reduce import ReduceKind
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.lower.match import is_unit, trace_axes

LETTERS = string.ascii_lowercase + string.ascii_uppercase


def contraction_rule(node: Node, ctx: Context):
    """sum_K(bcast(A) * bcast(B)) -> einsum(A, B)"""
    if node.spec.kind is not ReduceKind.sum:
        return NoMatch("not a sum")
    prod = ctx.made(node.inputs[0], Op.multiply)
    if prod is None or not prod.type.dtype.is_float:
        return NoMatch("not a float product")
    if prod.type.rank > len(LETTERS):
        return NoMatch("too many axes for einsum letters")
    (src_a, map_a), (src_b, map_b) = (trace_axes(ctx, n) for n in prod.inputs)
    reduced = set(node.spec.axes)
    axes = range(prod.type.rank)
    one_sided = any((map_a[i] is None) != (map_b[i] is None) for i in axes)
    contracted = any(map_a[i] is not None and map_b[i] is not None for i in reduced)
    if not (one_sided and contracted):
        return NoMatch("an elementwise product, not a contraction")
    neither = [i for i in axes if map_a[i] is None and map_b[i] is None]
    if any(not is_unit(prod.type.shape[i]) for i in neither):
        return NoMatch("an axis broadcast in both operands")
    equation = _equation(map_a, map_b, [i for i in axes if i not in reduced and i not in neither])
    emit = ctx.emitter(node)
    out = emit(Op.einsum, Einsum(equation), src_a, src_b)
    if any(i not in reduced for i in neither):  # size-1 axes neither operand has
        out = emit(Op.reshape, Reshape(node.type.shape), out)
    return emit.finish(out)


def _equation(map_a, map_b, kept) -> str:
    def labels(mapping) -> str:
        by_source = sorted((a, i) for i, a in enumerate(mapping) if a is not None)
        return "".join(LETTERS[i] for _, i in by_source)
    return f"{labels(map_a)},{labels(map_b)}->{''.join(LETTERS[i] for i in kept)}"


def einsum_bias_rule(node: Node, ctx: Context):
    """einsum(a, b) + bcast(bias over trailing axes) -> einsum(a, b, bias)"""
    for mine, other in (node.inputs, reversed(node.inputs)):
        found = ctx.made(mine, Op.einsum)
        if found is None or len(found.inputs) != 2 or not ctx.single_use(mine):
            continue
        bias = trailing_source(ctx, other, node.type.rank)
        if bias is None:
            continue
        emit = ctx.emitter(node)
        return emit.finish(emit(Op.einsum, found.spec, *found.inputs, bias))
    return NoMatch("no einsum plus a trailing bias")


def trailing_source(ctx: Context, name: str, rank: int) -> str | None:
    """The tensor that ``name`` broadcasts numpy-style (aligned to the trailing axes)."""
    src, mapping = trace_axes(ctx, name)
    n = ctx.type(src).rank
    if n == 0 or n == rank:
        return None  # a scalar (leave it elementwise) or no broadcast at all
    if tuple(mapping[rank - n:]) != tuple(range(n)) or \
            any(a is not None for a in mapping[:rank - n]):
        return None
    return src


def einsum_permute_rule(node: Node, ctx: Context):
    """permute(einsum(a, b)) -> einsum(a, b) with the output letters permuted"""
    found = ctx.made(node.inputs[0], Op.einsum)
    if found is None or len(found.inputs) != 2 or not ctx.single_use(node.inputs[0]):
        return NoMatch("not a permuted einsum")
    ins, out = parse_equation(found.spec.equation)
    equation = f"{ins[0]},{ins[1]}->{''.join(out[p] for p in node.spec.perm)}"
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.einsum, Einsum(equation), *found.inputs))


RULES = (
    Rule(Op.reduce, contraction_rule),     # sum_K(bcast(A) * bcast(B)) -> einsum(A, B)
    Rule(Op.permute, einsum_permute_rule),  # permute(einsum(a, b)) -> einsum(a, b) permuted
)
FUSE_RULES = (
    Rule(Op.add, einsum_bias_rule),  # einsum(a, b) + bcast(bias) -> einsum(a, b, bias)
)
