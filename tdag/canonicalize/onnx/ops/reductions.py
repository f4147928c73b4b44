"""ONNX reductions and scans: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSumExp, ReduceLogSum; CumSum and CumProd.

A reduction over no element is the op's identity; a shape value's reduction (the product of
a shape's tail) folds. A scan is pad + unfold + reduce over a static axis, a product with the
mask ``j <= i`` over a symbolic one.
"""
from __future__ import annotations

import math
import operator

import torch

from tdag import ops
from tdag.canonicalize.onnx.ops.table import OPS, axes_of, norm_axes, norm_axis, register
from tdag.canonicalize.onnx.values import Known, dim_max, dim_min, fold_reduce
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType


# -- reductions ------------------------------------------------------------------------------------

def _sum_square(x, axes, keep):
    return ops.sum(ops.mul(x, x), axes, keep)


_REDUCE = {
    "ReduceSum": (ops.sum, 13), "ReduceMean": (ops.mean, 18), "ReduceMax": (ops.amax, 18),
    "ReduceMin": (ops.amin, 18), "ReduceProd": (ops.prod, 18),
    "ReduceSumSquare": (_sum_square, 18),
    "ReduceL1": (lambda x, a, k: ops.sum(ops.abs(x), a, k), 18),
    "ReduceL2": (lambda x, a, k: ops.sqrt(_sum_square(x, a, k)), 18),
    "ReduceLogSumExp": (ops.logsumexp, 18),
    "ReduceLogSum": (lambda x, a, k: ops.log(ops.sum(x, a, k)), 18),
}


def _reduce(fn, axes_input_opset):
    def convert(ctx, x, axes=None):
        axes = axes_of(ctx, axes, axes_input_opset)
        keep = ctx.flag("keepdims", 1)
        rank = len(x.shape)
        if not axes:
            if ctx.flag("noop_with_empty_axes", 0):
                return x
            axes = list(range(rank))
        axes = norm_axes(axes, rank)
        fold = _REDUCE_FOLDS.get(ctx.node.op_type)
        if fold is not None and isinstance(x, Known):  # the product of a shape's tail
            folded = fold_reduce(fold, x, axes, keep)
            if folded is not None:
                return folded
        x = ctx.tensor(x)
        if any(is_static(x.shape[a]) and x.shape[a] == 0 for a in axes):
            return _reduce_empty(ctx, x, axes, keep)
        return fn(x, axes, keep)
    return convert


_REDUCE_FOLDS = {"ReduceSum": operator.add, "ReduceProd": operator.mul,
                 "ReduceMax": dim_max, "ReduceMin": dim_min}


def _reduce_empty(ctx, x, axes, keep):
    """A reduction over no element is the op's identity (ONNX: -inf for a max, False for a
    max of bools, ...); torch's amax refuses an empty axis."""
    op = ctx.node.op_type
    if op in ("ReduceMax", "ReduceMin"):
        low = op == "ReduceMax"
        if x.dtype is DType.bool:
            value = not low
        elif x.dtype.is_float:
            value = -math.inf if low else math.inf
        else:
            info = torch.iinfo(x.dtype.torch)
            value = info.min if low else info.max
    else:
        value = {"ReduceProd": 1, "ReduceMean": math.nan, "ReduceLogSumExp": -math.inf,
                 "ReduceLogSum": -math.inf}.get(op, 0)
    shape = [1 if a in axes else d for a, d in enumerate(x.shape) if keep or a not in axes]
    return ops.full(tuple(shape), value, x.dtype)


for _name, (_fn, _opset) in _REDUCE.items():
    OPS.add(_name, _reduce(_fn, _opset))


# -- scans -----------------------------------------------------------------------------------------

def _cumsum_symbolic(x, axis):
    """CumSum's prefix sums over a symbolic axis: a product with the mask ``j <= i`` (from
    iota)."""
    n = x.shape[axis]
    mask = ops.le(ops.unsqueeze(ops.iota(n), 1), ops.unsqueeze(ops.iota(n), 0))
    moved = ops.movedim(x, axis, -1)
    return ops.movedim(ops.matmul(moved, ops.cast(mask, x.dtype)), -1, axis)


def _flip(x, axis):
    n = x.shape[axis]
    if not is_static(n):
        raise UnsupportedOpError(f"a reversal along the symbolic axis {n}")
    return ops.gather(x, x.builder.const(torch.arange(n - 1, -1, -1)), axis)


def _scan(ctx, x, axis, kind: str):
    """Inclusive/exclusive, forward/reverse prefix sums or products along ``axis``: each
    output reduces a window of the (identity-padded) input (pad + unfold + reduce)."""
    x = ctx.tensor(x)
    axis = norm_axis(int(ctx.scalar(axis, "axis")), x.ndim)
    n = x.shape[axis]
    reverse, exclusive = ctx.flag("reverse", 0), ctx.flag("exclusive", 0)
    if not is_static(n):
        if kind != "sum":
            raise UnsupportedOpError(f"{ctx.node.op_type} along the symbolic axis {n}")
        total = _cumsum_symbolic(x, axis)  # a product with the mask j <= i
        if reverse:  # suffix sums: the whole sum less the prefix before each
            total = ops.add(ops.sub(ops.sum(x, (axis,), True), total), x)
        return ops.cast(ops.sub(total, x) if exclusive else total, x.dtype)
    if n == 0:
        return x
    y = _flip(x, axis) if reverse else x
    identity = 1 if kind == "prod" else 0
    widths = [(0, 0)] * x.ndim
    widths[axis] = (n - 1 + exclusive, 0)
    padded = ops.pad(y, widths, identity)
    if exclusive:
        padded = ops.slice(padded, axis, 0, 2 * n - 1)
    out = ops.reduce(ops.unfold(padded, axis, n), kind, (x.ndim,))
    out = ops.cast(out, x.dtype)
    return _flip(out, axis) if reverse else out


@register("CumSum")
def _cumsum(ctx, x, axis):
    return _scan(ctx, x, axis, "sum")


@register("CumProd")
def _cumprod(ctx, x, axis):
    return _scan(ctx, x, axis, "prod")
