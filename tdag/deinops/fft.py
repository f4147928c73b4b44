"""The ``fft`` primitive: a discrete Fourier transform along one axis.

Three kinds, as torch's ATen has them: ``c2c`` (complex to complex, forward or inverse),
``r2c`` (a real signal of length n to its n//2+1 non-negative frequencies, forward) and
``c2r`` (those frequencies back to n real values, inverse: the negative ones are the mirror
images' conjugates). ``norm`` is torch.fft's: "backward" scales the inverse by 1/n,
"forward" the forward transform, "ortho" both by 1/sqrt(n). Transforms over several axes
are one per axis (the DFT is separable, ``tdag.ops.fftn``).

ONNX holds a complex value as a trailing axis of (real, imaginary) (``reify/onnx/complex.py``),
which is what its ``DFT`` takes and gives.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import sympy
import torch

from tdag.deinops import fft_matmul
from tdag.deinops.primitive import Cost, primitive
from tdag.errors import ShapeError
from tdag.ir.batching import AxisRule, same_axis
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, format_dim, is_static, product
from tdag.ir.types import COMPLEX, DType, TensorType


class FftKind(enum.Enum):
    c2c = "c2c"
    r2c = "r2c"  # forward, onesided
    c2r = "c2r"  # inverse, onesided


class FftNorm(enum.Enum):
    backward = "backward"
    ortho = "ortho"
    forward = "forward"


@dataclass(frozen=True, slots=True)
class Fft:
    axis: int
    inverse: bool = False
    n: Dim = 0  # the transform's length: the real signal's for r2c and c2r
    norm: FftNorm = FftNorm.backward
    kind: FftKind = FftKind.c2c


_OF_PARTS = {part: whole for whole, part in COMPLEX.items()}


def half(n: Dim) -> Dim:
    """n//2 + 1: the non-negative frequencies of a real signal of length n."""
    return as_dim(n // 2 + 1)


def _shape(spec: Fft, ins) -> TensorType:
    (x,) = ins
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"fft: axis {spec.axis} out of range for {x}")
    kind, n, length = spec.kind, spec.n, x.shape[spec.axis]
    if kind is FftKind.r2c:
        if x.dtype not in _OF_PARTS or spec.inverse:
            raise ShapeError(f"fft[r2c]: a forward transform of f32 or f64, got {x} "
                             f"(inverse={spec.inverse})")
        out = x.with_dtype(_OF_PARTS[x.dtype])
    elif not x.dtype.is_complex:
        raise ShapeError(f"fft[{kind.value}]: needs a complex operand, got {x}")
    elif kind is FftKind.c2r and not spec.inverse:
        raise ShapeError("fft[c2r]: an inverse transform only")
    else:
        out = x if kind is FftKind.c2c else x.with_dtype(x.dtype.real)
    expected = half(n) if kind is FftKind.c2r else n
    if not dims_equal(length, expected):
        raise ShapeError(f"fft[{kind.value}]: axis {spec.axis} of {x} must be "
                         f"{format_dim(expected)} long for n={format_dim(n)}")
    shape = list(x.shape)
    shape[spec.axis] = half(n) if kind is FftKind.r2c else n
    return out.with_shape(shape)


_TORCH_FN = {(FftKind.c2c, False): "fft", (FftKind.c2c, True): "ifft",
             (FftKind.r2c, False): "rfft", (FftKind.c2r, True): "irfft"}


def _eval(spec: Fft, xs, resolve):
    fn = getattr(torch.fft, _TORCH_FN[spec.kind, spec.inverse])
    return fn(xs[0], n=resolve(spec.n), dim=spec.axis, norm=spec.norm.value)


def transform_flops(n: Dim) -> Dim:
    """5 n log2 n, rounded to a whole flop where n is no power of two."""
    if is_static(n):
        return round(5 * int(n) * math.log2(int(n))) if int(n) > 1 else 0
    return as_dim(5 * n * sympy.log(n, 2))


def _cost(spec: Fft, ins, out: TensorType) -> Cost:
    """5 n log2 n flops per transform of length n, as FFT literature counts a radix-2
    complex transform (a real one is counted as its complex transform)."""
    full = out if spec.kind is FftKind.c2r else ins[0]
    transforms = product(d for i, d in enumerate(full.shape) if i != spec.axis)
    return Cost(as_dim(transform_flops(spec.n) * transforms), ins[0].nbytes, out.nbytes)


def _torch(node, a, code):
    s = node.spec
    fn = _TORCH_FN[s.kind, s.inverse]
    return f"torch.fft.{fn}({a[0]}, n={code.dim(s.n)}, dim={s.axis}, norm={s.norm.value!r})"


def _jax(node, a, cx):
    s = node.spec
    fn = getattr(cx.jnp.fft, _TORCH_FN[s.kind, s.inverse])
    out = fn(a[0], n=cx.resolve(s.n), axis=s.axis, norm=s.norm.value)
    return out.astype(cx.dtype(node.type.dtype))


# the scale DFT (forward: none; inverse: 1/n) needs times n^power to give torch's norm
_ONNX_SCALE = {(FftNorm.backward, False): 0.0, (FftNorm.ortho, False): -0.5,
               (FftNorm.forward, False): -1.0, (FftNorm.backward, True): 0.0,
               (FftNorm.ortho, True): 0.5, (FftNorm.forward, True): 1.0}


def _onnx(node, ins, g, cx):
    """Matmuls where ``fft_matmul.plan`` splits the length (static, >= 64 points, a divisor
    from 4: ten times faster than onnxruntime's DFT and within 3 times torch's float32 error),
    else ONNX's DFT on (real, imaginary) pairs. c2r completes the spectrum by conjugate
    symmetry (DFT's inverse takes no one-sided input) and keeps the real part. DFTs of
    float32 run in float64, rounded once at the end: onnxruntime's float32 DFT is 5 to
    1000 times less accurate than torch's (2.6e-4 of the largest value at n = 1000, past
    the ONNX conformance cases' tolerance), its float64 one exact to 1e-12."""
    s = node.spec
    p = fft_matmul.plan(int(s.n)) if is_static(s.n) else None
    if p is not None:
        return _matmul_onnx(node, ins, g, cx, p)
    dtype = cx.type(node.inputs[0]).dtype.real
    if dtype is DType.f32:
        wide = node.replace(type=node.type.with_dtype(_WIDER[node.type.dtype]))
        wide_cx = _Wide(cx, {node.inputs[0]: cx.type(node.inputs[0]).with_dtype(
            _WIDER[cx.type(node.inputs[0]).dtype])})
        return g.cast(_onnx(wide, [g.cast(ins[0], DType.f64)], g, wide_cx), DType.f32)
    x = ins[0]
    if s.kind is FftKind.r2c:
        x = g.node("Unsqueeze", [x, g.const([-1])])
    if s.kind is FftKind.c2r:
        x = _mirror(g, x, s.axis, s.n, cx.type(node.inputs[0]).dtype.real)
    y = _dft(g, x, s.axis, s.n, s.inverse, s.kind is FftKind.r2c)
    power = _ONNX_SCALE[s.norm, s.inverse]
    if power and is_static(s.n):
        y = g.node("Mul", [y, g.const(float(int(s.n)) ** power, dtype)])
    elif power:
        n = g.cast(g.dim(s.n), dtype)
        y = g.node("Mul", [y, g.node("Pow", [n, g.const(power, dtype)])])
    if s.kind is FftKind.c2r:
        y = g.node("Gather", [y, g.const(0)], axis=-1)
    return y


_WIDER = {DType.f32: DType.f64, DType.c64: DType.c128}

def norm_scale(norm: FftNorm, inverse: bool, n: int) -> float:
    """The factor torch's ``norm`` puts on the unnormalised sum of n terms: "backward" 1/n
    on the inverse, "forward" on the forward transform, "ortho" 1/sqrt(n) on both."""
    if norm is FftNorm.ortho:
        return n ** -0.5
    return 1 / n if inverse == (norm is FftNorm.backward) else 1.0


def _matmul_onnx(node, ins, g, cx, p: fft_matmul.Plan) -> str:
    """The four-step FFT (``fft_matmul``): r2c computes the first n//2+1 frequencies of the
    real signal's transform, c2r the real part of the inverse of the one-sided spectrum
    weighted for the mirror images it leaves out (``fft_matmul.one_sided``), padded only to
    whole rows of the first stage (``fft_matmul.padded``: about half its matmul)."""
    s, t = node.spec, cx.type(node.inputs[0])
    n, x = int(s.n), ins[0]
    present = fft_matmul.padded(p, int(half(n))) if s.kind is FftKind.c2r else n
    if s.kind is FftKind.c2r:
        x = fft_matmul.one_sided(g, x, t.rank, s.axis, n, t.dtype.real, present)
    shape = [n if i == s.axis else d for i, d in enumerate(t.shape)]
    real = s.kind is FftKind.r2c
    return fft_matmul.transform(g, x, shape, s.axis, real, s.inverse,
                                norm_scale(s.norm, s.inverse, n), t.dtype.real, p,
                                int(half(n)) if real else n, s.kind is FftKind.c2r, present)


class _Wide:
    """The emitter's context with the operand's type widened to float64."""

    def __init__(self, cx, types: dict):
        self._cx, self._types = cx, types

    def type(self, name: str):
        return self._types.get(name) or self._cx.type(name)


def _dft(g, x: str, axis: int, n: Dim, inverse: bool, onesided: bool) -> str:
    length = g.const(int(n)) if is_static(n) else g.node("Squeeze", [g.dim(n)])  # a scalar
    attrs = {"inverse": int(inverse), "onesided": int(onesided)}
    if g.opset >= 20:
        return g.node("DFT", [x, length, g.const(axis)], **attrs)
    return g.node("DFT", [x, length], axis=axis, **attrs)


def _mirror(g, x: str, axis: int, n: Dim, dtype: DType) -> str:
    """The full n frequencies from the n//2+1 non-negative ones: X[n-k] = conj(X[k]), for
    k = n - n//2 - 1 down to 1."""
    rest = g.node("Slice", [x, g.dim(as_dim(n - half(n))), g.const([0]), g.const([axis]),
                            g.const([-1])])
    conj = g.node("Mul", [rest, g.const([1.0, -1.0], dtype)])
    return g.node("Concat", [x, conj], axis=axis)


def _vjp(spec: Fft, xs, y, dy, ops):
    """The adjoint transform, at the same absolute scale (torch's rules): c2c the opposite
    direction; r2c the inverse c2c of the one-sided cotangent padded with zeros, real part;
    c2r the r2c of the cotangent with the frequencies whose mirror images it left out
    counted twice."""
    adjoint = {FftNorm.backward: "forward", FftNorm.ortho: "ortho",
               FftNorm.forward: "backward"}[spec.norm]
    if spec.kind is FftKind.c2c:
        return (ops.fft(dy, spec.axis, not spec.inverse, spec.n, adjoint),)
    if spec.kind is FftKind.r2c:
        widths = [(0, 0)] * dy.ndim
        widths[spec.axis] = (0, as_dim(spec.n - dy.shape[spec.axis]))
        full = ops.fft(ops.pad(dy, widths), spec.axis, True, spec.n, adjoint)
        return (ops.real(full),)
    dx = ops.fft(dy, spec.axis, False, spec.n, adjoint, "r2c")
    doubled = int(spec.n) - int(half(spec.n))
    weights = [1.0] + [2.0] * doubled + [1.0] * (int(half(spec.n)) - 1 - doubled)
    shape = [1] * dx.ndim
    shape[spec.axis] = len(weights)
    w = ops.reshape(dx.builder.const(weights, dx.dtype.real), shape)
    return (ops.mul(dx, w),)


# works along its axis only: any other axis may be the batch
_BATCH = AxisRule(
    lambda s, t: {s.axis}, same_axis,
    lambda s, t, p: Fft(s.axis - (p < s.axis), s.inverse, s.n, s.norm, s.kind),
    lambda s: Fft(s.axis + 1, s.inverse, s.n, s.norm, s.kind),
    mixing="transforms along the batch axis")


primitive(Op.fft, Fft, 1, _shape, _eval, _cost,
          "the DFT as a matmul with a cos/sin matrix costs n^2 per transform; the FFT "
          "n log n",
          traits=Trait.NONE, batch=_BATCH, torch=_torch, onnx=_onnx, jax=_jax, vjp=_vjp,
          complex_values=True)
