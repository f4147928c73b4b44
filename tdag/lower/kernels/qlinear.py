"""Requantizing integer kernels: QLinearConv and QLinearMatMul.

Each is ConvInteger's or MatMulInteger's exact i32 accumulator (``kernels/quant.py``), plus
an i32 bias for the convolution, requantized to 8 bits: ``saturate(round(acc * scale +
y_zero))`` in f64, ``scale = x_scale * w_scale / y_scale`` computed in f32, as the
compositions ``tdag.ops.quantize.qlinear_conv`` / ``qlinear_matmul`` (what the ONNX importer
writes) compute. That requantization is a dozen passes over the output (round half to even
is a composition); onnxruntime's QLinearConv and QLinearMatMul fuse it into the integer GEMM.
onnxruntime requantizes in f32 or fixed point: a value on a rounding tie can land one step
from the exact composition.

Cost convention: the integer product's ``2*M*K*N`` (as ``conv_integer`` and
``matmul_integer``: integer work in ``tdag.cost``), plus the requantization per output element.
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
from tdag.ir.symbols import dims_equal, product
from tdag.ir.types import DType, TensorType
from tdag.lower.kernels.common import NDIM
from tdag.lower.kernels.contraction import Conv
from tdag.lower.kernels.quant import ConvInteger, MatMulInteger, one_value
from tdag.ops.quantize import RANGE, qlinear_conv, qlinear_matmul

# the kernels that work in f64 inside (their requantization): JAX runs them with x64 on
F64_WORK = frozenset({Op.qlinear_conv, Op.qlinear_matmul})
_REQUANTIZE = 12  # flops per output element: cast, scale, zero point, round, clamp, cast
_BATCH = Refuse("reads its operands in the framework's fixed layout: strip the batch before "
                "lowering")


def _check_requantize(op: str, ins, per: TensorType, dim) -> DType:
    """The scales are f32, x's and y's one value, w's one value or one per ``dim`` entry; y's
    zero point is one value of x's type, the output's."""
    x, xs, xz, w, ws, wz, ys, yz = ins[:8]
    if not all(s.dtype is DType.f32 for s in (xs, ws, ys)) or \
            not (one_value(xs) and one_value(ys)) or \
            not (one_value(ws) or ws.rank == 1 and dims_equal(ws.shape[0], dim)):
        raise ShapeError(f"{op}: f32 scales, x's and y's one value, w's one or one per "
                         f"{per}, got {xs}, {ws}, {ys}")
    if yz.dtype is not x.dtype or not one_value(yz):  # onnxruntime's kernels keep x's type
        raise ShapeError(f"{op}: y's zero point should be one {x.dtype.value}, got {yz}")
    return yz.dtype


def _requantize_torch(acc: str, scale: str, zero: str, dtype: DType) -> str:
    """Python source of the f64 requantization of ``acc`` (f64, exact) by the f32 ``scale``."""
    low, high = RANGE[dtype]
    return (f"torch.round({acc} * ({scale}).double() + {zero}.double().reshape(()))"
            f".clamp({low}, {high}).to({dtype_expr(dtype)})")


def _requantize_jax(acc, scale, zero, dtype: DType, cx):
    f64 = cx.dtype(DType.f64)
    d = acc.astype(f64) * scale.astype(f64) + zero.reshape(()).astype(f64)
    low, high = RANGE[dtype]
    return cx.jnp.clip(cx.jnp.round(d), low, high).astype(cx.dtype(dtype))


def _requantize_eval(acc: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: DType):
    d = acc.double() * scale.double() + zero.double().reshape(())
    low, high = RANGE[dtype]
    return torch.round(d).clamp(low, high).to(dtype.torch)


# -- QLinearConv ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class QLinearConv:
    """QLinearConv(x, x_scale, x_zero, w, w_scale, w_zero, y_scale, y_zero[, bias]) with
    symmetric zero padding of the centred input (asymmetric pads stay the composition); w's
    scale and zero point one value or one per output channel (lowering writes the kernel only
    where those zero points are equal, which onnxruntime's kernel requires)."""

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int = 1
    bias: bool = False


def _integer(spec: QLinearConv) -> ConvInteger:
    """ConvInteger of x less its zero point (the weight's, perhaps one per channel, apart)."""
    return ConvInteger(spec.stride, spec.padding, spec.dilation, spec.groups, True, False)


def _qc_shape(spec: QLinearConv, ins):
    if len(ins) != 8 + spec.bias:
        raise ShapeError(f"qlinear_conv: {len(ins)} operands for {spec}")
    x, _, xz, w, _, wz = ins[:6]
    acc = record(Op.conv_integer).shape(_integer(spec), (x, w, xz))
    if wz.dtype is not w.dtype or not (one_value(wz) or wz.rank == 1 and
                                       dims_equal(wz.shape[0], w.shape[0])):
        raise ShapeError(f"qlinear_conv: w's zero point {wz} should be one {w.dtype.value} "
                         "or one per output channel")
    dtype = _check_requantize("qlinear_conv", ins, "output channel", w.shape[0])
    if spec.bias and (ins[8].dtype is not DType.i32 or ins[8].rank != 1 or
                      not dims_equal(ins[8].shape[0], w.shape[0])):
        raise ShapeError(f"qlinear_conv: the bias should be i32, one per output channel, got "
                         f"{ins[8]}")
    return acc.with_dtype(dtype)


def _per_channel(t, rank: int):
    return t.reshape([-1] + [1] * (rank - 1))


def _qc_eval(spec: QLinearConv, xs, resolve):
    x, xsc, xz, w, ws, wz, ys, yz = xs[:8]
    rank = x.dim()
    centred = (x.double() - xz.double().reshape(()), w.double() - _per_channel(wz, rank))
    acc = record(Op.conv).evaluate(Conv(spec.stride, spec.padding, spec.dilation, spec.groups),
                                   centred, resolve)  # exact in f64
    if spec.bias:
        acc = acc + _per_channel(xs[8], rank - 1)
    scale = xsc * (_per_channel(ws, rank - 1) if ws.dim() else ws) / ys
    return _requantize_eval(acc, scale, yz, _dtype(yz))


def _dtype(t: torch.Tensor) -> DType:
    return DType.u8 if t.dtype is torch.uint8 else DType.i8


def _qc_cost(spec: QLinearConv, ins, out: TensorType) -> Cost:
    macs = out.numel * product(ins[3].shape[1:])
    return traffic(ins, out, 2 * macs + _REQUANTIZE * out.numel, 2 * macs)


def _qc_torch(node, a, code):
    s, rank = node.spec, node.type.rank
    x, xs, xz, w, ws, wz, ys, yz = a[:8]
    view = f".reshape({[-1] + [1] * (rank - 2)})"
    acc = (f"F.conv{NDIM[len(s.stride)]}(({x}.double() - {xz}.double().reshape(())), "
           f"({w}.double() - {wz}.double().reshape({[-1] + [1] * (rank - 1)})), None, "
           f"{tuple_expr(s.stride)}, "
           f"{tuple_expr(s.padding)}, {tuple_expr(s.dilation)}, {s.groups})")
    if s.bias:
        acc = f"({acc} + {a[8]}.double(){view})"
    scale = f"{xs} * {ws}{view} / {ys}"
    return _requantize_torch(acc, scale, yz, node.type.dtype)


def _qc_onnx(node, ins, g, cx):
    s = node.spec
    kernel = [int(k) for k in cx.type(node.inputs[3]).shape[2:]]
    return g.node("QLinearConv", list(ins), kernel_shape=kernel, strides=list(s.stride),
                  pads=list(s.padding) * 2, dilations=list(s.dilation), group=s.groups)


def _qc_jax(node, a, cx):
    s, rank = node.spec, node.type.rank
    x, xs, xz, w, ws, wz, ys, yz = a[:8]
    i32 = cx.dtype(DType.i32)
    acc = cx.lax.conv_general_dilated(
        x.astype(i32) - xz.reshape(()).astype(i32),
        w.astype(i32) - wz.reshape((-1,) + (1,) * (rank - 1)).astype(i32),
        s.stride, [(p, p) for p in s.padding], rhs_dilation=s.dilation,
        feature_group_count=s.groups, preferred_element_type=i32)
    view = (-1,) + (1,) * (rank - 2)
    if s.bias:
        acc = acc + a[8].reshape(view)
    return _requantize_jax(acc, xs * ws.reshape(view) / ys, yz, node.type.dtype, cx)


primitive(Op.qlinear_conv, QLinearConv, range(8, 10), _qc_shape, _qc_eval, _qc_cost,
          "ConvInteger's accumulator and its f64 requantization (round half to even is a "
          "composition) are a dozen passes over the output; QLinearConv fuses them into the "
          "8-bit kernel",
          traits=Trait.KERNEL, batch=_BATCH, torch=_qc_torch, onnx=_qc_onnx, jax=_qc_jax,
          decompose=lambda s, *xs: qlinear_conv(
              *xs[:8], xs[8] if s.bias else None, s.stride, s.padding, s.dilation, s.groups))


# -- QLinearMatMul ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class QLinearMatMul:
    """QLinearMatMul(a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero): numpy matmul
    broadcasting, b's scale and zero point one value or one per column."""


def _qm_shape(spec: QLinearMatMul, ins):
    if len(ins) != 8:
        raise ShapeError(f"qlinear_matmul: {len(ins)} operands, 8 expected")
    a, _, az, b, _, bz = ins[:6]
    acc = record(Op.matmul_integer).shape(MatMulInteger(True, True), (a, b, az, bz))
    return acc.with_dtype(_check_requantize("qlinear_matmul", ins, "column", b.shape[-1]))


def _qm_eval(spec: QLinearMatMul, xs, resolve):
    a, asc, az, b, bs, bz, ys, yz = xs
    acc = record(Op.matmul_integer).evaluate(MatMulInteger(True, True), (a, b, az, bz), resolve)
    return _requantize_eval(acc, asc * bs / ys, yz, _dtype(yz))


def _qm_cost(spec: QLinearMatMul, ins, out: TensorType) -> Cost:
    macs = out.numel * ins[0].shape[-1]
    return traffic(ins, out, 2 * macs + _REQUANTIZE * out.numel, 2 * macs)


def _qm_torch(node, a, code):
    x, xs, xz, w, ws, wz, ys, yz = a
    acc = (f"torch.matmul(({x}.double() - {xz}.double().reshape(())), "
           f"({w}.double() - {wz}.double()))")  # exact: every partial sum is below 2**53
    return _requantize_torch(acc, f"{xs} * {ws} / {ys}", yz, node.type.dtype)


def _qm_onnx(node, ins, g, cx):
    return g.node("QLinearMatMul", list(ins))


def _qm_jax(node, a, cx):
    x, xs, xz, w, ws, wz, ys, yz = a
    i32 = cx.dtype(DType.i32)
    acc = cx.jnp.matmul(x.astype(i32) - xz.reshape(()).astype(i32), w.astype(i32) -
                        wz.astype(i32), preferred_element_type=i32)
    return _requantize_jax(acc, xs * ws / ys, yz, node.type.dtype, cx)


primitive(Op.qlinear_matmul, QLinearMatMul, 8, _qm_shape, _qm_eval, _qm_cost,
          "MatMulInteger's accumulator and its f64 requantization are a dozen passes over the "
          "output; QLinearMatMul fuses them into the 8-bit GEMM",
          traits=Trait.KERNEL, batch=_BATCH, torch=_qm_torch, onnx=_qm_onnx, jax=_qm_jax,
          decompose=lambda s, *xs: qlinear_matmul(*xs, xs[7].dtype))
