"""torch.special through from_torch on every target (tdag.run, to_torch, to_onnx on
onnxruntime, to_jax), against eager on inputs that cross every branch of torch's Math.h
(each side of the Chebyshev and rational pieces, the reflections, 0, +-inf, NaN).

Tolerances: rtol 1e-4 and atol 1e-5 of each output's largest finite value; torch's float32
kernels are themselves that far from the float64 values.
"""
from __future__ import annotations

import pytest
import torch

import tdag
from support.targets import assert_on_targets, capture, on_targets

EDGES = [0.0, -0.0, 1.0, -1.0, 2.0, 5.0, 8.0, 50.0, float("inf"), float("-inf"), float("nan")]


def _points(low, high, count=61, seed=0):
    torch.manual_seed(seed)
    return torch.cat([torch.linspace(low, high, count), (high - low) * torch.rand(20) + low,
                      torch.tensor(EDGES)])


UNARY = [torch.special.i0, torch.special.i0e, torch.special.i1, torch.special.i1e,
         torch.special.modified_bessel_i0, torch.special.modified_bessel_i1,
         torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
         torch.special.scaled_modified_bessel_k0, torch.special.scaled_modified_bessel_k1,
         torch.special.bessel_j0, torch.special.bessel_j1, torch.special.bessel_y0,
         torch.special.bessel_y1, torch.special.spherical_bessel_j0, torch.lgamma,
         torch.digamma, torch.special.erfcx, torch.special.log_ndtr, torch.special.airy_ai,
         lambda x: torch.polygamma(1, x), lambda x: torch.polygamma(3, x)]


def test_unary_special_functions_on_every_target():
    x = _points(-12.0, 30.0)
    assert_on_targets(lambda t: tuple(f(t) for f in UNARY), (x,))


def test_airy_ai_past_its_branches():
    """Ai on both sides of Math.h's cuts at +-2.09, 8.32 and 103.892; far out on the
    oscillating side, torch's float32 is itself 1.4e-5 from float64 (sin of a rounded
    phase): the tolerance there is that."""
    cuts = torch.tensor([-2.09, -2.0899, 2.0899, 2.09, 8.3203353, 103.892, 103.9, 120.0])
    assert_on_targets(torch.special.airy_ai, (torch.cat([cuts, torch.linspace(-3, 3, 41)]),))
    far = torch.linspace(-120.0, -12.0, 201)
    assert_on_targets(torch.special.airy_ai, (far,), atol=4e-5)


def test_ndtri_and_zeta_on_every_target():
    p = torch.cat([torch.rand(40), torch.tensor([0.0, 1.0, -0.5, 1.5, 1e-20, 0.9, 0.5])])
    x = torch.cat([torch.rand(40) * 8 + 1, torch.tensor([1.0, 0.5, 2.0, 3.0, 4.0, 2.5, 6.0])])
    q = torch.cat([torch.randn(40) * 4, torch.tensor([1.0, 1.0, -2.0, -2.5, 0.0, -1.5, 3.0])])
    assert_on_targets(lambda a, b, c: (torch.special.ndtri(a), torch.special.zeta(b, c)),
                      (p, x, q))


POLYNOMIALS = [getattr(torch.special, f"{family}_polynomial_{kind}")
               for family, kinds in [("chebyshev", "tuvw"), ("shifted_chebyshev", "tuvw"),
                                     ("hermite", ["h", "he"]), ("laguerre", "l"),
                                     ("legendre", "p")] for kind in kinds]


@pytest.mark.parametrize("poly", POLYNOMIALS, ids=lambda f: f.__name__)
def test_polynomials_of_a_tensor_degree(poly):
    """Degrees -1..12 (past torch's closed-form switch at 6 and 8) at points in and outside
    [-1, 1], the ends included."""
    torch.manual_seed(0)
    x = torch.cat([torch.linspace(-1.5, 1.5, 13), torch.tensor([-1.0, 0.0, 1.0, 0.5])])
    n = torch.randint(-1, 13, (x.numel(),)).float()
    assert_on_targets(poly, (x, n), targets=("run", "torch", "onnx"))


def test_polynomials_of_a_python_degree():
    x = torch.linspace(-1.2, 1.2, 9)
    assert_on_targets(lambda t: tuple(p(t, 7) for p in POLYNOMIALS), (x,),
                      targets=("run", "onnx"))


def test_a_degree_past_the_unrolled_steps_raises():
    """|x| > 1 at degree 70 has no closed form: refused at run time, not truncated."""
    x, n = torch.tensor([2.0]), torch.tensor([70.0])
    prog = capture(torch.special.legendre_polynomial_p, (x, torch.tensor([3.0])))
    with pytest.raises(tdag.TdagError, match="polynomial_degree_past_64"):
        tdag.run(prog, x, n)
    inside = torch.tensor([0.3])  # Chebyshev's closed form covers |x| < 1 at any degree
    prog = capture(torch.special.chebyshev_polynomial_t, (inside, n))
    got = on_targets(prog, (inside, n), ("run",))["run"][0]
    torch.testing.assert_close(got, torch.special.chebyshev_polynomial_t(inside, n))


def test_mvlgamma_refuses_what_torch_refuses():
    x = torch.tensor([3.0, 4.5])
    assert_on_targets(lambda t: torch.mvlgamma(t, 3), (x,), targets=("run", "onnx"))
    prog = capture(lambda t: torch.mvlgamma(t, 3), (x,))
    with pytest.raises(tdag.TdagError, match="mvlgamma"):
        tdag.run(prog, torch.tensor([0.5, 4.0]))


def _gamma_grid():
    """a and x over several decades (a in [1e-3, 1e4], x in [1e-4, 3e4]: every branch of
    Math.h's igamma, the asymptotic regime's edges included) and its boundary cases."""
    a, x = torch.meshgrid(torch.logspace(-3, 4, 36), torch.logspace(-4, 4.5, 40), indexing="ij")
    inf, nan = float("inf"), float("nan")
    edge_a = torch.tensor([0.0, 0.0, 1.0, 1.0, inf, inf, -1.0, 1.0, nan, 2.0, 25.0, 300.0])
    edge_x = torch.tensor([1.0, 0.0, 0.0, inf, inf, 2.0, 1.0, -1.0, 1.0, nan, 26.0, 310.0])
    return torch.cat([a.reshape(-1), edge_a]), torch.cat([x.reshape(-1), edge_x])


def test_incomplete_gamma_on_every_target():
    """igamma / igammac against eager: largest absolute error 1.1e-6 over this grid; relative
    1.2e-4 only where the value is ~1e-28, where torch's float32 is as far from float64."""
    a, x = _gamma_grid()
    assert_on_targets(lambda p, q: (torch.igamma(p, q), torch.special.gammaincc(p, q)), (a, x))


def test_incomplete_gamma_past_the_unrolled_series_raises():
    """a = 1e6 just outside the asymptotic regime needs ~2,000 series terms: refused at run
    time, not truncated."""
    a, x = torch.tensor([1e6]), torch.tensor([0.99e6])
    prog = capture(torch.igamma, (torch.tensor([2.0]), torch.tensor([1.0])))
    with pytest.raises(tdag.TdagError, match="igamma_needs_more_than_240_terms"):
        tdag.run(prog, a, x)
