"""exp / reduce-sum / divide chains -> softmax and log_softmax, on any single axis.

    e = exp(x - bcast(max(x, a)))       (the shift is optional: softmax(s) without it)
    e / bcast(sum(e, a))          -> softmax(x, a)      (or e * reciprocal(...))
    s - bcast(log(sum(exp(s), a))) -> log_softmax(x, a) with s = x - bcast(max(x, a))
    log(sum(exp(x - m), a)) + m   -> logsumexp(x, a)    m = max(x, a), an infinite m made 0
"""
from __future__ import annotations

from functools import lru_cache

from tdag.lower.activations import abs_rule
from tdag.lower.kernels.activations import LogSumExp, Softmax
from tdag.deinops.reduce import ReduceKind
from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule, RuleSet, rewrite
from tdag.lower.match import (kernel_template, linear_coefficient, maps_reduced, matches_kernel,
                              trace_chain)
from tdag.refine.dataflow import prune


def _reduced(ctx: Context, name: str, kind: ReduceKind, of: str | None = None):
    """``name`` as a broadcast of ``reduce[kind](of, (a,))`` after the pointwise ``ops``:
    ``(input, axis, ops)``, else None."""
    src, mapping, ops = trace_chain(ctx, name)
    node = ctx.made(src, Op.reduce)
    if node is None or node.spec.kind is not kind or len(node.spec.axes) != 1:
        return None
    if of is not None and node.inputs[0] != of:
        return None
    rank = ctx.type(node.inputs[0]).rank
    if not maps_reduced(mapping, node.spec.axes, rank):
        return None
    return node.inputs[0], node.spec.axes[0], ops


def unshift(ctx: Context, s: str, axis: int) -> str:
    """``x - bcast(max(x, axis))`` -> x; anything else is returned unchanged."""
    node = ctx.made(s, Op.add)
    if node is None:
        return s
    for x, m in (node.inputs, reversed(node.inputs)):
        found = _reduced(ctx, m, ReduceKind.max, of=x)
        if found is not None and found[1] == axis and linear_coefficient(found[2]) == -1.0:
            return x
    return s


def _softmax_parts(ctx: Context, node: Node):
    """(e, denominator) of e / d or e * (1/d)."""
    if node.op is Op.divide and node.spec.mode.value == "true":
        return node.inputs
    if node.op is Op.multiply:
        for e, r in (node.inputs, reversed(node.inputs)):
            src, _, ops = trace_chain(ctx, r)
            if ops and ops[-1][0] is Op.reciprocal:
                return e, r
    return None


def softmax_rule(node: Node, ctx: Context):
    """exp(s) / bcast(sum(exp(s), a)) -> softmax(unshift(s), a)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    parts = _softmax_parts(ctx, node)
    if parts is None:
        return NoMatch("not a quotient")
    e, d = parts
    exp = ctx.made(e, Op.exp)
    found = _reduced(ctx, d, ReduceKind.sum, of=e)
    if exp is None or found is None:
        return NoMatch("not exp over its sum")
    want = [(Op.reciprocal, None)] if node.op is Op.multiply else []
    if found[2] != want:
        return NoMatch("the sum is transformed")
    axis = found[1]
    x = unshift(ctx, exp.inputs[0], axis)
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.softmax, Softmax(axis), x))


def log_softmax_rule(node: Node, ctx: Context):
    """s - bcast(log(sum(exp(s), a))) -> log_softmax(unshift(s), a)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    for s, t in (node.inputs, reversed(node.inputs)):
        src, mapping, ops = trace_chain(ctx, t)
        if ops != [(Op.log, None), (Op.neg, None)]:
            continue
        reduce = ctx.made(src, Op.reduce)
        if reduce is None or reduce.spec.kind is not ReduceKind.sum or len(reduce.spec.axes) != 1:
            continue
        exp = ctx.made(reduce.inputs[0], Op.exp)
        if exp is None or exp.inputs[0] != s or \
                not maps_reduced(mapping, reduce.spec.axes, node.type.rank):
            continue
        axis = reduce.spec.axes[0]
        emit = ctx.emitter(node)
        return emit.finish(emit(Op.log_softmax, Softmax(axis), unshift(ctx, s, axis)))
    return NoMatch("not a log-softmax")


# the activations pass runs first: logsumexp's |max| is the abs kernel when this pass meets it
_ABS = RuleSet((Rule(Op.where, abs_rule),))


@lru_cache(maxsize=64)
def _logsumexp_template(op: Op, spec, types: tuple) -> TDAG:
    graph, _ = rewrite(kernel_template(op, spec, types), _ABS)
    return prune(graph)


def logsumexp_rule(node: Node, ctx: Context):
    """log(sum(exp(x - m), axes)) + m, m = max(x, axes) with an infinite max made 0 ->
    logsumexp(x, axes) (kept dims or not; checked node for node against the kernel's
    decomposition)"""
    keepdim = node.op is Op.add
    add = node if keepdim else ctx.made(node.inputs[0], Op.add)
    if not node.type.dtype.is_float or add is None:
        return NoMatch("not log(...) + m")
    for logged, m in (add.inputs, reversed(add.inputs)):
        top = ctx.made(m, Op.where)
        shown = ctx.producer(top.inputs[2]) if top is not None else None
        while shown is not None and shown.op in (Op.reshape, Op.unsqueeze):
            shown = ctx.producer(shown.inputs[0])
        if ctx.made(logged, Op.log) is None or shown is None or shown.op is not Op.reduce or \
                shown.spec.kind is not ReduceKind.max:
            continue
        spec = LogSumExp(tuple(sorted(shown.spec.axes)), keepdim)
        if keepdim and _squeezed(ctx, node, spec.axes):
            return NoMatch("the squeeze after it takes the kernel, its dims dropped")
        if matches_kernel(ctx, node, Op.logsumexp, spec, (shown.inputs[0],),
                          _logsumexp_template):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.logsumexp, spec, shown.inputs[0]))
    return NoMatch("not a logsumexp")


def _squeezed(ctx: Context, node: Node, axes: tuple) -> bool:
    """Whether ``node``'s one reader drops its unit ``axes`` (a squeeze or such a reshape)."""
    readers = ctx.readers(node.name)
    if len(readers) != 1 or readers[0].op not in (Op.squeeze, Op.reshape):
        return False
    kept = tuple(d for i, d in enumerate(node.type.shape) if i not in axes)
    return readers[0].type.shape == kept


RULES = (
    Rule(Op.divide, softmax_rule),     # exp(s) / bcast(sum(exp(s), a)) -> softmax(s, a)
    Rule(Op.multiply, softmax_rule),   # exp(s) * bcast(1 / sum(exp(s), a)) -> softmax(s, a)
    Rule(Op.add, log_softmax_rule),    # s - bcast(log(sum(exp(s), a))) -> log_softmax(s, a)
    Rule(Op.add, logsumexp_rule),      # log(sum(exp(x - m), a)) + m -> logsumexp(x, a)
    Rule(Op.squeeze, logsumexp_rule),  # its dims dropped -> logsumexp(x, a)
    Rule(Op.reshape, logsumexp_rule),  # (squeeze as the movement pass writes it) -> the same
)
