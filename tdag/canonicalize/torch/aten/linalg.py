"""torch.linalg's factorizations, solvers and matrix functions. The main ones (inv, solve,
cholesky, det, slogdet, eigh, svd, qr, solve_triangular) are one kernel node each
(``tdag.ops.linalg.kernels``: torch.linalg / jnp.linalg at any n, the composition on ONNX);
the others over tdag.ops.linalg's compositions (static n <= 64, unrolled). ``check_errors``
and the raising ops keep torch's refusal of a singular or indefinite matrix (a run-time
check in the compositions, LAPACK's own error in the kernels); the ``_ex`` ops return
LAPACK's info instead, as torch does."""
from __future__ import annotations

import math

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.errors import UnsupportedOpError
from tdag.ops import linalg
from tdag.ops.linalg import kernels


def _empty(like):
    """The empty tensor torch returns for an output it was told not to compute."""
    return ops.slice(ops.reshape(like, (-1,)), 0, 0, 0)


@aten("_linalg_det")
def det(a):
    f = linalg.lu_factor(a)
    return linalg.det(a), f.lu, f.pivots


@aten("_linalg_slogdet")
def slogdet(a):
    f = linalg.lu_factor(a)
    sign, logabs = linalg.slogdet(a)
    return sign, logabs, f.lu, f.pivots


@aten("logdet")
def logdet(a):
    """log det: NaN for a negative determinant, -inf for a zero one, as torch."""
    sign, logabs = kernels.slogdet(a)
    return ops.where(ops.lt(sign, 0.0), float("nan"), logabs)


@aten("linalg_inv_ex")
def inv_ex(a, check_errors=False):
    inverse, info = linalg.inv_ex(a)
    return (linalg.checked(inverse, info, "linalg.inv") if check_errors else inverse), info


@aten("linalg_inv")
def inv(a):
    return kernels.inv(a)


@aten("linalg_det")
def linalg_det(a):
    return kernels.det(a)


@aten("linalg_slogdet")
def linalg_slogdet(a):
    return kernels.slogdet(a)


@aten("_linalg_solve_ex")
def solve_ex(a, b, left=True, check_errors=False):
    x, f = linalg.solve(a, b, left)
    if check_errors:
        x = linalg.checked(x, f.info, "linalg.solve")
    return x, f.lu, f.pivots, f.info


@aten("linalg_lu_factor_ex", "_lu_with_info")
def lu_factor_ex(a, pivot=True, check_errors=False):
    if not pivot:
        raise UnsupportedOpError("linalg.lu_factor: pivot=False (only partial pivoting)")
    f = linalg.lu_factor(a)
    lu = linalg.checked(f.lu, f.info, "linalg.lu_factor") if check_errors else f.lu
    return lu, f.pivots, f.info


@aten("linalg_lu_factor")
def lu_factor(a, pivot=True):
    lu_data, pivots, _ = lu_factor_ex(a, pivot, check_errors=True)
    return lu_data, pivots


@aten("linalg_solve")
def solve(a, b, left=True):
    """torch's rule: b is a vector where it is 1-d, or a's batch of vectors (..., n)."""
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    if not vector:
        return kernels.solve(a, b, left)
    return ops.squeeze(kernels.solve(a, ops.unsqueeze(b, -1 if left else -2), left),
                       -1 if left else -2)


@aten("linalg_lu")
def lu(a, pivot=True):
    if not pivot:
        raise UnsupportedOpError("linalg.lu: pivot=False (only partial pivoting)")
    f = linalg.lu_factor(a)
    return linalg.lu_unpack(f.lu, f.perm)


@aten("lu_unpack")
def lu_unpack(lu_data, pivots, unpack_data=True, unpack_pivots=True):
    perm = linalg.perm_from_pivots(pivots, int(lu_data.shape[-2]))
    p, lower, upper = linalg.lu_unpack(lu_data, perm)
    return (p if unpack_pivots else _empty(lu_data)), *((lower, upper) if unpack_data
                                                      else (_empty(lu_data),) * 2)


@aten("linalg_lu_solve")
def lu_solve(lu_data, pivots, b, left=True, adjoint=False):
    perm = linalg.perm_from_pivots(pivots, int(lu_data.shape[-2]))
    return linalg.lu_solve(lu_data, perm, b, left, adjoint)


@aten("linalg_solve_triangular")
def solve_triangular(t, b, upper, left=True, unitriangular=False):
    return kernels.solve_triangular(t, b, upper, left, unitriangular)


@aten("triangular_solve")
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    """(X, A) with op(A) X = B; only A's triangle is read (the coefficient is returned whole)."""
    coefficient = ops.transpose(a, -1, -2) if transpose else a
    x = linalg.solve_triangular(coefficient, b, upper != transpose, True, unitriangular)
    return x, a


@aten("linalg_cholesky_ex")
def cholesky_ex(a, upper=False, check_errors=False):
    factor, info = linalg.cholesky_ex(a, upper)
    return (linalg.checked(factor, info, "linalg.cholesky") if check_errors else factor), info


@aten("cholesky", "linalg_cholesky")
def cholesky(a, upper=False):
    return kernels.cholesky(a, upper)


@aten("cholesky_solve")
def cholesky_solve(b, factor, upper=False):
    return linalg.cholesky_solve(b, factor, upper)


@aten("cholesky_inverse")
def cholesky_inverse(factor, upper=False):
    return linalg.cholesky_inverse(factor, upper)


@aten("linalg_qr")
def qr(a, mode="reduced"):
    """The kernel where its reduced Q and R are what torch returns (mode "complete" of a
    wide or square matrix is the reduced one); the composition otherwise."""
    m, n = a.shape[-2], a.shape[-1]
    if mode == "r":
        return _empty(a), kernels.qr(a)[1]
    if mode == "reduced" or (mode == "complete" and m <= n):
        return kernels.qr(a)
    return linalg.qr(a, mode)


@aten("geqrf")
def geqrf(a):
    return linalg.geqrf(a)


@aten("linalg_householder_product", "orgqr")
def householder_product(a, tau):
    return linalg.householder_product(a, tau)


@aten("ormqr")
def ormqr(a, tau, c, left=True, transpose=False):
    return linalg.apply_q(a, tau, c, left, transpose)


@aten("linalg_matrix_exp")
def matrix_exp(a):
    return linalg.matrix_exp(a)


@aten("_linalg_eigh")
def eigh(a, UPLO="L", compute_v=True):  # noqa: N803  (ATen's argument name)
    values, vectors = kernels.eigh(a, upper=UPLO == "U")
    return values, (vectors if compute_v else _empty(a))


@aten("linalg_eigh")
def linalg_eigh(a, UPLO="L"):  # noqa: N803  (ATen's argument name)
    return kernels.eigh(a, upper=UPLO == "U")


@aten("linalg_eig")
def linalg_eig(a):
    """The general eigenproblem of a real matrix: one kernel (ONNX: its composition,
    n <= 12)."""
    return kernels.eig(a)


@aten("linalg_ldl_factor_ex")
def ldl_factor_ex(a, hermitian=False, check_errors=False):
    ld, pivots, info = kernels.ldl_factor(a, hermitian)
    return (linalg.checked(ld, info, "linalg.ldl_factor") if check_errors else ld), pivots, info


@aten("linalg_ldl_factor")
def ldl_factor(a, hermitian=False):
    ld, pivots, _ = ldl_factor_ex(a, hermitian, check_errors=True)
    return ld, pivots


@aten("linalg_ldl_solve")
def ldl_solve(ld, pivots, b, hermitian=False):
    return kernels.ldl_solve(ld, pivots, b, hermitian)


@aten("_linalg_svd")
def svd(a, full_matrices=False, compute_uv=True, driver=None):
    if full_matrices and compute_uv and a.shape[-1] != a.shape[-2]:
        raise UnsupportedOpError("linalg.svd: full_matrices=True of a non-square matrix "
                                 "(the complement of U or V is not computed)")
    u, s, vh = kernels.svd(a)
    if not compute_uv:
        return _empty(a), s, _empty(a)
    return u, s, vh


@aten("linalg_svd")
def linalg_svd(a, full_matrices=True, driver=None):
    return svd(a, full_matrices, True, driver)


@aten("linalg_pinv.atol_rtol_tensor")
def pinv(a, atol=None, rtol=None, hermitian=False):
    """V diag(1/s) U^T over the singular values past max(atol, rtol * s_max), torch's
    cut-off; a hermitian input is read from its lower triangle, as torch's eigh reads it."""
    if hermitian:
        lower = linalg.triangle(a, upper=False)
        a = ops.add(lower, ops.transpose(linalg.triangle(a, upper=False, offset=-1), -1, -2))
    u, s, vh = kernels.svd(a)
    eps = 1.1920928955078125e-07 if a.dtype.name == "f32" else 2.220446049250313e-16
    default = eps * max(int(a.shape[-1]), int(a.shape[-2]))
    if rtol is None:
        rtol = default if atol is None else ops.where(ops.gt(atol, 0.0), 0.0, default)
    cut = ops.mul(ops.unsqueeze(ops.amax(s, -1), -1), rtol if not hasattr(rtol, "ndim")
                  else ops.unsqueeze(rtol, -1) if rtol.ndim else rtol)
    if atol is not None:
        cut = ops.maximum(cut, ops.unsqueeze(atol, -1) if atol.ndim else atol)
    kept = ops.gt(s, cut)
    inverse = ops.where(kept, ops.div(1.0, ops.where(kept, s, 1.0)), 0.0)
    return ops.matmul(ops.mul(ops.transpose(vh, -1, -2), ops.unsqueeze(inverse, -2)),
                      ops.transpose(u, -1, -2))


@aten("linalg_tensorinv")
def tensorinv(a, ind=2):
    """The inverse of a read as a (prod(shape[:ind]), prod(shape[ind:])) matrix, shaped
    shape[ind:] + shape[:ind]."""
    rows, cols = tuple(a.shape[:ind]), tuple(a.shape[ind:])
    matrix = ops.reshape(a, (math.prod(int(d) for d in rows), math.prod(int(d) for d in cols)))
    return ops.reshape(kernels.inv(matrix), cols + rows)
