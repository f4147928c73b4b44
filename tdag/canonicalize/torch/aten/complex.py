"""Complex values and the FFT: ATen's views between a complex tensor and its (real,
imaginary) pairs, the parts, the conjugate, and its three FFT ops (``torch.fft.*`` all
decompose to ``_fft_r2c``, ``_fft_c2c`` and ``_fft_c2r`` under torch.export), each a chain of
one-axis ``fft`` primitives."""
from __future__ import annotations

from tdag import ops
from tdag.ir.symbols import is_static
from tdag.canonicalize.torch.aten.registry import aten


@aten("view_as_complex")
def view_as_complex(x):
    return ops.view_as_complex(x)


@aten("view_as_real")
def view_as_real(x):
    return ops.view_as_real(x)


@aten("complex")
def complex_(re, im):
    return ops.complex(re, im)


@aten("polar")
def polar(r, theta):
    return ops.polar(r, theta)


@aten("real")
def real(x):
    return ops.real(x)


@aten("imag")
def imag(x):
    return ops.imag(x)


@aten("conj", "_conj", "conj_physical", "_conj_physical")
def conj(x):
    return ops.conj(x)


# ATen's normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n, whichever the direction
_FORWARD_NORM = ("backward", "ortho", "forward")
_INVERSE_NORM = ("forward", "ortho", "backward")


def _norm(normalization: int, forward: bool) -> str:
    return (_FORWARD_NORM if forward else _INVERSE_NORM)[normalization]


@aten("_fft_r2c")
def fft_r2c(x, dim, normalization, onesided):
    norm = _norm(normalization, True)
    if not onesided and is_static(x.shape[dim[-1]]):  # r2c, then the mirrored half
        last = dim[-1]
        y = ops.full_spectrum(ops.fft(x, last, False, norm=norm, kind="r2c"), last,
                              int(x.shape[last]))
        return ops.fftn(y, dim[:-1], False, norm) if len(dim) > 1 else y
    if not onesided:  # the full spectrum: the real signal as complex values
        return ops.fftn(ops.cast(x, ops.real_to_complex(x.dtype)), dim, False, norm)
    return ops.fftn(x, dim, False, norm, "r2c")


@aten("_fft_c2c")
def fft_c2c(x, dim, normalization, forward):
    return ops.fftn(x, dim, not forward, _norm(normalization, forward))


@aten("_fft_c2r")
def fft_c2r(x, dim, normalization, last_dim_size):
    return ops.fftn(x, dim, True, _norm(normalization, False), "c2r", last_dim_size)
