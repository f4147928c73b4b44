"""Quantized kernels: quantize, dequantize, DynamicQuantizeLinear's outputs, the integer
matmul and convolution.

Each is one ONNX op (QuantizeLinear, DequantizeLinear, MatMulInteger) that onnxruntime runs
as one kernel and fuses further: Q/DQ pairs around a float Conv or MatMul become its
QLinearConv / integer matmul. Their compositions (``tdag.ops.quantize``) are what the ONNX
importer writes; ``tdag/lower/quant.py`` recognises them back. The arithmetic is exact:
quantizing rounds half to even and saturates, an integer matmul sums in i32 (wrapping as
every i32 accumulator does).

Cost convention: an integer matmul's work is ``2*M*K*N`` operations as a float one's, and
counts as integer work in ``tdag.cost``'s split by dtype (the operands' dtype names it).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag.deinops.codegen import dtype_expr, tuple_expr
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait, record
from tdag.ir.symbols import dims_equal, is_static, product
from tdag.ir.types import DType, TensorType
from tdag.lower.kernels.common import NDIM, per_element
from tdag.lower.kernels.contraction import Conv
from tdag.ops.quantize import (
    RANGE,
    conv_integer,
    dequantize_linear,
    dynamic_quantize_linear,
    matmul_integer,
    quantize_linear,
)

# the 8-bit types (16-bit ones need opset 21; they stay compositions)
QUANTIZED = frozenset({DType.u8, DType.i8})
_BATCH = Refuse("reads its scale along a fixed axis: strip the batch before lowering")


def one_value(t: TensorType) -> bool:
    """A scalar or a single value given as [1]."""
    return t.rank == 0 or (t.rank == 1 and is_static(t.shape[0]) and t.shape[0] == 1)


def _check_scale(op: str, x: TensorType, scale: TensorType, axis: int | None) -> None:
    """One scale for the tensor (rank 0 or [1]), or one per entry of ``axis``."""
    if axis is None and one_value(scale):
        return
    if axis is None or scale.rank != 1 or not 0 <= axis < x.rank or \
            not dims_equal(scale.shape[0], x.shape[axis]):
        raise ShapeError(f"{op}: scale {scale} does not fit {x} along axis {axis}")


def _zero_fits(op: str, zero: TensorType, scale: TensorType, dtype: DType) -> None:
    """Shaped as the scale, or (for one scale) one value too."""
    if zero.dtype is not dtype or \
            not (zero.shape == scale.shape or one_value(zero) and one_value(scale)):
        raise ShapeError(f"{op}: zero point {zero} should be {dtype.value} shaped as {scale}")


def _view(scale: torch.Tensor, rank: int, axis: int | None) -> torch.Tensor:
    """A scale or zero point shaped to broadcast against a rank-``rank`` tensor."""
    if axis is None:
        return scale.reshape(())
    return scale.reshape([-1 if i == axis else 1 for i in range(rank)])


def _view_expr(name: str, rank: int, axis: int | None) -> str:
    if axis is None:
        return f"{name}.reshape(())"
    return f"{name}.reshape({[-1 if i == axis else 1 for i in range(rank)]})"


def _axis_attrs(axis: int | None) -> dict:
    return {} if axis is None else {"axis": axis}


# -- quantize ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Quantize:
    """``saturate_dtype(round_half_even(x / scale) [+ zero_point])``; scale and zero point
    one value (``axis`` None) or one per entry of ``axis``."""

    dtype: DType
    axis: int | None = None


def _quantize_shape(spec: Quantize, ins):
    x, scale = ins[0], ins[1]
    if spec.dtype not in QUANTIZED or (len(ins) == 2 and spec.dtype is not DType.u8):
        raise ShapeError(f"quantize: to {spec.dtype.value} needs a zero point of that type")
    if not x.dtype.is_float or x.dtype.is_float8 or scale.dtype is not x.dtype:
        raise ShapeError(f"quantize: input {x} and scale {scale} must share a float dtype")
    _check_scale("quantize", x, scale, spec.axis)
    if len(ins) == 3:
        _zero_fits("quantize", ins[2], scale, spec.dtype)
    return x.with_dtype(spec.dtype)


def _quantize_eval(spec: Quantize, xs, resolve):
    x = xs[0]
    q = torch.round(x / _view(xs[1], x.dim(), spec.axis))
    if len(xs) == 3:
        q = q + _view(xs[2], x.dim(), spec.axis).to(x.dtype)
    low, high = RANGE[spec.dtype]
    return q.clamp(low, high).to(spec.dtype.torch)


def _quantize_torch(node, a, code):
    rank, axis = node.type.rank, node.spec.axis
    q = f"torch.round({a[0]} / {_view_expr(a[1], rank, axis)})"
    if len(a) == 3:
        q = f"({q} + {_view_expr(a[2], rank, axis)}.to({a[0]}.dtype))"
    low, high = RANGE[node.spec.dtype]
    return f"{q}.clamp({low}, {high}).to({dtype_expr(node.spec.dtype)})"


def _quantize_onnx(node, ins, g, cx):
    return g.node("QuantizeLinear", ins, **_axis_attrs(node.spec.axis))


def _quantize_jax(node, a, cx):
    jnp, rank, axis = cx.jnp, node.type.rank, node.spec.axis
    q = jnp.round(a[0] / _view(a[1], rank, axis))  # jnp.round rounds half to even
    if len(a) == 3:
        q = q + _view(a[2], rank, axis).astype(a[0].dtype)
    low, high = RANGE[node.spec.dtype]
    return jnp.clip(q, low, high).astype(cx.dtype(node.spec.dtype))


primitive(Op.quantize, Quantize, range(2, 4), _quantize_shape, _quantize_eval,
          per_element(4), "divide + round-half-even (floor, remainder, compares) + clamp is a "
          "dozen passes over the tensor; QuantizeLinear is one, and onnxruntime fuses it with "
          "the float op it feeds",
          traits=Trait.KERNEL, batch=_BATCH, torch=_quantize_torch, onnx=_quantize_onnx,
          jax=_quantize_jax,
          decompose=lambda s, x, scale, *zero: quantize_linear(
              x, scale, zero[0] if zero else None, s.dtype, s.axis))


# -- dequantize -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Dequantize:
    """``(q [- zero_point]) * scale`` in f32; scale one value or one per entry of ``axis``."""

    axis: int | None = None


def _dequantize_shape(spec: Dequantize, ins):
    q, scale = ins[0], ins[1]
    if q.dtype not in QUANTIZED | {DType.i32} or scale.dtype is not DType.f32:
        raise ShapeError(f"dequantize: an integer input and an f32 scale, got {q}, {scale}")
    _check_scale("dequantize", q, scale, spec.axis)
    if len(ins) == 3:
        _zero_fits("dequantize", ins[2], scale, q.dtype)
    return q.with_dtype(DType.f32)


def _dequantize_eval(spec: Dequantize, xs, resolve):
    q = xs[0].to(torch.float32)
    if len(xs) == 3:
        q = q - _view(xs[2], q.dim(), spec.axis).to(torch.float32)
    return q * _view(xs[1], q.dim(), spec.axis)


def _dequantize_torch(node, a, code):
    rank, axis = node.type.rank, node.spec.axis
    q = f"{a[0]}.float()"
    if len(a) == 3:
        q = f"({q} - {_view_expr(a[2], rank, axis)}.float())"
    return f"{q} * {_view_expr(a[1], rank, axis)}"


def _dequantize_onnx(node, ins, g, cx):
    axis = node.spec.axis
    if len(ins) == 2 and cx.ctx.op(node.inputs[0]) is Op.matmul_integer and \
            axis in (None, node.type.rank - 1):
        # MatMulInteger -> Cast -> Mul is the form onnxruntime fuses into MatMulIntegerToFloat
        # (and, after DynamicQuantizeLinear, DynamicQuantizeMatMul); the same f32 arithmetic
        return g.node("Mul", [g.cast(ins[0], DType.f32), ins[1]])
    return g.node("DequantizeLinear", ins, **_axis_attrs(axis))


def _dequantize_jax(node, a, cx):
    rank, axis, f32 = node.type.rank, node.spec.axis, cx.dtype(DType.f32)
    q = a[0].astype(f32)
    if len(a) == 3:
        q = q - _view(a[2], rank, axis).astype(f32)
    return q * _view(a[1], rank, axis)


primitive(Op.dequantize, Dequantize, range(2, 4), _dequantize_shape, _dequantize_eval,
          per_element(2), "cast + subtract + multiply is three passes; DequantizeLinear is one, "
          "and onnxruntime fuses a Q/DQ pair around a float op into its integer kernel",
          traits=Trait.KERNEL, batch=_BATCH, torch=_dequantize_torch, onnx=_dequantize_onnx,
          jax=_dequantize_jax,
          decompose=lambda s, q, scale, *zero: dequantize_linear(
              q, scale, zero[0] if zero else None, s.axis))


# -- integer matmul ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MatMulInteger:
    """``(a - a_zero) @ (b - b_zero)`` in i32 (numpy matmul broadcasting); which zero points
    are given: a's is one value, b's one value or one per column."""

    a_zero: bool = False
    b_zero: bool = False


def _mm_parts(spec: MatMulInteger, xs):
    """(a, b, a_zero or None, b_zero or None) of the operand list."""
    rest = list(xs[2:])
    a_zero = rest.pop(0) if spec.a_zero else None
    b_zero = rest.pop(0) if spec.b_zero else None
    return xs[0], xs[1], a_zero, b_zero


def _mm_shape(spec: MatMulInteger, ins):
    if len(ins) != 2 + spec.a_zero + spec.b_zero:
        raise ShapeError(f"matmul_integer: {len(ins)} operands for {spec}")
    a, b, az, bz = _mm_parts(spec, ins)
    if a.dtype not in (DType.u8, DType.i8) or b.dtype not in (DType.u8, DType.i8) or \
            a.rank < 2 or b.rank < 2 or not dims_equal(a.shape[-1], b.shape[-2]):
        raise ShapeError(f"matmul_integer: 8-bit matrices that chain, got {a} and {b}")
    if az is not None and (az.dtype is not a.dtype or az.rank > 1 or
                           not all(is_static(d) and d == 1 for d in az.shape)):
        raise ShapeError(f"matmul_integer: a's zero point {az} should be one {a.dtype.value}")
    if bz is not None and (bz.dtype is not b.dtype or bz.rank > 1 or (
            bz.rank == 1 and not (dims_equal(bz.shape[0], b.shape[-1]) or
                                  (is_static(bz.shape[0]) and bz.shape[0] == 1)))):
        raise ShapeError(f"matmul_integer: b's zero point {bz} should be one {b.dtype.value} "
                         "or one per column")
    lead_a, lead_b = a.shape[:-2], b.shape[:-2]
    if len(lead_a) < len(lead_b) or not all(
            dims_equal(x, y) for x, y in zip(reversed(lead_a), reversed(lead_b))):
        raise ShapeError(f"matmul_integer: batch axes of {a} and {b} differ")
    return TensorType(tuple(a.shape[:-1]) + (b.shape[-1],), DType.i32)


def _centered_eval(x, zero):
    x = x.to(torch.int32)
    return x if zero is None else x - zero.to(torch.int32)


def _mm_eval(spec: MatMulInteger, xs, resolve):
    a, b, az, bz = _mm_parts(spec, xs)
    return torch.matmul(_centered_eval(a, az.reshape(()) if az is not None else None),
                        _centered_eval(b, bz))


def _mm_cost(spec: MatMulInteger, ins, out: TensorType) -> Cost:
    macs = out.numel * ins[0].shape[-1]
    return traffic(ins, out, 2 * macs, 2 * macs)


def _mm_torch(node, a, code):
    x, y, az, bz = _mm_parts(node.spec, a)

    def centered(v, zero):
        v = f"{v}.to(torch.int32)"
        return v if zero is None else f"({v} - {zero}.to(torch.int32))"
    az = f"{az}.reshape(())" if az is not None else None
    return f"torch.matmul({centered(x, az)}, {centered(y, bz)})"  # torch's i32 matmul


def _mm_onnx(node, ins, g, cx):
    x, y, az, bz = _mm_parts(node.spec, ins)
    zeros = [az or "", bz] if bz is not None else ([az] if az is not None else [])
    return g.node("MatMulInteger", [x, y] + zeros)


def _mm_jax(node, a, cx):
    x, y, az, bz = _mm_parts(node.spec, a)
    i32 = cx.dtype(DType.i32)
    x = x.astype(i32) - (az.reshape(()).astype(i32) if az is not None else 0)
    y = y.astype(i32) - (bz.astype(i32) if bz is not None else 0)
    return cx.jnp.matmul(x, y, preferred_element_type=i32)


def _mm_decompose(spec: MatMulInteger, *xs):
    a, b, az, bz = _mm_parts(spec, xs)
    return matmul_integer(a, b, az, bz)


primitive(Op.matmul_integer, MatMulInteger, range(2, 5), _mm_shape, _mm_eval, _mm_cost,
          "multiply + reduce-sum of broadcast i32 operands materialises the whole product; "
          "MatMulInteger runs the 8-bit GEMM",
          traits=Trait.KERNEL,
          batch=Refuse("is an integer matmul of fixed-rank operands: strip the batch before "
                       "lowering"),
          torch=_mm_torch, onnx=_mm_onnx, jax=_mm_jax, decompose=_mm_decompose)


# -- integer convolution ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ConvInteger:
    """``conv(x - x_zero, w - w_zero)`` in i32 with symmetric zero padding of the centred
    input; each zero point one value (onnxruntime's ConvInteger refuses one per channel,
    which stays the composition)."""

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int = 1
    x_zero: bool = False
    w_zero: bool = False


def _conv_float(spec: ConvInteger) -> Conv:
    return Conv(spec.stride, spec.padding, spec.dilation, spec.groups)


def _ci_shape(spec: ConvInteger, ins):
    if len(ins) != 2 + spec.x_zero + spec.w_zero:
        raise ShapeError(f"conv_integer: {len(ins)} operands for {spec}")
    x, w, xz, wz = _mm_parts(MatMulInteger(spec.x_zero, spec.w_zero), ins)
    if x.dtype not in QUANTIZED or w.dtype not in QUANTIZED:
        raise ShapeError(f"conv_integer: 8-bit input and weight, got {x} and {w}")
    if xz is not None and (xz.dtype is not x.dtype or not (one_value(xz) or xz.rank == 0)):
        raise ShapeError(f"conv_integer: x's zero point {xz} should be one {x.dtype.value}")
    if wz is not None and (wz.dtype is not w.dtype or not one_value(wz)):
        raise ShapeError(f"conv_integer: w's zero point {wz} should be one {w.dtype.value}")
    f32 = (x.with_dtype(DType.f32), w.with_dtype(DType.f32))
    return record(Op.conv).shape(_conv_float(spec), f32).with_dtype(DType.i32)


def _ci_centered(spec: ConvInteger, xs):
    """x - x_zero and w - w_zero in f64 (exact: every partial sum is below 2**53)."""
    x, w, xz, wz = _mm_parts(MatMulInteger(spec.x_zero, spec.w_zero), xs)
    x = x.double() - (xz.double().reshape(()) if xz is not None else 0)
    w = w.double() - (wz.double().reshape(()) if wz is not None else 0)
    return x, w


def _ci_eval(spec: ConvInteger, xs, resolve):
    x, w = _ci_centered(spec, xs)
    return record(Op.conv).evaluate(_conv_float(spec), (x, w), resolve).to(torch.int32)


def _ci_cost(spec: ConvInteger, ins, out: TensorType) -> Cost:
    macs = out.numel * product(ins[1].shape[1:])
    return traffic(ins, out, 2 * macs, 2 * macs)


def _ci_torch(node, a, code):
    s = node.spec
    x, w, xz, wz = _mm_parts(MatMulInteger(s.x_zero, s.w_zero), a)
    x = f"({x}.double() - {xz}.double().reshape(()))" if xz is not None else f"{x}.double()"
    w = f"({w}.double() - {wz}.double().reshape(()))" if wz is not None else f"{w}.double()"
    return (f"F.conv{NDIM[len(s.stride)]}({x}, {w}, None, {tuple_expr(s.stride)}, "
            f"{tuple_expr(s.padding)}, {tuple_expr(s.dilation)}, {s.groups}).to(torch.int32)")


def _ci_onnx(node, ins, g, cx):
    s = node.spec
    x, w, xz, wz = _mm_parts(MatMulInteger(s.x_zero, s.w_zero), ins)
    zeros = [xz or "", wz] if wz is not None else ([xz] if xz is not None else [])
    kernel = [int(k) for k in cx.type(node.inputs[1]).shape[2:]]
    return g.node("ConvInteger", [x, w] + zeros, kernel_shape=kernel, strides=list(s.stride),
                  pads=list(s.padding) * 2, dilations=list(s.dilation), group=s.groups)


def _ci_jax(node, a, cx):
    s = node.spec
    x, w, xz, wz = _mm_parts(MatMulInteger(s.x_zero, s.w_zero), a)
    i32 = cx.dtype(DType.i32)
    x = x.astype(i32) - (xz.reshape(()).astype(i32) if xz is not None else 0)
    w = w.astype(i32) - (wz.reshape(()).astype(i32) if wz is not None else 0)
    return cx.lax.conv_general_dilated(
        x, w, s.stride, [(p, p) for p in s.padding], rhs_dilation=s.dilation,
        feature_group_count=s.groups, preferred_element_type=i32)


def _ci_decompose(spec: ConvInteger, *xs):
    x, w, xz, wz = _mm_parts(MatMulInteger(spec.x_zero, spec.w_zero), xs)
    return conv_integer(x, w, xz, wz, spec.stride, spec.padding, spec.dilation, spec.groups)


primitive(Op.conv_integer, ConvInteger, range(2, 5), _ci_shape, _ci_eval, _ci_cost,
          "the exact convolution of centred 8-bit tensors is a float conv of casts (f64 past "
          "2**24 partial sums, which onnxruntime cannot run); ConvInteger is the 8-bit kernel",
          traits=Trait.KERNEL,
          batch=Refuse("works on the framework's fixed (N, C, *S) layout: strip the batch "
                       "before lowering"), torch=_ci_torch, onnx=_ci_onnx, jax=_ci_jax,
          decompose=_ci_decompose)


# -- dynamic quantization ---------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DynamicQuantize:
    """Output ``part`` of DynamicQuantizeLinear(x): 0 the uint8 tensor, 1 the scale
    ``(max(x, 0) - min(x, 0)) / 255``, 2 the zero point ``saturate(round(-min(x, 0) / scale))``.
    A kernel has one output, so each part is a node; the ONNX emitter writes the op once per
    input (``GraphBuilder.node_once``) and takes each part from it."""

    part: int


def _dq_shape(spec: DynamicQuantize, ins):
    x = ins[0]
    if spec.part not in (0, 1, 2) or x.dtype is not DType.f32:
        raise ShapeError(f"dynamic_quantize: part {spec.part} of an f32 tensor, got {x}")
    return (x.with_dtype(DType.u8), TensorType((), DType.f32), TensorType((), DType.u8))[spec.part]


def _dq_parts(x, lib):
    """(q, scale, zero) of x with ``lib``'s functions (torch or jax.numpy): round half to
    even, and the same f32 operations as the composition, so the parts are bit-exact."""
    high = lib.maximum(x.max(), lib.zeros_like(x.max()))
    low = lib.minimum(x.min(), lib.zeros_like(x.min()))
    scale = (high - low) / 255.0
    zero = lib.clip(lib.round(-low / scale), 0, 255)
    return lib.clip(lib.round(x / scale) + zero, 0, 255), scale, zero


def _dq_eval(spec: DynamicQuantize, xs, resolve):
    part = _dq_parts(xs[0], torch)[spec.part]
    return part if spec.part == 1 else part.to(torch.uint8)


def _dq_torch(node, a, code):
    x = a[0]
    low = f"{x}.min().clamp(max=0)"
    scale = f"(({x}.max().clamp(min=0) - {low}) / 255.0)"
    zero = f"torch.round(-{low} / {scale}).clamp(0, 255)"
    q = f"(torch.round({x} / {scale}) + {zero}).clamp(0, 255)"
    part = (q, scale, zero)[node.spec.part]
    return part if node.spec.part == 1 else f"{part}.to(torch.uint8)"


def _dq_onnx(node, ins, g, cx):
    return g.node_once("DynamicQuantizeLinear", ins, outputs=3)[node.spec.part]


def _dq_jax(node, a, cx):
    part = _dq_parts(a[0], cx.jnp)[node.spec.part]
    return part if node.spec.part == 1 else part.astype(cx.dtype(DType.u8))


primitive(Op.dynamic_quantize, DynamicQuantize, 1, _dq_shape, _dq_eval, per_element(4),
          "the min, max, scale and zero point are nine small nodes around a quantization; "
          "DynamicQuantizeLinear computes all three outputs in two passes",
          traits=Trait.KERNEL, batch=_BATCH, torch=_dq_torch, onnx=_dq_onnx, jax=_dq_jax,
          decompose=lambda s, x: dynamic_quantize_linear(x)[s.part])
