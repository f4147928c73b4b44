"""Symmetric eigendecomposition and SVD by Jacobi rotations, a fixed number of sweeps.

A sweep visits every pair (p, q) once in round-robin order (Brent-Luk): n - 1 rounds of n/2
disjoint rotations, each round a handful of O(n^2) elementwise ops and one static row/column
permutation, O(n^3) a sweep. Jacobi converges quadratically once the off-diagonal is small;
``sweeps(n)`` (6 for n <= 4, up to 10 for n = 64) takes a float32 matrix, random or
ill-conditioned (cond 1e6), to the eigenvalues torch's syevd gives within 1e-5 relative to
the largest. The SVD is the
one-sided form (Hestenes): the same rotations on the columns of A, A^T A's eigenproblem
without forming it. Eigen- and singular vectors are unique up to sign only: tdag's and
LAPACK's may differ by a column's sign."""
from __future__ import annotations

import math

from tdag.ops import core
from tdag.ops.linalg.common import batch_eye, diagonal, mT, positions, static_size
from tdag.ops.sorting import sort
from tdag.ops.tensor import Tensor
from tdag.ops.writes import take_along

MAX_SWEEPS = 10


def rounds(n: int) -> list[list[int]]:
    """Each round's partner of every index (itself where it sits out): the circle method."""
    players = list(range(n)) + ([n] if n % 2 else [])
    size = len(players)
    out = []
    for _ in range(size - 1):
        partner = list(range(n))
        for i in range(size // 2):
            p, q = players[i], players[size - 1 - i]
            if p < n and q < n:
                partner[p], partner[q] = q, p
        out.append(partner)
        players = [players[0], players[-1]] + players[1:-1]
    return out


def _gather_last(v: Tensor, partner: list[int]) -> Tensor:
    """v[..., partner]: the partner's entry (or column) on the last axis, a static take."""
    return core.gather(v, partner, v.ndim - 1, wrap=False)


def _rotation(diag: Tensor, off: Tensor, partner: list[int]) -> tuple[Tensor, Tensor]:
    """(c, s_i) per index: the rotation that zeroes a_pq, theta = (a_qq - a_pp) / 2 a_pq;
    the partner's s is the negative of p's, so one row/column formula serves both."""
    alone = diag.builder.const([p == i for i, p in enumerate(partner)], "bool")  # sits out
    zero = core.logical_or(core.eq(off, 0.0), alone)
    theta = core.div(core.sub(_gather_last(diag, partner), diag),
                     core.mul(core.where(zero, 1.0, off), 2.0))
    t = core.div(core.where(core.ge(theta, 0.0), 1.0, -1.0),
                 core.add(core.abs(theta), core.sqrt(core.add(core.square(theta), 1.0))))
    t = core.where(zero, 0.0, t)
    c = core.rsqrt(core.add(core.square(t), 1.0))
    return c, core.mul(t, c)


def _rotate_columns(x: Tensor, c: Tensor, s: Tensor, partner: list[int]) -> Tensor:
    """x J: column i becomes c_i x_i - s_i x_partner(i)."""
    return core.sub(core.mul(x, core.unsqueeze(c, -2)),
                    core.mul(_gather_last(x, partner), core.unsqueeze(s, -2)))


def sweeps(n: int) -> int:
    """Sweeps for float32 accuracy at size n: quadratic convergence needs about log2(n) + 4
    (checked: eigenvalues and singular values within 1e-5 of the largest for n = 4, 8, 16 on
    random and cond-1e6 matrices)."""
    return min(MAX_SWEEPS, max(6, math.ceil(math.log2(max(n, 2))) + 4))


def eigh(a: Tensor, upper: bool = False) -> tuple[Tensor, Tensor]:
    """(eigenvalues ascending, eigenvectors as columns) of the symmetric matrices of a, read
    from one triangle (the lower unless ``upper``), as torch.linalg.eigh."""
    n = static_size(a, "eigh")
    idx = positions(n, a)
    keep = (core.ge if upper else core.le)(idx, core.unsqueeze(idx, 1))  # col <= row: lower
    a = core.where(keep, a, mT(a))
    v = batch_eye(a, n)
    upper = core.ge(idx, core.unsqueeze(idx, 1))
    one_hots = {}
    for _ in range(sweeps(n) if n > 1 else 0):
        for partner in rounds(n):
            key = tuple(partner)
            if key not in one_hots:  # a[i, partner[i]] as a masked row sum
                one_hots[key] = a.builder.const(
                    [[float(j == p) for j in range(n)] for p in partner], a.dtype)
            a = core.where(upper, a, mT(a))  # exactly symmetric: p and q rotate alike
            off = core.sum(core.mul(a, one_hots[key]), -1)
            c, s = _rotation(diagonal(a), off, partner)
            a = _rotate_columns(mT(_rotate_columns(a, c, s, partner)), c, s, partner)
            v = _rotate_columns(v, c, s, partner)
    values, order = sort(diagonal(a), -1)
    return values, take_along(v, v.ndim - 1, core.broadcast_to(core.unsqueeze(order, -2),
                                                                tuple(v.shape)))


def svd(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(U, S descending, V^T), reduced, by one-sided Jacobi on the columns of a (m >= n; the
    transpose otherwise)."""
    static_size(a, "svd", square=False)
    m, n = int(a.shape[-2]), int(a.shape[-1])
    if m < n:
        u, s, vh = svd(mT(a))
        return mT(vh), s, mT(u)
    v = batch_eye(a, n)
    for _ in range(sweeps(n) if n > 1 else 0):
        for partner in rounds(n):
            norms = core.sum(core.square(a), -2)
            off = core.sum(core.mul(a, _gather_last(a, partner)), -2)
            c, s = _rotation(norms, off, partner)
            a = _rotate_columns(a, c, s, partner)
            v = _rotate_columns(v, c, s, partner)
    values, order = sort(core.sqrt(core.sum(core.square(a), -2)), -1, descending=True)
    a = take_along(a, a.ndim - 1, core.broadcast_to(core.unsqueeze(order, -2), tuple(a.shape)))
    v = take_along(v, v.ndim - 1, core.broadcast_to(core.unsqueeze(order, -2), tuple(v.shape)))
    safe = core.where(core.eq(values, 0.0), 1.0, values)
    return core.div(a, core.unsqueeze(safe, -2)), values, mT(v)
