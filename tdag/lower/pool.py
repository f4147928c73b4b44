"""Windowed reductions -> max_pool / avg_pool, on any spatial axes of any layout.

    sum(where(first_max(W), W, -0.0), kernel axes)              -> reduce[max](W, kernel axes)
        (in the cnn_backward pass, before the max inside the mask becomes a max_pool here)
    reduce[max](unfold+(pad?(x, -inf)), kernel axes)            -> max_pool
    reduce[sum](unfold+(pad?(x, 0)), kernel axes) / prod(kernel) -> avg_pool (padding counted)
    reduce[sum](unfold+(pad(x, 0)), kernel axes) / real cells   -> avg_pool[exclude_pad]

The pooled axes are moved last and the others merged into torch's (N, C) so that the
kernel sees x[N, C, *S]; the result is reshaped and permuted back.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

from tdag.lower.kernels.layout import Reshape
from tdag.lower.kernels.windows import Pool
from tdag.deinops.movement import Permute
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.windows import Unfold
from tdag.ir.graph import TDAG, Node
from tdag.ir.program import Program
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import product, shape_is_static
from tdag.ir.types import DType, TensorKind, TensorType
from tdag.lower.match import bind_template, close, scalar, simplified, trace_axes
from tdag.ops import core
from tdag.ops.builder import Builder
from tdag.ops.nn.pool import first_max
from tdag.lower.windows import symmetric_padding, windows_of


def _pooled(ctx: Context, name: str, kind: ReduceKind):
    """``name`` = reduce[kind] over exactly the kernel axes of unfolded windows."""
    node = ctx.made(name, Op.reduce)
    if node is None or node.spec.kind is not kind:
        return None
    win = windows_of(ctx, node.inputs[0])
    if win is None or any(a.kind not in ("src", "win", "ker") or a.parts != 1 for a in win.axes):
        return None
    kernel_axes = tuple(i for i, a in enumerate(win.axes) if a.kind == "ker")
    if tuple(sorted(node.spec.axes)) != kernel_axes or not 1 <= len(win.unfolds) <= 3:
        return None
    dtype = ctx.type(name).dtype
    if not (dtype.is_float or kind is ReduceKind.max and dtype in (DType.u8, DType.i8)):
        return None
    return win


@lru_cache(maxsize=64)
def _first_max_template(windows: TensorType, d: int) -> TDAG:
    """ops.max_pool's value over windows of this type: the sum of each window's first max."""
    builder = Builder()
    with builder.active():
        w = builder.input("w", windows)
        mask = first_max(w, tuple(int(k) for k in windows.shape[-d:]))
        out = core.sum(core.where(mask, w, -0.0), tuple(range(windows.rank - d, windows.rank)))
    return simplified(Program.from_tdag(builder.build([out])))


def first_max_rule(node: Node, ctx: Context):
    """sum(where(first_max(W), W, -0.0), K) -> reduce[max](W, K): the same value (the mask
    only routes the gradient), and the windowed max the rule below makes a max_pool"""
    pick = ctx.made(node.inputs[0], Op.where)
    if node.spec.kind is not ReduceKind.sum or pick is None:
        return NoMatch("not a sum of selected window cells")
    windows = ctx.type(pick.inputs[1])
    d = len(node.spec.axes)
    if not d or node.spec.axes != tuple(range(windows.rank - d, windows.rank)) or \
            not shape_is_static(windows.shape[-d:]) or not windows.dtype.is_float:
        return NoMatch("not a sum over static trailing window axes")
    bound = bind_template(ctx, node, _first_max_template(windows, d))
    if bound is None:
        return NoMatch("not each window's first maximum")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.reduce, Reduce(ReduceKind.max, node.spec.axes), bound["w"]))


def max_pool_rule(node: Node, ctx: Context):
    """max over the windows of x -> max_pool"""
    if any(r.op is Op.unfold for r in ctx.readers(node.name)):
        return NoMatch("a separable pooling goes on: merge the axes first")
    win = _pooled(ctx, node.name, ReduceKind.max)
    if win is None:
        return NoMatch("not a windowed max")
    dtype = node.type.dtype  # a quantized tensor pads with its least value
    fill = float("-inf") if dtype.is_float else float(torch.iinfo(dtype.torch).min)
    return _emit(node, ctx, win, Op.max_pool, fill)


def avg_pool_rule(node: Node, ctx: Context):
    """sum over the windows of x / window size -> avg_pool"""
    for total, c in (node.inputs, reversed(node.inputs)):
        win = _pooled(ctx, total, ReduceKind.sum)
        value = scalar(ctx, c)
        if win is None or value is None or value == 0:
            continue
        count = product(s.size for s in win.unfolds.values())
        if node.op is Op.divide and c == node.inputs[1] and close(value, count) or \
                node.op is Op.multiply and close(value * count, 1.0):
            if any(s.dilation != 1 for s in win.unfolds.values()):
                return NoMatch("avg_pool has no dilation")
            return _emit(node, ctx, win, Op.avg_pool, 0.0, source=total)
    if node.op is Op.divide:
        win = _pooled(ctx, node.inputs[0], ReduceKind.sum)
        if win is not None and _counts_real_cells(ctx, win, node.inputs[1]) and \
                all(s.dilation == 1 for s in win.unfolds.values()):
            return _emit(node, ctx, win, Op.avg_pool, 0.0, exclude_pad=True)
    return NoMatch("not a windowed mean")


def _counts_real_cells(ctx: Context, win, divisor: str) -> bool:
    """Whether ``divisor`` is a constant table, broadcast over the other axes, holding each
    window's number of real (unpadded) cells: the divisor of a mean that skips padding."""
    spatial = sorted(win.unfolds)
    src, mapping = trace_axes(ctx, divisor)
    weight = ctx.weight(src)
    if weight is None or weight.value is None or weight.kind is not TensorKind.const:
        return False
    if [m for i, m in enumerate(mapping) if i not in spatial] != \
            [None] * (len(mapping) - len(spatial)):
        return False
    kept = [mapping[a] for a in spatial]
    source_shape = ctx.type(win.source).shape
    if not shape_is_static([source_shape[a] for a in spatial]):
        return False
    padding = symmetric_padding(win, spatial, len(source_shape))[1]
    if win.pad is not None and not any(padding):
        return False  # a pad the kernel cannot take: its cells count, or are not zeros
    expected = _real_cells(tuple(int(source_shape[a]) for a in spatial),
                           [win.unfolds[a] for a in spatial], padding)
    table = weight.value.double()
    order = [m for m in kept if m is not None]
    view = table.permute([*order, *[i for i in range(table.dim()) if i not in order]]) \
        if table.dim() == len(order) else None
    if view is None:
        return False
    shape = [expected.shape[i] if m is not None else 1 for i, m in enumerate(kept)]
    return tuple(view.shape) == tuple(s for s, m in zip(shape, kept) if m is not None) and \
        bool((view.reshape(shape) == expected).all())


def _real_cells(lengths: tuple, specs, padding) -> torch.Tensor:
    """Each window's count of cells inside the unpadded input, as a table over the windows:
    a windowed sum of ones, the padding zeros."""
    ones = torch.ones((1, 1) + lengths, dtype=torch.float64)
    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[len(lengths)]
    kernel = tuple(s.size for s in specs)
    mean = pool(ones, kernel, tuple(s.step for s in specs), tuple(padding),
                count_include_pad=True)
    return (mean * math.prod(kernel)).round()[0, 0]


def _emit(node: Node, ctx: Context, win, op: Op, fill: float, source: str | None = None,
          exclude_pad: bool = False):
    spatial = sorted(win.unfolds)
    rank = ctx.type(win.source).rank
    x, padding = symmetric_padding(win, spatial, rank, fill)
    specs = [win.unfolds[a] for a in spatial]
    if any(2 * p > s.size for p, s in zip(padding, specs)):
        x, padding = (win.pad.name if win.pad is not None else x), (0,) * len(spatial)
    others = [a for a in range(rank) if a not in spatial]
    emit = ctx.emitter(node)
    perm = tuple(others + spatial)
    if perm != tuple(range(rank)):
        x = emit(Op.permute, Permute(perm), x)
    shape = ctx.type(x).shape
    lead = shape[:len(others)]
    merged = (product(lead[:-1]) if len(lead) > 1 else 1, lead[-1] if lead else 1)
    if tuple(lead) != merged:
        x = emit(Op.reshape, Reshape(merged + tuple(shape[len(others):])), x)
    spec = Pool(tuple(s.size for s in specs), tuple(s.step for s in specs), padding,
                tuple(s.dilation for s in specs), exclude_pad)
    out = emit(op, spec, x)
    windows = ctx.type(out).shape[2:]
    if tuple(lead) != merged:
        out = emit(Op.reshape, Reshape(tuple(lead) + tuple(windows)), out)
    if perm != tuple(range(rank)):
        inverse = tuple(perm.index(i) for i in range(rank))
        out = emit(Op.permute, Permute(inverse), out)
    return emit.finish(out)


def merge_windows_rule(node: Node, ctx: Context):
    """reduce(unfold(reduce(W, K1), a), last) -> reduce(unfold(W, a), K1 + last): separable
    window sums (or maxes), one axis at a time, become one windowed reduction"""
    if node.spec.kind not in (ReduceKind.sum, ReduceKind.max):
        return NoMatch("neither a sum nor a max")
    outer = ctx.made(node.inputs[0], Op.unfold)
    if outer is None or node.spec.axes != (node.type.rank,):
        return NoMatch("not a reduction of the last window axis")
    inner = ctx.made(outer.inputs[0], Op.reduce)
    if inner is None or inner.spec.kind is not node.spec.kind or not ctx.single_use(inner.name):
        return NoMatch("not nested window reductions")
    w = ctx.type(inner.inputs[0])
    k1 = tuple(range(w.rank - len(inner.spec.axes), w.rank))
    if tuple(sorted(inner.spec.axes)) != k1 or windows_of(ctx, inner.inputs[0]) is None:
        return NoMatch("inner reduction is not over window axes")
    emit = ctx.emitter(node)
    s = outer.spec
    both = emit(Op.unfold, Unfold(s.axis, s.size, s.step, s.dilation), inner.inputs[0])
    return emit.finish(emit(Op.reduce, Reduce(node.spec.kind, k1 + (w.rank,)), both))


RULES = (
    Rule(Op.reduce, merge_windows_rule),  # reduce(unfold(reduce(W, K1), a)) -> reduce(unfold(W))
    Rule(Op.reduce, max_pool_rule),       # max(windows of x) -> max_pool(x)
    Rule(Op.divide, avg_pool_rule),       # sum(windows of x) / window size -> avg_pool(x)
    Rule(Op.multiply, avg_pool_rule),     # sum(windows of x) * (1 / window size) -> avg_pool(x)
)
