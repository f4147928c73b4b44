"""The regularized incomplete gamma functions P(a, x) (torch.igamma, special.gammainc) and
Q(a, x) = 1 - P (igammac, gammaincc) as torch evaluates them (ATen/native/Math.h, after
SciPy's Cephes): the uniform asymptotic expansion (DLMF 8.12.3) where a > 20 and x is near a,
else the power series for P (DLMF 8.11.4), and for Q the alternating series at x <= 1.1
(DLMF 8.7.3) or the continued fraction (DLMF 8.9.2). Every branch is evaluated on every
element and the one torch's value tests pick is selected with where.

torch's loops stop at machine epsilon; here each runs a fixed count, as far as torch's runs
for a in [1e-3, 1e4] (measured at float32's epsilon: the series takes at most 236 terms, at
a = 1e4 on the edge of the asymptotic regime, ~2.4 sqrt(a); the fraction 20, the
alternating series 11, the expansion 5 of its rows). Terms summed past convergence are
below rounding, so the value is torch's to float32 rounding; an element whose branch has not
converged within its count is a run-time error, never a truncated sum."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tdag.ir.types import DType
from tdag.ops import core, creation
from tdag.ops.scans import cumprod
from tdag.ops.promotion import broadcast_shapes
from tdag.ops.special.gamma import lgamma, lgamma_near_one_two
from tdag.ops.special.normal import erfc
from tdag.ops.special.series import expm1, filled, horner, log1p, refuse_where
from tdag.ops.tensor import Tensor

SERIES_TERMS = 240
FRACTION_STEPS = 26
ALTERNATING_TERMS = 20
_LANCZOS_G = 6.024680040776729583740234375


@dataclass(frozen=True)
class _Precision:
    """Math.h's constants for float and for double."""
    machep: float
    maxlog: float
    big: float


_F32 = _Precision(5.9604644775390625e-8, 88.72283905206835, 16777216.0)
_F64 = _Precision(1.11022302462515654042e-16, 7.09782712893383996843e2, 4.503599627370496e15)


@dataclass(frozen=True)
class _Branch:
    """A branch's value and whether its loop reached torch's stopping test."""
    value: Tensor
    converged: Tensor


def igamma(a: Tensor, x: Tensor) -> Tensor:
    """P(a, x), the lower regularized incomplete gamma function; a and x broadcast."""
    return _incomplete_gamma(a, x, lower=True)


def igammac(a: Tensor, x: Tensor) -> Tensor:
    """Q(a, x) = 1 - P(a, x), without the cancellation of 1 - P where Q is small."""
    return _incomplete_gamma(a, x, lower=False)


def _incomplete_gamma(a: Tensor, x: Tensor, lower: bool) -> Tensor:
    """Math.h's calc_igamma / calc_igammac over every element; an element whose branch did
    not converge within its unrolled count (in practice only the series, a past ~1e4)
    raises at run time."""
    shape = broadcast_shapes(tuple(a.shape), tuple(x.shape))
    a, x = core.broadcast_to(a, shape), core.broadcast_to(x, shape)
    eps = _F64 if a.dtype is DType.f64 else _F32
    prefactor = _prefactor(a, x, eps)
    series = _series(a, x, prefactor, eps)
    result = _upper(a, x, series, prefactor, eps)
    if lower:  # calc_igamma: 1 - Q past x > max(1, a), the series below
        complement = core.logical_and(core.gt(x, 1.0), core.gt(x, a))
        result = _Branch(core.where(complement, core.sub(1.0, result.value), series.value),
                         core.where(complement, result.converged, series.converged))
    near = _asymptotic_regime(a, x)
    value = core.where(near, _asymptotic(a, x, lower, eps), result.value)
    decided, edge = _edges(a, x, lower)
    short = core.logical_not(core.logical_or(result.converged, core.logical_or(near, decided)))
    value = refuse_where(value, short, f"igamma_needs_more_than_{SERIES_TERMS}_terms")
    return core.where(decided, edge, value)


def _upper(a: Tensor, x: Tensor, series: _Branch, prefactor: Tensor,
           eps: _Precision) -> _Branch:
    """calc_igammac outside the asymptotic regime: 1 - P by the series where x is below a
    (x > 1.1), below a / 1.1 (x in (0.5, 1.1]) or -0.4 / log x below a (x <= 0.5); else the
    continued fraction (x > 1.1) or the alternating series."""
    high = core.gt(x, 1.1)
    by_series = core.where(high, core.lt(x, a), core.where(
        core.le(x, 0.5), core.lt(core.div(-0.4, core.log(x)), a), core.lt(core.mul(x, 1.1), a)))
    fraction, alternating = _fraction(a, x, prefactor, eps), _alternating(a, x, eps)
    value = core.where(by_series, core.sub(1.0, series.value),
                       core.where(high, fraction.value, alternating.value))
    converged = core.where(by_series, series.converged,
                           core.where(high, fraction.converged, alternating.converged))
    return _Branch(value, converged)


def _prefactor(a: Tensor, x: Tensor, eps: _Precision) -> Tensor:
    """x^a e^-x / Gamma(a): directly in logs where x is far from a, else by Lanczos' sum
    (Math.h's _igam_helper_fac)."""
    log_value = core.sub(core.sub(core.mul(a, core.log(x)), x), lgamma(a))
    direct = core.where(core.lt(log_value, -eps.maxlog), 0.0, core.exp(log_value))
    fac = core.add(a, _LANCZOS_G - 0.5)
    scale = core.div(core.sqrt(core.div(fac, math.e)), _lanczos_sum_expg_scaled(a))
    moderate = core.mul(core.exp(core.sub(a, x)), core.pow(core.div(x, fac), a))
    ratio = core.div(core.sub(x, core.add(a, _LANCZOS_G - 0.5)), fac)
    large = core.exp(core.add(core.mul(a, core.sub(log1p(ratio), ratio)),
                              core.div(core.mul(x, 0.5 - _LANCZOS_G), fac)))
    small = core.logical_and(core.lt(a, 200.0), core.lt(x, 200.0))
    lanczos = core.mul(scale, core.where(small, moderate, large))
    far = core.gt(core.abs(core.sub(a, x)), core.mul(core.abs(a), 0.4))
    return core.where(far, direct, lanczos)


def _lanczos_sum_expg_scaled(a: Tensor) -> Tensor:
    """Boost's Lanczos sum as Math.h's ratevl evaluates it: in 1/a past |a| > 1."""
    inverse = core.div(1.0, a)
    outer = core.div(horner(inverse, _LANCZOS_NUM[::-1]), horner(inverse, _LANCZOS_DEN[::-1]))
    inner = core.div(horner(a, _LANCZOS_NUM), horner(a, _LANCZOS_DEN))
    return core.where(core.gt(core.abs(a), 1.0), outer, inner)


def _series(a: Tensor, x: Tensor, prefactor: Tensor, eps: _Precision) -> _Branch:
    """P = prefactor / a * (1 + sum_n x^n / ((a + 1)..(a + n))) (DLMF 8.11.4): the terms are
    a cumulative product along a new axis of SERIES_TERMS (one scan, not a chain of nodes)."""
    steps = _steps(x, SERIES_TERMS)
    terms = cumprod(core.div(core.unsqueeze(x, -1), core.add(core.unsqueeze(a, -1), steps)), -1)
    total = core.add(core.sum(terms, -1), 1.0)
    last = core.select(terms, -1, SERIES_TERMS - 1)
    converged = core.le(last, core.mul(total, eps.machep))  # the terms only shrink once < 1
    value = core.where(core.eq(prefactor, 0.0), 0.0, core.div(core.mul(total, prefactor), a))
    return _Branch(value, converged)


def _steps(like: Tensor, count: int) -> Tensor:
    """1, 2, .., count in like's dtype: the index of a series' terms."""
    return creation.arange(1.0, count + 1.0, dtype=like.dtype, like=like)


def _alternating(a: Tensor, x: Tensor, eps: _Precision) -> _Branch:
    """Q = -expm1(a log x - lgamma(1 + a)) - x^a / Gamma(a) sum_n (-x)^n / (n! (a + n))
    (DLMF 8.7.3), for x <= 1.1 where the terms fall as x^n / n!; torch takes it only for
    a <= 1.1 x, so lgamma(1 + a) needs only its Taylor series about 1 and 2."""
    steps = _steps(x, ALTERNATING_TERMS)
    factorials = cumprod(core.div(core.neg(core.unsqueeze(x, -1)), steps), -1)
    terms = core.div(factorials, core.add(core.unsqueeze(a, -1), steps))
    total = core.sum(terms, -1)
    last = core.abs(core.select(terms, -1, ALTERNATING_TERMS - 1))
    converged = core.le(last, core.mul(core.abs(total), eps.machep))
    exponent = core.sub(core.mul(a, core.log(x)), lgamma_near_one_two(core.add(a, 1.0)))
    power = core.mul(core.exp(exponent), a)  # x^a / Gamma(a) = a x^a / Gamma(1 + a)
    return _Branch(core.sub(core.neg(expm1(exponent)), core.mul(power, total)), converged)


def _fraction(a: Tensor, x: Tensor, prefactor: Tensor, eps: _Precision) -> _Branch:
    """Q = prefactor times Legendre's continued fraction (DLMF 8.9.2), by its convergents
    p_k / q_k, rescaled by 1 / big as they grow; converged once a step changes it by at most
    four epsilons (torch asks for one and, where rounding keeps the steps an ulp apart, runs
    on to 2,000 steps without changing the value)."""
    y = core.sub(1.0, a)
    z = core.add(core.add(x, y), 1.0)
    pkm2, qkm2 = filled(x, 1.0), x
    pkm1, qkm1 = core.add(x, 1.0), core.mul(z, x)
    ans = core.div(pkm1, qkm1)
    converged = core.ne(x, x)
    for step in range(1, FRACTION_STEPS + 1):
        y, z = core.add(y, 1.0), core.add(z, 2.0)
        yc = core.mul(y, float(step))
        pk = core.sub(core.mul(pkm1, z), core.mul(pkm2, yc))
        qk = core.sub(core.mul(qkm1, z), core.mul(qkm2, yc))
        nonzero = core.ne(qk, 0.0)
        r = core.div(pk, core.where(nonzero, qk, 1.0))
        change = core.where(nonzero, core.abs(core.div(core.sub(ans, r), r)), 1.0)
        ans = core.where(nonzero, r, ans)
        scale = core.where(core.gt(core.abs(pk), eps.big), 1.0 / eps.big, 1.0)
        pkm2, pkm1 = core.mul(pkm1, scale), core.mul(pk, scale)
        qkm2, qkm1 = core.mul(qkm1, scale), core.mul(qk, scale)
        converged = core.logical_or(converged, core.le(change, 4 * eps.machep))
    value = core.where(core.eq(prefactor, 0.0), 0.0, core.mul(ans, prefactor))
    return _Branch(value, converged)


def _asymptotic_regime(a: Tensor, x: Tensor) -> Tensor:
    """Math.h's test for the expansion: 20 < a < 200 with |x - a| / a < 0.3, or a > 200
    with |x - a| / a < 4.5 / sqrt(a)."""
    distance = core.div(core.abs(core.sub(x, a)), a)
    moderate = core.logical_and(core.logical_and(core.gt(a, 20.0), core.lt(a, 200.0)),
                                core.lt(distance, 0.3))
    large = core.logical_and(core.gt(a, 200.0),
                             core.lt(distance, core.div(4.5, core.sqrt(a))))
    return core.logical_or(moderate, large)


def _asymptotic(a: Tensor, x: Tensor, lower: bool, eps: _Precision) -> Tensor:
    """Temme's uniform expansion (DLMF 8.12.3/8.12.4): erfc in eta plus a series in 1 / a,
    stopped where its terms start to grow or fall below epsilon (masks over the rows)."""
    sign = -1.0 if lower else 1.0
    sigma = core.div(core.sub(x, a), a)
    magnitude = core.sqrt(core.mul(core.sub(log1p(sigma), sigma), -2.0))
    eta = core.where(core.gt(x, a), magnitude, core.where(core.lt(x, a), core.neg(magnitude),
                                                          0.0))
    value = core.mul(erfc(core.mul(eta, core.mul(core.sqrt(core.div(a, 2.0)), sign))), 0.5)
    total, afac = filled(a, 0.0), filled(a, 1.0)
    previous, stopped = filled(a, float("inf")), core.ne(a, a)
    for row in _ASYMPTOTIC_D:
        term = core.mul(horner(eta, row[::-1]), afac)
        size = core.abs(term)
        stopped = core.logical_or(stopped, core.gt(size, previous))
        total = core.where(stopped, total, core.add(total, term))
        stopped = core.logical_or(stopped, core.lt(size, core.mul(core.abs(total), eps.machep)))
        previous, afac = size, core.div(afac, a)
    weight = core.div(core.exp(core.mul(core.mul(a, core.mul(eta, eta)), -0.5)),
                      core.sqrt(core.mul(a, 2 * math.pi)))
    return core.add(value, core.mul(core.mul(weight, total), sign))


def _edges(a: Tensor, x: Tensor, lower: bool) -> tuple[Tensor, Tensor]:
    """(decided, value) for Math.h's boundary cases, in its order: NaN for a or x < 0; at
    a = 0, P = 1 (Q = 0) for x > 0, else NaN; at x = 0, P = 0; at a = inf, NaN for x = inf,
    else P = 0; at x = inf, P = 1; NaN for a NaN operand. Q is 1 - P in each."""
    inf, nan = float("inf"), float("nan")
    p_value = core.where(core.eq(x, inf), 1.0, nan)  # each test below overrides the last
    p_value = core.where(core.eq(a, inf), core.where(core.eq(x, inf), nan, 0.0), p_value)
    p_value = core.where(core.eq(x, 0.0), 0.0, p_value)
    p_value = core.where(core.eq(a, 0.0), core.where(core.gt(x, 0.0), 1.0, nan), p_value)
    negative = core.logical_or(core.lt(x, 0.0), core.lt(a, 0.0))
    p_value = core.where(negative, nan, p_value)
    unordered = core.logical_or(core.isnan(a), core.isnan(x))  # NaN, as the loops give
    decided = core.logical_or(core.logical_or(negative, unordered), core.logical_or(
        core.logical_or(core.eq(a, 0.0), core.eq(x, 0.0)),
        core.logical_or(core.eq(a, inf), core.eq(x, inf))))
    return decided, p_value if lower else core.sub(1.0, p_value)


_LANCZOS_NUM = (  # Math.h's lanczos_sum_expg_scaled_num, highest power first
    0.006061842346248906525783753964555936883222, 0.5098416655656676188125178644804694509993,
    19.51992788247617482847860966235652136208, 449.9445569063168119446858607650988409623,
    6955.999602515376140356310115515198987526, 75999.29304014542649875303443598909137092,
    601859.6171681098786670226533699352302507, 3481712.15498064590882071018964774556468,
    14605578.08768506808414169982791359218571, 43338889.32467613834773723740590533316085,
    86363131.28813859145546927288977868422342, 103794043.1163445451906271053616070238554,
    56906521.91347156388090791033559122686859)
_LANCZOS_DEN = (1.0, 66.0, 1925.0, 32670.0, 357423.0, 2637558.0, 13339535.0, 45995730.0,
                105258076.0, 150917976.0, 120543840.0, 39916800.0, 0.0)

_ASYMPTOTIC_D = (  # Math.h's d[k][n] for k < 6, n while |d[k][n]| 0.37^n / 20^k > 1e-12
    (-0.3333333333333333, 0.08333333333333333, -0.014814814814814815, 0.0011574074074074073,
     0.0003527336860670194, -0.0001787551440329218, 3.919263178522438e-05,
     -2.1854485106799924e-06, -1.85406221071516e-06, 8.296711340953087e-07,
     -1.7665952736826078e-07),
    (-0.001851851851851852, -0.003472222222222222, 0.0026455026455026454,
     -0.0009902263374485596, 0.00020576131687242798, -4.018775720164609e-07,
     -1.8098550334489977e-05, 7.64916091608111e-06, -1.6120900894563446e-06),
    (0.004133597883597883, -0.0026813271604938273, 0.0007716049382716049,
     2.0093878600823047e-06, -0.00010736653226365161, 5.2923448829120125e-05,
     -1.2760635188618728e-05, 3.423578734096138e-08, 1.3721957309062932e-06),
    (0.0006494341563786008, 0.00022947209362139917, -0.0004691894943952557,
     0.00026772063206283885, -7.561801671883977e-05, -2.396505113867297e-07,
     1.1082654115347302e-05),
    (-0.0008618882909167117, 0.0007840392217200666, -0.0002990724803031902,
     -1.4638452578843418e-06, 6.641498215465122e-05, -3.968365047179435e-05),
    (-0.00033679855336635813, -6.972813758365858e-05, 0.0002772753244959392,
     -0.00019932570516188847),
)
