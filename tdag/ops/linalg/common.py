"""What every factorization shares: the check that a matrix is small, square and static (the
steps unroll over n), the index grids the masked updates compare against, and row/column
helpers on the last two axes."""
from __future__ import annotations

from tdag.errors import ShapeError
from tdag.ir.symbols import is_static
from tdag.ops import core, creation
from tdag.ops.arrays import concat, matmul
from tdag.ops.tensor import Tensor

MAX_UNROLLED = 64  # matrix size past which an unrolled factorization is refused


def static_size(x: Tensor, op: str, square: bool = True) -> int:
    """n of x (..., m, n): static, at most MAX_UNROLLED, square unless ``square`` is False.
    A factorization's n dependent steps unroll into the graph, so n must be known."""
    if x.ndim < 2 or not all(is_static(d) for d in x.shape[-2:]) \
            or (square and x.shape[-2] != x.shape[-1]) or max(x.shape[-2:]) > MAX_UNROLLED:
        kind = "square matrices" if square else "matrices"
        raise ShapeError(f"{op}: needs static {kind} of at most {MAX_UNROLLED} rows and "
                         f"columns (the steps unroll over n), got {x.type}")
    return int(x.shape[-1])


def positions(n: int, like: Tensor) -> Tensor:
    """0..n-1 as i64[n]."""
    return creation.iota(n, "i64", like.builder)


def row_grid(n: int, like: Tensor) -> Tensor:
    """i64[n, 1]: a row's index, broadcast against (..., n, m)."""
    return core.unsqueeze(positions(n, like), 1)


def eye(n: int, like: Tensor) -> Tensor:
    """The identity (n, n) in like's dtype."""
    rows = positions(n, like)
    return core.cast(core.eq(core.unsqueeze(rows, 1), core.unsqueeze(rows, 0)), like.dtype)


def diagonal(x: Tensor) -> Tensor:
    """x[..., i, i] as (..., n)."""
    n = int(x.shape[-1])
    return core.sum(core.mul(x, eye(n, x)), -1)


def mT(x: Tensor) -> Tensor:
    return core.transpose(x, -1, -2)


def outer(col: Tensor, row: Tensor) -> Tensor:
    """(..., n) x (..., m) -> (..., n, m)."""
    return core.mul(core.unsqueeze(col, -1), core.unsqueeze(row, -2))


def set_row(x: Tensor, k: int, row: Tensor) -> Tensor:
    """x with row k (axis -2) replaced by row (..., m): copies, O(n m) bytes, no flops."""
    parts = [core.slice(x, -2, 0, k), core.unsqueeze(row, -2), core.slice(x, -2, k + 1)]
    return concat([p for p in parts if p.shape[-2] != 0], -2)


def set_column(x: Tensor, k: int, column: Tensor) -> Tensor:
    return mT(set_row(mT(x), k, column))


def batch_eye(x: Tensor, n: int) -> Tensor:
    """The identity broadcast to x's batch: (..., n, n)."""
    return core.broadcast_to(eye(n, x), tuple(x.shape[:-2]) + (n, n))


__all__ = ["MAX_UNROLLED", "batch_eye", "diagonal", "eye", "mT", "matmul", "outer",
           "positions", "row_grid", "set_column", "set_row", "static_size"]
