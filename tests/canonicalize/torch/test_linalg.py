"""torch.linalg through from_torch on every target (tdag.run, to_torch, to_onnx on
onnxruntime, to_jax), against eager on random matrices: LU and what reads it, triangular
solves, Cholesky, Householder QR, the matrix exponential, eigh and SVD (kernels on torch and
JAX, Jacobi compositions on ONNX); and the bad input torch refuses (a singular inv, solve or
cholesky raises, the _ex ops return their info, NaN stays NaN). The kernels themselves:
tests/lower/test_linalg_kernels.py.

Tolerances: 1e-4 relative (of the output's scale) for the direct factorizations of
well-conditioned 4x4 and 5x5 float32 matrices, 1e-3 for matrix_exp; Jacobi's 10 sweeps give
eigenvalues within 1e-5 of the largest on random and cond-1e6 matrices.
"""
from __future__ import annotations

import pytest
import torch

import tdag
from support.targets import assert_on_targets, capture, on_targets


def _matrix(*shape, seed=0):
    torch.manual_seed(seed)
    return torch.randn(*shape)


def _spd(n, batch=(2,), seed=0):
    a = _matrix(*batch, n, n, seed=seed)
    return a @ a.mT + n * torch.eye(n)


def _column_signs(outs):
    """Eigen/singular vectors are unique up to a column's sign: largest entry positive."""
    def fix(x):
        top = torch.gather(x, -2, x.abs().argmax(-2, keepdim=True))
        return x * torch.where(top < 0, -1.0, 1.0)
    return tuple(fix(o) if o.ndim >= 2 else o for o in outs)


A = _matrix(2, 4, 4)
B = _matrix(2, 4, 3, seed=1)
CASES = {
    "det": (torch.linalg.det, (A,)),
    "slogdet": (torch.linalg.slogdet, (A,)),
    "logdet": (torch.logdet, (_spd(4),)),
    "inv": (torch.linalg.inv, (A,)),
    "inv_ex": (torch.linalg.inv_ex, (A,)),
    "solve": (torch.linalg.solve, (A, B)),
    "solve_vector": (lambda a, b: torch.linalg.solve(a, b[..., 0]), (A, B)),
    "solve_right": (lambda a, b: torch.linalg.solve(a, b.mT, left=False), (A, B)),
    "lu_factor": (torch.linalg.lu_factor, (A,)),
    "lu_rectangular": (torch.linalg.lu, (_matrix(3, 5, seed=2),)),
    "lu_tall": (torch.linalg.lu, (_matrix(5, 3, seed=2),)),
    "lu_solve": (lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b), (A, B)),
    "lu_solve_adjoint": (lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b,
                                                            adjoint=True), (A, B)),
    "solve_triangular": (lambda a, b: torch.linalg.solve_triangular(a, b, upper=True), (A, B)),
    "solve_triangular_unit_right": (lambda a, b: torch.linalg.solve_triangular(
        a, b.mT, upper=False, left=False, unitriangular=True), (A, B)),
    "triangular_solve": (lambda a, b: torch.triangular_solve(b, a, upper=False,
                                                             transpose=True), (A, B)),
    "cholesky": (torch.linalg.cholesky, (_spd(4),)),
    "cholesky_upper": (lambda a: torch.linalg.cholesky(a, upper=True), (_spd(4),)),
    "cholesky_solve": (lambda a, b: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
                       (_spd(4), B)),
    "cholesky_inverse": (lambda a: torch.cholesky_inverse(torch.linalg.cholesky(a)),
                         (_spd(4),)),
    "qr": (torch.linalg.qr, (_matrix(2, 5, 3),)),
    "qr_complete": (lambda a: torch.linalg.qr(a, mode="complete"), (_matrix(5, 3),)),
    "qr_wide": (torch.linalg.qr, (_matrix(3, 5),)),
    "matrix_exp": (torch.linalg.matrix_exp, (_matrix(2, 4, 4) * 3,)),
    "geqrf": (torch.geqrf, (_matrix(5, 3),)),
    "householder_product": (lambda a: torch.linalg.householder_product(*torch.geqrf(a)),
                            (_matrix(5, 3),)),
    "ormqr": (lambda a, c: torch.ormqr(*torch.geqrf(a), c, left=False, transpose=True),
              (_matrix(4, 3), _matrix(2, 4, seed=1))),
    "eigvalsh": (torch.linalg.eigvalsh, (_spd(4),)),
    "svdvals": (torch.linalg.svdvals, (_matrix(2, 5, 3),)),
    "pinv": (torch.linalg.pinv, (_matrix(5, 3),)),
    "tensorinv": (lambda a: torch.linalg.tensorinv(a.reshape(4, 2, 2), ind=1), (A[0],)),
}


FAST = ("det", "inv_ex", "lu_rectangular", "qr", "solve", "cholesky_solve")


@pytest.mark.parametrize("name", FAST)
def test_linalg_matches_eager_on_every_target(name):
    fn, args = CASES[name]
    assert_on_targets(fn, args)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(CASES) - set(FAST)))
def test_linalg_matches_eager_on_every_target_all(name):
    """The whole table (~40 s on two loaded cores: JAX compiles the unrolled LU)."""
    fn, args = CASES[name]
    assert_on_targets(fn, args, rtol=1e-3 if name == "matrix_exp" else 1e-4)


@pytest.mark.parametrize("name", ["matrix_exp", "eigvalsh", "solve_triangular_unit_right",
                                  "triangular_solve", "lu_solve_adjoint", "pinv", "ormqr"])
def test_linalg_matches_eager_through_run_and_onnx(name):
    fn, args = CASES[name]
    assert_on_targets(fn, args, rtol=1e-3 if name == "matrix_exp" else 1e-4,
                      targets=("run", "onnx"))


SVD = lambda x: torch.linalg.svd(x, full_matrices=False)  # noqa: E731


@pytest.mark.parametrize("fn", [torch.linalg.eigh, SVD], ids=["eigh", "svd"])
def test_vectors_match_up_to_sign(fn):
    a = _spd(4) if fn is torch.linalg.eigh else _matrix(2, 5, 4)
    normalize = _column_signs if fn is torch.linalg.eigh else _svd_signs
    assert_on_targets(fn, (a,), normalize=normalize, targets=("run", "onnx"))


def _svd_signs(outs):
    """U's columns and V^T's rows flip together: fix U's signs, carry them to V^T."""
    u, s, vh = outs
    top = torch.gather(u, -2, u.abs().argmax(-2, keepdim=True))
    flip = torch.where(top < 0, -1.0, 1.0)
    return u * flip, s, vh * flip.mT


def test_jacobi_eigenvalues_of_an_ill_conditioned_matrix():
    """cond 1e6: the eigenvalues within 1e-5 of the largest, the vectors orthonormal to 1e-5."""
    q, _ = torch.linalg.qr(_matrix(6, 6, seed=3).double())
    a = (q @ torch.diag(torch.logspace(-6, 0, 6).double()) @ q.T).float()
    prog = capture(torch.linalg.eigh, (a,))
    values, vectors = tdag.run(prog, a)
    assert (values - torch.linalg.eigvalsh(a)).abs().max() < 1e-5
    assert (vectors.mT @ vectors - torch.eye(6)).abs().max() < 1e-5


@pytest.mark.parametrize("fn", [torch.linalg.inv, torch.linalg.cholesky,
                                lambda a: torch.linalg.solve(a, a[..., :1])],
                         ids=["inv", "cholesky", "solve"])
def test_a_singular_matrix_raises_on_every_target(fn):
    """tdag.run raises tdag's error naming the kernel, the torch module torch.linalg's own
    error, onnxruntime the composition's run-time check."""
    singular = torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    prog = capture(fn, (torch.eye(2),))
    with pytest.raises(tdag.TdagError, match="linalg_(inv|cholesky|solve)"):
        tdag.run(prog, singular)
    with pytest.raises(torch.linalg.LinAlgError):
        on_targets(prog, (singular,), ("torch",))
    with pytest.raises(Exception):  # ConstantOfShape refuses the -1 of the failed check
        on_targets(prog, (singular,), ("onnx",))
    assert torch.equal(on_targets(prog, (torch.eye(2),), ("torch",))["torch"][0],
                       fn(torch.eye(2)))


@pytest.mark.parametrize("fn", [torch.linalg.inv_ex, torch.linalg.cholesky_ex],
                         ids=["inv_ex", "cholesky_ex"])
def test_the_ex_ops_return_the_info_of_a_singular_matrix(fn):
    singular = torch.tensor([[[1.0, 2.0], [2.0, 4.0]], [[2.0, 0.0], [0.0, 1.0]]])
    prog = capture(fn, (singular,))
    for target, (_, info) in on_targets(prog, (singular,)).items():
        assert info.tolist() == fn(singular).info.tolist(), target


def test_nan_stays_nan():
    a = _matrix(3, 3)
    a[1, 1] = float("nan")
    assert_on_targets(torch.linalg.det, (a,), targets=("run", "onnx"))


def test_a_symbolic_size_is_refused():
    spec = tdag.TensorSpec(("n", "n"))
    with pytest.raises(tdag.ShapeError, match="static square matrices"):
        tdag.trace(lambda x: tdag.ops.linalg.inv(x), spec)


def test_nonzero_of_a_scalar_keeps_torch_shape_on_onnx():
    """onnxruntime reads a 0-d input as one element; torch gives (count, 0)."""
    for value in (0.0, 3.0):
        assert_on_targets(torch.nonzero, (torch.tensor(value),), targets=("run", "onnx"))
