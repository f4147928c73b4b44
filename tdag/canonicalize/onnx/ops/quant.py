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
from tdag.ir.symbols import is_static, product
from tdag.ir.types import DType
from tdag.ops.quantize import (
    RANGE,
    centered,
    dequantize_linear,
    matmul_integer,
    per_axis,
    quantize_linear,
    saturate,
)

_RANGE = RANGE  # the name contrib_quant.py reads


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


def _saturate(q, dtype: DType):
    return saturate(q, dtype)


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
    """uint8 with a scale and zero point that map [min(x, 0), max(x, 0)] onto [0, 255]."""
    x = ctx.tensor(x)
    axes = tuple(range(x.ndim))
    high = ops.maximum(ops.amax(x, axes), 0.0)
    low = ops.minimum(ops.amin(x, axes), 0.0)
    scale = ops.div(ops.sub(high, low), 255.0)
    # round(0 - low / scale) is round(-low / scale): negation is exact
    zero = quantize_linear(ops.neg(low), scale, None, DType.u8)
    return quantize_linear(x, scale, zero, DType.u8), scale, zero


def _centered(ctx, x, zero_point, row_axis=None):
    """x - zero_point in i32; a 1-D zero point of a matrix is one per row (``row_axis``)."""
    return centered(ctx.tensor(x), None if zero_point is None else ctx.tensor(zero_point),
                    row_axis)


@register("MatMulInteger")
def _matmul_integer(ctx, a, b, a_zero=None, b_zero=None):
    def opt(t):
        return None if t is None else ctx.tensor(t)
    return matmul_integer(ctx.tensor(a), ctx.tensor(b), opt(a_zero), opt(b_zero))


@register("QLinearMatMul")
def _qlinear_matmul(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero=None):
    product = ops.matmul(_centered(ctx, a, a_zero, row_axis=-1), _centered(ctx, b, b_zero))
    scale = ops.div(ops.mul(ctx.tensor(a_scale), ctx.tensor(b_scale)), ctx.tensor(y_scale))
    d = ops.mul(ops.cast(product, DType.f64), ops.cast(scale, DType.f64))
    dtype = ctx.tensor(y_zero).dtype if y_zero is not None else ctx.tensor(a).dtype
    if y_zero is not None:
        d = ops.add(d, ops.cast(ctx.tensor(y_zero), DType.f64))
    return _saturate(ops.round(d), dtype)


def _conv_attrs(ctx, x, w):
    kernel = kernel_shape(ctx, x, w.shape[2:])
    strides, dilations, begins, ends = window_attrs(ctx, x, kernel)
    return strides, dilations, begins, ends, group_count(ctx), pre_pad


def _int_conv(ctx, x, w):
    """The exact integer convolution of centred 8-bit tensors, as i32: summed in f32 where
    every partial sum stays below 2**24 (|x|, |w| <= 255, so 255 * 255 * terms; onnxruntime
    has no f64 Conv), else in f64 (exact below 2**53)."""
    terms = product(w.shape[1:])
    exact32 = is_static(terms) and 255 * 255 * terms < 2 ** 24
    work = DType.f32 if exact32 else DType.f64
    x64, w64 = ops.cast(x, work), ops.cast(w, work)
    strides, dilations, begins, ends, group, pre_pad = _conv_attrs(ctx, x64, w64)
    x64, padding = pre_pad(x64, begins, ends)
    return ops.cast(ops.conv(x64, w64, None, strides, padding, dilations, group), DType.i32)


@register("ConvInteger")
def _conv_integer(ctx, x, w, x_zero=None, w_zero=None):
    x = _centered(ctx, x, x_zero)
    w = _centered(ctx, w, None)
    if w_zero is not None:  # one per output channel
        zp = ops.cast(ctx.tensor(w_zero), DType.i32)
        w = ops.sub(w, ops.reshape(zp, (-1,) + (1,) * (w.ndim - 1)) if zp.ndim else zp)
    return _int_conv(ctx, x, w)


@register("QLinearConv")
def _qlinear_conv(ctx, x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero=None, b=None):
    xc = _centered(ctx, x, x_zero)
    wc = ops.cast(ctx.tensor(w), DType.i32)
    wz = ops.cast(ctx.tensor(w_zero), DType.i32)
    wc = ops.sub(wc, ops.reshape(wz, (-1,) + (1,) * (wc.ndim - 1)) if wz.ndim else wz)
    acc = _int_conv(ctx, xc, wc)
    if b is not None:  # the i32 bias, added exactly
        acc = ops.add(acc, ops.reshape(ops.cast(ctx.tensor(b), DType.i32),
                                       (-1,) + (1,) * (acc.ndim - 2)))
    ws = ctx.tensor(w_scale)
    ws = ops.reshape(ws, (-1,) + (1,) * (acc.ndim - 2)) if ws.ndim else ws
    scale = ops.div(ops.mul(ctx.tensor(x_scale), ws), ctx.tensor(y_scale))
    d = ops.mul(ops.cast(acc, DType.f64), ops.cast(scale, DType.f64))
    dtype = ctx.tensor(y_zero).dtype if y_zero is not None else ctx.tensor(x).dtype
    if y_zero is not None:
        d = ops.add(d, ops.cast(ctx.tensor(y_zero), DType.f64))
    return _saturate(ops.round(d), dtype)
