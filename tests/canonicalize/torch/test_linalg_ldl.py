"""torch.linalg.ldl_factor(_ex) / ldl_solve through from_torch: one kernel each, LAPACK's
sytrf / sytrs on tdag.run and to_torch (the same LD, pivots and info as eager, 2x2 pivot
blocks included), the unrolled Bunch-Kaufman composition on onnxruntime; a singular D raises
where torch raises; to_jax refuses them by name (JAX has no LDL^T). The composition itself
against torch on many matrices: tests/ops/test_linalg_ldl.py.

Tolerances: exact on tdag.run and to_torch (the same LAPACK call as eager); on onnxruntime
pivots and info exact, LD and the solution within 1e-4 of their scale.
"""
from __future__ import annotations

import pytest
import torch

import tdag
from support.targets import capture, on_targets


def _factor_and_solve(a, b):
    ld, pivots, info = torch.linalg.ldl_factor_ex(a)
    return ld, pivots, info, torch.linalg.ldl_solve(ld, pivots, b)


def test_ldl_factor_and_solve_match_eager():
    """An indefinite batch, whose pivots include 2x2 blocks (negative entries)."""
    torch.manual_seed(0)
    a = torch.randn(3, 5, 5)
    a = a + a.mT
    b = torch.randn(3, 5, 2)
    want = _factor_and_solve(a, b)
    assert (want[1] < 0).any()
    got = on_targets(capture(_factor_and_solve, (a, b)), (a, b), ("run", "torch"))
    for target, outs in got.items():
        for g, w in zip(outs, want):
            assert g.dtype == w.dtype and torch.equal(g, w), target
    torch.testing.assert_close(a @ want[3], b, rtol=1e-4, atol=1e-4)


def test_a_singular_ldl_factor_raises_where_torch_raises():
    a = torch.eye(4)
    prog = capture(torch.linalg.ldl_factor, (a,))
    torch.testing.assert_close(tdag.run(prog, a)[0], torch.linalg.ldl_factor(a)[0])
    with pytest.raises(RuntimeError):
        torch.linalg.ldl_factor(torch.zeros(4, 4))
    with pytest.raises(tdag.TdagError, match="linalg_ldl_factor_singular"):
        tdag.run(prog, torch.zeros(4, 4))


def test_onnx_runs_the_composition():
    """An indefinite batch whose matrices pivot differently, hermitian=True as well (the
    same sytrf for real matrices)."""
    torch.manual_seed(1)
    a = torch.randn(4, 5, 5)
    a[2:, range(5), range(5)] = 0.0  # zero diagonals: 2x2 blocks
    b = torch.randn(4, 5, 2)
    want = _factor_and_solve(a, b)
    outs = on_targets(capture(_factor_and_solve, (a, b)), (a, b), ("onnx",))["onnx"]
    for got, ref in zip(outs, want):
        assert got.dtype == ref.dtype
        if ref.is_floating_point():
            scale = ref.abs().max().item()
            torch.testing.assert_close(got, ref, rtol=0, atol=1e-4 * scale)
        else:
            assert torch.equal(got, ref)
    hermitian = capture(lambda x: torch.linalg.ldl_factor(x, hermitian=True), (a[:2],))
    for got, ref in zip(on_targets(hermitian, (a[:2],), ("onnx",))["onnx"],
                        torch.linalg.ldl_factor(a[:2], hermitian=True)):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def test_a_singular_ldl_factor_raises_on_onnx():
    prog = capture(torch.linalg.ldl_factor, (torch.eye(3),))
    with pytest.raises(Exception):  # ConstantOfShape refuses the -1 of the failed check
        on_targets(prog, (torch.zeros(3, 3),), ("onnx",))


def test_jax_refuses_ldl_by_name():
    a, b = torch.eye(4) * 2, torch.randn(4, 2)
    prog = capture(_factor_and_solve, (a, b))
    with pytest.raises(tdag.UnsupportedOpError, match="linalg_ldl_factor"):
        on_targets(prog, (a, b), ("jax",))
