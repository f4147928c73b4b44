"""The general eigenproblem's composition (tdag/ops/linalg/eig.py: Hessenberg reduction,
complex Wilkinson-shifted QR, triangular back-substitution) against torch.linalg.eig (LAPACK's
geev) on float32 batches of every kind the fixed iteration count must reach: random
matrices, complex conjugate pairs (rotations), symmetric, triangular, diagonal, zero,
repeated eigenvalues and the cyclic permutation (Wilkinson's shift stalls on it; the
exceptional shift breaks the cycle).

The order of the eigenvalues and the phase of the eigenvectors are implementation-defined
(torch's docs say so): values are matched to torch's by an assignment on |difference|, and
vectors are checked by what defines them, A V = V diag(L), unit 2-norm, largest entry real
and positive (geev's convention up to sign).

Tolerances, relative to the largest |eigenvalue| (or max |a_ij| for the residual): values
1e-5 (3e-5 for repeated eigenvalues, a cluster float32 splits by rounding); residual 1e-5;
norms 1e-5; float64 1e-12 for all three. A defective matrix (a Jordan block) gets its
m-fold eigenvalue to eps^(1/m) only, as LAPACK does.
"""
from __future__ import annotations

import pytest
import torch
from scipy.optimize import linear_sum_assignment

import tdag
from tdag import ops
from tdag.ops import linalg
from tdag.ops.linalg.eig import MAX_EIG

PER_KIND = 6


def _kinds(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """PER_KIND float32 n x n matrices of each kind."""
    def randn(*shape):
        return torch.randn(*shape, generator=gen)

    orthogonal = torch.linalg.qr(randn(PER_KIND, n, n))[0]
    repeated = torch.tensor([1.0] * (n // 2) + [-2.0] * (n - n // 2))
    return {
        "random": randn(PER_KIND, n, n),
        "rotation": orthogonal,  # every eigenvalue on the unit circle: complex pairs
        "symmetric": (lambda x: x + x.mT)(randn(PER_KIND, n, n)),
        "triangular": randn(PER_KIND, n, n).triu(),
        "diagonal": torch.diag_embed(randn(PER_KIND, n)),
        "zero": torch.zeros(PER_KIND, n, n),
        "repeated": orthogonal @ torch.diag_embed(repeated.expand(PER_KIND, n)) @ orthogonal.mT,
        "cyclic": torch.roll(torch.eye(n), 1, 0).expand(PER_KIND, n, n).contiguous(),
        "graded": randn(PER_KIND, n, n).triu(-1) * torch.logspace(-3, 3, n),  # non-normal
    }


def _run_eig(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dtype = "f64" if a.dtype == torch.float64 else "f32"
    prog = tdag.trace(lambda x: tuple(ops.view_as_real(y) for y in linalg.eig(x)),
                      tdag.TensorSpec(tuple(a.shape), dtype))
    values, vectors = tdag.run(prog, a)
    return torch.view_as_complex(values.contiguous()), torch.view_as_complex(vectors.contiguous())


def _value_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| over the best matching, relative to the largest |want|."""
    cost = (got.to(torch.complex128)[:, None] - want[None, :]).abs()
    rows, cols = linear_sum_assignment(cost.numpy())
    return cost[rows, cols].max().item() / max(want.abs().max().item(), 1e-30)


def _check(a: torch.Tensor, values: torch.Tensor, vectors: torch.Tensor, tol: float,
           vector_tol: float = 1e-5) -> None:
    want = torch.linalg.eigvals(a.double())
    ac, v = a.to(torch.complex128), vectors.to(torch.complex128)
    for b in range(a.shape[0]):
        assert _value_error(values[b], want[b]) <= tol, (b, values[b], want[b])
    scale = a.abs().amax((-2, -1)).clamp_min(1e-30)
    residual = (ac @ v - v * values.to(torch.complex128).unsqueeze(-2)).abs().amax((-2, -1))
    assert (residual / scale).max() <= vector_tol
    assert (v.abs().square().sum(-2) - 1).abs().max() <= vector_tol
    largest = v.abs() >= v.abs().amax(-2, keepdim=True) - 1e-5  # ties: the cyclic matrix
    assert (largest & (v.imag.abs() <= 1e-6) & (v.real > 0)).any(-2).all()


@pytest.fixture(scope="module", params=[6, 9])
def batch(request):
    """(n, the kinds, the composition's values and vectors on them all in one batch)."""
    n = request.param
    kinds = _kinds(n, torch.Generator().manual_seed(n))
    values, vectors = _run_eig(torch.cat(list(kinds.values())))
    return n, kinds, values, vectors


@pytest.mark.parametrize("kind", list(_kinds(3, torch.Generator())))
def test_eig_matches_lapack(batch, kind):
    n, kinds, values, vectors = batch
    index = list(kinds).index(kind) * PER_KIND
    part = slice(index, index + PER_KIND)
    _check(kinds[kind], values[part], vectors[part], 3e-5 if kind == "repeated" else 1e-5)


@pytest.mark.parametrize("n", [1, 2])
def test_eig_of_the_smallest_sizes(n):
    a = torch.randn(4, n, n, generator=torch.Generator().manual_seed(3))
    _check(a, *_run_eig(a), 1e-5)


def test_float64_to_its_own_precision():
    a = torch.randn(3, 6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    _check(a, *_run_eig(a), 1e-12, 1e-12)


def test_eigvals_alone_equal_eigs_values():
    a = torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(4))
    prog = tdag.trace(lambda x: ops.view_as_real(linalg.eigvals(x)), tdag.TensorSpec((3, 5, 5)))
    values = torch.view_as_complex(tdag.run(prog, a).contiguous())
    torch.testing.assert_close(values, _run_eig(a)[0], rtol=0, atol=1e-6)


def test_a_defective_matrix_gets_its_eigenvalue_to_the_square_root_of_eps():
    """A 2 x 2 Jordan block in a random basis: LAPACK, too, splits the double eigenvalue by
    about sqrt(eps)."""
    q = torch.linalg.qr(torch.randn(4, 4, generator=torch.Generator().manual_seed(5)))[0]
    jordan = torch.tensor([[2.0, 1.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0],
                           [0.0, 0.0, -1.0, 0.5], [0.0, 0.0, 0.0, 3.0]])
    a = (q @ jordan @ q.mT).unsqueeze(0)
    values, _ = _run_eig(a)
    assert _value_error(values[0], torch.linalg.eigvals(a.double())[0]) <= 1e-3


def test_an_infinite_or_nan_entry_raises_as_torch_does():
    prog = tdag.trace(lambda x: ops.view_as_real(linalg.eigvals(x)), tdag.TensorSpec((2, 3, 3)))
    for bad in (float("nan"), float("inf")):
        a = torch.randn(2, 3, 3)
        a[1, 0, 2] = bad
        with pytest.raises(tdag.TdagError, match="linalg_eig_finite"):
            tdag.run(prog, a)


def test_a_matrix_past_the_cap_is_refused():
    with pytest.raises(tdag.ShapeError, match=f"linalg.eig.*at most {MAX_EIG}"):
        tdag.trace(linalg.eig, tdag.TensorSpec((MAX_EIG + 1, MAX_EIG + 1)))


@pytest.mark.slow
def test_eig_at_the_cap():
    """The fixed iteration count at the largest n it is allowed: 4 x PER_KIND of each kind."""
    kinds = _kinds(MAX_EIG, torch.Generator().manual_seed(7))
    for kind, a in kinds.items():
        _check(a, *_run_eig(a), 3e-5 if kind == "repeated" else 1e-5)


def test_real_eigenvalues_and_their_vectors_come_out_real():
    """geev works in real arithmetic, so a real eigenvalue's imaginary part is exactly 0 and
    its eigenvector is real: the composition's rounding-sized imaginary parts are dropped."""
    gen = torch.Generator().manual_seed(3)
    a = torch.cat([torch.randn(8, 6, 6, generator=gen),
                   (lambda x: x + x.mT)(torch.randn(4, 6, 6, generator=gen))])
    values, vectors = _run_eig(a)
    want = torch.linalg.eigvals(a)
    for b in range(a.shape[0]):
        cost = (values[b][:, None] - want[b][None, :]).abs()
        rows, cols = linear_sum_assignment(cost.numpy())
        real = want[b][cols].imag == 0
        assert torch.equal(values[b][rows].imag == 0, real), (b, values[b], want[b])
        assert (vectors[b][:, rows[real.numpy()]].imag == 0).all(), b
    _check(a, values, vectors, 1e-5)
