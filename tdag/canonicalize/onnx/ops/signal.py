"""ONNX signal ops: DFT, STFT, MelWeightMatrix and the window functions HannWindow,
HammingWindow and BlackmanWindow; each is a composition of tdag ops.

A DFT is the ``fft`` primitive (O(L log L) per row, where the products with the cos and sin
matrices were O(n L)) on the signal's complex values, the pairs (re, im) on the last axis as
ONNX stores them (``ops.view_as_complex``). A length known only at run time (STFT's
frame_length) makes the frames' size fresh; the transform takes it as its length.
"""
from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from tdag import ops
from tdag.canonicalize.onnx.ops.table import arange_i64, norm_axis, register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType


def _static_int(ctx, value, what: str) -> int | None:
    """A scalar input known while importing, as an int; None where it is absent or only
    known at run time."""
    known = ctx.known(value) if value is not None else None
    if known is None or not known.static:
        return None
    return int(known.dims()[0])


def _fit(x, axis: int, length):
    """x cut, or padded with zeros, to ``length`` along ``axis``."""
    n = x.shape[axis]
    if is_static(n) and is_static(length) and n > length:
        return ops.slice(x, axis, 0, length)
    if is_static(n) and is_static(length) and n < length:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, length - n)
        return ops.pad(x, widths)
    return x


def _dft_along(x, axis: int, length, inverse: bool, onesided: bool):
    """The ONNX DFT of x (..., 1 or 2) along ``axis`` (not the last): the ``fft``
    primitive on the signal cut or zero-padded to ``length``; inverse and onesided is
    numpy's irfft (a real result)."""
    parts = x.shape[-1]
    if parts not in (1, 2):
        raise InvalidModelError(f"DFT: the last axis holds 1 (real) or 2 (complex) values, "
                                f"got {x.type}")
    dtype = x.dtype
    wide = x if dtype in (DType.f32, DType.f64) else ops.cast(x, DType.f32)
    signal = ops.view_as_complex(wide) if parts == 2 else ops.select(wide, -1, 0)
    n = x.shape[axis]
    if inverse and onesided:
        length = 2 * (n - 1) if length is None else length
        spectrum = _fit(ops.cast(signal, ops.real_to_complex(wide.dtype)), axis, length // 2 + 1)
        out = ops.unsqueeze(ops.fft(spectrum, axis, True, length, kind="c2r"), -1)
        return ops.cast(out, dtype)
    length = n if length is None else length
    if length < 1:
        raise InvalidModelError(f"DFT: dft_length {length} must be positive")
    signal = _fit(signal, axis, length)
    if parts == 1 and onesided and not inverse:
        out = ops.fft(signal, axis, n=length, kind="r2c")
    else:
        out = ops.fft(signal, axis, inverse, length)
        out = ops.slice(out, axis, 0, length // 2 + 1) if onesided else out
    return ops.cast(ops.view_as_real(out), dtype)


@register("DFT")
def _dft(ctx, x, dft_length=None, axis=None):
    x = ctx.tensor(x)
    length = _static_int(ctx, dft_length, "dft_length")
    if dft_length is not None and length is None:
        raise UnsupportedOpError("DFT: a dft_length known only at run time")
    inverse, onesided = ctx.flag("inverse", 0), ctx.flag("onesided", 0)
    if ctx.opset < 20:
        axes = [norm_axis(ctx.attr("axis", 1), x.ndim)]
    elif axis is None:
        axes = [x.ndim - 2]
    else:
        fixed = _static_int(ctx, axis, "axis")
        axes = [norm_axis(fixed, x.ndim)] if fixed is not None else None
    if axes is not None:
        if axes[0] == x.ndim - 1:
            raise InvalidModelError(f"DFT: axis {axes[0]} is the real/imaginary axis")
        return _dft_along(x, axes[0], length, inverse, onesided)
    return _pick_axis(ctx.tensor(axis), x, length, inverse, onesided)


def _pick_axis(axis, x, length, inverse: bool, onesided: bool):
    """The result for an axis given at run time: every legal axis is transformed, and the
    one asked for is gathered (an axis out of range is refused at run time). Only possible
    where every axis gives a result of the same shape (so not one-sided, mostly)."""
    rank = x.ndim
    try:
        results = [_dft_along(x, a, length, inverse, onesided) for a in range(rank - 1)]
    except InvalidModelError as e:
        raise UnsupportedOpError(f"DFT: an axis given at run time, and some axis cannot be "
                                 f"transformed ({e}); make the axis a constant") from None
    if len({tuple(r.shape) for r in results}) != 1:
        raise UnsupportedOpError("DFT: an axis given at run time where the axes give "
                                 "results of different shapes; make the axis a constant")
    axis = ops.cast(ops.reshape(axis, ()), DType.i64)
    axis = ops.where(ops.lt(axis, 0), ops.add(axis, rank), axis)
    legal = ops.logical_and(ops.ge(axis, 0), ops.lt(axis, rank - 1))
    index = ops.add(axis, ops.checked_zero(legal))
    return ops.gather(ops.stack(results, 0), index, 0, wrap=False)


def _scalar_or_static(ctx, value, what: str):
    """An i64 scalar input: an int where it is known while importing, else a 0-d tensor."""
    known = _static_int(ctx, value, what)
    if known is not None:
        return known
    return ops.cast(ops.reshape(ctx.tensor(value), ()), DType.i64)


@register("STFT")
def _stft(ctx, signal, frame_step, window=None, frame_length=None):
    """Frames of frame_length samples every frame_step (1 + (T - L) // step of them, a fresh
    size where the step is given at run time), each times the window, then a DFT of length
    L along the frame (the matrices built from run-time positions where L is)."""
    signal = ctx.tensor(signal)
    if signal.ndim != 3 or signal.shape[-1] not in (1, 2) or not is_static(signal.shape[1]):
        raise UnsupportedOpError(f"STFT of a signal {signal.type} (a static (B, T, 1 or 2))")
    window = ctx.tensor(window) if window is not None else None
    if frame_length is not None:
        length = _scalar_or_static(ctx, frame_length, "frame_length")
    elif window is not None:
        length = window.shape[0]
    else:
        length = signal.shape[1]
    step = _scalar_or_static(ctx, frame_step, "frame_step")
    count = (signal.shape[1] - length) // step + 1 if isinstance(length, int) and \
        isinstance(step, int) else ops.add(ops.floor_divide(ops.sub(signal.shape[1], length),
                                                            step), 1)
    frames = arange_i64(count, ctx.builder)
    taps = arange_i64(length, ctx.builder)
    index = ops.add(ops.unsqueeze(ops.mul(frames, step), 1), ops.unsqueeze(taps, 0))
    framed = ops.gather(signal, index, 1, wrap=False)  # (B, F, L, parts)
    if window is not None:
        framed = ops.mul(framed, ops.unsqueeze(ops.cast(window, signal.dtype), 1))
    return _dft_along(framed, 2, None, False, ctx.flag("onesided", 1))


def _scalar_f64(ctx, value):
    return ops.cast(ops.reshape(ctx.tensor(value), ()), DType.f64)


@register("MelWeightMatrix")
def _mel_weight_matrix(ctx, mel_bins, dft_length, sample_rate, lower_hz, upper_hz):
    """(dft_length // 2 + 1, num_mel_bins) triangular filters, as the ONNX reference: M + 2
    edges evenly spaced in mel (the step is the range over M + 2), each turned back to hertz
    and to a DFT bin floor((L + 1) hz / rate); filter i rises from edge i to edge i + 1 and
    falls to edge i + 2. Both sizes come from the inputs at run time (fresh sizes)."""
    count = ops.cast(ops.reshape(ctx.tensor(mel_bins), ()), DType.i64)
    length = ops.cast(ops.reshape(ctx.tensor(dft_length), ()), DType.i64)
    filters = ops.cast(arange_i64(count, ctx.builder), DType.f64)  # i, (M,)
    spectrum = ops.cast(arange_i64(ops.add(ops.floor_divide(length, 2), 1), ctx.builder),
                        DType.f64)  # j, (L // 2 + 1,)

    def mel(hz):
        return ops.div(ops.mul(ops.log(ops.add(ops.div(hz, 700.0), 1.0)), 2595.0),
                       math.log(10))

    low, high = mel(_scalar_f64(ctx, lower_hz)), mel(_scalar_f64(ctx, upper_hz))
    step = ops.div(ops.sub(high, low), ops.add(ops.cast(count, DType.f64), 2.0))
    scale = ops.add(ops.cast(length, DType.f64), 1.0)
    rate = _scalar_f64(ctx, sample_rate)

    def edge(k: float):  # the DFT bin of edge i + k, (1, M)
        mels = ops.add(ops.mul(ops.add(filters, k), step), low)
        hz = ops.mul(ops.sub(ops.exp(ops.mul(ops.div(mels, 2595.0), math.log(10))), 1.0), 700.0)
        return ops.unsqueeze(ops.floor(ops.div(ops.mul(scale, hz), rate)), 0)

    left, centre, right = edge(0.0), edge(1.0), edge(2.0)
    j = ops.unsqueeze(spectrum, 1)
    rising = ops.where(ops.eq(centre, left), 1.0,
                       ops.div(ops.sub(j, left), ops.maximum(ops.sub(centre, left), 1.0)))
    falling = ops.div(ops.sub(right, j), ops.maximum(ops.sub(right, centre), 1.0))
    out = ops.where(ops.logical_and(ops.ge(j, left), ops.le(j, centre)), rising, 0.0)
    out = ops.where(ops.logical_and(ops.ge(j, centre), ops.lt(j, right)), falling, out)
    return ops.cast(out, ctx.dtype(ctx.attr("output_datatype", TensorProto.FLOAT)))


# -- window functions ------------------------------------------------------------------------------

def _cosine_window(ctx, size, terms):
    """A window of ``size`` points: sum_k a_k cos(2 pi k n / N), N = size (periodic) or
    size - 1 (symmetric)."""
    known = ctx.known(size)
    if known is not None and known.static:
        count = int(np.asarray(known.values).reshape(-1)[0])
        positions = ops.cast(ops.iota(count, "i64", ctx.builder), DType.f32)
        length = float(count)
    else:
        size_t = ops.cast(ops.reshape(ctx.tensor(size), ()), DType.i64)
        positions = ops.cast(ops.arange_of(size_t), DType.f32)
        length = ops.cast(size_t, DType.f32)
    period = length if ctx.flag("periodic", 1) else ops.sub(length, 1.0) \
        if not isinstance(length, float) else length - 1.0
    out = None
    for k, a in enumerate(terms):
        term = ops.full(tuple(positions.shape), a, DType.f32, like=positions) if k == 0 else \
            ops.mul(ops.cos(ops.div(ops.mul(positions, 2.0 * math.pi * k), period)), a)
        out = term if out is None else ops.add(out, term)
    dtype = ctx.attr("output_datatype", 1)
    return ops.cast(out, ctx.dtype(dtype))


@register("HannWindow")
def _hann(ctx, size):
    return _cosine_window(ctx, size, (0.5, -0.5))


@register("HammingWindow")
def _hamming(ctx, size):
    return _cosine_window(ctx, size, (25.0 / 46.0, -(1.0 - 25.0 / 46.0)))


@register("BlackmanWindow")
def _blackman(ctx, size):
    return _cosine_window(ctx, size, (0.42, -0.5, 0.08))
