"""torch.linalg's factorizations and solves as kernels: each is one LAPACK call in torch
(``torch.linalg.*``) and JAX (``jnp.linalg.*``, ``lax.linalg``), where the composition of
``tdag.ops.linalg`` unrolls over n: thousands of nodes at n = 64, refused past it.

The front end emits these nodes itself (``tdag.ops.linalg.kernels`` says why) and lowering
leaves them; the composition is each record's ``decompose``, which ONNX (no linear algebra
operators) and ``tdag.grad`` run, within the composition's cap of n <= 64 (n <= 12 for
eig, whose QR iterations unroll over n^2). The ops with
several results stack them into their one output (the layouts are in ``tdag/ir/op.py``).

Costs are LAPACK's flop counts (Golub & Van Loan, table 5.5 / 8.6.1), the constant named in
each reason; bytes are the unfused traffic. A singular or indefinite matrix raises in torch
(``torch.linalg``'s own error) and in ``tdag.run`` (a TdagError naming the op); JAX gives
NaN, as jax.numpy does.
"""
from __future__ import annotations

import math

import torch

from tdag import ops
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError, TdagError, UnsupportedOpError
from tdag.ir.batching import AxisRule, Refuse, keep_spec, same_axis
from tdag.ir.op import Op
from tdag.ir.record import NoSpec, Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, is_static
from tdag.ir.types import DType, TensorType
from tdag.lower.kernels.common import decomposed_onnx
from tdag.ops import linalg
from tdag.ops.linalg.kernels import Ldl, Side, Triangle, TriangularSolve
from tdag.ops.promotion import broadcast_shapes


def _matrix(op: str, x: TensorType, square: bool = True) -> tuple[Dim, Dim]:
    """(m, n) of a f32 or f64 (..., m, n), square unless ``square`` is False: LAPACK's
    real types (torch refuses half precision; complex matrices are not mapped yet)."""
    if x.dtype not in (DType.f32, DType.f64) or x.rank < 2:
        raise ShapeError(f"{op}: needs f32 or f64 matrices (..., m, n), got {x}")
    m, n = x.shape[-2], x.shape[-1]
    if square and not dims_equal(m, n):
        raise ShapeError(f"{op}: needs square matrices, got {x}")
    return m, n


def _batch(x: TensorType) -> Dim:
    return as_dim(math.prod(x.shape[:-2], start=1))


def _solve_shape(op: str, a: TensorType, b: TensorType, left: bool) -> TensorType:
    n, _ = _matrix(op, a)
    if b.dtype is not a.dtype or b.rank < 2 or not dims_equal(b.shape[-2 if left else -1], n):
        raise ShapeError(f"{op}: the right-hand side {b} does not fit {a}")
    return b.with_shape(broadcast_shapes(a.shape[:-2], b.shape[:-2]) + tuple(b.shape[-2:]))


def _evaluate(op: Op, call):
    """The reference evaluator: ``call`` on torch.linalg, its refusal of a singular or
    indefinite matrix raised as tdag's error naming the op."""
    def evaluate(spec, xs, resolve):
        try:
            return call(spec, *xs)
        except torch.linalg.LinAlgError as e:
            raise TdagError(f"{op.value}: {e}") from e
    return evaluate


def _cost(flops):
    """Traffic plus ``flops(spec, ins)`` per matrix (rounded to a whole count where static:
    LAPACK's counts carry thirds) times the matrices: the first operand's batch, or the
    output's where a right-hand side broadcasts against it."""
    def cost(spec, ins, out: TensorType) -> Cost:
        count = flops(spec, ins)
        count = round(count) if isinstance(count, float) else as_dim(count)
        return traffic(ins, out, as_dim(count * _batch(out if len(ins) == 2 else ins[0])))
    return cost


# works on the last two axes: any axis before them may be the batch
MATRIX_BATCH = AxisRule(lambda s, t: {t.rank - 2, t.rank - 1}, same_axis, keep_spec,
                        lambda s: s, mixing="factors the matrix the batch axis is part of")
TWO_OPERANDS = Refuse("reads a matrix and a right-hand side whose batches may broadcast")


# -- the packed results and the torch code that writes them ------------------------------------

def linalg_eigh(a: torch.Tensor, uplo: str) -> torch.Tensor:
    """torch.linalg.eigh as the kernel's one output: the vectors' rows, then the values."""
    values, vectors = torch.linalg.eigh(a, UPLO=uplo)
    return torch.cat([vectors, values.unsqueeze(-2)], -2)


def linalg_eig(a: torch.Tensor) -> torch.Tensor:
    """torch.linalg.eig as the kernel's one (complex) output: the vectors' rows, the values."""
    values, vectors = torch.linalg.eig(a)
    return torch.cat([vectors, values.unsqueeze(-2)], -2)


def linalg_ldl_factor(a: torch.Tensor, hermitian: bool) -> torch.Tensor:
    """torch.linalg.ldl_factor_ex as LD's rows, the pivots' row, then info's (as floats)."""
    ld, pivots, info = torch.linalg.ldl_factor_ex(a, hermitian=hermitian)
    info = info[..., None, None].expand(*ld.shape[:-2], 1, ld.shape[-1])
    return torch.cat([ld, pivots.unsqueeze(-2).to(ld.dtype), info.to(ld.dtype)], -2)


def linalg_svd(a: torch.Tensor) -> torch.Tensor:
    """torch.linalg.svd (reduced) as U's rows, S, V's rows."""
    u, s, vh = torch.linalg.svd(a, full_matrices=False)
    return torch.cat([u, s.unsqueeze(-2), vh.mT], -2)


def linalg_qr(a: torch.Tensor) -> torch.Tensor:
    """torch.linalg.qr (reduced) as Q's rows, then R^T's."""
    q, r = torch.linalg.qr(a)
    return torch.cat([q, r.mT], -2)


def _linalg_inv(spec, a):
    return torch.linalg.inv(a)


def _linalg_solve(spec: Side, a, b):
    return torch.linalg.solve(a, b, left=spec.left)


def _linalg_cholesky(spec: Triangle, a):
    return torch.linalg.cholesky(a, upper=spec.upper)


def _linalg_solve_triangular(spec: TriangularSolve, t, b):
    return torch.linalg.solve_triangular(t, b, upper=spec.upper, left=spec.left,
                                         unitriangular=spec.unit)


def _uplo(spec: Triangle) -> str:
    return "U" if spec.upper else "L"


# -- JAX: jnp.linalg, lax.linalg for the triangular solve --------------------------------------

def _jax_solve(node, a, cx):
    x, b = a
    if node.spec.left:
        return cx.jnp.linalg.solve(x, b)
    return cx.jnp.swapaxes(cx.jnp.linalg.solve(cx.jnp.swapaxes(x, -1, -2),
                                               cx.jnp.swapaxes(b, -1, -2)), -1, -2)


def _jax_cholesky(node, a, cx):
    """From the named triangle only, as torch (jnp.linalg.cholesky averages A and A^T):
    the upper factor is the lower one of A^T, transposed."""
    x = cx.jnp.swapaxes(a[0], -1, -2) if node.spec.upper else a[0]
    lower = cx.lax.linalg.cholesky(x, symmetrize_input=False)
    return cx.jnp.swapaxes(lower, -1, -2) if node.spec.upper else lower


def _jax_eigh(node, a, cx):
    values, vectors = cx.jnp.linalg.eigh(a[0], UPLO=_uplo(node.spec), symmetrize_input=False)
    return cx.jnp.concatenate([vectors, values[..., None, :]], -2)


def _jax_eig(node, a, cx):
    """jnp.linalg.eig: LAPACK's geev on the CPU, as torch's (GPU and TPU JAX refuse it)."""
    values, vectors = cx.jnp.linalg.eig(a[0])
    return cx.jnp.concatenate([vectors, values[..., None, :]], -2)


def _jax_refuses(node, a, cx):
    raise UnsupportedOpError(f"to_jax: {node.op.value}: JAX has no LDL^T factorization "
                             "(LAPACK's sytrf / sytrs)", node=node.name, origin=node.origin)


def _jax_svd(node, a, cx):
    u, s, vh = cx.jnp.linalg.svd(a[0], full_matrices=False)
    return cx.jnp.concatenate([u, s[..., None, :], cx.jnp.swapaxes(vh, -1, -2)], -2)


def _jax_qr(node, a, cx):
    q, r = cx.jnp.linalg.qr(a[0], mode="reduced")
    return cx.jnp.concatenate([q, cx.jnp.swapaxes(r, -1, -2)], -2)


def _jax_solve_triangular(node, a, cx):
    t, b = a
    s = node.spec
    batch = broadcast_shapes(t.shape[:-2], b.shape[:-2])
    t = cx.jnp.broadcast_to(t, batch + t.shape[-2:])
    b = cx.jnp.broadcast_to(b, batch + b.shape[-2:])
    return cx.lax.linalg.triangular_solve(t, b, left_side=s.left, lower=not s.upper,
                                          unit_diagonal=s.unit)


# -- the compositions (decompose), packed as the kernels' outputs ------------------------------

def _decompose_solve(spec: Side, a, b):
    x, factors = linalg.solve(a, b, spec.left)
    return linalg.checked(x, factors.info, "linalg.solve")


def _decompose_cholesky(spec: Triangle, a):
    factor, info = linalg.cholesky_ex(a, spec.upper)
    return linalg.checked(factor, info, "linalg.cholesky")


def _decompose_eigh(spec: Triangle, a):
    values, vectors = linalg.eigh(a, spec.upper)
    return ops.concat([vectors, ops.unsqueeze(values, -2)], -2)


def _decompose_ldl_factor(spec: Ldl, a):
    """LD's rows, the pivots' row, info's row (as floats), as linalg_ldl_factor packs them;
    ``hermitian`` is sytrf's own for real matrices."""
    factors = linalg.ldl_factor(a)
    n = a.shape[-1]
    info = ops.broadcast_to(ops.unsqueeze(ops.unsqueeze(ops.cast(factors.info, a.dtype), -1), -1),
                            tuple(a.shape[:-2]) + (1, n))
    return ops.concat([factors.ld, ops.unsqueeze(ops.cast(factors.pivots, a.dtype), -2), info],
                      -2)


def _decompose_eig(spec, a):
    values, vectors = linalg.eig(a)
    return ops.concat([vectors, ops.unsqueeze(values, -2)], -2)


def _decompose_svd(spec, a):
    u, s, vh = linalg.svd(a)
    return ops.concat([u, ops.unsqueeze(s, -2), ops.transpose(vh, -1, -2)], -2)


def _decompose_qr(spec, a):
    q, r = linalg.qr(a, "reduced")
    return ops.concat([q, ops.transpose(r, -1, -2)], -2)


# -- shapes ------------------------------------------------------------------------------------

def _same(op: str):
    def shape(spec, ins):
        _matrix(op, ins[0])
        return ins[0]
    return shape


def _det_shape(spec, ins):
    _matrix("linalg_det", ins[0])
    return ins[0].with_shape(ins[0].shape[:-2])


def _slogdet_shape(spec, ins):
    _matrix("linalg_slogdet", ins[0])
    return ins[0].with_shape(tuple(ins[0].shape[:-2]) + (2,))


def _eigh_shape(spec, ins):
    n, _ = _matrix("linalg_eigh", ins[0])
    return ins[0].with_shape(tuple(ins[0].shape[:-2]) + (as_dim(n + 1), n))


def _eig_shape(spec, ins):
    n, _ = _matrix("linalg_eig", ins[0])
    complex_type = DType.c64 if ins[0].dtype is DType.f32 else DType.c128
    return ins[0].with_shape(tuple(ins[0].shape[:-2]) + (as_dim(n + 1), n)).with_dtype(
        complex_type)


def _ldl_factor_shape(spec, ins):
    n, _ = _matrix("linalg_ldl_factor", ins[0])
    return ins[0].with_shape(tuple(ins[0].shape[:-2]) + (as_dim(n + 2), n))


def _ldl_solve_shape(spec, ins):
    ld, pivots, b = ins
    n, _ = _matrix("linalg_ldl_solve", ld)
    if pivots.dtype is not DType.i32 or not dims_equal(pivots.shape[-1], n):
        raise ShapeError(f"linalg_ldl_solve: pivots {pivots} do not fit {ld} (int32 [..., n])")
    return _solve_shape("linalg_ldl_solve", ld, b, True)


def _svd_shape(spec, ins):
    m, n = _matrix("linalg_svd", ins[0], square=False)
    return ins[0].with_shape(tuple(ins[0].shape[:-2]) + (as_dim(m + 1 + n), _smaller(m, n)))


def _qr_shape(spec, ins):
    m, n = _matrix("linalg_qr", ins[0], square=False)
    return ins[0].with_shape(tuple(ins[0].shape[:-2]) + (as_dim(m + n), _smaller(m, n)))


def _smaller(m: Dim, n: Dim) -> Dim:
    if is_static(m) and is_static(n):
        return min(int(m), int(n))
    if dims_equal(m, n):
        return m
    raise ShapeError(f"linalg: min({m}, {n}) of two symbolic sizes")


def _n(ins) -> Dim:
    return ins[0].shape[-1]


def _mn(ins) -> tuple[Dim, Dim]:
    """(m, n): the larger side, then the smaller."""
    m, n = ins[0].shape[-2], ins[0].shape[-1]
    if is_static(m) and is_static(n) and int(m) < int(n):
        m, n = n, m
    return m, n


def _columns(spec, ins) -> Dim:
    """The right-hand side's column count (its row count where the solve is on the right)."""
    return ins[1].shape[-1] if spec.left else ins[1].shape[-2]


def _register(op, spec_type, arity, shape, call, flops, reason, torch_code, jax, decompose,
              batch=MATRIX_BATCH):
    primitive(op, spec_type, arity, shape, _evaluate(op, call), _cost(flops), reason,
              traits=Trait.KERNEL, batch=batch, torch=torch_code, onnx=decomposed_onnx,
              jax=jax, decompose=decompose)


_register(Op.linalg_inv, NoSpec, 1, _same("linalg_inv"), _linalg_inv,
          lambda s, ins: 2 * _n(ins) ** 3,
          "getrf + getri, 2 n^3 flops; the unrolled LU is n steps of graph nodes, n <= 64",
          lambda node, a, code: f"torch.linalg.inv({a[0]})",
          lambda node, a, cx: cx.jnp.linalg.inv(a[0]),
          lambda s, a: linalg.inv(a))
_register(Op.linalg_solve, Side, 2,
          lambda s, ins: _solve_shape("linalg_solve", ins[0], ins[1], s.left), _linalg_solve,
          lambda s, ins: (2 * _n(ins) ** 3 / 3 + 2 * _n(ins) ** 2 * _columns(s, ins))
         ,
          "getrf + getrs, 2/3 n^3 + 2 n^2 k flops; the unrolled LU is n steps of graph nodes",
          lambda node, a, code: f"torch.linalg.solve({a[0]}, {a[1]}, left={node.spec.left})",
          _jax_solve, _decompose_solve, batch=TWO_OPERANDS)
_register(Op.linalg_cholesky, Triangle, 1, _same("linalg_cholesky"), _linalg_cholesky,
          lambda s, ins: _n(ins) ** 3 / 3,
          "potrf, n^3/3 flops; the unrolled factorization is n rank-one updates of nodes",
          lambda node, a, code: f"torch.linalg.cholesky({a[0]}, upper={node.spec.upper})",
          _jax_cholesky, _decompose_cholesky)
_register(Op.linalg_det, NoSpec, 1, _det_shape, lambda s, a: torch.linalg.det(a),
          lambda s, ins: 2 * _n(ins) ** 3 / 3,
          "getrf and U's diagonal, 2/3 n^3 flops; the unrolled LU is n steps of nodes",
          lambda node, a, code: f"torch.linalg.det({a[0]})",
          lambda node, a, cx: cx.jnp.linalg.det(a[0]), lambda s, a: linalg.det(a))
_register(Op.linalg_slogdet, NoSpec, 1, _slogdet_shape,
          lambda s, a: torch.stack(torch.linalg.slogdet(a), -1),
          lambda s, ins: 2 * _n(ins) ** 3 / 3,
          "getrf and U's diagonal, 2/3 n^3 flops; the unrolled LU is n steps of nodes",
          lambda node, a, code: f"torch.stack(torch.linalg.slogdet({a[0]}), -1)",
          lambda node, a, cx: cx.jnp.stack(cx.jnp.linalg.slogdet(a[0]), -1),
          lambda s, a: ops.stack(list(linalg.slogdet(a)), -1))
_register(Op.linalg_eigh, Triangle, 1, _eigh_shape,
          lambda s, a: linalg_eigh(a, _uplo(s)),
          lambda s, ins: 9 * _n(ins) ** 3,
          "syevd with vectors, about 9 n^3 flops; the composition is up to 10 unrolled "
          "Jacobi sweeps of n - 1 rounds, n <= 64",
          lambda node, a, code: f"_rt.linalg_eigh({a[0]}, {_uplo(node.spec)!r})",
          _jax_eigh, _decompose_eigh)
_register(Op.linalg_eig, NoSpec, 1, _eig_shape, lambda s, a: linalg_eig(a),
          lambda s, ins: 25 * _n(ins) ** 3,
          "geev with right vectors, about 25 n^3 flops (Hessenberg QR to the real Schur form, "
          "then back-substitution); the composition is Hessenberg reduction, 10 complex "
          "Wilkinson-shifted QR steps per deflated eigenvalue and triangular back-"
          "substitution, n <= 12",
          lambda node, a, code: f"_rt.linalg_eig({a[0]})", _jax_eig, _decompose_eig)
_register(Op.linalg_ldl_factor, Ldl, 1, _ldl_factor_shape,
          lambda s, a: linalg_ldl_factor(a, s.hermitian), lambda s, ins: _n(ins) ** 3 / 3,
          "sytrf, n^3/3 flops; the composition unrolls sytf2's Bunch-Kaufman steps (1x1 or "
          "2x2 blocks chosen by value, per matrix, with where), n <= 64; JAX refuses it",
          lambda node, a, code: f"_rt.linalg_ldl_factor({a[0]}, {node.spec.hermitian})",
          _jax_refuses, _decompose_ldl_factor)
_register(Op.linalg_ldl_solve, Ldl, 3, _ldl_solve_shape,
          lambda s, ld, pivots, b: torch.linalg.ldl_solve(ld, pivots, b, hermitian=s.hermitian),
          lambda s, ins: 2 * _n(ins) ** 2 * ins[2].shape[-1],
          "sytrs, 2 n^2 k flops; the composition unrolls its two sweeps, each step's block "
          "read from the pivots' sign, n <= 64; JAX refuses it",
          lambda node, a, code: (f"torch.linalg.ldl_solve({a[0]}, {a[1]}, {a[2]}, "
                                 f"hermitian={node.spec.hermitian})"),
          _jax_refuses, lambda s, ld, pivots, b: linalg.ldl_solve(ld, pivots, b),
          batch=Refuse("reads factors, pivots and a right-hand side whose batches may "
                       "broadcast"))
_register(Op.linalg_svd, NoSpec, 1, _svd_shape, lambda s, a: linalg_svd(a),
          lambda s, ins: 14 * _mn(ins)[0] * _mn(ins)[1] ** 2 + 8 * _mn(ins)[1] ** 3,
          "gesdd reduced, about 14 m n^2 + 8 n^3 flops; the composition is up to 10 unrolled "
          "one-sided Jacobi sweeps, n <= 64",
          lambda node, a, code: f"_rt.linalg_svd({a[0]})", _jax_svd, _decompose_svd)
_register(Op.linalg_qr, NoSpec, 1, _qr_shape, lambda s, a: linalg_qr(a),
          lambda s, ins: 4 * _mn(ins)[0] * _mn(ins)[1] ** 2 - 4 * _mn(ins)[1] ** 3 / 3,
          "geqrf + orgqr, 4 m n^2 - 4/3 n^3 flops; the composition unrolls each reflector",
          lambda node, a, code: f"_rt.linalg_qr({a[0]})", _jax_qr, _decompose_qr)
_register(Op.linalg_solve_triangular, TriangularSolve, 2,
          lambda s, ins: _solve_shape("linalg_solve_triangular", ins[0], ins[1], s.left),
          _linalg_solve_triangular,
          lambda s, ins: _n(ins) ** 2 * _columns(s, ins),
          "trsm, n^2 k flops; the unrolled substitution is n steps of nodes",
          lambda node, a, code: (
              f"torch.linalg.solve_triangular({a[0]}, {a[1]}, upper={node.spec.upper}, "
              f"left={node.spec.left}, unitriangular={node.spec.unit})"),
          _jax_solve_triangular,
          lambda s, t, b: linalg.solve_triangular(t, b, s.upper, s.left, s.unit),
          batch=TWO_OPERANDS)
