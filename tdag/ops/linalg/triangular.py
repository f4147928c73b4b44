"""Triangular solves and Cholesky, unrolled over the static n: substitution is n steps of
O(n m) (trsm's n^2 m), Cholesky n steps of a rank-one update (potrf's n^3 / 3, here n^3: the
update covers the whole trailing square, not its lower half)."""
from __future__ import annotations

from tdag.ops import core, creation
from tdag.ops.arrays import stack
from tdag.ops.linalg.common import batch_eye, mT, outer, positions, set_row, static_size
from tdag.ops.promotion import broadcast_shapes
from tdag.ops.tensor import Tensor


def solve_triangular(t: Tensor, b: Tensor, upper: bool, left: bool = True,
                     unit: bool = False) -> Tensor:
    """X with T X = B (X T = B where not ``left``); only T's triangle is read."""
    if not left:  # X T = B  <=>  T^T X^T = B^T
        return mT(solve_triangular(mT(t), mT(b), not upper, True, unit))
    n = static_size(t, "solve_triangular")
    batch = broadcast_shapes(tuple(t.shape[:-2]), tuple(b.shape[:-2]))
    b = core.broadcast_to(core.cast(b, t.dtype), batch + tuple(b.shape[-2:]))
    rows = positions(n, t)
    for k in (range(n - 1, -1, -1) if upper else range(n)):
        y = core.select(b, -2, k)  # row k is final once the rows before it are out
        if not unit:
            y = core.div(y, core.unsqueeze(core.select(core.select(t, -1, k), -1, k), -1))
        later = core.lt(rows, k) if upper else core.gt(rows, k)
        column = core.where(later, core.select(t, -1, k), 0.0)
        b = set_row(core.sub(b, outer(column, y)), k, core.broadcast_to(
            y, batch + (b.shape[-1],)))
    return b


def cholesky_ex(a: Tensor, upper: bool = False) -> tuple[Tensor, Tensor]:
    """(L, info): A = L L^T from A's lower triangle (U^T U from the upper one where
    ``upper``), right-looking; info is k where the k-th pivot is not positive (potrf's), its
    factor NaN from there on."""
    n = static_size(a, "cholesky")
    batch = tuple(a.shape[:-2])
    rows = positions(n, a)
    if upper:  # torch reads the upper triangle then: A^T's lower one
        a = mT(a)
    a = core.where(core.ge(core.unsqueeze(rows, 1), rows), a, mT(a))  # the lower triangle
    info = creation.full(batch, 0, "i32", like=a)
    columns = []
    for k in range(n):
        pivot = core.select(core.select(a, -1, k), -1, k)
        bad = core.logical_not(core.gt(pivot, 0.0))
        info = core.where(core.logical_and(bad, core.eq(info, 0)), k + 1, info)
        d = core.sqrt(pivot)
        column = core.where(core.ge(rows, k), core.div(core.select(a, -1, k),
                                                       core.unsqueeze(d, -1)), 0.0)
        below = core.where(core.gt(rows, k), column, 0.0)
        a = core.sub(a, outer(below, below))
        columns.append(column)
    lower = stack(columns, -1) if columns else a
    return (mT(lower) if upper else lower), info


def cholesky_solve(b: Tensor, factor: Tensor, upper: bool = False) -> Tensor:
    """X with A X = B for A = L L^T (U^T U where ``upper``): two triangular solves."""
    lower = mT(factor) if upper else factor
    y = solve_triangular(lower, b, upper=False)
    return solve_triangular(mT(lower), y, upper=True)


def cholesky_inverse(factor: Tensor, upper: bool = False) -> Tensor:
    """A^-1 from A's Cholesky factor."""
    n = static_size(factor, "cholesky_inverse")
    return cholesky_solve(batch_eye(factor, n), factor, upper)


def triangle(x: Tensor, upper: bool, offset: int = 0) -> Tensor:
    """triu / tril of the last two axes."""
    m, n = int(x.shape[-2]), int(x.shape[-1])
    rows = core.unsqueeze(positions(m, x), 1)
    cols = positions(n, x)
    keep = core.ge(cols, core.add(rows, offset)) if upper else \
        core.le(cols, core.add(rows, offset))
    return core.where(keep, x, 0.0)
