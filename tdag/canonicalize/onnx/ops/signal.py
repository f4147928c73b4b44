"""ONNX signal ops: DFT, STFT, MelWeightMatrix and the window functions HannWindow,
HammingWindow and BlackmanWindow; each is a composition of tdag ops.

A DFT of length L along an axis is two products with the cos and sin matrices
``cos(2 pi (k t mod L) / L)`` (the integer product reduced mod L first, so the angle stays in
[0, 2 pi) and float32 loses nothing to a large k t): O(n L) per row instead of an FFT's
O(L log L), exact to float32 rounding of the sums. A complex value is the pair (re, im) on the
last axis, as ONNX stores it. A length known only at run time (STFT's frame_length) builds the
matrices from ``arange_of`` positions, so their sizes are fresh.
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


def _angles(rows, cols, length):
    """2 pi (r c mod L) / L for i64 positions rows (n,) and cols (K,): f64 (n, K). In
    float64 so that sin(pi) is 1e-16, not float32's -8.7e-8 (times a large sum, past
    tolerance at a Nyquist bin)."""
    product = ops.mul(ops.unsqueeze(rows, 1), ops.unsqueeze(cols, 0))
    turns = ops.remainder(product, length)
    scale = 2 * math.pi / length if isinstance(length, int) else \
        ops.div(2 * math.pi, ops.cast(length, DType.f64))
    return ops.mul(ops.cast(turns, DType.f64), scale)


def _matmul(x, matrix):
    return ops.matmul(x, ops.cast(matrix, x.dtype))


def _forward(re, im, rows, cols, length):
    """X[k] = sum_t (a + ib)[t] e^(-2 pi i k t / L) for signal positions ``rows``, bins
    ``cols``."""
    theta = _angles(rows, cols, length)
    cos, sin = ops.cos(theta), ops.sin(theta)
    if im is None:
        return _matmul(re, cos), ops.neg(_matmul(re, sin))
    return (ops.add(_matmul(re, cos), _matmul(im, sin)),
            ops.sub(_matmul(im, cos), _matmul(re, sin)))


def _inverse(re, im, rows, cols, length):
    """x[t] = 1/L sum_k X[k] e^(2 pi i k t / L) for bins ``rows``, signal positions
    ``cols``."""
    theta = _angles(rows, cols, length)
    cos, sin = ops.cos(theta), ops.sin(theta)
    scale = 1.0 / length if isinstance(length, int) else \
        ops.reciprocal(ops.cast(length, re.dtype))
    if im is None:
        return ops.mul(_matmul(re, cos), scale), ops.mul(_matmul(re, sin), scale)
    return (ops.mul(ops.sub(_matmul(re, cos), _matmul(im, sin)), scale),
            ops.mul(ops.add(_matmul(re, sin), _matmul(im, cos)), scale))


def _inverse_real(re, im, length: int):
    """numpy's irfft: the one-sided spectrum's first L//2 + 1 bins, each but bin 0 and (for
    an even L) bin L/2 counted twice for its conjugate twin; the real part only."""
    bins = min(re.shape[-1], length // 2 + 1)
    re, im = ops.slice(re, -1, 0, bins), ops.slice(im, -1, 0, bins) if im is not None else None
    twice = [1.0 if k == 0 or 2 * k == length else 2.0 for k in range(bins)]
    weight = ops.unsqueeze(re.builder.const(twice, re.dtype), 1)
    theta = _angles(ops.iota(bins, "i64", re.builder), ops.iota(length, "i64", re.builder),
                    length)
    cos = ops.mul(ops.cast(ops.cos(theta), re.dtype), weight)
    out = _matmul(re, cos)
    if im is not None:
        out = ops.sub(out, _matmul(im, ops.mul(ops.cast(ops.sin(theta), re.dtype), weight)))
    return ops.mul(out, 1.0 / length)


def _dft_along(x, axis: int, length: int | None, inverse: bool, onesided: bool):
    """The ONNX DFT of x (..., 1 or 2) along ``axis`` (not the last)."""
    parts = x.shape[-1]
    if parts not in (1, 2):
        raise InvalidModelError(f"DFT: the last axis holds 1 (real) or 2 (complex) values, "
                                f"got {x.type}")
    n = x.shape[axis]
    if not is_static(n):
        raise UnsupportedOpError(f"DFT along the symbolic axis {n}")
    re = ops.movedim(ops.select(x, -1, 0), axis, -1)
    im = ops.movedim(ops.select(x, -1, 1), axis, -1) if parts == 2 else None
    if length is None:
        length = 2 * (n - 1) if inverse and onesided else n
    if length < 1:
        raise InvalidModelError(f"DFT: dft_length {length} must be positive")
    if inverse and onesided:
        out = ops.unsqueeze(_inverse_real(re, im, length), -1)
        return ops.movedim(out, -2, axis)
    if n > length:  # the signal is cut to dft_length (and zero-padded where shorter)
        re, im = ops.slice(re, -1, 0, length), ops.slice(im, -1, 0, length) \
            if im is not None else None
    rows = ops.iota(min(n, length), "i64", x.builder)
    bins = length // 2 + 1 if onesided and not inverse else length
    cols = ops.iota(bins, "i64", x.builder)
    out_re, out_im = (_inverse if inverse else _forward)(re, im, rows, cols, length)
    return ops.movedim(ops.stack([out_re, out_im], -1), -2, axis)


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
    re = ops.select(framed, -1, 0)
    im = ops.select(framed, -1, 1) if signal.shape[-1] == 2 else None
    onesided = ctx.flag("onesided", 1)
    bins = (length // 2 + 1 if isinstance(length, int) else
            ops.add(ops.floor_divide(length, 2), 1)) if onesided else length
    columns = arange_i64(bins, ctx.builder) if bins is not length else taps
    out_re, out_im = _forward(re, im, taps, columns, length)
    return ops.stack([out_re, out_im], -1)


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
