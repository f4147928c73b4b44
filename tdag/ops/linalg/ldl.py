"""LDL^T of a symmetric matrix by Bunch-Kaufman diagonal pivoting (LAPACK's sytrf with
uplo='L', as torch.linalg.ldl_factor calls it) and the solve that reads it (sytrs).

For n <= 64 sytrf runs the unblocked sytf2, whose steps this unrolls over the static n: at
each step the column maxima decide, per matrix, between a 1x1 pivot, a 1x1 pivot after a
symmetric interchange and a 2x2 pivot (which takes two steps, so a per-matrix ``skip`` mask
rides along); ``where`` applies the choice, the interchange exchanges two rows and columns
by masked sums, and one rank-2 update serves both block sizes (a 1x1 block's second term is
zero). O(n^2) elementwise work per step on the trailing block, cut down every SHRINK steps:
O(n^3) in all, near sytf2's n^3 / 3 times the few passes a step makes. The same operations
in the same order as sytf2, so the same bits as torch's (MKL's) LD, pivots and info on the
1,792 matrices of n 1..64 tried (random, zero diagonals, ties, zero columns, float32 and
float64). A NaN input is the exception: this follows LAPACK 3.x (a NaN diagonal entry ends
its step as a zero one, in info), MKL does not, so pivots and info may differ there (both
factors NaN-laden). The solve reads the pivots as data: each step's block
kind from the pivot's sign, its interchange as a mask.

Differentiable where the pivot choices are locally constant (everywhere but ties), as any
branch of LAPACK is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tdag.ops import core, creation
from tdag.ops.arrays import argmax, stack
from tdag.ops.linalg.common import mT, outer, positions, row_grid, static_size
from tdag.ops.promotion import broadcast_shapes
from tdag.ops.tensor import Tensor


@dataclass(frozen=True)
class LDL:
    """A = P L D L^T P^T in LAPACK's packing: ``ld`` holds D's 1x1 and 2x2 blocks on the
    diagonal and first sub-diagonal, L's multipliers below them, zeros above (as torch);
    ``pivots`` the 1-based interchanges (i32), a 2x2 block's two entries both -p; ``info``
    0, or the first k where D(k, k) is exactly zero (its column was zero)."""
    ld: Tensor
    pivots: Tensor
    info: Tensor


@dataclass(frozen=True)
class _Pivot:
    """One step's choice per matrix: ``one``/``two`` the block size (both False on a skipped
    step or a zero column), ``target`` the trailing block's row exchanged with the step's
    row j (1x1) or j + 1 (2x2), j where nothing moves; ``zero`` the zero column sytf2
    reports in info."""
    one: Tensor
    two: Tensor
    target: Tensor
    zero: Tensor


def _alpha(dtype) -> float:
    """(1 + sqrt(17)) / 8 rounded as sytf2 computes it in the matrix's precision."""
    if dtype.torch.itemsize == 4:
        return float((np.float32(1) + np.sqrt(np.float32(17))) / np.float32(8))
    return (1.0 + math.sqrt(17.0)) / 8.0


def _entry(x: Tensor, i: int, j: int) -> Tensor:
    return core.select(core.select(x, -2, i), -1, j)


def _whole(mask: Tensor) -> Tensor:
    """(...,) -> (..., 1, 1): a per-matrix mask over its entries."""
    return core.unsqueeze(core.unsqueeze(mask, -1), -1)


# the trailing block is cut down every SHRINK steps: most of sytf2's n^3 / 3 saving over the
# full square, and few distinct shapes (lowering's matchers build a template per shape)
SHRINK = 8


def _column(x: Tensor) -> Tensor:
    """(...,) -> (..., 1): a per-matrix value against a row or column."""
    return core.unsqueeze(x, -1)


def ldl_factor(a: Tensor) -> LDL:
    """Bunch-Kaufman LDL^T of each matrix of a (..., n, n), read from its lower triangle."""
    n = static_size(a, "ldl_factor")
    batch = tuple(a.shape[:-2])
    info = creation.full(batch, 0, "i32", like=a)
    if n == 0:
        return LDL(a, creation.full(batch + (0,), 0, "i32", like=a), info)
    grid, rows = row_grid(n, a), positions(n, a)
    # the trailing block is kept symmetric, each update mirrored from its lower triangle:
    # sytf2 reads only that triangle, row imax included
    x = core.where(core.ge(grid, rows), a, mT(a))
    alpha = _alpha(a.dtype)
    skip = creation.full(batch, False, "bool", like=a)
    pending = creation.full(batch, 0, "i64", like=a)  # a 2x2 block's pivot, for its 2nd step
    pivots, columns = [], []
    start = 0  # x is the trailing block A[start:, start:]; step k works on its row k - start
    for k in range(n):
        j = k - start
        step = _choose(x, j, alpha, skip)
        x = _interchange(x, j, step)
        if k < n - 1:
            x = core.where(_whole(core.logical_or(step.one, step.two)), _update(x, j, step), x)
        one_based = core.add(step.target, start + 1)
        signed = core.where(step.two, core.neg(one_based), one_based)
        pivots.append(core.where(skip, pending, signed))
        info = core.where(core.logical_and(step.zero, core.eq(info, 0)), k + 1, info)
        pending, skip = signed, step.two
        if (k + 1) % SHRINK == 0 or k == n - 1:  # columns start..k are final
            columns += _finished(x, j + 1, start)
            x = core.slice(core.slice(x, -2, j + 1), -1, j + 1)
            start = k + 1
    return LDL(stack(columns, -1), core.cast(stack(pivots, -1), "i32"), info)


def _finished(x: Tensor, count: int, start: int) -> list[Tensor]:
    """The first ``count`` columns of the trailing block, on and below the diagonal, as
    columns start.. of LD (zeros above)."""
    rows = positions(int(x.shape[-2]), x)
    widths = [(0, 0)] * (x.ndim - 2) + [(start, 0)]
    return [core.pad(core.where(core.ge(rows, c), core.select(x, -1, c), 0.0), widths)
            for c in range(count)]


def _choose(x: Tensor, j: int, alpha: float, skip: Tensor) -> _Pivot:
    """sytf2's choice at row and column j of the trailing block x (symmetric)."""
    n = int(x.shape[-1])
    rows = positions(n, x)
    column = core.abs(core.select(x, -1, j))
    absakk = core.select(column, -1, j)
    active = core.logical_not(skip)
    none = creation.full(tuple(x.shape[:-2]), j, "i64", like=x)
    if j == n - 1:  # no column below: a 1x1 pivot, or a zero one
        zero = core.logical_or(core.eq(absakk, 0.0), core.isnan(absakk))
        return _Pivot(core.logical_and(active, core.logical_not(zero)),
                      creation.full(tuple(x.shape[:-2]), False, "bool", like=x), none,
                      core.logical_and(active, zero))
    below = core.where(core.gt(rows, j), column, -1.0)
    imax = argmax(below, -1)  # the first largest, as idamax
    colmax = core.amax(below, -1)
    zero = core.logical_or(core.eq(core.maximum(absakk, colmax), 0.0), core.isnan(absakk))
    at = core.unsqueeze(imax, -1)
    across = core.abs(_pick(x, -1, imax))  # column imax
    others = core.logical_and(core.ge(rows, j), core.ne(rows, at))
    rowmax = core.amax(core.where(others, across, -1.0), -1)
    diag = core.sum(core.where(core.eq(rows, at), across, 0.0), -1)
    scaled = core.mul(alpha, colmax)
    keep = core.logical_or(core.ge(absakk, scaled),
                           core.ge(absakk, core.mul(scaled, core.div(colmax, rowmax))))
    single = core.logical_or(keep, core.ge(diag, core.mul(alpha, rowmax)))
    live = core.logical_and(active, core.logical_not(zero))
    moved = core.logical_and(live, core.logical_not(keep))
    return _Pivot(core.logical_and(live, single),
                  core.logical_and(live, core.logical_not(single)),
                  core.where(moved, imax, none), core.logical_and(active, zero))


def _pick(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """x's row (axis -2) or column (axis -1) ``index`` (...,) of each matrix, as a masked sum:
    the one entry plus zeros, exact (-0.0 reads +0.0), NaN elsewhere left out."""
    n = int(x.shape[axis])
    at = core.unsqueeze(core.unsqueeze(index, -1), -1)
    lines = row_grid(n, x) if axis == -2 else positions(n, x)
    return core.sum(core.where(core.eq(lines, at), x, 0.0), axis)


def _swap(x: Tensor, axis: int, i: Tensor, j: Tensor) -> Tensor:
    """x with rows (axis -2) or columns (axis -1) i and j (each (...,)) exchanged."""
    n = int(x.shape[axis])
    lines = row_grid(n, x) if axis == -2 else positions(n, x)
    at_i = core.eq(lines, core.unsqueeze(core.unsqueeze(i, -1), -1))
    at_j = core.eq(lines, core.unsqueeze(core.unsqueeze(j, -1), -1))
    line_i = core.unsqueeze(_pick(x, axis, i), axis)
    line_j = core.unsqueeze(_pick(x, axis, j), axis)
    return core.where(at_i, line_j, core.where(at_j, line_i, x))


def _interchange(x: Tensor, j: int, step: _Pivot) -> Tensor:
    """Rows and columns j (j + 1 for a 2x2) and ``target`` exchanged in x[j:, j:] only: L's
    finished columns stay (sytrs applies each swap in turn)."""
    n = int(x.shape[-1])
    kk = core.add(core.cast(step.two, "i64"), j)
    swapped = _swap(_swap(x, -2, kk, step.target), -1, kk, step.target)
    if j == 0:
        return swapped
    grid, rows = row_grid(n, x), positions(n, x)
    return core.where(core.logical_and(core.ge(grid, j), core.ge(rows, j)), swapped, x)


def _set_column(x: Tensor, k: int, column: Tensor) -> Tensor:
    """x with column k replaced by column (..., n)."""
    return core.where(core.eq(positions(int(x.shape[-1]), x), k), core.unsqueeze(column, -1), x)


def _symmetric_update(x: Tensor, updated: Tensor, first: int) -> Tensor:
    """x with its block [first:, first:] replaced by ``updated``'s lower triangle, mirrored."""
    n = int(x.shape[-1])
    grid, rows = row_grid(n, x), positions(n, x)
    lower = core.where(core.ge(grid, rows), updated, mT(updated))
    return core.where(core.logical_and(core.ge(grid, first), core.ge(rows, first)), lower, x)


def _update(x: Tensor, j: int, step: _Pivot) -> Tensor:
    """The trailing block less the pivot block's part (step j's), one rank-2 update for both
    kinds: A22 -= A(:,j) wk^T + A(:,j+1) wkp1^T, W = [wk wkp1] = [A(:,j) A(:,j+1)] D^-1 L's
    columns. A 1x1 pivot d has wk = A(:,k) / d, wkp1 = 0 (syr's x(i) * (-x(j) / d), the same
    bits); a 2x2 one [[a, b], [b, c]] sytf2's wk, wkp1 as it writes them out. The divisors
    of the kind not taken read 1: no infinity in the branch ``where`` drops, whose gradient
    would be 0 * inf."""
    rows = positions(int(x.shape[-1]), x)
    two = _column(step.two)
    later = core.gt(rows, core.add(core.cast(two, "i64"), j))  # below the pivot block
    below_two = core.logical_and(later, two)
    ak = core.where(later, core.select(x, -1, j), 0.0)
    ak1 = core.where(below_two, core.select(x, -1, j + 1), 0.0)
    d = core.where(step.one, _entry(x, j, j), 1.0)
    b = core.where(step.two, _entry(x, j + 1, j), 1.0)
    d11 = core.div(_entry(x, j + 1, j + 1), b)
    d22 = core.div(_entry(x, j, j), b)
    det = core.where(step.two, core.sub(core.mul(d11, d22), 1.0), 1.0)
    d21 = _column(core.div(core.reciprocal(det), b))
    d11, d22 = _column(d11), _column(d22)
    wk = core.where(two, core.mul(d21, core.sub(core.mul(d11, ak), ak1)),
                    core.mul(ak, _column(core.reciprocal(d))))
    wkp1 = core.where(below_two, core.mul(d21, core.sub(core.mul(d22, ak1), ak)), 0.0)
    x = _symmetric_update(x, core.sub(core.sub(x, outer(ak, wk)), outer(ak1, wkp1)), j + 1)
    x = _set_column(x, j, core.where(later, wk, core.select(x, -1, j)))
    return _set_column(x, j + 1, core.where(below_two, wkp1, core.select(x, -1, j + 1)))


@dataclass(frozen=True)
class _Block:
    """Step k's part in the block structure the pivots spell, per matrix: a 1x1 block, the
    first or the second row of a 2x2 one; ``target`` the 0-based row its swap exchanges."""
    one: Tensor
    first: Tensor
    second: Tensor
    target: Tensor


def _blocks(pivots: Tensor, n: int) -> list[_Block]:
    """Walk the pivots as sytrs does: a negative pivot opens a 2x2 block (unless it closes
    one), which its successor closes; the last row cannot open one."""
    blocks = []
    never = creation.full(tuple(pivots.shape[:-1]), False, "bool", like=pivots)
    second = never
    for k in range(n):
        p = core.select(pivots, -1, k)
        first = core.logical_and(core.lt(p, 0), core.logical_not(second)) if k < n - 1 \
            else never
        one = core.logical_not(core.logical_or(first, second))
        blocks.append(_Block(one, first, second, core.sub(core.abs(p), 1)))
        second = first
    return blocks


def ldl_solve(ld: Tensor, pivots: Tensor, b: Tensor) -> Tensor:
    """X with A X = B (B (..., n, m)) from ldl_factor's LD and pivots, which may come from
    anywhere: sytrs's two sweeps, L D Y = P B forwards, then L^T P^T X = Y backwards."""
    n = static_size(ld, "ldl_solve")
    batch = broadcast_shapes(tuple(ld.shape[:-2]), tuple(pivots.shape[:-1]),
                             tuple(b.shape[:-2]))
    ld = core.broadcast_to(ld, batch + (n, n))
    pivots = core.broadcast_to(core.cast(pivots, "i64"), batch + (n,))
    b = core.broadcast_to(core.cast(b, ld.dtype), batch + tuple(b.shape[-2:]))
    blocks = _blocks(pivots, n)
    for k, block in enumerate(blocks):
        b = _forward(ld, b, k, block)
    for k in range(n - 1, -1, -1):
        b = _backward(ld, b, k, blocks[k])
    return b


def _exchange(b: Tensor, i, row_i: Tensor, target: Tensor, used: Tensor) -> Tensor:
    """b with rows i (an int or (...,); its values ``row_i`` (..., m), known to the caller)
    and ``target`` (...,) exchanged where ``used``: one masked read, the target row."""
    grid = row_grid(int(b.shape[-2]), b)
    used = _whole(used)
    at_i = core.logical_and(used, core.eq(grid, _whole(i) if isinstance(i, Tensor) else i))
    at_target = core.logical_and(used, core.eq(grid, _whole(target)))
    row_target = core.unsqueeze(_pick(b, -2, target), -2)
    return core.where(at_i, row_target, core.where(at_target, core.unsqueeze(row_i, -2), b))


def _set_rows(b: Tensor, rows: dict[int, Tensor]) -> Tensor:
    """b with the given rows (each (..., m)) replaced: a where per row, O(1) nodes at any n."""
    grid = row_grid(int(b.shape[-2]), b)
    for i, row in rows.items():
        b = core.where(core.eq(grid, i), core.unsqueeze(row, -2), b)
    return b


def _forward(ld: Tensor, b: Tensor, k: int, block: _Block) -> Tensor:
    """Step k of L D Y = P B: the interchange of row k (k + 1 opening a 2x2 block), the
    rows below less L's column(s) times the block's rows (one ger, or two), the block's rows
    through D's block."""
    n = int(ld.shape[-1])
    first = _column(block.first)
    kk = core.add(core.cast(block.first, "i64"), k)
    at_kk = core.select(b, -2, k) if k == n - 1 else \
        core.where(first, core.select(b, -2, k + 1), core.select(b, -2, k))
    b = _exchange(b, kk, at_kk, block.target, core.logical_not(block.second))
    bk = core.select(b, -2, k)
    one = core.mul(bk, _column(core.reciprocal(core.where(block.one, _entry(ld, k, k), 1.0))))
    if k == n - 1:
        return core.where(_whole(block.one), _set_rows(b, {k: one}), b)
    rows = positions(n, ld)
    later = core.gt(rows, core.add(core.cast(first, "i64"), k))
    ak = core.where(later, core.select(ld, -1, k), 0.0)
    ak1 = core.where(core.logical_and(later, first), core.select(ld, -1, k + 1), 0.0)
    bk1 = core.select(b, -2, k + 1)
    out = core.sub(core.sub(b, outer(ak, bk)), outer(ak1, bk1))
    two_k, two_k1 = _solve_two(ld, bk, bk1, k, block.first)
    out = _set_rows(out, {k: core.where(first, two_k, one),
                          k + 1: core.where(first, two_k1, core.select(out, -2, k + 1))})
    return core.where(_whole(block.second), b, out)


def _solve_two(ld: Tensor, bk: Tensor, bk1: Tensor, k: int,
               used: Tensor) -> tuple[Tensor, Tensor]:
    """Rows k, k + 1 (``bk``, ``bk1``) through D's 2x2 block, as sytrs writes it out."""
    akm1k = _column(core.where(used, _entry(ld, k + 1, k), 1.0))
    akm1 = core.div(_column(_entry(ld, k, k)), akm1k)
    ak = core.div(_column(_entry(ld, k + 1, k + 1)), akm1k)
    denom = core.where(_column(used), core.sub(core.mul(akm1, ak), 1.0), 1.0)
    bkm1, bk = core.div(bk, akm1k), core.div(bk1, akm1k)
    return (core.div(core.sub(core.mul(ak, bkm1), bk), denom),
            core.div(core.sub(core.mul(akm1, bk), bkm1), denom))


def _backward(ld: Tensor, b: Tensor, k: int, block: _Block) -> Tensor:
    """Step k (from the last) of L^T P^T X = Y: row k (and row k - 1 closing a 2x2 block)
    less L's column below times the rows below (gemv), then the interchange."""
    n = int(ld.shape[-1])
    rows = positions(n, ld)
    if k < n - 1:
        later = core.where(core.gt(rows, k), core.select(ld, -1, k), 0.0)
        updates = {k: core.sub(core.select(b, -2, k), _dot(later, b))}
        if k > 0:
            before = core.where(core.gt(rows, k), core.select(ld, -1, k - 1), 0.0)
            updates[k - 1] = core.where(_column(block.second), core.sub(
                core.select(b, -2, k - 1), _dot(before, b)), core.select(b, -2, k - 1))
        b = core.where(_whole(block.first), b, _set_rows(b, updates))
    return _exchange(b, k, core.select(b, -2, k), block.target, core.logical_not(block.first))


def _dot(column: Tensor, b: Tensor) -> Tensor:
    """column^T b: (..., n) x (..., n, m) -> (..., m)."""
    return core.sum(core.mul(core.unsqueeze(column, -1), b), -2)
