"""The full spectrum of a real signal as one kernel: ``torch.fft.fft`` of a real tensor.

Its composition (``tdag.ops.full_spectrum`` of an r2c ``fft``) is the r2c transform, a
gather of the mirrored half, a conjugate and a concat: three passes over the spectrum after
the transform, which ATen's ``_fft_r2c`` with onesided=False makes in one (2.2-2.7x eager
for a 1,024 x 1,024 batch, where this kernel is one call).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tdag import ops
from tdag.deinops import fft_matmul
from tdag.deinops.fft import FftNorm, norm_scale, transform_flops
from tdag.deinops.primitive import Cost, primitive
from tdag.errors import ShapeError
from tdag.ir.batching import AxisRule, plus1, same_axis, shift
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import as_dim, dims_equal, is_static, product
from tdag.ir.types import COMPLEX
from tdag.lower.kernels.common import decomposed_onnx

_OF_PARTS = {part: whole for whole, part in COMPLEX.items()}  # f32 -> c64


@dataclass(frozen=True, slots=True)
class FftOfReal:
    """The ``n``-point forward transform of a real signal along ``axis`` (``n`` static: the
    mirror's positions are constants), normalised as torch.fft's ``norm``."""

    axis: int
    n: int
    norm: FftNorm = FftNorm.backward


def _shape(spec: FftOfReal, ins):
    (x,) = ins
    if x.dtype not in _OF_PARTS or not 0 <= spec.axis < x.rank or \
            not is_static(spec.n) or not dims_equal(x.shape[spec.axis], spec.n):
        raise ShapeError(f"fft_of_real: an f32 or f64 signal {spec.n} long along axis "
                         f"{spec.axis}, got {x}")
    return x.with_dtype(_OF_PARTS[x.dtype])


def _eval(spec: FftOfReal, xs, resolve):
    return torch.fft.fft(xs[0], n=spec.n, dim=spec.axis, norm=spec.norm.value)


def _cost(spec: FftOfReal, ins, out) -> Cost:
    """5 n log2 n per transform, as the fft primitive counts a complex one."""
    transforms = product(d for i, d in enumerate(out.shape) if i != spec.axis)
    return Cost(as_dim(transform_flops(spec.n) * transforms), ins[0].nbytes, out.nbytes)


def _torch(node, a, code):
    s = node.spec
    return f"torch.fft.fft({a[0]}, n={s.n}, dim={s.axis}, norm={s.norm.value!r})"


def _jax(node, a, cx):
    s = node.spec
    out = cx.jnp.fft.fft(a[0], n=s.n, axis=s.axis, norm=s.norm.value)
    return out.astype(cx.dtype(node.type.dtype))


def _onnx(node, ins, g, cx):
    """The four-step FFT of the real rows gives every frequency (``fft_matmul``); lengths
    it does not split run the composition (ONNX's DFT, then the mirror)."""
    s, t = node.spec, cx.type(node.inputs[0])
    p = fft_matmul.plan(s.n)
    if p is None:
        return decomposed_onnx(node, ins, g, cx)
    return fft_matmul.transform(g, ins[0], list(t.shape), s.axis, True, False,
                                norm_scale(s.norm, False, s.n), t.dtype, p)


def _decompose(spec: FftOfReal, x):
    half = ops.fft(x, spec.axis, n=spec.n, norm=spec.norm.value, kind="r2c")
    return ops.full_spectrum(half, spec.axis, spec.n)


_ADJOINT = {FftNorm.backward: "forward", FftNorm.ortho: "ortho", FftNorm.forward: "backward"}


def _vjp(spec: FftOfReal, xs, y, dy, ops):
    """The real part of the adjoint transform (the inverse at the same absolute scale), as
    torch's rule; the composition has none (its gather's scatter takes no complex values)."""
    return (ops.real(ops.fft(dy, spec.axis, True, spec.n, _ADJOINT[spec.norm])),)


# works along its axis only: any other axis may be the batch
_BATCH = AxisRule(lambda s, t: {s.axis}, same_axis,
                  lambda s, t, p: replace(s, axis=shift((s.axis,), p)[0]),
                  lambda s: replace(s, axis=plus1((s.axis,))[0]),
                  mixing="transforms along the batch axis")

primitive(Op.fft_of_real, FftOfReal, 1, _shape, _eval, _cost,
          "the full spectrum as r2c, a gather of the mirrored half, a conjugate and a "
          "concat is three passes after the transform; torch.fft.fft of the real tensor "
          "writes it in one",
          traits=Trait.KERNEL, batch=_BATCH, torch=_torch, onnx=_onnx, jax=_jax,
          decompose=_decompose, vjp=_vjp)
