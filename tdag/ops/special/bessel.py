"""Bessel functions as torch evaluates them (ATen/native/Math.h, from Cephes): Chebyshev
series for the modified functions on [0, 8] (I) or [0, 2] (K) and in 1/x beyond; rational
fits for J and Y on [0, 5] and the Hankel asymptotic form beyond. Both pieces are computed
for every element and ``where`` picks one: a fixed number of multiply-adds, about 60 per
element, where torch branches. Accuracy: torch's own, to float32 rounding (relative 1e-6 on
OpInfo's samples)."""
from __future__ import annotations

import math

from tdag.ops import core
from tdag.ops.special import tables as T
from tdag.ops.special.series import chbevl, horner
from tdag.ops.tensor import Tensor

_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_TWO_OVER_PI = 0.636619772367581343075535053490057448


def _negate_where_negative(x: Tensor, value: Tensor) -> Tensor:
    return core.where(core.lt(x, 0.0), core.neg(value), value)


def i0e(x: Tensor, a=T.I0E_A, b=T.I0E_B) -> Tensor:
    """exp(-|x|) I0(x)."""
    ax = core.abs(x)
    near = chbevl(core.sub(core.div(ax, 2.0), 2.0), a)
    far = core.div(chbevl(core.sub(core.div(32.0, ax), 2.0), b), core.sqrt(ax))
    return core.where(core.le(ax, 8.0), near, far)


def i0(x: Tensor, a=T.I0E_A, b=T.I0E_B) -> Tensor:
    return core.mul(core.exp(core.abs(x)), i0e(x, a, b))


def i1e(x: Tensor, a=T.I1E_A, b=T.I1E_B) -> Tensor:
    """exp(-|x|) I1(x), odd in x."""
    ax = core.abs(x)
    near = core.mul(chbevl(core.sub(core.div(ax, 2.0), 2.0), a), ax)
    far = core.div(chbevl(core.sub(core.div(32.0, ax), 2.0), b), core.sqrt(ax))
    return _negate_where_negative(x, core.where(core.le(ax, 8.0), near, far))


def i1(x: Tensor, a=T.I1E_A, b=T.I1E_B) -> Tensor:
    return core.mul(core.exp(core.abs(x)), i1e(x, a, b))


def modified_i0(x: Tensor) -> Tensor:
    return i0(x, T.MI0_A, T.MI0_B)


def modified_i1(x: Tensor) -> Tensor:
    return i1(x, T.MI1_A, T.MI1_B)


def _k(x: Tensor, order: int, scaled: bool) -> Tensor:
    """K0 / K1 (times exp(x) where ``scaled``); inf at 0 and NaN for x < 0, as torch."""
    near_series = chbevl(core.sub(core.mul(x, x), 2.0), T.K0_A if order == 0 else T.K1_A)
    log_half = core.log(core.mul(x, 0.5))
    if order == 0:
        near = core.sub(near_series, core.mul(log_half, modified_i0(x)))
    else:
        near = core.add(core.mul(log_half, modified_i1(x)), core.div(near_series, x))
    far = core.div(chbevl(core.sub(core.div(8.0, x), 2.0), T.K0_B if order == 0 else T.K1_B),
                   core.sqrt(x))
    if scaled:
        near = core.mul(near, core.exp(x))
    else:
        far = core.mul(far, core.exp(core.neg(x)))
    value = core.where(core.le(x, 2.0), near, far)
    return core.where(core.eq(x, 0.0), float("inf"),
                      core.where(core.lt(x, 0.0), float("nan"), value))


def modified_k0(x: Tensor) -> Tensor:
    return _k(x, 0, False)


def modified_k1(x: Tensor) -> Tensor:
    return _k(x, 1, False)


def scaled_modified_k0(x: Tensor) -> Tensor:
    return _k(x, 0, True)


def scaled_modified_k1(x: Tensor) -> Tensor:
    return _k(x, 1, True)


def _hankel(x: Tensor, order: int, second_kind: bool) -> Tensor:
    """The large-x form of J_order / Y_order (x > 5): P cos(x - phase) -+ Q sin(...)."""
    pre = ("Y" if second_kind else "J") + str(order)  # each function's own copy of the fit
    z = core.div(25.0, core.mul(x, x)) if order == 0 else \
        core.mul(core.div(5.0, x), core.div(5.0, x))
    p = core.div(horner(z, getattr(T, pre + "_PP")), horner(z, getattr(T, pre + "_PQ")))
    q = core.mul(core.div(5.0, x), core.div(horner(z, getattr(T, pre + "_QP")),
                                            horner(z, getattr(T, pre + "_QQ"))))
    shifted = core.sub(x, math.pi / 4 if order == 0 else 3 * math.pi / 4)
    if second_kind:
        wave = core.add(core.mul(p, core.sin(shifted)), core.mul(q, core.cos(shifted)))
    else:
        wave = core.sub(core.mul(p, core.cos(shifted)), core.mul(q, core.sin(shifted)))
    return core.div(core.mul(wave, _SQRT_2_OVER_PI), core.sqrt(x))


def j0(x: Tensor) -> Tensor:
    x = core.abs(x)
    xx = core.mul(x, x)
    near = core.div(core.mul(core.mul(core.sub(xx, 5.78318596294678452118e+00),
                                      core.sub(xx, 3.04712623436620863991e+01)),
                             horner(xx, T.J0_RP)), horner(xx, T.J0_RQ))
    near = core.where(core.lt(x, 0.00001), core.sub(1.0, core.div(xx, 4.0)), near)
    return core.where(core.le(x, 5.0), near, _hankel(x, 0, False))


def j1(x: Tensor) -> Tensor:
    ax = core.abs(x)
    xx = core.mul(ax, ax)
    near = core.mul(core.mul(core.mul(core.div(horner(xx, T.J1_RP), horner(xx, T.J1_RQ)), ax),
                             core.sub(xx, 1.46819706421238932572e+01)),
                    core.sub(xx, 4.92184563216946036703e+01))
    return _negate_where_negative(x, core.where(core.le(ax, 5.0), near, _hankel(ax, 1, False)))


def y0(x: Tensor) -> Tensor:
    xx = core.mul(x, x)
    near = core.add(core.div(horner(xx, T.Y0_YP), horner(xx, T.Y0_YQ)),
                    core.mul(core.mul(_TWO_OVER_PI, core.log(x)), j0(x)))
    value = core.where(core.le(x, 5.0), near, _hankel(x, 0, True))
    return _at_origin(x, value)


def y1(x: Tensor) -> Tensor:
    xx = core.mul(x, x)
    near = core.add(core.mul(x, core.div(horner(xx, T.Y1_YP), horner(xx, T.Y1_YQ))),
                    core.mul(_TWO_OVER_PI, core.sub(core.mul(j1(x), core.log(x)),
                                                    core.div(1.0, x))))
    value = core.where(core.le(x, 5.0), near, _hankel(x, 1, True))
    return _at_origin(x, value)


def _at_origin(x: Tensor, value: Tensor) -> Tensor:
    """Y's -inf at 0 and NaN for x < 0."""
    return core.where(core.eq(x, 0.0), float("-inf"),
                      core.where(core.lt(x, 0.0), float("nan"), value))


def spherical_j0(x: Tensor) -> Tensor:
    """sin(x) / x, its Taylor series for |x| < 0.5, 0 at infinity."""
    xx = core.mul(x, x)
    series = 1.0 / 6227020800.0
    for c in (-1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0):
        series = core.add(core.mul(xx, series), c)
    near = core.add(core.mul(xx, series), 1.0)
    far = core.div(core.sin(x), x)
    value = core.where(core.lt(core.abs(x), 0.5), near, far)
    return core.where(core.eq(core.abs(x), float("inf")), 0.0, value)
