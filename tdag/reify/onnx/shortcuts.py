"""Shorter ONNX for three idioms that tdag spells with primitives and ONNX has one op for,
and a form that keeps onnxruntime on its faster kernels (issue 25).

Read from the lowered TDAG while it is written; each returns None where it does not apply,
and the nodes it skips are left unread (``prune`` drops them):

    reduce[sum](expand(c, [n]))                 -> c * n, read with Shape (a size as a tensor)
    gather(t, where(i < 0, i + len, i))         -> Gather(t, i)   (ONNX's Gather wraps i < 0)
    reduce[sum](x, axes) / size(x, axes)        -> ReduceMean (GlobalAveragePool over H, W)
    layer_norm(a + b)                           -> LayerNormalization(Sum(a, b))

tdag has no op for a run-time size (``ops.dim_tensor`` sums a vector of ones) nor for a mean
(``ops.mean`` divides a sum by its count), and its gather takes no negative index (the ONNX
importer wraps them); an exporter's file has one node for each, which onnxruntime fuses and
lays out better (its NCHWc GlobalAveragePool), so the re-emitted file writes them back.

onnxruntime's optimiser rewrites ``Add -> LayerNormalization`` into its com.microsoft
``SkipLayerNormalization``, whose CPU kernel (1.32, one thread) takes 4-7x the time of the
two nodes it replaces: 168 us against 30 us on [128, 256] rows, 488 against 70 on [128, 768],
4.2 ms against 1.5 on [1024, 768] (BERT's four post-norm residuals are 13% of its run). A sum
that a layer norm reads is written as ONNX's ``Sum`` of the two, the same addition, which
that fusion does not match.

A conv of channels joined by a concat (a U-Net's skip connection) arrives as the sum of its
pieces' convs: ``lower``'s final ``split_concat`` pass (``tdag.lower.conv``).
"""
from __future__ import annotations

import sympy

from tdag.deinops.elementwise import CompareKind
from tdag.deinops.reduce import ReduceKind
from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.rewrite import Context
from tdag.ir.symbols import Dim, dims_equal, is_static, product
from tdag.ir.types import DType
from tdag.lower.match import scalar


def size_value(ctx: Context, name: str) -> Dim | None:
    """The size ``name`` holds when it is one number computed from sizes only: a constant,
    ``reduce[sum](expand(c, [n]))`` (c * n), their products and casts, broadcast to any
    shape; else None."""
    node = ctx.producer(name)
    if node is None:
        value = scalar(ctx, name)
        return int(value) if value is not None and value == int(value) else None
    if node.op is Op.cast or (has(node.op, Trait.KEEPS_VALUES) and node.op is not Op.reduce):
        return size_value(ctx, node.inputs[0])
    if node.op is Op.multiply:
        factors = [size_value(ctx, n) for n in node.inputs]
        return None if None in factors else sympy.Mul(*factors)
    if node.op is Op.reduce and node.spec.kind is ReduceKind.sum and node.type.rank == 0:
        source = ctx.producer(node.inputs[0])
        if source is not None and source.op is Op.expand and ctx.type(source.inputs[0]).rank == 0:
            value = scalar(ctx, source.inputs[0])
            if value is not None and value == int(value):
                return int(value) * product(source.type.shape)
    return None


def counted_size(ctx: Context, node) -> Dim | None:
    """``node``'s value when it is a run-time size: ``reduce[sum](expand(c, [n]))``."""
    if node.op is not Op.reduce or node.type.rank != 0:
        return None
    value = size_value(ctx, node.name)
    return None if value is None or is_static(value) else value


def unwrapped_index(ctx: Context, node) -> str | None:
    """The raw index ``i`` of ``gather(t, where(i < 0, i + len, i))``, len the gathered
    axis's length: ONNX's Gather wraps a negative index itself."""
    picked = ctx.producer(node.inputs[1])
    if picked is None or picked.op is not Op.where:
        return None
    test, wrapped, raw = picked.inputs
    compare, add = ctx.producer(test), ctx.producer(wrapped)
    if compare is None or compare.op is not Op.compare or \
            compare.spec.kind is not CompareKind.lt or compare.inputs[0] != raw or \
            scalar(ctx, compare.inputs[1]) != 0:
        return None
    if add is None or add.op is not Op.add or raw not in add.inputs:
        return None
    shift = size_value(ctx, add.inputs[1 - add.inputs.index(raw)])
    length = ctx.type(node.inputs[0]).shape[node.spec.axis]
    same_type = ctx.type(raw).shape == picked.type.shape
    return raw if same_type and shift is not None and dims_equal(shift, length) else None


def mean_of(ctx: Context, node) -> tuple[str, tuple] | None:
    """(x, axes) where ``node`` divides ``reduce[sum](x, axes)`` (reshaped to keep its axes,
    or not) by the number of elements it summed, a size over symbolic dims; else None."""
    if node.op is not Op.divide or not node.type.dtype.is_float:
        return None
    total = ctx.producer(node.inputs[0])
    if total is not None and total.op is Op.reshape:
        total = ctx.producer(total.inputs[0])
    if total is None or total.op is not Op.reduce or total.spec.kind is not ReduceKind.sum:
        return None
    x = ctx.type(total.inputs[0])
    count = product(x.shape[a] for a in total.spec.axes)
    if is_static(count) or not ctx.type(node.inputs[0]).rank == node.type.rank:
        return None
    divisor = size_value(ctx, node.inputs[1])
    if divisor is None or not dims_equal(divisor, count):
        return None
    kept = tuple(1 if a in total.spec.axes else d for a, d in enumerate(x.shape))
    if not any(_same(node.type.shape, s) for s in (kept, total.type.shape)):
        return None
    return total.inputs[0], tuple(total.spec.axes)


def emit_mean(node, x: str, axes: tuple, g, rank: int) -> str:
    """ReduceMean, or GlobalAveragePool where it averages every axis after N, C and keeps
    them (as ResNet's pooler does)."""
    keep = node.type.rank == rank
    if keep and rank > 2 and axes == tuple(range(2, rank)):
        return g.node("GlobalAveragePool", [x])
    return g.node("ReduceMean", [x, g.const(list(axes))], keepdims=int(keep))


def is_normalised_sum(ctx: Context, node) -> bool:
    """Whether ``node`` is a float32 add that a layer_norm normalises (``Sum``, not ``Add``,
    keeps onnxruntime's slower SkipLayerNormalization out: see above)."""
    return node.op is Op.add and node.type.dtype is DType.f32 and \
        any(r.op is Op.layer_norm and r.inputs[0] == node.name for r in ctx.readers(node.name))


def _same(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b))
