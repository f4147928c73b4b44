"""``bitcast``: the same bits read as another element type of the same width.

Between integer types (and bool and uint8) a bitcast is the cast that wraps modulo 2**n,
but float32 <-> int32 and float64 <-> int64 have no exact composition: the sign, exponent
and mantissa fields, NaN payloads and subnormals would each need their own arithmetic. torch
reads the bits with ``Tensor.view(dtype)``, ONNX with ``BitCast`` (opset 26), JAX with
``lax.bitcast_convert_type``.

A complex type and its parts' type (c64 and f32) are the one pair of different widths: the
complex value's bits are its (real, imaginary) pair, so the bitcast adds (or drops) a
trailing axis of 2, as ``torch.view_as_real`` (``view_as_complex``) does; ONNX, which holds
a complex value as that pair (``tdag/reify/onnx/complex.py``), has nothing to do.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag.deinops.codegen import dtype_expr
from tdag.deinops.primitive import primitive, traffic
from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.batching import Aligned
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.types import DType, TensorType

BITCAST_OPSET = 26  # the first ONNX opset with BitCast


@dataclass(frozen=True, slots=True)
class BitCast:
    dtype: DType


def bitcast(x, dtype):
    """``x``'s bits as ``dtype``, which must have the same width."""
    dtype = DType.of(dtype)
    return x if x.dtype is dtype else x.builder.emit(Op.bitcast, BitCast(dtype), x)


def is_pair(source: DType, target: DType) -> bool:
    """Whether a bitcast between these types is a complex value to or from its pair."""
    return source.is_complex and target is source.real or \
        target.is_complex and source is target.real


def _shape(spec: BitCast, ins):
    (x,) = ins
    if x.dtype.is_complex and spec.dtype is x.dtype.real:
        return TensorType((*x.shape, 2), spec.dtype)
    if spec.dtype.is_complex and x.dtype is spec.dtype.real:
        if not x.rank or x.shape[-1] != 2:
            raise ShapeError(f"bitcast: {x} to {spec.dtype.value} needs a trailing axis of 2 "
                             "(the real and imaginary parts)")
        return TensorType(x.shape[:-1], spec.dtype)
    if x.dtype.itemsize != spec.dtype.itemsize:
        raise ShapeError(f"bitcast: {x.dtype.value} has {x.dtype.itemsize} bytes, "
                         f"{spec.dtype.value} {spec.dtype.itemsize}")
    return x.with_dtype(spec.dtype)


def needs_onnx_bitcast(source: DType, target: DType) -> bool:
    """Whether ONNX needs its BitCast op: a float is involved (else Cast wraps exactly)."""
    return source.is_float or target.is_float


def _eval(spec: BitCast, xs, resolve):
    (x,) = xs
    if is_pair(DType.of(x.dtype), spec.dtype):
        return torch.view_as_real(x) if x.is_complex() else torch.view_as_complex(x.contiguous())
    return x.view(spec.dtype.torch)


def _torch(node, a, code):
    rank = code.rank(node.inputs[0])
    if node.type.rank != rank:  # a complex value to or from its pair
        return f"torch.view_as_real({a[0]})" if node.type.rank > rank else \
            f"torch.view_as_complex({a[0]}.contiguous())"
    return f"{a[0]}.view({dtype_expr(node.spec.dtype)})"


def _jax(node, a, cx):
    (x,) = a
    if cx.jnp.iscomplexobj(x) and not node.spec.dtype.is_complex:
        return cx.jnp.stack([cx.jnp.real(x), cx.jnp.imag(x)], axis=-1)
    if node.spec.dtype.is_complex and not cx.jnp.iscomplexobj(x):
        return cx.lax.complex(x[..., 0], x[..., 1])
    return cx.lax.bitcast_convert_type(x, cx.dtype(node.spec.dtype))


def _vjp(spec: BitCast, xs, y, dy, ops):
    """A complex value and its pair are the same numbers: the cotangent is bitcast back."""
    (x,) = xs
    return (bitcast(dy, x.dtype),) if is_pair(x.dtype, spec.dtype) else (None,)


def _onnx(node, ins, g, cx):
    source, target = cx.type(node.inputs[0]).dtype, node.spec.dtype
    if is_pair(source, target):  # to_onnx holds a complex value as its pair already
        return ins[0]
    if not needs_onnx_bitcast(source, target):
        return g.cast(ins[0], target)
    if g.opset < BITCAST_OPSET:
        raise UnsupportedOpError(f"bitcast {source.value} -> {target.value} needs ONNX opset "
                                 f"{BITCAST_OPSET} (BitCast); to_onnx was asked for "
                                 f"opset {g.opset}", node=node.name, origin=node.origin)
    return g.bitcast(ins[0], target)


primitive(Op.bitcast, BitCast, 1, _shape, _eval,
          lambda s, ins, out: traffic(ins, out),
          "reads the bits as another type; no arithmetic composition is exact for floats "
          "(NaN payloads, subnormals, -0)",
          traits=Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_torch, onnx=_onnx, jax=_jax, vjp=_vjp, complex_values=True,
          complex_half=True)
