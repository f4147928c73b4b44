"""The Airy function Ai(x) (torch.special.airy_ai) as torch evaluates it (ATen/native/Math.h,
after Cephes' airy): the Maclaurin series of its two solutions below |x| < 2.09, Cephes'
rational fits of the asymptotic forms beyond (an oscillating one for x < -2.09, a decaying
one for x >= 2.09), each evaluated on every element and selected with where. torch sums the
series to epsilon; here it is SERIES_TERMS terms, past where |x|^3 <= 9.2 makes them
vanish (the 8th is below 1e-16), as a cumulative product along a new axis."""
from __future__ import annotations

import math

from tdag.ops import core, creation
from tdag.ops.scans import cumprod
from tdag.ops.special.series import horner
from tdag.ops.tensor import Tensor

SERIES_TERMS = 12
_ISQRT_PI = 5.64189583547756286948e-01
_C1, _C2 = 0.355028053887817239260, 0.258819403792806798405  # Ai(0), -Ai'(0)


def airy_ai(x: Tensor) -> Tensor:
    """Ai(x); NaN at +-inf and 0 past x > 103.892, as torch."""
    value = core.where(core.lt(x, -2.09), _oscillating(x),
                       core.where(core.ge(x, 2.09), _decaying(x), _maclaurin(x)))
    value = core.where(core.gt(x, 103.892), 0.0, value)
    return core.where(core.eq(core.abs(x), float("inf")), float("nan"), value)


def _maclaurin(x: Tensor) -> Tensor:
    """c1 f(x) - c2 g(x), f = sum_k 3^k (1/3)_k x^3k / (3k)!, g likewise from x: the terms
    as Math.h forms them, f's k-th from the last by z / ((3k - 1) 3k), g's by z / (3k (3k + 1)),
    z = x^3."""
    k = creation.arange(1.0, SERIES_TERMS + 1.0, dtype=x.dtype, like=x)
    z = core.unsqueeze(core.mul(core.mul(x, x), x), -1)
    f_terms = cumprod(core.div(z, core.mul(core.sub(core.mul(k, 3.0), 1.0), core.mul(k, 3.0))), -1)
    g_terms = cumprod(core.div(z, core.mul(core.mul(k, 3.0), core.add(core.mul(k, 3.0), 1.0))),
                      -1)
    f = core.add(core.sum(f_terms, -1), 1.0)
    g = core.mul(core.add(core.sum(g_terms, -1), 1.0), x)
    return core.sub(core.mul(f, _C1), core.mul(g, _C2))


def _oscillating(x: Tensor) -> Tensor:
    """x < -2.09: (sin t (1 + z^2 F(z^2)) - cos t z G(z^2)) / (sqrt(pi) (-x)^(1/4)),
    t = 2/3 (-x)^(3/2) + pi/4, z = 1 / (2/3 (-x)^(3/2)); the operations in Math.h's order,
    so that t rounds as torch's does (sin of a large t is that rounding's)."""
    root = core.sqrt(core.neg(x))
    phase = core.div(core.mul(core.mul(x, -2.0), root), 3.0)
    z = core.div(1.0, phase)
    zz = core.mul(z, z)
    f = core.div(core.mul(zz, horner(zz, _AFN)), horner(zz, _AFD))
    g = core.div(core.mul(z, horner(zz, _AGN)), horner(zz, _AGD))
    t = core.add(phase, 0.25 * math.pi)
    wave = core.sub(core.mul(core.sin(t), core.add(f, 1.0)), core.mul(core.cos(t), g))
    return core.mul(core.div(_ISQRT_PI, core.sqrt(root)), wave)


def _decaying(x: Tensor) -> Tensor:
    """x >= 2.09: A(1/zeta) / (2 sqrt(pi) x^(1/4) e^zeta), zeta = 2/3 x^(3/2)."""
    zeta = core.div(core.mul(core.mul(x, 2.0), core.sqrt(x)), 3.0)
    inverse = core.div(1.0, zeta)
    ratio = core.div(horner(inverse, _AN), horner(inverse, _AD))
    return core.div(core.mul(ratio, _ISQRT_PI),
                    core.mul(core.mul(core.sqrt(core.sqrt(x)), 2.0), core.exp(zeta)))


# Math.h's coefficient arrays for airy_ai, highest power first
_AN = (
    3.46538101525629032477e-01, 1.20075952739645805542e+01, 7.62796053615234516538e+01,
    1.68089224934630576269e+02, 1.59756391350164413639e+02, 7.05360906840444183113e+01,
    1.40264691163389668864e+01, 9.99999999999999995305e-01)
_AD = (
    5.67594532638770212846e-01, 1.47562562584847203173e+01, 8.45138970141474626562e+01,
    1.77318088145400459522e+02, 1.64234692871529701831e+02, 7.14778400825575695274e+01,
    1.40959135607834029598e+01, 1.00000000000000000470e+00)
_AFN = (
    -1.31696323418331795333e-01, -6.26456544431912369773e-01, -6.93158036036933542233e-01,
    -2.79779981545119124951e-01, -4.91900132609500318020e-02, -4.06265923594885404393e-03,
    -1.59276496239262096340e-04, -2.77649108155232920844e-06, -1.67787698489114633780e-08)
_AFD = (
    1.33560420706553243746e+01, 3.26825032795224613948e+01, 2.67367040941499554804e+01,
    9.18707402907259625840e+00, 1.47529146771666414581e+00, 1.15687173795188044134e-01,
    4.40291641615211203805e-03, 7.54720348287414296618e-05, 4.51850092970580378464e-07)
_AGN = (
    1.97339932091685679179e-02, 3.91103029615688277255e-01, 1.06579897599595591108e+00,
    9.39169229816650230044e-01, 3.51465656105547619242e-01, 6.33888919628925490927e-02,
    5.85804113048388458567e-03, 2.82851600836737019778e-04, 6.98793669997260967291e-06,
    8.11789239554389293311e-08, 3.41551784765923618484e-10)
_AGD = (
    9.30892908077441974853e+00, 1.98352928718312140417e+01, 1.55646628932864612953e+01,
    5.47686069422975497931e+00, 9.54293611618961883998e-01, 8.64580826352392193095e-02,
    4.12656523824222607191e-03, 1.01259085116509135510e-04, 1.17166733214413521882e-06,
    4.91834570062930015649e-09)
