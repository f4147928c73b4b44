"""The differential cases of complex values (c64, c128) and of ``fft``: each primitive that
takes complex operands on them (tests/support/primitive_cases.py collects these too).

A case's program takes and gives complex values; ``build(case, pairs=True)`` takes and gives
their (real, imaginary) pairs instead, the form to_onnx's programs cross their boundary in.
"""
from __future__ import annotations

import numpy as np

from support.primitive_cases import In, case, nonzero
from tdag.deinops.bitcast import BitCast
from tdag.deinops.elementwise import Cast, Compare, CompareKind, Divide
from tdag.deinops.extent import Slice
from tdag.deinops.fft import Fft, FftKind, FftNorm
from tdag.deinops.movement import Permute
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.windows import Unfold
from tdag.ir.op import Op
from tdag.ir.types import DType

C64, C128 = DType.c64, DType.c128
_NP_FFT = {(FftKind.c2c, False): np.fft.fft, (FftKind.c2c, True): np.fft.ifft,
           (FftKind.r2c, False): np.fft.rfft, (FftKind.c2r, True): np.fft.irfft}


def complex_pairs(rng, shape, dtype):
    """Complex values with both parts in [-3, 3)."""
    parts = rng.uniform(-3, 3, (*shape, 2))
    return (parts[..., 0] + 1j * parts[..., 1]).astype(np.complex64 if dtype is C64
                                                       else np.complex128)


def _nonzero_complex(rng, shape, dtype):
    return complex_pairs(rng, shape, dtype) + nonzero(0.5, 1)(rng, shape, DType.f32)


for _dt in (C64, C128):
    _x = In((3, 4), _dt, complex_pairs)
    case(Op.neg, None, [_x], lambda s, d, x: -x, f"{_dt.value}")
    case(Op.exp, None, [_x], lambda s, d, x: np.exp(x), f"{_dt.value}")
    case(Op.add, None, [_x, _x], lambda s, d, a, b: a + b, f"{_dt.value}")
    case(Op.multiply, None, [_x, _x], lambda s, d, a, b: a * b, f"{_dt.value}")
    case(Op.divide, Divide(), [_x, In((3, 4), _dt, _nonzero_complex)],
         lambda s, d, a, b: a / b, f"{_dt.value}")
    case(Op.reduce, Reduce(ReduceKind.sum, (1,)), [_x], lambda s, d, x: x.sum(axis=1),
         f"sum-{_dt.value}")
_z = In(("b", 3), C64, complex_pairs)
case(Op.where, None, [In(("b", 3), DType.bool), _z, _z], lambda s, d, c, a, b: np.where(c, a, b),
     "c64")
case(Op.compare, Compare(CompareKind.eq), [_z, _z], lambda s, d, a, b: a == b, "eq-c64")
case(Op.permute, Permute((1, 0)), [_z], lambda s, d, x: x.T, "c64", exact=True)
case(Op.slice, Slice((1,), (1,), (3,), (1,)), [_z], lambda s, d, x: x[:, 1:3], "c64", exact=True)
case(Op.unfold, Unfold(1, 2), [_z], lambda s, d, x: np.stack([x[:, :2], x[:, 1:]], 1), "c64",
     exact=True)  # the window axis goes last, before to_onnx's pair axis
case(Op.cast, Cast(C64), [In((3, 4), DType.f32)], lambda s, d, x: x.astype(np.complex64),
     "f32-c64")
case(Op.cast, Cast(DType.f32), [_z], lambda s, d, x: x.real, "c64-f32")
case(Op.cast, Cast(C128), [_z], lambda s, d, x: x.astype(np.complex128), "c64-c128")
case(Op.bitcast, BitCast(DType.f32), [_z], lambda s, d, x: np.stack([x.real, x.imag], -1),
     "c64-pair", exact=True)
case(Op.bitcast, BitCast(C64), [In(("b", 3, 2), DType.f32)],
     lambda s, d, x: x[..., 0] + 1j * x[..., 1], "pair-c64", exact=True)


def _fft_ref(spec, dims, x):
    fn = _NP_FFT[spec.kind, spec.inverse]
    return fn(x, n=spec.n, axis=spec.axis, norm=spec.norm.value)


for _norm in FftNorm:
    for _inverse in (False, True):
        case(Op.fft, Fft(1, _inverse, 8, _norm), [In(("b", 8), C64, complex_pairs)], _fft_ref,
             f"c2c-{_norm.value}-{_inverse}")
    case(Op.fft, Fft(0, False, 6, _norm, FftKind.r2c), [In((6, 3), DType.f32)], _fft_ref,
         f"r2c-{_norm.value}")
    for _n in (8, 7):
        case(Op.fft, Fft(1, True, _n, _norm, FftKind.c2r), [In((2, _n // 2 + 1), C64,
                                                                   complex_pairs)],
             _fft_ref, f"c2r-{_n}-{_norm.value}")
case(Op.fft, Fft(0, False, 5), [In((5,), C128, complex_pairs)], _fft_ref, "c2c-c128-odd")
case(Op.fft, Fft(1, False, 12, kind=FftKind.r2c), [In((2, 12), DType.f64)], _fft_ref,
     "r2c-f64")
