"""torch.special's functions (and the gamma family of torch's namespace) over
tdag.ops.special's compositions, which evaluate the series torch's Math.h evaluates."""
from __future__ import annotations

import math

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.ops.special import airy, bessel, gamma, incomplete_gamma, normal, polynomials
from tdag.ops.promotion import result_dtype
from tdag.ops.tensor import Tensor


def _float(x):
    """Integer and bool inputs compute in float32, as torch promotes them."""
    return x if x.dtype.is_float else ops.cast(x, "f32")


def _unary(fn):
    return lambda x: fn(_float(x))


for _names, _fn in [
    (("i0", "special_i0"), bessel.i0), (("special_i0e",), bessel.i0e),
    (("special_i1",), bessel.i1), (("special_i1e",), bessel.i1e),
    (("special_modified_bessel_i0",), bessel.modified_i0),
    (("special_modified_bessel_i1",), bessel.modified_i1),
    (("special_modified_bessel_k0",), bessel.modified_k0),
    (("special_modified_bessel_k1",), bessel.modified_k1),
    (("special_scaled_modified_bessel_k0",), bessel.scaled_modified_k0),
    (("special_scaled_modified_bessel_k1",), bessel.scaled_modified_k1),
    (("special_bessel_j0",), bessel.j0), (("special_bessel_j1",), bessel.j1),
    (("special_bessel_y0",), bessel.y0), (("special_bessel_y1",), bessel.y1),
    (("special_spherical_bessel_j0",), bessel.spherical_j0),
    (("lgamma.default", "special_gammaln"), gamma.lgamma),
    (("digamma", "special_digamma", "special_psi"), gamma.digamma),
    (("special_erfcx",), normal.erfcx), (("special_ndtri",), normal.ndtri),
    (("special_log_ndtr",), normal.log_ndtr), (("special_airy_ai",), airy.airy_ai),
]:
    aten(*_names)(_unary(_fn))


@aten("polygamma")
def polygamma(n, x):
    return gamma.polygamma(int(n), _float(x))


@aten("special_polygamma")
def special_polygamma(n, x):
    return gamma.polygamma(int(n), _float(x))


@aten("mvlgamma", "special_multigammaln")
def mvlgamma(x, p):
    return gamma.mvlgamma(_float(x), int(p))


@aten("special_zeta")
def zeta(x, q):
    x, q = _pair(x, q)
    return gamma.zeta(x, q)


@aten("igamma", "special_gammainc")
def igamma(a, x):
    return incomplete_gamma.igamma(*_promoted(a, x))


@aten("igammac", "special_gammaincc")
def igammac(a, x):
    return incomplete_gamma.igammac(*_promoted(a, x))


def _promoted(a, x):
    """a and x as float tensors of torch's promoted dtype (f32 and f64 give f64)."""
    a, x = _pair(a, x)
    dtype = result_dtype(a, x)
    return ops.cast(a, dtype), ops.cast(x, dtype)


def _pair(a, b):
    """Two operands as float tensors, a Python scalar made a constant like the other."""
    like = a if isinstance(a, Tensor) else b
    a, b = (_float(v) if isinstance(v, Tensor) else ops.full((), float(v), "f32", like=like)
            for v in (a, b))
    return a, b


def _degree(n):
    """A Python degree as torch casts it (truncated); a tensor stays a tensor."""
    if isinstance(n, Tensor):
        return n
    return int(n) if math.isfinite(n) else -1


def _polynomial(names, fn):
    def entry(x, n):
        if not isinstance(x, Tensor):
            x = ops.full((), float(x), "f32", like=n)
        return fn(_float(x), _degree(n))
    aten(*names)(entry)


for _kind in "tuvw":
    _polynomial((f"special_chebyshev_polynomial_{_kind}",),
                lambda x, n, k=_kind: polynomials.chebyshev(x, n, k))
    _polynomial((f"special_shifted_chebyshev_polynomial_{_kind}",),
                lambda x, n, k=_kind: polynomials.shifted_chebyshev(x, n, k))
_polynomial(("special_hermite_polynomial_h",), polynomials.hermite_h)
_polynomial(("special_hermite_polynomial_he",), polynomials.hermite_he)
_polynomial(("special_laguerre_polynomial_l",), polynomials.laguerre)
_polynomial(("special_legendre_polynomial_p",), polynomials.legendre)
