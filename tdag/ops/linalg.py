"""Linear algebra on small static matrices as compositions: the determinant by Gaussian
elimination with partial pivoting (LAPACK's getrf, which numpy.linalg.det and torch run),
unrolled over the static size n: n steps of O(n^2) elementwise work, gathers for the row
swaps. Exact in the sense LU is: the same operations as the libraries, so the same rounding
up to their order of summation.
"""
from __future__ import annotations

from tdag.ops import core, creation
from tdag.ops.arrays import argmax
from tdag.ops.tensor import Tensor
from tdag.ops.writes import take_along
from tdag.errors import ShapeError
from tdag.ir.symbols import is_static

__all__ = ["MAX_UNROLLED", "det"]

MAX_UNROLLED = 64  # matrix size past which the unrolled elimination is refused


def det(x: Tensor) -> Tensor:
    """The determinant of each matrix of x (..., n, n)."""
    n = x.shape[-1]
    if x.ndim < 2 or not is_static(n) or x.shape[-2] != n or n > MAX_UNROLLED:
        raise ShapeError(f"det: needs static square matrices of at most {MAX_UNROLLED} rows, "
                         f"got {x.type}")
    rows = creation.iota(n, "i64", x.builder)
    row_axis = core.unsqueeze(rows, 1)  # (n, 1): broadcast against a row index (..., 1, 1)
    sign = creation.full(tuple(x.shape[:-2]), 1.0, x.dtype, like=x)
    total = sign
    for k in range(n):
        column = core.abs(core.select(x, -1, k))  # (..., n)
        below = core.where(core.ge(rows, k), column, -1.0)  # rows above k are done
        pivot_row = core.unsqueeze(core.unsqueeze(argmax(below, -1), -1), -1)  # the first
        order = core.where(core.eq(row_axis, k), pivot_row,
                           core.where(core.eq(row_axis, pivot_row), k, row_axis))
        x = take_along(x, x.ndim - 2, core.broadcast_to(order, tuple(x.shape)))
        swapped = core.ne(core.squeeze(pivot_row, (-2, -1)), k)
        sign = core.where(swapped, core.neg(sign), sign)
        pivot = core.select(core.select(x, -1, k), -1, k)
        total = core.mul(total, pivot)
        safe = core.where(core.eq(pivot, 0.0), 1.0, pivot)
        factor = core.div(core.select(x, -1, k), core.unsqueeze(safe, -1))  # (..., n)
        factor = core.where(core.gt(rows, k), factor, 0.0)
        x = core.sub(x, core.mul(core.unsqueeze(factor, -1),
                                 core.unsqueeze(core.select(x, -2, k), -2)))
    return core.mul(total, sign)

