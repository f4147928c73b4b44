"""Normalisation patterns -> layer_norm, rms_norm, group_norm, batch_norm kernels.

    c = x - bcast(sum(x, A) / N)                       (centre over axes A, N = |A|)
    c * bcast(rsqrt(sum(c * c, A) / N + eps))          -> layer_norm over A (trailing)
    x * bcast(rsqrt(sum(x * x, A) / N + eps))          -> rms_norm over A (trailing)
    reshape(layer_norm(reshape(x, [N,G,C/G,*S])))     -> group_norm(x, G)
    (x - bcast(mean[C])) * bcast(rsqrt(var[C] + eps)) -> batch_norm(x, mean, var)

rsqrt may be ``1/sqrt``, ``pow(., -0.5)`` or a divide by ``sqrt``. Views (keepdim unsqueezes,
repeats) may sit anywhere between the reduction and its use. The affine weight and bias are
folded in by ``AFFINE_RULES`` (run with the other fusions).
"""
from __future__ import annotations

from tdag.lower.kernels.norms import (BatchNorm, GroupNorm, LayerNorm, RMSNorm, Variance,
                                      VectorNorm)
from tdag.deinops.reduce import ReduceKind
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import is_static, product
from tdag.lower.match import (
    close,
    is_scalar,
    linear_coefficient,
    maps_reduced,
    matches_kernel,
    trace_axes,
    trace_chain,
)
from tdag.lower.movement import RESHAPES


def _mean_of(ctx: Context, name: str, rank: int):
    """``name`` = (pointwise ops of) bcast(sum(y, A) / N): ``(y, A, remaining ops)``."""
    src, mapping, ops = trace_chain(ctx, name)
    node = ctx.made(src, Op.reduce)
    if node is None or node.spec.kind is not ReduceKind.sum:
        return None
    y, axes = node.inputs[0], node.spec.axes
    if ctx.type(y).rank != rank or not maps_reduced(mapping, axes, rank):
        return None
    count = product(ctx.type(y).shape[a] for a in axes)
    if not is_static(count) or not ops:
        return None
    scale = ops[0]  # the division by the count comes first
    if scale[0] is Op.divide and not scale[2] and close(scale[1], count):
        return y, axes, ops[1:]
    if scale[0] is Op.multiply and close(scale[1] * count, 1.0):
        return y, axes, ops[1:]
    return None


def _eps_of_rsqrt(ops, inverse: bool = True) -> float | None:
    """eps for ops computing ``1/sqrt(t + eps)`` (or ``sqrt(t + eps)`` if not inverse)."""
    if not ops or ops[0][0] is not Op.add:
        return None
    eps, rest = ops[0][1], [(s[0], s[1]) for s in ops[1:]]
    if inverse and rest in ([(Op.pow, 0.5), (Op.reciprocal, None)], [(Op.pow, -0.5)]):
        return eps
    if not inverse and rest == [(Op.pow, 0.5)]:
        return eps
    return None


def _square_of(ctx: Context, name: str) -> str | None:
    node = ctx.made(name, Op.multiply)
    if node is not None and node.inputs[0] == node.inputs[1]:
        return node.inputs[0]
    node = ctx.made(name, Op.pow)
    if node is not None:
        if is_scalar(ctx, node.inputs[1], 2.0):
            return node.inputs[0]
    return None


def _normalized(ctx: Context, node: Node):
    """(numerator, eps, axes) of ``n * rsqrt(mean(n*n)+eps)`` or ``n / sqrt(...)``."""
    rank = node.type.rank
    pairs = [tuple(node.inputs), tuple(reversed(node.inputs))] if node.op is Op.multiply else \
        [tuple(node.inputs)]
    for n, s in pairs:
        found = _mean_of(ctx, s, rank)
        if found is None:
            continue
        y, axes, ops = found
        eps = _eps_of_rsqrt(ops, inverse=node.op is Op.multiply)
        if eps is not None and _square_of(ctx, y) == n:
            return n, eps, axes
    return None


def _centred(ctx: Context, c: str, axes: tuple) -> str | None:
    """``x - bcast(mean(x, axes))`` -> x."""
    node = ctx.made(c, Op.add)
    if node is None:
        return None
    for x, m in (node.inputs, reversed(node.inputs)):
        found = _mean_of(ctx, m, node.type.rank)
        if found is not None and found[0] == x and tuple(found[1]) == tuple(axes) and \
                linear_coefficient(found[2]) == -1.0:
            return x
    return None


def _trailing(axes, rank: int) -> bool:
    return tuple(axes) == tuple(range(rank - len(axes), rank))


def norm_rule(node: Node, ctx: Context):
    """centred * rsqrt(var + eps) -> layer_norm;  x * rsqrt(mean(x^2) + eps) -> rms_norm"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    if node.op is Op.divide and node.spec.mode.value != "true":
        return NoMatch("a rounding division")
    found = _normalized(ctx, node)
    if found is None:
        return NoMatch("not a normalisation")
    n, eps, axes = found
    if not _trailing(axes, node.type.rank):
        return NoMatch("normalised axes are not trailing")
    x = _centred(ctx, n, axes)
    emit = ctx.emitter(node)
    if x is not None:
        return emit.finish(emit(Op.layer_norm, LayerNorm(len(axes), eps), x))
    return emit.finish(emit(Op.rms_norm, RMSNorm(len(axes), eps), n))


def group_norm_rule(node: Node, ctx: Context):
    """reshape(layer_norm(reshape(x[N,C,*S] -> [N,G,C/G,*S]))) -> group_norm(x, G)"""
    ln = ctx.made(node.inputs[0], Op.layer_norm)
    if ln is None or len(ln.inputs) != 1:
        return NoMatch("not a reshaped layer norm")
    split = ctx.producer(ln.inputs[0])
    if split is None or split.op not in RESHAPES:
        return NoMatch("layer norm input is not reshaped")
    x = split.inputs[0]
    xs, ys = ctx.type(x).shape, split.type.shape
    if len(xs) < 2 or len(ys) != len(xs) + 1 or ln.spec.count != len(ys) - 2:
        return NoMatch("not a channel split into groups")
    if not (tuple(ys[3:]) == tuple(xs[2:]) and ys[0] == xs[0] and is_static(ys[1]) and
            node.type.same_as(ctx.type(x))):
        return NoMatch("not a channel split into groups")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.group_norm, GroupNorm(int(ys[1]), ln.spec.eps), x))


def _channel_vector(ctx: Context, name: str, rank: int):
    """``name`` = (pointwise ops of) a [C] vector broadcast on axis 1: ``(vector, ops)``."""
    src, mapping, ops = trace_chain(ctx, name)
    if ctx.type(src).rank != 1 or len(mapping) != rank:
        return None
    if [i for i, m in enumerate(mapping) if m is not None] != [1]:
        return None
    return src, ops


def batch_norm_rule(node: Node, ctx: Context):
    """(x - bcast(mean)) * bcast(rsqrt(var + eps)) -> batch_norm(x, mean, var)"""
    if not node.type.dtype.is_float or node.type.rank < 2:
        return NoMatch("not a float tensor with channels")
    for c, s in (node.inputs, reversed(node.inputs)):
        scale = _channel_vector(ctx, s, node.type.rank)
        centred = ctx.made(c, Op.add)
        if scale is None or centred is None:
            continue
        var, ops = scale
        eps = _eps_of_rsqrt(ops)
        for x, m in (centred.inputs, reversed(centred.inputs)):
            mean = _channel_vector(ctx, m, node.type.rank)
            if eps is None or mean is None or linear_coefficient(mean[1]) != -1.0:
                continue
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.batch_norm, BatchNorm(eps), x, mean[0], var))
    return NoMatch("not a batch norm")


RULES = (
    Rule(Op.multiply, norm_rule),        # c * rsqrt(mean(c * c) + eps) -> layer_norm / rms_norm
    Rule(Op.divide, norm_rule),          # c / sqrt(mean(c * c) + eps) -> layer_norm / rms_norm
    # reshape(layer_norm(reshape(x -> [N, G, C/G, *S]))) -> group_norm(x, G), on each reshape op
    Rule(Op.group, group_norm_rule),      # group(layer_norm(split x)) -> group_norm(x, G)
    Rule(Op.ungroup, group_norm_rule),    # ungroup(layer_norm(split x)) -> group_norm(x, G)
    Rule(Op.squeeze, group_norm_rule),    # squeeze(layer_norm(split x)) -> group_norm(x, G)
    Rule(Op.unsqueeze, group_norm_rule),  # unsqueeze(layer_norm(split x)) -> group_norm(x, G)
    Rule(Op.reshape, group_norm_rule),    # reshape(layer_norm(split x)) -> group_norm(x, G)
    Rule(Op.multiply, batch_norm_rule),  # (x - mean) * rsqrt(var + eps) -> batch_norm(x, ...)
)


# -- affine weight and bias -------------------------------------------------------------------

def _operand_of(ctx: Context, node: Node, op: Op, arity: int):
    """(kernel node, other operand) when one operand is a single-use ``op`` with ``arity``."""
    for mine, other in (node.inputs, reversed(node.inputs)):
        found = ctx.made(mine, op)
        if found is not None and len(found.inputs) == arity and ctx.single_use(mine):
            return found, other
    return None


def _trailing_vector(ctx: Context, name: str, rank: int, count: int) -> str | None:
    src, mapping = trace_axes(ctx, name)
    if ctx.type(src).rank != count or len(mapping) != rank:
        return None
    if tuple(mapping) != (None,) * (rank - count) + tuple(range(count)):
        return None
    return src


def _channel_only(ctx: Context, name: str, rank: int) -> str | None:
    src, mapping = trace_axes(ctx, name)
    if ctx.type(src).rank != 1 or [i for i, m in enumerate(mapping) if m is not None] != [1]:
        return None
    return src


def affine_rule(node: Node, ctx: Context):
    """norm(x) * bcast(w) -> norm(x, w);  norm(x, w) + bcast(b) -> norm(x, w, b)"""
    rank = node.type.rank
    want = 1 if node.op is Op.multiply else 2
    for op in (Op.layer_norm, Op.rms_norm):
        found = _operand_of(ctx, node, op, want)
        if found is None or (op is Op.rms_norm and node.op is Op.add):
            continue
        kernel, other = found
        vec = _trailing_vector(ctx, other, rank, kernel.spec.count)
        if vec is not None:
            emit = ctx.emitter(node)
            return emit.finish(emit(op, kernel.spec, *kernel.inputs, vec))
    want = 3 if node.op is Op.multiply else 4
    found = _operand_of(ctx, node, Op.batch_norm, want)
    if found is not None:
        kernel, other = found
        vec = _channel_only(ctx, other, rank)
        if vec is not None:
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.batch_norm, kernel.spec, *kernel.inputs, vec))
    return _channel_affine(node, ctx)


def _channel_affine(node: Node, ctx: Context):
    """group_norm(x) * w + b (or an instance norm: layer_norm over all of x[N,C,*S] but N
    and C, with a per-channel affine) -> group_norm(x, G, w, b)"""
    if node.op is not Op.add or node.type.rank < 3:
        return NoMatch("no norm kernel times a weight (plus a bias)")
    for prod_name, b_name in (node.inputs, reversed(node.inputs)):
        prod = ctx.made(prod_name, Op.multiply)
        bias = _channel_only(ctx, b_name, node.type.rank)
        if prod is None or bias is None or not ctx.single_use(prod_name):
            continue
        for k_name, w_name in (prod.inputs, reversed(prod.inputs)):
            kernel = ctx.producer(k_name)
            weight = _channel_only(ctx, w_name, node.type.rank)
            if kernel is None or weight is None or len(kernel.inputs) != 1 or \
                    not ctx.single_use(k_name):
                continue
            if kernel.op is Op.group_norm:
                spec = kernel.spec
            elif kernel.op is Op.layer_norm and kernel.spec.count == node.type.rank - 2 and \
                    is_static(node.type.shape[1]):
                spec = GroupNorm(int(node.type.shape[1]), kernel.spec.eps)
            else:
                continue
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.group_norm, spec, kernel.inputs[0], weight, bias))
    return NoMatch("no norm kernel times a weight (plus a bias)")


AFFINE_RULES = (
    Rule(Op.multiply, affine_rule),  # norm(x) * bcast(w) -> norm(x, w)
    Rule(Op.add, affine_rule),       # norm(x, w) + bcast(b) -> norm(x, w, b)
)


def variance_rule(node: Node, ctx: Context):
    """sum((x - mean(x))^2, a) / (n - correction) -> var(x, a, correction)  (kept dims or
    not; checked node for node against the kernel's decomposition; after the norms, whose
    rules read the composition)"""
    top = ctx.producer(node.inputs[0])
    keepdim = top is not None and top.op is Op.unsqueeze
    total = ctx.producer(top.inputs[0]) if keepdim else top
    if not node.type.dtype.is_float or node.spec.mode.value != "true" or total is None or \
            total.op is not Op.reduce or total.spec.kind is not ReduceKind.sum:
        return NoMatch("not a sum over a count")
    square = ctx.made(total.inputs[0], Op.multiply)
    centered = ctx.made(square.inputs[0], Op.add) if square is not None and \
        square.inputs[0] == square.inputs[1] else None
    if centered is None:
        return NoMatch("not a sum of squares of x - mean")
    axes = tuple(sorted(total.spec.axes))
    for x in dict.fromkeys(centered.inputs):
        for correction in (1, 0):
            spec = Variance(axes, correction, keepdim)
            if ctx.type(x).dtype is node.type.dtype and \
                    matches_kernel(ctx, node, Op.var, spec, (x,)):
                emit = ctx.emitter(node)
                return emit.finish(emit(Op.var, spec, x))
    return NoMatch("not var's composition (correction 0 or 1)")


VARIANCE_RULES = (
    Rule(Op.divide, variance_rule),  # sum((x - mean)^2, a) / (n - c) -> var(x, a, c)
)


def vector_norm_rule(node: Node, ctx: Context):
    """sqrt(sum(x * x, a)) -> vector_norm(x, 2, a)  (the root a pow by 0.5; kept dims or
    not; after the norms, whose rules read such sums)"""
    if not is_scalar(ctx, node.inputs[1], 0.5):
        return NoMatch("not a square root")
    top = ctx.producer(node.inputs[0])
    keepdim = top is not None and top.op is Op.unsqueeze
    total = ctx.producer(top.inputs[0]) if keepdim else top
    if not node.type.dtype.is_float or total is None or total.op is not Op.reduce or \
            total.spec.kind is not ReduceKind.sum:
        return NoMatch("not the root of a sum")
    square = ctx.made(total.inputs[0], Op.multiply)
    if square is None or square.inputs[0] != square.inputs[1]:
        return NoMatch("not a sum of squares")
    x, spec = square.inputs[0], VectorNorm(2.0, tuple(sorted(total.spec.axes)), keepdim)
    if ctx.type(x).dtype is not node.type.dtype or \
            not matches_kernel(ctx, node, Op.vector_norm, spec, (x,)):
        return NoMatch("not vector_norm's composition")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.vector_norm, spec, x))


VECTOR_NORM_RULES = (
    Rule(Op.pow, vector_norm_rule),  # sum(x * x, a) ** 0.5 -> vector_norm(x, 2, a)
)
