"""The Bunch-Kaufman LDL^T composition (tdag/ops/linalg/ldl.py) against torch.linalg's
(MKL's sytrf / sytrs) on batches that pivot differently matrix by matrix: random symmetric
matrices (most take 2x2 blocks), diagonally dominant ones (1x1 only), zero diagonals (2x2
forced), exact zero columns (info > 0), small integers (ties in the column maxima).

Tolerances: pivots and info exactly equal; LD within 1e-5 of its scale (the same operations
in the same order: equal bits on every matrix tried so far, float32 and float64); the solve
within 1e-5 of the solution's scale (1e-4 for float32 2x2 blocks, whose conditioning is up to
(1 + alpha) / (1 - alpha) worse).
"""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag.ops import linalg
from tdag.ops.linalg.ldl import SHRINK

BATCH = 24


def _factor_program(n: int, dtype: str) -> tdag.Program:
    def factor(a):
        out = linalg.ldl_factor(a)
        return out.ld, out.pivots, out.info
    return tdag.trace(factor, tdag.TensorSpec((BATCH, n, n), dtype))


def _mixed(n: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A batch of BATCH matrices, a quarter of each kind; the upper triangle is noise (only
    the lower one is read)."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(BATCH, n, n, generator=gen, dtype=dtype)
    a[6:12] += 2 * n * torch.eye(n, dtype=dtype)  # diagonally dominant
    a[12:18, range(n), range(n)] = 0.0  # zero diagonal
    a[18:21] = (3 * a[18:21]).round()  # small integers: ties
    if n > 1:
        a[21:, :, n // 2] = 0.0  # a zero column: singular, info > 0
        a[21:, n // 2, :] = 0.0
    else:
        a[21:] = 0.0
    return a


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 13])
def test_ldl_factor_matches_torch(n, dtype):
    a = _mixed(n, getattr(torch, dtype), seed=n)
    ld, pivots, info = tdag.run(_factor_program(n, dtype), a)
    want = torch.linalg.ldl_factor_ex(a)
    assert torch.equal(pivots, want.pivots) and torch.equal(info, want.info)
    scale = max(want.LD.abs().max().item(), 1.0)
    torch.testing.assert_close(ld, want.LD, rtol=0, atol=1e-5 * scale)
    if n > 2:  # every kind of step was taken
        assert (want.pivots < 0).any() and (info > 0).any()
        assert (want.pivots > torch.arange(1, n + 1, dtype=torch.int32)).any()
    if n > SHRINK:  # a 2x2 block across the cut of the trailing block
        assert any(SHRINK - 1 in _two_by_two(p.tolist()) for p in want.pivots)


def _two_by_two(pivots: list[int]) -> list[int]:
    """The rows where LAPACK's pivots open a 2x2 block."""
    k, starts = 0, []
    while k < len(pivots):
        if pivots[k] < 0:
            starts.append(k)
        k += 2 if pivots[k] < 0 else 1
    return starts


def _solve_program(n: int, dtype: str, batch=(BATCH,)) -> tdag.Program:
    return tdag.trace(linalg.ldl_solve, tdag.TensorSpec((*batch, n, n), dtype),
                      tdag.TensorSpec((*batch, n), "int32"),
                      tdag.TensorSpec((BATCH, n, 3), dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [1, 4, 7])
def test_ldl_solve_reads_torch_factors(n, dtype):
    """Factors from torch (the pivots are data): 1x1 and 2x2 blocks, per matrix."""
    torch_dtype = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(n)
    a = torch.randn(BATCH, n, n, generator=gen, dtype=torch_dtype)
    a[12:, range(n), range(n)] = 0.0 if n > 1 else 1.0
    b = torch.randn(BATCH, n, 3, generator=gen, dtype=torch_dtype)
    ld, pivots, info = torch.linalg.ldl_factor_ex(a)
    assert not info.any()
    got = tdag.run(_solve_program(n, dtype), ld, pivots, b)
    want = torch.linalg.ldl_solve(ld, pivots, b)
    tol = 1e-4 if dtype == "float32" else 1e-5
    torch.testing.assert_close(got, want, rtol=0, atol=tol * want.abs().max().item())


def test_ldl_solve_takes_any_interchanges_and_broadcasts():
    """Pivots drawn at random (1x1 blocks, any row swapped in), one factorization for the
    whole batch of right-hand sides."""
    n = 5
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen, dtype=torch.float64) + 2 * n * torch.eye(n)
    ld = torch.linalg.ldl_factor(a).LD
    pivots = torch.randint(1, n + 1, (n,), generator=gen, dtype=torch.int32)
    b = torch.randn(BATCH, n, 3, generator=gen, dtype=torch.float64)
    got = tdag.run(_solve_program(n, "float64", batch=()), ld, pivots, b)
    torch.testing.assert_close(got, torch.linalg.ldl_solve(ld, pivots, b))


def test_a_symbolic_size_is_refused():
    with pytest.raises(tdag.ShapeError, match="static square matrices"):
        tdag.trace(lambda x: linalg.ldl_factor(x).ld, tdag.TensorSpec(("n", "n")))


def test_empty_matrices():
    ld, pivots, info = tdag.run(_factor_program(0, "float32"), torch.zeros(BATCH, 0, 0))
    assert ld.shape == (BATCH, 0, 0) and pivots.shape == (BATCH, 0) and not info.any()
