"""QR by Householder reflections as LAPACK computes it (geqrf, then orgqr / ormqr, which torch
calls): min(m, n) steps, each a rank-one update of the trailing columns, O(m n) (2 m n^2 flops
in all, geqrf's order); Q is the reflectors applied to the identity's columns. Each
reflection follows dlarfg: beta = -sign(alpha) ||x||, and none (tau = 0) where the column
below the diagonal is already zero, so R's signs are LAPACK's."""
from __future__ import annotations

from tdag.errors import UnsupportedOpError
from tdag.ops import core
from tdag.ops.arrays import matmul, stack
from tdag.ops.linalg.common import batch_eye, positions, set_column, static_size
from tdag.ops.tensor import Tensor


def qr(a: Tensor, mode: str = "reduced") -> tuple[Tensor, Tensor]:
    """(Q, R) of a (..., m, n); mode as torch.linalg.qr's: reduced, complete or r (Q empty)."""
    if mode not in ("reduced", "complete", "r"):
        raise UnsupportedOpError(f"linalg.qr: mode {mode!r}")
    compact, tau = geqrf(a)
    m, n = int(a.shape[-2]), int(a.shape[-1])
    k = min(m, n)
    r = core.where(core.ge(positions(n, a), core.unsqueeze(positions(m, a), 1)), compact, 0.0)
    if mode == "r":
        return core.slice(core.reshape(a, (-1,)), 0, 0, 0), core.slice(r, -2, 0, k)
    columns = m if mode == "complete" else k
    eye = core.slice(batch_eye(a, m), -1, 0, columns)
    q = apply_q(compact, tau, core.broadcast_to(eye, tuple(a.shape[:-2]) + (m, columns)))
    return q, (r if mode == "complete" else core.slice(r, -2, 0, k))


def geqrf(a: Tensor) -> tuple[Tensor, Tensor]:
    """LAPACK's compact QR: R on and above the diagonal, each reflector's v below it (v_j = 1
    implied), and tau, with H_j = I - tau_j v v^T (dlarfg's scaling)."""
    static_size(a, "geqrf", square=False)
    m, n = int(a.shape[-2]), int(a.shape[-1])
    rows, cols = positions(m, a), positions(n, a)
    r, taus = a, []
    for j in range(min(m, n)):
        column = core.select(r, -1, j)
        v, tau = reflector(column, j)
        r = core.sub(r, core.where(core.ge(cols, j), _reflection(v, tau, r), 0.0))
        r = set_column(r, j, core.where(core.gt(rows, j), v, core.select(r, -1, j)))
        taus.append(tau)
    tau = stack(taus, -1) if taus else core.slice(core.sum(a, -1), -1, 0, 0)
    return r, tau


def reflector(column: Tensor, j: int) -> tuple[Tensor, Tensor]:
    """(v, tau) of dlarfg: H = I - tau v v^T takes column[j:] (..., m) to (beta, 0, ...),
    beta = -sign(alpha) ||column[j:]||, v_j = 1 and v zero above j; none (tau = 0) where
    the column below j is already zero."""
    rows = positions(int(column.shape[-1]), column)
    alpha = core.select(column, -1, j)
    tail = core.where(core.gt(rows, j), column, 0.0)
    sigma = core.sum(core.square(tail), -1)
    norm = core.sqrt(core.add(core.square(alpha), sigma))
    beta = core.where(core.ge(alpha, 0.0), core.neg(norm), norm)
    reflect = core.gt(sigma, 0.0)
    v = core.add(core.div(tail, core.unsqueeze(core.where(reflect, core.sub(alpha, beta), 1.0),
                                               -1)),
                 core.cast(core.eq(rows, j), column.dtype))
    tau = core.where(reflect, core.div(core.sub(beta, alpha), core.where(reflect, beta, 1.0)),
                     0.0)
    return v, tau


def _reflection(v: Tensor, tau: Tensor, x: Tensor) -> Tensor:
    """tau v (v^T x): what H = I - tau v v^T takes from x (..., m, c)."""
    return core.mul(core.unsqueeze(core.mul(v, core.unsqueeze(tau, -1)), -1),
                    matmul(core.unsqueeze(v, -2), x))


def _reflector(a: Tensor, tau: Tensor, i: int) -> tuple[Tensor, Tensor]:
    """(v_i, tau_i) from geqrf's compact form."""
    rows = positions(int(a.shape[-2]), a)
    v = core.add(core.where(core.gt(rows, i), core.select(a, -1, i), 0.0),
                 core.cast(core.eq(rows, i), a.dtype))
    return v, core.select(tau, -1, i)


def apply_q(a: Tensor, tau: Tensor, c: Tensor, left: bool = True,
            transpose: bool = False) -> Tensor:
    """Q C, Q^T C, C Q or C Q^T for Q = H_1 ... H_k from geqrf's (a, tau): ormqr."""
    if not left:  # C Q = (Q^T C^T)^T
        return core.transpose(apply_q(a, tau, core.transpose(c, -1, -2), True, not transpose),
                              -1, -2)
    k = int(tau.shape[-1])
    order = range(k) if transpose else range(k - 1, -1, -1)  # Q^T C applies H_1 first
    for i in order:
        v, t = _reflector(a, tau, i)
        c = core.sub(c, _reflection(v, t, c))
    return c


def householder_product(a: Tensor, tau: Tensor) -> Tensor:
    """The first n columns of Q = H_1 ... H_k (orgqr)."""
    m, n = int(a.shape[-2]), int(a.shape[-1])
    eye = core.slice(batch_eye(a, m), -1, 0, n)
    return apply_q(a, tau, core.broadcast_to(eye, tuple(a.shape[:-2]) + (m, n)))
