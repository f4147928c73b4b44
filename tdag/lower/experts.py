"""Mixture of experts: ``ops.grouped_matmul``'s composition -> the grouped_mm kernel.

    where(iota(S) < offsets[-1], sum_k(x * gather(weight, group(offsets))), 0)
                                                        -> grouped_mm(x, weight, offsets)

The operands are read off the composition's ends (x and the gathered weight at the product,
the offsets at the mask's slice) and the whole is checked against the kernel's own
decomposition, node for node. The pass runs before ``contraction``, which would make the
product an einsum kernel of gathered matrices.
"""
from __future__ import annotations

from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.lower.match import matches_kernel, trace_axes


def _rows_and_weight(ctx: Context, product: str) -> tuple[str, str] | None:
    """(x, weight) where ``product`` sums x's rows, broadcast, times each row's gathered
    expert matrix."""
    total = ctx.made(product, Op.reduce)
    times = ctx.made(total.inputs[0], Op.multiply) if total is not None else None
    if times is None:
        return None
    for rows, picked in (times.inputs, reversed(times.inputs)):
        gathered = ctx.made(picked, Op.gather)
        if gathered is not None and gathered.spec.axis == 0:
            return trace_axes(ctx, rows)[0], gathered.inputs[0]
    return None


def _offsets(ctx: Context, mask: str) -> str | None:
    """The offsets whose last entry ``mask`` (rows < offsets[-1], broadcast) compares to."""
    below = ctx.made(trace_axes(ctx, mask)[0], Op.compare)
    last = ctx.made(trace_axes(ctx, below.inputs[1], units=True)[0], Op.slice) \
        if below is not None else None
    return last.inputs[0] if last is not None else None


def grouped_mm_rule(node: Node, ctx: Context):
    """where(rows < offsets[-1], x times each row's gathered expert, 0) -> grouped_mm"""
    mask, product, _ = node.inputs
    found, offsets = _rows_and_weight(ctx, product), _offsets(ctx, mask)
    if found is None or offsets is None:
        return NoMatch("not a product of rows and their gathered experts under a row mask")
    operands = (*found, offsets)
    if not matches_kernel(ctx, node, Op.grouped_mm, NoSpec(), operands):
        return NoMatch("not ops.grouped_matmul's composition")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.grouped_mm, NoSpec(), *operands))


RULES = (Rule(Op.where, grouped_mm_rule),)  # the grouped matmul's composition -> grouped_mm
