"""ONNX reductions and scans: ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd,
ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSumExp, ReduceLogSum; CumSum and CumProd.

A reduction over no element is the op's identity; a shape value's reduction (the product of
a shape's tail) folds. CumSum and CumProd are the scan primitive (linear in the axis).
"""
from __future__ import annotations

import math
import operator

import torch

from tdag import ops
from tdag.canonicalize.onnx.ops.table import OPS, axes_of, norm_axes, norm_axis, register
from tdag.canonicalize.onnx.values import Known, dim_max, dim_min, fold_reduce
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

def _scan(ctx, x, axis, combine: str):
    """Inclusive or exclusive, forward or reverse: an exclusive scan is the inclusive scan of
    the input moved one place on (the combine's identity first), so it is exact."""
    x = ctx.tensor(x)
    axis = norm_axis(int(ctx.scalar(axis, "axis")), x.ndim)
    reverse, exclusive = bool(ctx.flag("reverse", 0)), ctx.flag("exclusive", 0)
    if exclusive:  # one identity in front, the last element dropped
        widths = [(0, 0)] * x.ndim
        widths[axis] = (-1, 1) if reverse else (1, -1)
        x = ops.pad(x, widths, 1 if combine == "mul" else 0)
    return ops.scan(x, axis, combine, reverse)


@register("CumSum")
def _cumsum(ctx, x, axis):
    return _scan(ctx, x, axis, "add")


@register("CumProd")
def _cumprod(ctx, x, axis):
    return _scan(ctx, x, axis, "mul")
