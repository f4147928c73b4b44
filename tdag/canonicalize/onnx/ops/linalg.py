"""ONNX linear algebra: MatMul, Gemm, Einsum and Det (the integer and quantized products are
in onnx/ops/quant.py).
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import register
from tdag.ops import linalg


@register("MatMul")
def _matmul(ctx, a, b):
    a, b = ctx.tensor(a), ctx.tensor(b)
    if a.ndim > 0 and b.ndim > 1:  # a weight fixes the features an input names
        ctx.pin(a.shape[-1], b.shape[-2])
        ctx.pin(b.shape[-2], a.shape[-1])
    return ops.matmul(a, b)


@register("Gemm")
def _gemm(ctx, a, b, c=None):
    a, b = ctx.tensor(a), ctx.tensor(b)
    if ctx.flag("transA", 0):
        a = ops.permute(a, 1, 0)
    if ctx.flag("transB", 0):
        b = ops.permute(b, 1, 0)
    if a.ndim == 2 and b.ndim == 2:
        ctx.pin(a.shape[1], b.shape[0])
        ctx.pin(b.shape[0], a.shape[1])
    y = ops.matmul(a, b)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        y = ops.mul(y, alpha)
    if c is not None:
        c = ctx.tensor(c)
        y = ops.add(y, c if beta == 1.0 else ops.mul(c, beta))
    return y


@register("Einsum")
def _einsum(ctx, *xs):
    equation = ctx.attr("equation").replace(" ", "")
    return ops.einsum(equation, *[ctx.tensor(x) for x in xs])


@register("Det")
def _det(ctx, x):
    return linalg.det(ctx.tensor(x))
