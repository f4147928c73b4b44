"""Complex values and the FFT from jaxprs: ``fft`` (fft_type FFT, IFFT, RFFT or IRFFT over
the trailing ``len(fft_lengths)`` axes, as ``jnp.fft.*`` write it) onto tdag's one-axis
``fft`` primitive, one per axis (the DFT is separable); ``real``, ``imag``, ``conj`` and
``complex`` onto the pair views of ``tdag.ops.complex``."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.jax.ops.table import op

# lax.FftType's values: FFT 0, IFFT 1, RFFT 2, IRFFT 3
_FFT, _IFFT, _RFFT, _IRFFT = range(4)


@op("fft")
def _fft(ctx, x):
    """jnp.fft's transforms are unnormalised forward and 1/n inverse: tdag's "backward".
    RFFT takes the last axis first (r2c), IRFFT transforms the others first and the last
    axis to its real length last (c2r), as numpy's rfftn / irfftn."""
    kind, lengths = int(ctx.params["fft_type"]), tuple(ctx.params["fft_lengths"])
    axes = list(range(x.ndim - len(lengths), x.ndim))
    if kind == _RFFT:
        return ops.fftn(x, axes, kind="r2c")
    if kind == _IRFFT:
        return ops.fftn(x, axes, True, kind="c2r", n=int(lengths[-1]))
    return ops.fftn(x, axes, inverse=kind == _IFFT)


@op("real")
def _real(ctx, x):
    return ops.real(x)


@op("imag")
def _imag(ctx, x):
    return ops.imag(x)


@op("conj")
def _conj(ctx, x):
    return ops.conj(x)


@op("complex")
def _complex(ctx, re, im):
    return ops.complex(re, im)
