"""Linear quantization as compositions: the one meaning of ONNX's QuantizeLinear,
DequantizeLinear and MatMulInteger that the ONNX importer writes and the quantized kernels
(``tdag/lower/kernels/quant.py``) decompose to, so that lowering recognises one as the other.

Integer arithmetic stays exact: a quantization rounds half to even and saturates, as
onnx/reference/ops computes; an integer matmul subtracts the zero points and sums in i32.
"""
from __future__ import annotations

from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static, product
from tdag.ir.types import DType
from tdag.ops import arrays, core
from tdag.ops.nn.conv import conv
from tdag.ops.tensor import Tensor

# the integer types a quantization saturates to (float8 keeps its own path in the importer)
RANGE = {DType.u8: (0, 255), DType.i8: (-128, 127), DType.u16: (0, 65535),
         DType.i16: (-32768, 32767), DType.i32: (-2 ** 31, 2 ** 31 - 1)}


def per_axis(value: Tensor, x: Tensor, axis: int | None, block: int = 0) -> Tensor:
    """A scale or zero point broadcastable to ``x``: a scalar (``axis`` None, or one value
    given as [1]), one per ``axis`` entry, or one per block of ``block`` along it."""
    if value.ndim == 0:
        return value
    if axis is None or (value.ndim == 1 and value.shape[0] == 1 and not block):
        return core.reshape(value, ())
    if block:
        value = arrays.repeat_interleave(value, block, axis)
        return core.slice(value, axis, 0, x.shape[axis])
    shape = [1] * x.ndim
    shape[axis] = value.shape[0]
    return core.reshape(value, tuple(shape))


def saturate(q: Tensor, dtype: DType) -> Tensor:
    """Clamp to ``dtype``'s range, then cast (the values are already whole)."""
    if dtype not in RANGE:
        raise UnsupportedOpError(f"quantization to {dtype.value}")
    low, high = RANGE[dtype]
    return core.cast(core.clamp(q, float(low), float(high)), dtype)


def quantize_linear(x: Tensor, scale: Tensor, zero_point: Tensor | None, dtype: DType,
                    axis: int | None = None, block: int = 0) -> Tensor:
    """``saturate(round(x / scale) + zero_point)`` in x's float type."""
    q = core.round(core.div(x, core.cast(per_axis(scale, x, axis, block), x.dtype)))
    if zero_point is not None:
        q = core.add(q, core.cast(per_axis(zero_point, x, axis, block), x.dtype))
    return saturate(q, dtype)


def dequantize_linear(q: Tensor, scale: Tensor, zero_point: Tensor | None,
                      axis: int | None = None, block: int = 0) -> Tensor:
    """``(q - zero_point) * scale`` in f32."""
    dx = core.cast(q, DType.f32)
    if zero_point is not None:
        dx = core.sub(dx, core.cast(per_axis(zero_point, q, axis, block), DType.f32))
    return core.mul(dx, core.cast(per_axis(scale, q, axis, block), DType.f32))


def dynamic_quantize_linear(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """DynamicQuantizeLinear: (uint8 x, scale, zero point), the scale and zero point mapping
    [min(x, 0), max(x, 0)] onto [0, 255]."""
    axes = tuple(range(x.ndim))
    high = core.maximum(core.amax(x, axes), 0.0)
    low = core.minimum(core.amin(x, axes), 0.0)
    scale = core.div(core.sub(high, low), 255.0)
    # round(0 - low / scale) is round(-low / scale): negation is exact
    zero = quantize_linear(core.neg(low), scale, None, DType.u8)
    return quantize_linear(x, scale, zero, DType.u8), scale, zero


def centered(x: Tensor, zero_point: Tensor | None, row_axis: int | None = None) -> Tensor:
    """x - zero_point in i32; a 1-D zero point of a matrix is one per row (``row_axis``)."""
    x = core.cast(x, DType.i32)
    if zero_point is None:
        return x
    zp = core.cast(zero_point, DType.i32)
    if zp.ndim == 1 and zp.shape[0] == 1:
        zp = core.reshape(zp, ())
    elif zp.ndim == 1 and row_axis is not None:
        zp = core.unsqueeze(zp, row_axis)
    return core.sub(x, zp)  # else one per column: broadcast along the last axis


def matmul_integer(a: Tensor, b: Tensor, a_zero: Tensor | None = None,
                   b_zero: Tensor | None = None) -> Tensor:
    """MatMulInteger: ``(a - a_zero) @ (b - b_zero)`` exactly, in i32. a's zero point is one
    per row of a; b's one per column, broadcast along b's last axis."""
    return arrays.matmul(centered(a, a_zero, row_axis=-1), centered(b, b_zero))


def per_channel(zero_point: Tensor, like: Tensor) -> Tensor:
    """A weight's zero point in i32, broadcastable to ``like`` (O, C/g, *K): one value, or
    one per output channel."""
    zp = core.cast(zero_point, DType.i32)
    if zp.ndim == 1 and zp.shape[0] == 1:
        return core.reshape(zp, ())
    return core.reshape(zp, (-1,) + (1,) * (like.ndim - 1)) if zp.ndim else zp


def centered_conv(x: Tensor, w: Tensor, stride, padding, dilation, groups: int) -> Tensor:
    """The exact convolution of centred integer tensors (i32), as i32: summed in f32 where
    every partial sum stays below 2**24 (|x|, |w| <= 255, so 255 * 255 * terms; onnxruntime
    has no f64 Conv), else in f64 (exact below 2**53)."""
    terms = product(w.shape[1:])
    work = DType.f32 if is_static(terms) and 255 * 255 * terms < 2 ** 24 else DType.f64
    y = conv(core.cast(x, work), core.cast(w, work), None, stride, padding, dilation, groups)
    return core.cast(y, DType.i32)


def conv_integer(x: Tensor, w: Tensor, x_zero: Tensor | None = None,
                 w_zero: Tensor | None = None, stride=1, padding=0, dilation=1,
                 groups: int = 1) -> Tensor:
    """ConvInteger: ``conv(x - x_zero, w - w_zero)`` exactly, in i32; x's zero point one
    value, w's one value or one per output channel. Padding pads ``x - x_zero`` with 0, that
    is x with its zero point, as onnxruntime does."""
    wc = core.cast(w, DType.i32)
    if w_zero is not None:
        wc = core.sub(wc, per_channel(w_zero, wc))
    return centered_conv(centered(x, x_zero), wc, stride, padding, dilation, groups)


def requantize(acc: Tensor, scale: Tensor, y_zero: Tensor | None, dtype: DType) -> Tensor:
    """An i32 accumulator to ``dtype``: ``saturate(round(acc * scale + y_zero))`` in f64,
    where every i32 and the f32 scale are exact (onnx/reference/ops' QLinear ops)."""
    d = core.mul(core.cast(acc, DType.f64), core.cast(scale, DType.f64))
    if y_zero is not None:
        d = core.add(d, core.cast(y_zero, DType.f64))
    return saturate(core.round(d), dtype)


def qlinear_conv_output(acc: Tensor, x_scale: Tensor, w_scale: Tensor, y_scale: Tensor,
                        y_zero: Tensor | None, dtype: DType, bias: Tensor | None = None
                        ) -> Tensor:
    """QLinearConv from ConvInteger's accumulator (N, C, *S): plus the i32 bias (one per
    channel), requantized by ``x_scale * w_scale / y_scale`` (w's one value or one per
    output channel)."""
    per_c = (-1,) + (1,) * (acc.ndim - 2)
    if bias is not None:  # the i32 bias, added exactly
        acc = core.add(acc, core.reshape(core.cast(bias, DType.i32), per_c))
    ws = core.reshape(w_scale, per_c) if w_scale.ndim else w_scale
    return requantize(acc, core.div(core.mul(x_scale, ws), y_scale), y_zero, dtype)


def qlinear_conv(x: Tensor, x_scale: Tensor, x_zero: Tensor, w: Tensor, w_scale: Tensor,
                 w_zero: Tensor, y_scale: Tensor, y_zero: Tensor, bias: Tensor | None = None,
                 stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """QLinearConv with symmetric padding: ConvInteger's exact accumulator, requantized."""
    acc = conv_integer(x, w, x_zero, w_zero, stride, padding, dilation, groups)
    return qlinear_conv_output(acc, x_scale, w_scale, y_scale, y_zero, y_zero.dtype, bias)


def qlinear_matmul(a: Tensor, a_scale: Tensor, a_zero: Tensor | None, b: Tensor,
                   b_scale: Tensor, b_zero: Tensor | None, y_scale: Tensor,
                   y_zero: Tensor | None, dtype: DType) -> Tensor:
    """QLinearMatMul: MatMulInteger's exact product requantized by ``a_scale * b_scale /
    y_scale`` (b's one value or one per column), to ``dtype``."""
    acc = matmul_integer(a, b, a_zero, b_zero)
    return requantize(acc, core.div(core.mul(a_scale, b_scale), y_scale), y_zero, dtype)
