"""The FFT in ONNX matmuls (the "four-step" FFT), for the ``fft`` primitive's ONNX emitter.

onnxruntime's DFT is about ten times slower than torch's FFT, and its float32 one 5 to 1000
times less accurate; its MatMul is fast. A transform of n = n1 * n2 points is a dense
n1-point DFT as a matmul, the twiddle factors, then n2-point transforms of its rows (Bailey's
four-step FFT), split again while longer than ``DENSE_POINTS`` (n1 near the cube root of
n past ``CUBE_ROOT_FROM``, else near its square root): a stage of
m points costs 4 n m multiply-adds where the dense DFT takes 4 n^2, and 65,536 points as
32 x 32 x 64 cost a quarter of 256 x 256. In float32 within 2-3 times torch's own error
(3-5e-7 of the largest value at n = 1,024 to 65,536, torch's 1.3-1.8e-7). With index
i = n2 i1 + i2 and k = k1 + n1 k2:

    X[k1 + n1 k2] = sum_i2 W_n^(i2 k1) W_n2^(i2 k2) sum_i1 x[n2 i1 + i2] W_n1^(i1 k1)

Complex values are (real, imaginary) pairs on a trailing axis (``reify/onnx/complex.py``); a
complex product is a real one of 2 x 2 blocks [[c, s], [-s, c]]. Between stages the rows are
planar (real parts, then imaginary ones), the layout a matmul from the left takes with no
transpose; each stage's one transpose (k2 before k1) is of the pairs it gives.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
import torch

from tdag.ir.types import DType

MIN_POINTS = 64  # below, ONNX's DFT (a dense product at that size costs about as much)
MIN_FACTOR = 4  # n = n1 * n2 with n1 >= this (no prime or 2 * prime lengths)
DENSE_POINTS = 64  # an inner transform this short (or with no factor) is one dense matmul
DENSE_LIMIT = 512  # but none longer: its (2 n)^2 constants past 4 MB in float32
CUBE_ROOT_FROM = 4096  # longer transforms split three ways: 4x fewer products at 65,536


@dataclass(frozen=True, slots=True)
class Plan:
    """n = n1 * n2: a dense n1-point DFT, then the n2-point one by ``inner`` (None: dense)."""
    n1: int
    n2: int
    inner: Plan | None


def plan(n: int) -> Plan | None:
    """The split of n (``_split``), or None where ONNX's DFT serves: fewer than
    ``MIN_POINTS`` points, or no divisor from ``MIN_FACTOR``."""
    return None if n < MIN_POINTS else _split(n)


def _split(n: int) -> Plan | None:
    """n1 the largest divisor up to sqrt(n), or up to the cube root past ``CUBE_ROOT_FROM``
    (the n2 = n / n1 points split again); None where no divisor is from ``MIN_FACTOR`` or
    an unsplit n2 is past ``DENSE_LIMIT``. A stage of m points costs 8 n m flops on n
    complex values: 65,536 as 32 x 32 x 64 costs 8 x 128 per value, as 256 x 256 8 x 512."""
    root = math.isqrt(n) if n <= CUBE_ROOT_FROM else round(n ** (1 / 3))
    n1 = next(d for d in range(root, 0, -1) if n % d == 0)
    n2 = n // n1
    if n1 < MIN_FACTOR:
        return None
    if n2 <= DENSE_POINTS:
        return Plan(n1, n2, None)
    inner = _split(n2)
    return None if inner is None and n2 > DENSE_LIMIT else Plan(n1, n2, inner)


class Layout(enum.Enum):
    """How rows of n values lie: real [rows, n]; (real, imaginary) pairs [rows, n, 2]; or
    planar [rows, 2, n], the real parts then the imaginary ones (what a stage gives)."""
    real = "real"
    pairs = "pairs"
    planar = "planar"


def _blocks(angle: np.ndarray) -> np.ndarray:
    """[..., i, k] angles -> [..., i, 2, k, 2]: (input, its pair part) by (output, its
    part), the real form of multiplying by e^(i angle)."""
    c, s = np.cos(angle), np.sin(angle)
    out = np.zeros((*angle.shape[:-1], 2, angle.shape[-1], 2))
    out[..., 0, :, 0], out[..., 1, :, 0] = c, -s
    out[..., 0, :, 1], out[..., 1, :, 1] = s, c
    return out


def _dft_angles(n: int, sign: float) -> np.ndarray:
    k = np.arange(n)
    return sign * 2 * np.pi * np.outer(k, k) / n


def transform(g, x: str, shape, axis: int, real: bool, inverse: bool, scale: float,
              dtype: DType, p: Plan, outputs: int | None = None, real_part: bool = False,
              present: int | None = None) -> str:
    """The transform along ``axis`` of ``x`` (real of ``shape``, or its (real, imaginary)
    pairs), times ``scale``: pairs, or with ``real_part`` the real parts alone (c2r's; half
    the last matmul); the first ``outputs`` frequencies (default all; r2c's n//2+1 cost
    about half the last matmul). ``x`` holds the first ``present`` values of the axis
    (default n; ``padded``), the rest zeros. The axis moves last, the others are rows."""
    n = p.n1 * p.n2
    outputs = n if outputs is None else outputs
    present = n if present is None else present
    others = [i for i in range(len(shape)) if i != axis]
    perm = others + [axis]
    if perm != list(range(len(shape))):
        x = g.node("Transpose", [x], perm=perm if real else perm + [len(shape)])
    x = g.node("Reshape", [x, g.const([-1, present] if real else [-1, present, 2])])
    stage = _Stage(1.0 if inverse else -1.0, scale, 1 if real_part else 2, _Consts(g, dtype))
    y = _rows(g, x, Layout.real if real else Layout.pairs, n, p, stage, outputs, present)
    parts = stage.parts
    if len(others) != 1 or parts == 1:  # else y is [rows, outputs, 2] already: no copy
        y = g.node("Reshape", [y, g.shape([shape[i] for i in others] +
                                          [outputs, parts][:parts])])
    if perm == list(range(len(shape))):
        return y
    back = [perm.index(i) for i in range(len(shape))] + [len(shape)] * (parts - 1)
    return g.node("Transpose", [y], perm=back)


def padded(p: Plan, present: int) -> int:
    """The length an operand whose first ``present`` values are its only nonzero ones is
    padded to for ``transform``: whole rows of the first stage (i = n2 i1 + i2), whose
    matmul then skips the rest (c2r's one-sided spectrum: half the first stage)."""
    return p.n2 * -(-present // p.n2)


def one_sided(g, x: str, rank: int, axis: int, n: int, dtype: DType, length: int) -> str:
    """c2r's operand: the n//2+1 non-negative frequencies' pairs padded to ``length``
    (``padded``), those with a mirror image (X[n-k] = conj X[k]) doubled. The real part of
    its inverse transform is the real signal: Re(X[k] w^kt) = Re(X[n-k] w^(n-k)t). One Pad
    and one Mul, where completing
    the spectrum (a reversed slice, a conjugate, a concat) is three passes, the conjugate's
    Mul by (1, -1) a slow broadcast in onnxruntime."""
    pads = [0] * (2 * (rank + 1))
    pads[rank + 1 + axis] = length - (n // 2 + 1)
    weights = np.zeros(length)
    weights[0], weights[1:(n + 1) // 2] = 1.0, 2.0
    if n % 2 == 0:
        weights[n // 2] = 1.0
    shape = (length,) + (1,) * (rank - 1 - axis) + (2,)
    weights = np.broadcast_to(weights.reshape(length, *(1,) * (rank - axis)), shape)
    return g.node("Mul", [g.node("Pad", [x, g.const(pads)]),
                          _Consts(g, dtype)("fft_one_sided", np.ascontiguousarray(weights))])


class _Consts:
    """Float64 matrices as initializers of the transform's precision."""

    def __init__(self, g, dtype: DType):
        self.g, self.dtype = g, dtype

    def __call__(self, hint: str, value: np.ndarray) -> str:
        return self.g.initializer(hint, torch.from_numpy(value).to(self.dtype.torch))


@dataclass(frozen=True, slots=True)
class _Stage:
    """What every stage of one transform shares: the exponent's sign (-1 forward), the
    scale (in the last matmul), the output parts kept (2, or 1: the real parts)."""
    sign: float
    scale: float
    parts: int
    const: _Consts


def _rows(g, x: str, layout: Layout, n: int, p: Plan | None, st: _Stage, outputs: int,
          present: int | None = None) -> str:
    """The first ``outputs`` frequencies of each row's n-point DFT: [rows, outputs, parts];
    the rows hold the first ``present`` of n values (a multiple of n2, default all).
    With index i = n2 i1 + i2 and k = k1 + n1 k2, a stage takes i1 to k1 and twiddles
    (``_first``), the n2-point transforms of its rows (k1) give k2, and one transpose puts
    k2 before k1."""
    if p is None:
        return _dense(g, x, layout, n, st, outputs)
    n1, n2 = p.n1, p.n2
    k2s = min(n2, -(-outputs // n1))  # k = k1 + n1 k2 < outputs
    i1s = n1 if present is None else present // n2
    y = _rows(g, _first(g, x, layout, n1, n2, i1s, st), Layout.planar, n2, p.inner, st, k2s)
    y = g.node("Transpose", [g.node("Reshape", [y, g.const([-1, n1, k2s, st.parts])])],
               perm=[0, 2, 1, 3])
    y = g.node("Reshape", [y, g.const([-1, n1 * k2s, st.parts])])
    if outputs < n1 * k2s:
        y = g.node("Slice", [y, g.const([0]), g.const([outputs]), g.const([1])])
    return y


def _dense(g, x: str, layout: Layout, n: int, st: _Stage, outputs: int) -> str:
    """One matmul by the DFT matrix, its rows ordered as the layout's values:
    [rows, outputs, parts]."""
    blocks = _blocks(_dft_angles(n, st.sign)[:, :outputs])[..., :st.parts] * st.scale
    if layout is Layout.real:
        blocks = blocks[:, 0]  # [i, k, part]
    elif layout is Layout.planar:
        blocks = blocks.transpose(1, 0, 2, 3)  # [pair_in, i, k, part]
    width = n if layout is Layout.real else 2 * n
    matrix = np.ascontiguousarray(blocks.reshape(width, outputs * st.parts))
    y = g.node("MatMul", [g.node("Reshape", [x, g.const([-1, width])]),
                          st.const("fft_dft", matrix)])
    return g.node("Reshape", [y, g.const([-1, outputs, st.parts])])


def _first(g, x: str, layout: Layout, n1: int, n2: int, i1s: int, st: _Stage) -> str:
    """rows (i1 < i1s, i2) -> planar rows (rows, k1) of n2 values, twiddled (the inputs
    from i1s on are zeros, their columns of the DFT left out). Two matmuls from the
    left give y and i y ((k1, part) by i2), so that the twiddle w y = cos y + sin (i y) is
    two Muls and an Add (onnxruntime's ReduceSum over a variant axis of 2 is 6 times slower
    than an Add where the rows are few)."""
    dft = _blocks(_dft_angles(n1, st.sign))  # [i1, pair_in, k1, part]
    both = np.stack([dft, dft[..., ::-1] * np.array([-1.0, 1.0])])  # i y = (-im, re)
    first = both.transpose(0, 3, 4, 2, 1)[..., :i1s]  # [variant, k1, part, pair_in, i1]
    if layout is Layout.real:
        a = g.node("Reshape", [x, g.const([-1, i1s, n2])])
        first = first[:, :, :, 0]
    elif layout is Layout.pairs:
        a = g.node("Transpose", [g.node("Reshape", [x, g.const([-1, i1s, n2, 2])])],
                   perm=[0, 3, 1, 2])
        a = g.node("Reshape", [a, g.const([-1, 2 * i1s, n2])])
    else:
        a = g.node("Reshape", [x, g.const([-1, 2 * n1, n2])])
    angle = st.sign * 2 * np.pi * np.outer(np.arange(n1), np.arange(n2)) / (n1 * n2)
    terms = []
    for matrix, weight in zip(first, (np.cos(angle), np.sin(angle))):  # y, i y
        y = g.node("MatMul", [st.const("fft_dft", np.ascontiguousarray(
            matrix.reshape(2 * n1, -1))), a])
        weights = np.repeat(weight[:, None], 2, 1).reshape(2 * n1, n2)  # [(k1, part), i2]
        terms.append(g.node("Mul", [y, st.const("fft_twiddles", weights)]))
    y = g.node("Add", terms)  # [rows, (k1, part), i2]
    return g.node("Reshape", [y, g.const([-1, 2, n2])])
