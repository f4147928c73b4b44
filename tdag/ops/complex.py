"""Complex values and the FFT as compositions.

A complex tensor (c64, c128) is a tensor of (real, imaginary) pairs: ``view_as_real`` is the
bitcast to the pair's type with a trailing axis of 2 and ``view_as_complex`` its mirror, so
``real``, ``imag``, ``conj``, ``complex``, ``polar``, ``abs`` and ``angle`` are moves and
real arithmetic on the pair. add, multiply, divide, neg, exp, cast and reduce-sum take complex
operands themselves (torch's arithmetic), as the ops that move values do.

>>> import tdag, torch
>>> from tdag import ops
>>> p = tdag.trace(lambda x: ops.view_as_real(ops.fft(x, kind="r2c")), tdag.TensorSpec((2, 8)))
>>> tuple(tdag.run(p, torch.ones(2, 8)).shape)
(2, 5, 2)
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from tdag.deinops.bitcast import bitcast
from tdag.deinops.fft import Fft, FftKind, FftNorm
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.types import COMPLEX, DType
from tdag.ops.arrays import concat, stack
from tdag.ops.core import (
    abs, add, atan, cast, cos, div, eq, gather, isnan, logical_and, logical_or, lt, mul, select,
    sign, sin, unsqueeze, where,
)
from tdag.ops.promotion import norm_axis
from tdag.ops.tensor import Tensor

_OF_PARTS = {part: whole for whole, part in COMPLEX.items()}  # f32 -> c64


def real_to_complex(dtype: DType) -> DType:
    """The complex type whose parts are ``dtype`` (f64 -> c128; any other -> c64)."""
    return _OF_PARTS.get(dtype, DType.c64)


def view_as_real(x: Tensor) -> Tensor:
    """``torch.view_as_real``: c64[..., n] -> f32[..., n, 2] (c32 -> f16, c128 -> f64)."""
    if not x.dtype.is_complex:
        raise ShapeError(f"view_as_real: needs a complex tensor, got {x.type}")
    return bitcast(x, x.dtype.real)


def view_as_complex(x: Tensor) -> Tensor:
    """``torch.view_as_complex``: f32[..., n, 2] -> c64[..., n]."""
    if x.dtype not in _OF_PARTS:
        raise ShapeError(f"view_as_complex: needs f16, f32 or f64 pairs, got {x.type}")
    return bitcast(x, _OF_PARTS[x.dtype])


def real(x: Tensor) -> Tensor:
    return select(view_as_real(x), -1, 0) if x.dtype.is_complex else x


def imag(x: Tensor) -> Tensor:
    if not x.dtype.is_complex:
        raise ShapeError(f"imag: needs a complex tensor, got {x.type}")
    return select(view_as_real(x), -1, 1)


def conj(x: Tensor) -> Tensor:
    """The conjugate: the pair times (1, -1), exact; a real tensor is its own."""
    if not x.dtype.is_complex:
        return x
    signs = x.builder.const([1.0, -1.0], x.dtype.real)
    return view_as_complex(mul(view_as_real(x), signs))


def complex(re, im) -> Tensor:
    """``torch.complex``: the pairs (re, im), both of one float type."""
    if re.dtype is not im.dtype or re.dtype not in _OF_PARTS:
        raise ShapeError(f"complex: needs two f16, f32 or f64 tensors, got {re.type}, {im.type}")
    return view_as_complex(stack([re, im], -1))


def polar(r: Tensor, theta: Tensor) -> Tensor:
    """``torch.polar``: r * (cos theta + i sin theta); not of float16 (torch has no
    complex32 polar)."""
    _refuse_complex32("polar", r, DType.f16)
    return complex(mul(r, cos(theta)), mul(r, sin(theta)))


def sgn(x: Tensor) -> Tensor:
    """``torch.sgn``: x / |x| for complex x (0 where x is 0; nan in both parts where either
    is, as torch's complex division gives for an infinite x), ``sign`` for real x."""
    if not x.dtype.is_complex:
        return sign(x)
    _refuse_complex32("sgn", x, DType.c32)
    modulus = unsqueeze(abs(x), -1)
    zero = eq(modulus, 0.0)
    unit = div(view_as_real(x), where(zero, 1.0, modulus))
    undefined = unsqueeze(logical_or(isnan(select(unit, -1, 0)), isnan(select(unit, -1, 1))), -1)
    return view_as_complex(where(zero, 0.0, where(undefined, float("nan"), unit)))


def _refuse_complex32(what: str, x: Tensor, dtype: DType) -> None:
    """torch computes ``what`` of no complex32 (``not implemented for 'ComplexHalf'``): a
    composition on float16 parts would give what no framework does."""
    if x.dtype is dtype:
        raise ShapeError(f"{what}: torch computes no complex32 {what}, got {x.type}")


def signbit(x: Tensor) -> Tensor:
    """torch.signbit of a float: x < 0, -0.0 included (1 / -0.0 is -inf)."""
    return logical_or(lt(x, 0.0), lt(div(1.0, x), 0.0))


def atan2(y: Tensor, x: Tensor) -> Tensor:
    """C's atan2: atan(y / x), plus pi with y's sign where x's sign bit is set (x = -0.0
    included: atan2(1, -0.0) is pi/2). The ratios that are nan take their limits: two zeros
    give y (atan2(+-0, +-0) is +-0 or +-pi), two infinities sign(y) sign(x) (+-pi/4 or
    +-3pi/4); a nan operand gives nan."""
    both_zero = logical_and(eq(y, 0.0), eq(x, 0.0))
    both_inf = logical_and(eq(abs(y), math.inf), eq(abs(x), math.inf))
    ratio = where(both_zero, y, where(both_inf, mul(sign(y), sign(x)), div(y, x)))
    base = atan(ratio)
    shift = where(signbit(y), -math.pi, math.pi)
    return where(signbit(x), add(base, shift), base)


def angle(x: Tensor) -> Tensor:
    """The argument: atan2(im, re); of a real number pi if negative, else 0 (nan stays)."""
    _refuse_complex32("angle", x, DType.c32)
    if x.dtype.is_complex:
        return atan2(imag(x), real(x))
    x = x if x.dtype.is_float else cast(x, DType.f32)
    return where(lt(x, 0.0), math.pi, where(isnan(x), x, 0.0))


def fft(x: Tensor, axis: int = -1, inverse: bool = False, n: int | None = None,
        norm: str = "backward", kind: str = "c2c") -> Tensor:
    """One transform along ``axis`` (the ``fft`` primitive): ``kind`` c2c (complex to
    complex), r2c (real to its n//2+1 non-negative frequencies) or c2r (their inverse, to
    ``n`` real values); ``norm`` as torch.fft's."""
    axis = norm_axis(axis, x.ndim)
    kind = FftKind(kind)
    if kind is FftKind.c2r:
        n = 2 * (x.shape[axis] - 1) if n is None else n
    else:
        n = x.shape[axis] if n is None else n
        if kind is FftKind.c2c and not x.dtype.is_complex:
            x = cast(x, real_to_complex(x.dtype))
    return x.builder.emit(Op.fft, Fft(axis, inverse, n, FftNorm(norm), kind), x)


def full_spectrum(half: Tensor, axis: int, n: int) -> Tensor:
    """The n-point spectrum of a real signal from its r2c half (0 .. n//2): the frequencies
    above n//2 are the conjugates of those below, X[k] = conj(X[n - k]). What ATen's
    ``_fft_r2c`` with onesided=False computes: an r2c transform and the mirror, half the
    work of a complex transform of the signal cast to complex."""
    mirrored = n - n // 2 - 1
    if mirrored <= 0:
        return half
    positions = half.builder.const(torch.arange(mirrored, 0, -1))
    return concat([half, conj(gather(half, positions, axis))], axis)


def fftn(x: Tensor, axes: Sequence[int], inverse: bool = False, norm: str = "backward",
         kind: str = "c2c", n: int | None = None) -> Tensor:
    """Transforms along several axes, one after another (the DFT is separable): r2c takes
    the last axis first, c2r transforms the others first and the last axis to ``n``."""
    axes = [norm_axis(a, x.ndim) for a in axes]
    if kind == "r2c":
        x = fft(x, axes[-1], False, norm=norm, kind="r2c")
        return fftn(x, axes[:-1], False, norm) if axes[:-1] else x
    if kind == "c2r":
        x = fftn(x, axes[:-1], True, norm) if axes[:-1] else x
        return fft(x, axes[-1], True, n, norm, "c2r")
    for a in axes:
        x = fft(x, a, inverse, norm=norm)
    return x
