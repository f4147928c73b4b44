"""torch.linalg.ldl_factor(_ex) / ldl_solve through from_torch: one kernel each, LAPACK's
sytrf / sytrs on tdag.run and to_torch (the same LD, pivots and info as eager, 2x2 pivot
blocks included); a singular D raises where torch raises; to_onnx and to_jax refuse them by
name (Bunch-Kaufman picks its blocks by value: no composition; JAX has no LDL^T).

Tolerances: exact (the same LAPACK call as eager).
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


def test_onnx_and_jax_refuse_ldl_by_name():
    a, b = torch.eye(4) * 2, torch.randn(4, 2)
    prog = capture(_factor_and_solve, (a, b))
    with pytest.raises(tdag.UnsupportedOpError, match="linalg_ldl_factor"):
        tdag.to_onnx(prog)
    with pytest.raises(tdag.UnsupportedOpError, match="linalg_ldl_factor"):
        on_targets(prog, (a, b), ("jax",))
