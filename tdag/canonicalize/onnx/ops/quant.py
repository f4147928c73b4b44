"""The ONNX op table, quantized ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv. The integer arithmetic stays in the
IR: integer inputs, zero points subtracted in i32, products summed exactly (integer matmul;
convolutions in f32 or f64, whichever is exact for the sizes), a requantization rounds half
to even and saturates to the output type, as onnx/reference/ops computes. Entries follow
onnx/ops/table.py's convention.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.elementwise import saturate_float8
from tdag.canonicalize.onnx.ops.table import (
    group_count,
    kernel_shape,
    norm_axis,
    pre_pad,
    register,
    window_attrs,
)
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType
from tdag.ops.quantize import (
    centered,
    centered_conv,
    conv_integer,
    dequantize_linear,
    dynamic_quantize_linear,
    matmul_integer,
    per_axis,
    per_channel,
    qlinear_conv_output,
    qlinear_matmul,
    quantize_linear,
)

def _axis(ctx, value, x):
    """The ``axis`` a scale or zero point runs along: None for one value."""
    block = ctx.attr("block_size", 0)
    if value.ndim == 0 or (value.ndim == 1 and value.shape[0] == 1 and not block):
        return None
    if value.ndim != 1 and not block:
        raise InvalidModelError(f"{ctx.node.op_type}: a scale of rank {value.ndim} without "
                                "block_size")
    return norm_axis(ctx.attr("axis", 1), x.ndim)


def _per_axis(ctx, value, x):
    """A scale or zero point broadcastable to x: a scalar, one per ``axis`` entry, or one per
    block of ``block_size`` along it."""
    return per_axis(value, x, _axis(ctx, value, x), ctx.attr("block_size", 0))


@register("QuantizeLinear")
def _quantize(ctx, x, scale, zero_point=None):
    x, scale = ctx.tensor(x), ctx.tensor(scale)
    dtype = ctx.tensor(zero_point).dtype if zero_point is not None else \
        (ctx.dtype(ctx.attr("output_dtype")) if ctx.attr("output_dtype") else DType.u8)
    precision = ctx.attr("precision")
    work = ctx.dtype(precision) if precision else x.dtype
    zero = ctx.tensor(zero_point) if zero_point is not None else None
    if not dtype.is_float8:
        return quantize_linear(ops.cast(x, work), scale, zero, dtype, _axis(ctx, scale, x),
                               ctx.attr("block_size", 0))
    q = ops.div(ops.cast(x, work), ops.cast(_per_axis(ctx, scale, x), work))
    if zero is not None:  # float8 keeps the fraction: the cast rounds it
        q = ops.add(q, ops.cast(_per_axis(ctx, zero, x), work))
    return ops.cast(saturate_float8(q, dtype) if ctx.flag("saturate", 1) else q, dtype)


@register("DequantizeLinear")
def _dequantize(ctx, x, scale, zero_point=None):
    x, scale = ctx.tensor(x), ctx.tensor(scale)
    if x.dtype.is_float and not x.dtype.is_float8:
        raise UnsupportedOpError(f"DequantizeLinear from {x.dtype.value}")
    zero = ctx.tensor(zero_point) if zero_point is not None else None
    y = dequantize_linear(x, scale, zero, _axis(ctx, scale, x), ctx.attr("block_size", 0))
    out = ctx.attr("output_dtype")
    return ops.cast(y, ctx.dtype(out) if out else scale.dtype)


@register("DynamicQuantizeLinear")
def _dynamic_quantize(ctx, x):
    return dynamic_quantize_linear(ctx.tensor(x))


@register("MatMulInteger")
def _matmul_integer(ctx, a, b, a_zero=None, b_zero=None):
    def opt(t):
        return None if t is None else ctx.tensor(t)
    return matmul_integer(ctx.tensor(a), ctx.tensor(b), opt(a_zero), opt(b_zero))


@register("QLinearMatMul")
def _qlinear_matmul(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero=None):
    def opt(t):
        return None if t is None else ctx.tensor(t)
    dtype = ctx.tensor(y_zero).dtype if y_zero is not None else ctx.tensor(a).dtype
    return qlinear_matmul(ctx.tensor(a), ctx.tensor(a_scale), opt(a_zero), ctx.tensor(b),
                          ctx.tensor(b_scale), opt(b_zero), ctx.tensor(y_scale), opt(y_zero),
                          dtype)


def _int_conv(ctx, x, w, x_zero, w_zero):
    """ConvInteger of the node's tensors (zero points None where absent): symmetric pads go
    to the kernel's composition; asymmetric ones pad the centred input explicitly."""
    x, w = ctx.tensor(x), ctx.tensor(w)
    if x.ndim > 1 and w.ndim > 1:  # the weight fixes the channels an input names
        ctx.pin(x.shape[1], w.shape[1] * group_count(ctx))
    strides, dilations, begins, ends = window_attrs(ctx, x, kernel_shape(ctx, x, w.shape[2:]))
    x_zero = None if x_zero is None else ctx.tensor(x_zero)
    w_zero = None if w_zero is None else ctx.tensor(w_zero)
    if begins == ends:
        return conv_integer(x, w, x_zero, w_zero, strides, list(begins), dilations,
                            group_count(ctx))
    wc = ops.cast(w, DType.i32)
    wc = wc if w_zero is None else ops.sub(wc, per_channel(w_zero, wc))
    xc, padding = pre_pad(centered(x, x_zero), begins, ends)
    return centered_conv(xc, wc, strides, padding, dilations, group_count(ctx))


@register("ConvInteger")
def _conv_integer(ctx, x, w, x_zero=None, w_zero=None):
    return _int_conv(ctx, x, w, x_zero, w_zero)


@register("QLinearConv")
def _qlinear_conv(ctx, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero=None, b=None):
    acc = _int_conv(ctx, x, w, x_zero, w_zero)
    dtype = ctx.tensor(y_zero).dtype if y_zero is not None else ctx.tensor(x).dtype
    return qlinear_conv_output(acc, ctx.tensor(x_scale), ctx.tensor(w_scale),
                               ctx.tensor(y_scale), None if y_zero is None else
                               ctx.tensor(y_zero), dtype, None if b is None else ctx.tensor(b))
