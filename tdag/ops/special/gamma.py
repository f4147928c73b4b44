"""The gamma family and Hurwitz zeta as torch evaluates them (ATen/native/Math.h, Cephes):
digamma and trigamma by shifting x up (a fixed count of guarded steps, as many as torch's
loop can take) then their asymptotic series; zeta by Euler-Maclaurin after a direct sum,
both loops unrolled to their bound with torch's early exits as masks; polygamma(n >= 2) as
(-1)^(n+1) n! zeta(n+1, x). lgamma (std::lgamma in torch) is Stirling's series after a shift
to x >= 8 (error under 1e-9 there), Taylor series about 1 and 2 below 2.5 (relative accuracy
at its zeros), the reflection formula below 1/2: float32 accuracy."""
from __future__ import annotations

import math

from tdag.ops import core
from tdag.ops.promotion import broadcast_shapes
from tdag.ops.special import tables as T
from tdag.ops.special.series import filled, horner, refuse_where
from tdag.ops.tensor import Tensor

_MACHEP = 1.11022302462515654042e-16
_ZETA_TERMS = 30  # direct terms: torch's loop runs 9, or until q + i > 9: q > -20 fits
_SHIFT = 8
_EULER = 0.5772156649015329
_AT_ONE = (  # (-1)^k zeta(k) / k, k = 2..25 (mpmath)
    0.8224670334241132, -0.40068563438653143, 0.27058080842778454, -0.20738555102867398,
    0.1695571769974082, -0.1440498967688461, 0.12550966952474304, -0.11133426586956469,
    0.1000994575127818, -0.09095401714582904, 0.083353840546109, -0.0769325164113522,
    0.07143294629536133, -0.06666870588242046, 0.06250095514121304, -0.058823978658684585,
    0.055555767627403614, -0.05263167937961666, 0.05000004769810169, -0.047619070330142226,
    0.04545455629320467, -0.04347826605304026, 0.04166666915034121, -0.04000000119214014)
_AT_TWO = (  # (-1)^k (zeta(k) - 1) / k, k = 2..17 (mpmath)
    0.3224670334241132, -0.0673523010531981, 0.020580808427784546, -0.007385551028673986,
    0.0028905103307415234, -0.001192753911703261, 0.0005096695247430425,
    -0.00022315475845357939, 9.945751278180853e-05, -4.492623673813314e-05,
    2.050721277567069e-05, -9.439488275268397e-06, 4.374866789907488e-06,
    -2.039215753801366e-06, 9.55141213040742e-07, -4.492469198764566e-07)


def _is_nonpositive_integer(x: Tensor) -> Tensor:
    return core.logical_and(core.le(x, 0.0), core.eq(x, core.floor(x)))


def _lgamma_positive(y: Tensor) -> Tensor:
    """lgamma(y) for y >= 1/2: Taylor series about 1 and 2 below 2.5 (relative accuracy at
    the zeros, where 1 - x^a Gamma(a) in igammac needs it), Stirling above."""
    return core.where(core.lt(y, 2.5), lgamma_near_one_two(y), _stirling(y))


def lgamma_near_one_two(y: Tensor) -> Tensor:
    """lgamma(y) for y in [1/2, 5/2): its Taylor series about 1 below 3/2, about 2 above."""
    about_one = _taylor(core.sub(y, 1.0), -_EULER, _AT_ONE)
    about_two = _taylor(core.sub(y, 2.0), 1.0 - _EULER, _AT_TWO)
    return core.where(core.lt(y, 1.5), about_one, about_two)


def _taylor(t: Tensor, linear: float, higher) -> Tensor:
    """linear t + sum_k higher[k - 2] t^k: |t| <= 1/2 keeps the terms under 2^-k."""
    return core.mul(t, core.add(core.mul(t, horner(t, higher[::-1])), linear))


def _stirling(y: Tensor) -> Tensor:
    """Stirling at z = y + 8 where y < 8, less log y (y+1)..(y+7)."""
    small = core.lt(y, float(_SHIFT))
    z = core.where(small, core.add(y, float(_SHIFT)), y)
    zz = core.mul(z, z)
    series = core.div(core.add(core.div(core.sub(core.div(1.0 / 1260.0, zz), 1.0 / 360.0), zz),
                               1.0 / 12.0), z)
    stirling = core.add(core.sub(core.mul(core.sub(z, 0.5), core.log(z)), z),
                        core.add(series, 0.5 * math.log(2 * math.pi)))
    shift = core.log(y)
    for k in range(1, _SHIFT):
        shift = core.add(shift, core.log(core.add(y, float(k))))
    return core.where(small, core.sub(stirling, shift), stirling)


def lgamma(x: Tensor) -> Tensor:
    """log |Gamma(x)|; +inf at 0 and the negative integers, as torch."""
    reflect = core.lt(x, 0.5)
    y = core.where(reflect, core.sub(1.0, x), x)
    direct = _lgamma_positive(y)
    offset = core.sub(x, core.round(x))  # exact; |sin(pi x)| = |sin(pi offset)|, accurately
    reflected = core.sub(core.log(core.div(math.pi, core.abs(core.sin(core.mul(offset,
                                                                                math.pi))))),
                         direct)
    value = core.where(reflect, reflected, direct)
    value = core.where(core.eq(x, float("inf")), float("inf"), value)
    return core.where(_is_nonpositive_integer(x), float("inf"), value)


def digamma(x: Tensor) -> Tensor:
    """psi(x): torch's float branch step by step (reflection, ten shifts, series)."""
    negative_zero = core.logical_and(core.eq(x, 0.0), core.lt(core.div(1.0, x), 0.0))
    reflect = core.lt(x, 0.0)
    offset = core.sub(x, core.round(x))  # exact; tan has period pi (torch takes it in f64)
    correction = core.div(math.pi, core.tan(core.mul(offset, math.pi)))
    y = core.where(reflect, core.sub(1.0, x), x)
    result = filled(y, 0.0)
    for _ in range(10):  # push y to >= 10: at most ten steps from y > 0
        below = core.lt(y, 10.0)
        result = core.where(below, core.sub(result, core.div(1.0, y)), result)
        y = core.where(below, core.add(y, 1.0), y)
    z = core.div(1.0, core.mul(y, y))
    tail = core.where(core.lt(y, 1.0e17), core.mul(z, horner(z, T.DIGAMMA_A)), 0.0)
    series = core.sub(core.sub(core.add(result, core.log(y)), core.div(0.5, y)), tail)
    value = core.where(core.eq(y, 10.0), core.add(result, 2.25175258906672110764), series)
    value = core.where(reflect, core.sub(value, correction), value)
    value = core.where(core.logical_and(reflect, core.eq(x, core.trunc(x))), float("nan"), value)
    value = core.where(core.eq(x, float("inf")), float("inf"), value)
    return core.where(core.eq(x, 0.0), core.where(negative_zero, float("inf"), float("-inf")),
                      value)


def trigamma(x: Tensor) -> Tensor:
    """psi'(x): reflection below 1/2, six shifts, the asymptotic series."""
    reflect = core.lt(x, 0.5)
    sin_pi_x = core.sin(core.mul(x, math.pi))
    result = core.where(reflect, core.neg(core.div(math.pi * math.pi,
                                                   core.mul(sin_pi_x, sin_pi_x))), 0.0)
    y = core.where(reflect, core.sub(1.0, x), x)
    for _ in range(6):
        result = core.add(result, core.div(1.0, core.mul(y, y)))
        y = core.add(y, 1.0)
    ixx = core.div(1.0, core.mul(y, y))
    inner = core.mul(ixx, core.sub(1.0 / 6, core.mul(ixx, core.sub(
        1.0 / 30, core.mul(ixx, 1.0 / 42)))))
    result = core.add(result, core.div(core.add(core.add(1.0, core.div(1.0, core.mul(y, 2.0))),
                                                inner), y))
    return core.where(reflect, core.neg(result), result)


def zeta(x: Tensor, q: Tensor) -> Tensor:
    """Hurwitz zeta(x, q) = sum_k (k + q)^-x, torch's Cephes loop unrolled: the direct sum to
    q + i > 9 (at least 9 terms), then Euler-Maclaurin with 12 Bernoulli terms, each early
    exit a mask. A q below -20 needs more direct terms than the unrolled loop holds: a
    run-time error, never a truncated sum."""
    shape = _broadcast(x, q)
    x, q = core.broadcast_to(x, shape), core.broadcast_to(q, shape)
    decided, special = _zeta_domain(x, q)
    s = core.pow(q, core.neg(x))
    a, b = q, filled(q, 0.0)
    done = core.ne(x, x)  # torch returned early (NaN x: decided already)
    looping = core.logical_not(done)
    for i in range(_ZETA_TERMS):
        if i >= 9:  # while (i < 9 || a <= 9)
            looping = core.logical_and(looping, core.le(a, 9.0))
        run = core.logical_and(looping, core.logical_not(done))
        a = core.where(run, core.add(a, 1.0), a)
        b = core.where(run, core.pow(a, core.neg(x)), b)
        s = core.where(run, core.add(s, b), s)
        done = core.logical_or(done, core.logical_and(run, core.lt(core.abs(b),
                                                                    core.mul(s, _MACHEP))))
    more = core.logical_and(core.logical_and(looping, core.le(a, 9.0)),
                            core.logical_not(core.logical_or(done, decided)))
    s = refuse_where(s, more, f"zeta_needs_more_than_{_ZETA_TERMS}_terms")
    w = a
    s = core.where(done, s, core.add(s, core.sub(core.div(core.mul(b, w), core.sub(x, 1.0)),
                                                 core.mul(b, 0.5))))
    factor, k = filled(x, 1.0), 0.0
    for coefficient in T.ZETA_A:
        factor = core.mul(factor, core.add(x, k))
        b = core.div(b, w)
        t = core.div(core.mul(factor, b), float(coefficient))
        s = core.where(done, s, core.add(s, t))
        done = core.logical_or(done, core.lt(core.abs(core.div(t, s)), _MACHEP))
        k += 1.0
        factor = core.mul(factor, core.add(x, k))
        b = core.div(b, w)
        k += 1.0
    return core.where(decided, special, s)


def _broadcast(x: Tensor, q: Tensor) -> tuple:
    return broadcast_shapes(tuple(x.shape), tuple(q.shape))


def _zeta_domain(x: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
    """(decided, value) for torch's special cases: inf at x = 1 or a pole q <= 0 integer,
    NaN for x < 1 or a non-integer x at q <= 0."""
    pole = _is_nonpositive_integer(q)
    nan = core.logical_or(core.lt(x, 1.0), core.logical_and(
        core.le(q, 0.0), core.logical_and(core.logical_not(pole),
                                          core.ne(x, core.floor(x)))))
    inf = core.logical_or(core.eq(x, 1.0), core.logical_and(core.gt(x, 1.0), pole))
    value = core.where(inf, float("inf"), float("nan"))
    return core.logical_or(inf, nan), core.broadcast_to(value, tuple(x.shape))


def polygamma(n: int, x: Tensor) -> Tensor:
    """The n-th derivative of digamma: digamma, trigamma, then +-n! zeta(n + 1, x)."""
    if n == 0:
        return digamma(x)
    if n == 1:
        return trigamma(x)
    sign = 1.0 if n % 2 else -1.0
    order = filled(x, float(n + 1))
    return core.mul(zeta(order, x), sign * math.factorial(n))


def mvlgamma(x: Tensor, p: int) -> Tensor:
    """The multivariate log-gamma: sum_j lgamma(x - j/2) + p(p-1)/4 log(pi); torch refuses
    an element <= (p-1)/2, and so does the run (a run-time check)."""
    total = filled(x, 0.0)
    for j in range(p):
        total = core.add(total, lgamma(core.sub(x, j / 2)))
    total = core.add(total, p * (p - 1) / 4 * math.log(math.pi))
    return refuse_where(total, core.le(x, (p - 1) / 2), "mvlgamma_argument_too_small")
