"""The factorizations as one kernel node each, for the front ends: ``linalg_inv``,
``linalg_solve``, ``linalg_cholesky``, ``linalg_det``, ``linalg_slogdet``, ``linalg_eigh``,
``linalg_svd``, ``linalg_qr``, ``linalg_eig``, ``linalg_solve_triangular``,
``linalg_ldl_factor`` and ``linalg_ldl_solve`` (records in ``tdag/lower/kernels/linalg.py``,
each with the composition of this package as its ``decompose``).

Why the front end emits the kernel rather than lowering finding it: the compositions unroll
over n (thousands of nodes at n = 64) and are refused past ``MAX_UNROLLED``, so a rule that
recognised them could never give a 128 x 128 inverse, and matching a template that large at
every candidate root costs more than the conversion. The kernel runs torch.linalg /
jnp.linalg at any n; ONNX and tdag.grad run its ``decompose`` (capped at n <= 64).

A kernel has one output: the ops with several (eigh, svd, qr, slogdet) stack them into one
tensor, as ``adamw_update`` does, and the functions here read them back with slices.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ops import core
from tdag.ops.tensor import Tensor


@dataclass(frozen=True, slots=True)
class Triangle:
    """Which triangle of the matrix an op reads (cholesky: which factor it returns)."""

    upper: bool = False


@dataclass(frozen=True, slots=True)
class Side:
    """linalg.solve: A X = B where ``left``, X A = B otherwise."""

    left: bool = True


@dataclass(frozen=True, slots=True)
class TriangularSolve:
    """linalg.solve_triangular's arguments."""

    upper: bool
    left: bool = True
    unit: bool = False


@dataclass(frozen=True, slots=True)
class Ldl:
    """ldl_factor / ldl_solve: A read as hermitian (sytrf vs hetrf; one for real A)."""

    hermitian: bool = False


def inv(a: Tensor) -> Tensor:
    return a.builder.emit(Op.linalg_inv, NoSpec(), a)


def solve(a: Tensor, b: Tensor, left: bool = True) -> Tensor:
    """X with A X = B; B (..., n, k) (a vector right-hand side is the front end's reshape)."""
    return a.builder.emit(Op.linalg_solve, Side(left), a, b)


def cholesky(a: Tensor, upper: bool = False) -> Tensor:
    return a.builder.emit(Op.linalg_cholesky, Triangle(upper), a)


def det(a: Tensor) -> Tensor:
    return a.builder.emit(Op.linalg_det, NoSpec(), a)


def slogdet(a: Tensor) -> tuple[Tensor, Tensor]:
    """(sign, log|det|), stacked on a last axis of 2 by the kernel."""
    both = a.builder.emit(Op.linalg_slogdet, NoSpec(), a)
    return core.select(both, -1, 0), core.select(both, -1, 1)


def eigh(a: Tensor, upper: bool = False) -> tuple[Tensor, Tensor]:
    """(eigenvalues ascending, eigenvectors): the kernel's (..., n + 1, n) holds the vectors'
    n rows, then the values."""
    n = a.shape[-1]
    both = a.builder.emit(Op.linalg_eigh, Triangle(upper), a)
    return core.select(both, -2, n), core.slice(both, -2, 0, n)


def eig(a: Tensor) -> tuple[Tensor, Tensor]:
    """(eigenvalues, eigenvectors) of a real square matrix, complex, in LAPACK's order and
    phase (geev: unit vectors, each one's largest entry real; the composition,
    ``tdag.ops.linalg.eig``, has its own order); packed as eigh's."""
    n = a.shape[-1]
    both = a.builder.emit(Op.linalg_eig, NoSpec(), a)
    return core.select(both, -2, n), core.slice(both, -2, 0, n)


def ldl_factor(a: Tensor, hermitian: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """(LD, pivots, info) of LAPACK's sytrf (Bunch-Kaufman: 1x1 and 2x2 pivot blocks chosen
    by value): the kernel's (..., n + 2, n) holds LD's n rows, the pivots' row and info's
    (the integers as floats, exact below 2^24)."""
    n = a.shape[-1]
    packed = a.builder.emit(Op.linalg_ldl_factor, Ldl(hermitian), a)
    pivots = core.cast(core.select(packed, -2, n), "i32")
    info = core.cast(core.select(core.select(packed, -2, n + 1), -1, 0), "i32")
    return core.slice(packed, -2, 0, n), pivots, info


def ldl_solve(ld: Tensor, pivots: Tensor, b: Tensor, hermitian: bool = False) -> Tensor:
    """X with A X = B from ldl_factor's LD and pivots (sytrs)."""
    return ld.builder.emit(Op.linalg_ldl_solve, Ldl(hermitian), ld, pivots, b)


def svd(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(U, S, V^T), reduced: the kernel's (..., m + 1 + n, k) holds U's m rows, S, V's n rows."""
    m, n = a.shape[-2], a.shape[-1]
    packed = a.builder.emit(Op.linalg_svd, NoSpec(), a)
    u = core.slice(packed, -2, 0, m)
    v = core.slice(packed, -2, m + 1, m + 1 + n)
    return u, core.select(packed, -2, m), core.transpose(v, -1, -2)


def qr(a: Tensor) -> tuple[Tensor, Tensor]:
    """(Q, R), reduced: the kernel's (..., m + n, k) holds Q's m rows, then R^T's n rows."""
    m = a.shape[-2]
    packed = a.builder.emit(Op.linalg_qr, NoSpec(), a)
    return core.slice(packed, -2, 0, m), core.transpose(core.slice(packed, -2, m), -1, -2)


def solve_triangular(t: Tensor, b: Tensor, upper: bool, left: bool = True,
                     unit: bool = False) -> Tensor:
    return t.builder.emit(Op.linalg_solve_triangular, TriangularSolve(upper, left, unit), t, b)


__all__ = ["Ldl", "Side", "Triangle", "TriangularSolve", "cholesky", "det", "eig", "eigh", "inv",
           "ldl_factor", "ldl_solve", "qr", "slogdet", "solve", "solve_triangular", "svd"]
