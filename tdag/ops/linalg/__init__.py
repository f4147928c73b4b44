"""Linear algebra on small static matrices as compositions at LAPACK's complexity, unrolled
over the static n (a symbolic n is refused with a ShapeError): LU with partial pivoting and
what reads it (lu), triangular solves and Cholesky (triangular), Householder QR (qr), the
exponential by scaling and squaring (matfun), symmetric eigen and SVD by a fixed number of
Jacobi sweeps (jacobi), Bunch-Kaufman LDL^T and its solve (ldl), the general eigenproblem
by Hessenberg QR iterations (eig)."""
from tdag.ops.linalg.common import MAX_UNROLLED
from tdag.ops.linalg.eig import eig, eigvals
from tdag.ops.linalg.jacobi import eigh, svd, sweeps
from tdag.ops.linalg.ldl import LDL, ldl_factor, ldl_solve
from tdag.ops.linalg.lu import (
    LU, checked, det, inv, inv_ex, lu_factor, lu_solve, lu_unpack, perm_from_pivots, slogdet,
    solve,
)
from tdag.ops.linalg.matfun import matrix_exp
from tdag.ops.linalg.qr import apply_q, geqrf, householder_product, qr
from tdag.ops.linalg.triangular import (
    cholesky_ex, cholesky_inverse, cholesky_solve, solve_triangular, triangle,
)

__all__ = ["LDL", "LU", "MAX_UNROLLED", "apply_q", "checked", "cholesky_ex", "cholesky_inverse",
           "cholesky_solve", "det", "eig", "eigh", "eigvals", "geqrf", "householder_product", "inv",
           "inv_ex", "ldl_factor", "ldl_solve", "lu_factor", "lu_solve", "lu_unpack", "matrix_exp",
           "perm_from_pivots", "qr", "slogdet", "solve", "solve_triangular", "svd", "sweeps",
           "triangle"]
