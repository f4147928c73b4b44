"""``bitcast``: the same bits read as another element type of the same width.

Between integer types (and bool and uint8) a bitcast is the cast that wraps modulo 2**n,
but float32 <-> int32 and float64 <-> int64 have no exact composition: the sign, exponent
and mantissa fields, NaN payloads and subnormals would each need their own arithmetic. torch
reads the bits with ``Tensor.view(dtype)``, ONNX with ``BitCast`` (opset 26), JAX with
``lax.bitcast_convert_type``.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.deinops.codegen import dtype_expr
from tdag.deinops.primitive import primitive, traffic
from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.batching import Aligned
from tdag.ir.op import Op
from tdag.ir.record import Trait, no_gradient
from tdag.ir.types import DType

BITCAST_OPSET = 26  # the first ONNX opset with BitCast


@dataclass(frozen=True, slots=True)
class BitCast:
    dtype: DType


def bitcast(x, dtype):
    """``x``'s bits as ``dtype``, which must have the same width."""
    dtype = DType.of(dtype)
    return x if x.dtype is dtype else x.builder.emit(Op.bitcast, BitCast(dtype), x)


def _shape(spec: BitCast, ins):
    (x,) = ins
    if x.dtype.itemsize != spec.dtype.itemsize:
        raise ShapeError(f"bitcast: {x.dtype.value} has {x.dtype.itemsize} bytes, "
                         f"{spec.dtype.value} {spec.dtype.itemsize}")
    return x.with_dtype(spec.dtype)


def needs_onnx_bitcast(source: DType, target: DType) -> bool:
    """Whether ONNX needs its BitCast op: a float is involved (else Cast wraps exactly)."""
    return source.is_float or target.is_float


def _onnx(node, ins, g, cx):
    source, target = cx.type(node.inputs[0]).dtype, node.spec.dtype
    if not needs_onnx_bitcast(source, target):
        return g.cast(ins[0], target)
    if g.opset < BITCAST_OPSET:
        raise UnsupportedOpError(f"bitcast {source.value} -> {target.value} needs ONNX opset "
                                 f"{BITCAST_OPSET} (BitCast); to_onnx was asked for "
                                 f"opset {g.opset}", node=node.name, origin=node.origin)
    return g.bitcast(ins[0], target)


primitive(Op.bitcast, BitCast, 1, _shape, lambda s, xs, r: xs[0].view(s.dtype.torch),
          lambda s, ins, out: traffic(ins, out),
          "reads the bits as another type; no arithmetic composition is exact for floats "
          "(NaN payloads, subnormals, -0)",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=lambda node, a, code: f"{a[0]}.view({dtype_expr(node.spec.dtype)})",
          onnx=_onnx,
          jax=lambda node, a, cx: cx.lax.bitcast_convert_type(a[0], cx.dtype(node.spec.dtype)),
          vjp=no_gradient)
