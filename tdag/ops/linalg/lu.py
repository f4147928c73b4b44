"""LU with partial pivoting (LAPACK's getrf, which torch, numpy and JAX call) and what reads
it: solve, inverse, determinant. The elimination unrolls over the static n: n steps of O(n^2)
elementwise work (O(n^3) in all, getrf's count), a take_along per step for the row swap. The
same operations as getf2, so the same rounding up to the order of summation.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.ops import core, creation
from tdag.ops.arrays import argmax, stack
from tdag.ops.linalg.common import (
    batch_eye, diagonal, outer, positions, row_grid, set_column, static_size,
)
from tdag.ops.linalg.triangular import solve_triangular
from tdag.ops.masking import checked_zero
from tdag.ops.promotion import broadcast_shapes
from tdag.ops.tensor import Tensor
from tdag.ops.writes import take_along


@dataclass(frozen=True)
class LU:
    """A = P L U: ``lu`` holds L's multipliers below the diagonal and U on and above it;
    ``pivots`` LAPACK's 1-based row swaps (i32); ``perm`` the row order (A[perm] = L U);
    ``info`` 0, or k where U[k-1, k-1] is zero (i32), as getrf reports."""
    lu: Tensor
    pivots: Tensor
    perm: Tensor
    info: Tensor


def lu_factor(x: Tensor) -> LU:
    """Gaussian elimination with partial pivoting of each matrix of x (..., m, n):
    min(m, n) steps, as getrf."""
    static_size(x, "lu_factor", square=False)
    m, n = int(x.shape[-2]), int(x.shape[-1])
    batch = tuple(x.shape[:-2])
    rows, cols, row_axis = positions(m, x), positions(n, x), row_grid(m, x)
    perm = core.broadcast_to(rows, batch + (m,))
    info = creation.full(batch, 0, "i32", like=x)
    pivots = []
    for k in range(min(m, n)):
        column = core.abs(core.select(x, -1, k))
        below = core.where(core.ge(rows, k), column, -1.0)  # rows above k are done
        pivot_row = argmax(below, -1)  # the first largest, as idamax
        at = core.unsqueeze(core.unsqueeze(pivot_row, -1), -1)
        order = core.where(core.eq(row_axis, k), at,
                           core.where(core.eq(row_axis, at), k, row_axis))  # (..., m, 1)
        x = take_along(x, x.ndim - 2, core.broadcast_to(order, tuple(x.shape)))
        perm = take_along(perm, perm.ndim - 1, core.squeeze(order, -1))
        pivots.append(core.add(pivot_row, 1))
        pivot = core.select(core.select(x, -1, k), -1, k)
        zero = core.eq(pivot, 0.0)
        info = core.where(core.logical_and(zero, core.eq(info, 0)), k + 1, info)
        factor = core.div(core.select(x, -1, k), core.unsqueeze(core.where(zero, 1.0, pivot), -1))
        factor = core.where(core.gt(rows, k), factor, 0.0)  # a zero column stays unscaled
        row = core.where(core.gt(cols, k), core.select(x, -2, k), 0.0)
        x = core.sub(x, outer(factor, row))
        x = set_column(x, k, core.where(core.gt(rows, k), factor, core.select(x, -1, k)))
    pivots = stack(pivots, -1) if pivots else creation.full(batch + (0,), 0, "i64", like=x)
    return LU(x, core.cast(pivots, "i32"), perm, info)


def lu_unpack(lu: Tensor, perm: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(P, L, U) with A = P L U: P (m, m), L (m, k) unit lower, U (k, n), k = min(m, n)."""
    static_size(lu, "lu_unpack", square=False)
    m, n = int(lu.shape[-2]), int(lu.shape[-1])
    k = min(m, n)
    rows, cols = row_grid(m, lu), positions(n, lu)
    unit = core.cast(core.eq(rows, cols), lu.dtype)
    lower = core.slice(core.add(core.where(core.gt(rows, cols), lu, 0.0), unit), -1, 0, k)
    upper = core.slice(core.where(core.le(rows, cols), lu, 0.0), -2, 0, k)
    p = core.cast(core.eq(rows, core.unsqueeze(perm, -2)), lu.dtype)  # P[perm[i], i] = 1
    return p, lower, upper


def perm_from_pivots(pivots: Tensor, m: int) -> Tensor:
    """The row order (..., m) the swaps of LAPACK's 1-based ``pivots`` (..., k) make."""
    rows = positions(m, pivots)
    perm = core.broadcast_to(rows, tuple(pivots.shape[:-1]) + (m,))
    for k in range(int(pivots.shape[-1])):
        at = core.unsqueeze(core.sub(core.cast(core.select(pivots, -1, k), "i64"), 1), -1)
        order = core.where(core.eq(rows, k), at, core.where(core.eq(rows, at), k, rows))
        perm = take_along(perm, perm.ndim - 1, order)
    return perm


def lu_solve(lu: Tensor, perm: Tensor, b: Tensor, left: bool = True,
             adjoint: bool = False) -> Tensor:
    """X with A X = B (X A = B where not ``left``) from A's factorization."""
    if not left:  # X A = B  <=>  A^T X^T = B^T
        return core.transpose(lu_solve(lu, perm, core.transpose(b, -1, -2), True,
                                       not adjoint), -1, -2)
    n = static_size(lu, "lu_solve")
    batch = broadcast_shapes(tuple(lu.shape[:-2]), tuple(b.shape[:-2]))
    b = core.broadcast_to(b, batch + tuple(b.shape[-2:]))
    perm = core.broadcast_to(perm, batch + (n,))
    if adjoint:  # A^T = U^T L^T P^T
        y = solve_triangular(core.transpose(lu, -1, -2), b, upper=False)
        x = solve_triangular(core.transpose(lu, -1, -2), y, upper=True, unit=True)
        inverse = _inverse_perm(perm, n)
        return take_along(x, x.ndim - 2, core.broadcast_to(core.unsqueeze(inverse, -1),
                                                           tuple(x.shape)))
    b = take_along(b, b.ndim - 2, core.broadcast_to(core.unsqueeze(perm, -1), tuple(b.shape)))
    y = solve_triangular(lu, b, upper=False, unit=True)
    return solve_triangular(lu, y, upper=True)


def _inverse_perm(perm: Tensor, n: int) -> Tensor:
    """inverse[perm[i]] = i, as a one-hot contraction (n is small)."""
    onehot = core.cast(core.eq(core.unsqueeze(perm, -1), positions(n, perm)), "i64")
    return core.sum(core.mul(onehot, core.unsqueeze(positions(n, perm), -1)), -2)


def solve(a: Tensor, b: Tensor, left: bool = True) -> tuple[Tensor, LU]:
    """X with A X = B, and A's factorization (its info says whether A was singular)."""
    vector = b.ndim == 1 or (b.ndim == a.ndim - 1 and tuple(b.shape) == tuple(a.shape[:-1]))
    factors = lu_factor(a)
    rhs = core.unsqueeze(b, -1) if vector else b
    x = lu_solve(factors.lu, factors.perm, rhs, left)
    return (core.squeeze(x, -1) if vector else x), factors


def inv_ex(a: Tensor) -> tuple[Tensor, Tensor]:
    """(A^-1, info): A^-1 by solving against the identity; info as getrf's."""
    n = static_size(a, "inv")
    factors = lu_factor(a)
    return lu_solve(factors.lu, factors.perm, batch_eye(a, n)), factors.info


def inv(a: Tensor) -> Tensor:
    """A^-1; a singular A raises at run time, as torch.linalg.inv does (a check in the data
    flow: tdag.run and torch refuse a length of -1, so does onnxruntime)."""
    inverse, info = inv_ex(a)
    return checked(inverse, info, "linalg.inv")


def checked(value: Tensor, info: Tensor, op: str) -> Tensor:
    """value, raising at run time (tdag.run, torch, onnxruntime) where any info is nonzero:
    ``op`` failed on a singular or not positive-definite matrix."""
    if any(d == 0 for d in info.shape):  # no matrix to check (a symbolic batch may be)
        return value
    worst = core.amax(core.reshape(core.cast(info, "i64"), (-1,)), 0)
    check = checked_zero(core.eq(worst, 0), f"{op.replace('.', '_')}_singular")
    return core.add(value, core.cast(check, value.dtype))


def slogdet(a: Tensor) -> tuple[Tensor, Tensor]:
    """(sign, log|det|): the product of U's diagonal as a sum of logs, the sign of the
    permutation from the swaps."""
    n = static_size(a, "slogdet")
    factors = lu_factor(a)
    d = diagonal(factors.lu) if n else creation.full(tuple(a.shape[:-2]) + (0,), 1.0,
                                                     a.dtype, like=a)
    swaps = core.sum(core.cast(core.ne(core.cast(factors.pivots, "i64"),
                                       core.add(positions(n, a), 1)), "i64"), -1)
    parity = core.where(core.eq(core.remainder(swaps, 2), 0), 1.0, -1.0)
    sign = core.mul(core.prod(core.sign(d), -1), parity)
    return core.cast(sign, a.dtype), core.sum(core.log(core.abs(d)), -1)


def det(a: Tensor) -> Tensor:
    """The determinant of each matrix of a (..., n, n): U's diagonal product, signed."""
    n = static_size(a, "det")
    factors = lu_factor(a)
    if n == 0:
        return creation.full(tuple(a.shape[:-2]), 1.0, a.dtype, like=a)
    swaps = core.sum(core.cast(core.ne(core.cast(factors.pivots, "i64"),
                                       core.add(positions(n, a), 1)), "i64"), -1)
    parity = core.where(core.eq(core.remainder(swaps, 2), 0), 1.0, -1.0)
    return core.cast(core.mul(core.prod(diagonal(factors.lu), -1), parity), a.dtype)
