"""The normal distribution's tails as torch evaluates them: erfcx (Johnson's Faddeeva form: 100
degree-6 Chebyshev pieces of y = 400 / (4 + |x|), the piece's 7 coefficients gathered by its
index, a continued fraction past 50), log_ndtr over erfcx, and ndtri (Cephes' rational fits).
Accuracy: torch's, to float32 rounding."""
from __future__ import annotations

import math

from tdag.ops import core
from tdag.ops.special import tables as T
from tdag.ops.special.series import horner, log1p
from tdag.ops.tensor import Tensor

_ISPI = 0.56418958354775628694807945156  # 1 / sqrt(pi)


def _erfcx_y100(y100: Tensor) -> Tensor:
    """The piece of y100 in [i, i + 1), t = 2 y100 - (2 i + 1); 1 at y100 = 100 (x = 0)."""
    piece = core.clamp(core.floor(y100), 0.0, 99.0)
    piece = core.where(core.isnan(piece), 0.0, piece)  # a NaN index would read anywhere
    t = core.sub(core.mul(y100, 2.0), core.add(core.mul(piece, 2.0), 1.0))
    table = y100.builder.const([[float(c) for c in row] for row in T.ERFCX_Y100], y100.dtype)
    rows = core.gather(table, core.cast(piece, "i64"), 0, wrap=False)  # (..., 7)
    value = core.select(rows, -1, 6)
    for k in range(5, -1, -1):
        value = core.add(core.select(rows, -1, k), core.mul(value, t))
    return core.where(core.ge(y100, 100.0), 1.0, value)


def erfcx(x: Tensor) -> Tensor:
    """exp(x^2) erfc(x) without overflow or cancellation."""
    xx = core.mul(x, x)
    fraction = core.div(core.mul(core.add(core.mul(xx, core.add(xx, 4.5)), 2.0), _ISPI),
                        core.mul(x, core.add(core.mul(xx, core.add(xx, 5.0)), 3.75)))
    fraction = core.where(core.gt(x, 5e7), core.div(_ISPI, x), fraction)
    positive = core.where(core.gt(x, 50.0), fraction,
                          _erfcx_y100(core.div(400.0, core.add(core.abs(x), 4.0))))
    doubled = core.mul(core.exp(core.where(core.lt(x, 0.0), xx, 0.0)), 2.0)
    negative = core.where(core.lt(x, -6.1), doubled,
                          core.sub(doubled, _erfcx_y100(core.div(400.0, core.sub(4.0,
                                                                                  x)))))
    negative = core.where(core.lt(x, -26.7), float("inf"), negative)
    value = core.where(core.ge(x, 0.0), positive, negative)
    return core.where(core.isnan(x), x, value)


def erfc(x: Tensor) -> Tensor:
    """1 - erf(x) to float32's relative accuracy in the tail, where 1 - erf(x) cancels:
    erfcx(|x|) exp(-x^2) for x >= 0, 2 less that for x < 0."""
    tail = core.mul(erfcx(core.abs(x)), core.exp(core.neg(core.mul(x, x))))
    return core.where(core.lt(x, 0.0), core.sub(2.0, tail), tail)


def log_ndtr(x: Tensor) -> Tensor:
    """log Phi(x): log(erfcx(-t) / 2) - t^2 below -1, log1p(-erfc(t) / 2) above, t = x/sqrt 2
    (erfc(t) as erfcx(t) exp(-t^2), accurate where 1 - erf(t) cancels)."""
    t = core.mul(x, math.sqrt(0.5))
    low = core.sub(core.log(core.div(erfcx(core.neg(t)), 2.0)), core.mul(t, t))
    erfc_t = core.where(core.ge(t, 0.0), erfc(t), core.sub(1.0, core.erf(t)))
    high = log1p(core.div(core.neg(erfc_t), 2.0))
    return core.where(core.lt(x, -1.0), low, high)


def ndtri(p: Tensor) -> Tensor:
    """The inverse of the normal CDF: Cephes' three rational fits."""
    flip = core.gt(p, 1.0 - 0.13533528323661269189)  # exp(-2)
    y = core.where(flip, core.sub(1.0, p), p)
    centred = core.sub(y, 0.5)
    y2 = core.mul(centred, centred)
    middle = core.mul(core.add(centred, core.mul(centred, core.div(
        core.mul(y2, horner(y2, T.NDTRI_P0)), horner(y2, T.NDTRI_Q0)))), 2.50662827463100050242)
    safe = core.where(core.gt(y, 0.0), y, 1.0)
    x = core.sqrt(core.mul(core.log(safe), -2.0))
    x0 = core.sub(x, core.div(core.log(x), x))
    z = core.div(1.0, x)
    near = core.div(core.mul(z, horner(z, T.NDTRI_P1)), horner(z, T.NDTRI_Q1))
    far = core.div(core.mul(z, horner(z, T.NDTRI_P2)), horner(z, T.NDTRI_Q2))
    tail = core.sub(x0, core.where(core.lt(x, 8.0), near, far))
    tail = core.where(flip, tail, core.neg(tail))
    value = core.where(core.gt(y, 0.13533528323661269189), middle, tail)
    value = core.where(core.logical_or(core.lt(p, 0.0), core.gt(p, 1.0)), float("nan"), value)
    value = core.where(core.eq(p, 1.0), float("inf"), value)
    return core.where(core.eq(p, 0.0), float("-inf"), value)
