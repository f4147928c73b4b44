"""The linear-algebra kernels (tdag/lower/kernels/linalg.py): each equals its composition
(its ``decompose``) on random matrices, the torch module calls torch.linalg, a 128 x 128
matrix (past the compositions' cap of 64) goes through to_torch and to_jax, ONNX (which runs
the composition) refuses it by name, and strip_batch and tdag.grad see through the kernels.

Tolerances: 1e-4 of the output's scale on 6 x 6 float32 matrices (Jacobi's sweeps and LAPACK
round differently; eigen- and singular vectors compared up to a column's sign); 1e-3 at
128 x 128 (LAPACK's blocked and unblocked paths, torch's and JAX's, differ there).
"""
from __future__ import annotations

import pytest
import torch

import tdag
from support.targets import assert_on_targets
from tdag.ir.op import Op
from tdag.ir.record import NoSpec, record
from tdag.ops.linalg.kernels import Side, Triangle, TriangularSolve

S = tdag.TensorSpec


def _spd(*shape):
    a = torch.randn(*shape)
    return a @ a.mT + shape[-1] * torch.eye(shape[-1])


def _signs(u: torch.Tensor) -> torch.Tensor:
    """+-1 per column making each column's largest entry positive."""
    top = torch.gather(u, -2, u.abs().argmax(-2, keepdim=True))
    return torch.where(top < 0, -1.0, 1.0)


def _eigh_signs(packed: torch.Tensor) -> torch.Tensor:
    """The vectors' rows (all but the last) with each column's sign fixed."""
    vectors = packed[..., :-1, :]
    return torch.cat([vectors * _signs(vectors), packed[..., -1:, :]], -2)


def _svd_signs(m: int):
    """U's and V's columns flip together: U's signs fixed, carried to V."""
    def fix(packed):
        flip = _signs(packed[..., :m, :])
        return torch.cat([packed[..., :m, :] * flip, packed[..., m:m + 1, :],
                          packed[..., m + 1:, :] * flip], -2)
    return fix


def _same(x):
    return x


# name: (op, spec, operand shapes, whether the first operand is drawn positive definite,
# the normalisation of the packed output)
CASES = {
    "inv": (Op.linalg_inv, NoSpec(), [(2, 6, 6)], False, _same),
    "solve": (Op.linalg_solve, Side(), [(2, 6, 6), (2, 6, 3)], False, _same),
    "solve_right": (Op.linalg_solve, Side(False), [(6, 6), (2, 3, 6)], False, _same),
    "cholesky": (Op.linalg_cholesky, Triangle(), [(2, 6, 6)], True, _same),
    "cholesky_upper": (Op.linalg_cholesky, Triangle(True), [(6, 6)], True, _same),
    "det": (Op.linalg_det, NoSpec(), [(2, 6, 6)], False, _same),
    "slogdet": (Op.linalg_slogdet, NoSpec(), [(2, 6, 6)], False, _same),
    "eigh": (Op.linalg_eigh, Triangle(), [(2, 6, 6)], True, _eigh_signs),
    "eigh_upper": (Op.linalg_eigh, Triangle(True), [(6, 6)], True, _eigh_signs),
    "svd": (Op.linalg_svd, NoSpec(), [(2, 7, 5)], False, _svd_signs(7)),
    "svd_wide": (Op.linalg_svd, NoSpec(), [(4, 6)], False, _svd_signs(4)),
    "qr": (Op.linalg_qr, NoSpec(), [(2, 7, 5)], False, _same),
    "qr_wide": (Op.linalg_qr, NoSpec(), [(5, 7)], False, _same),
    "solve_triangular": (Op.linalg_solve_triangular, TriangularSolve(True),
                         [(2, 6, 6), (2, 6, 3)], True, _same),
    "solve_triangular_right_unit": (Op.linalg_solve_triangular,
                                    TriangularSolve(False, False, True), [(6, 6), (2, 3, 6)],
                                    True, _same),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_kernel_equals_its_composition(name):
    op, spec, shapes, spd, normalize = CASES[name]
    specs = [S(s) for s in shapes]
    kernel = tdag.trace(lambda *xs: xs[0].builder.emit(op, spec, *xs), *specs)
    composition = tdag.trace(lambda *xs: record(op).decompose(spec, *xs), *specs)
    assert [n.op for n in kernel.graph.nodes] == [op]
    assert op not in {n.op for n in composition.graph.nodes}
    torch.manual_seed(0)
    args = [_spd(*shapes[0]) if spd else torch.randn(*shapes[0])] + \
        [torch.randn(*s) for s in shapes[1:]]
    want = normalize(tdag.run(kernel, *args))
    got = normalize(tdag.run(composition, *args))
    scale = max(want.abs().max().item(), 1.0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * scale)


TORCH_CALLS = {
    "inv": (torch.linalg.inv, "torch.linalg.inv("),
    "solve": (lambda a: torch.linalg.solve(a, a[..., :2]), "torch.linalg.solve("),
    "cholesky": (torch.linalg.cholesky, "torch.linalg.cholesky("),
    "det": (torch.linalg.det, "torch.linalg.det("),
    "slogdet": (torch.linalg.slogdet, "torch.linalg.slogdet("),
    "eigh": (torch.linalg.eigh, "_rt.linalg_eigh("),
    "svd": (lambda a: torch.linalg.svd(a, full_matrices=False), "_rt.linalg_svd("),
    "qr": (torch.linalg.qr, "_rt.linalg_qr("),
    "solve_triangular": (lambda a: torch.linalg.solve_triangular(a, a[..., :2], upper=True),
                         "torch.linalg.solve_triangular("),
}


def _vector_signs(outs):
    """eigh's or svd's outputs with U's (or the vectors') column signs fixed, V's with them."""
    if len(outs) == 2:
        return outs[0], outs[1] * _signs(outs[1])
    flip = _signs(outs[0])
    return outs[0] * flip, outs[1], outs[2] * flip.mT


@pytest.mark.parametrize("name", list(TORCH_CALLS))
def test_to_torch_calls_torch_linalg_past_the_unrolled_cap(name):
    """n = 128 > MAX_UNROLLED: the kernel through to_torch and to_jax, against eager."""
    fn, call = TORCH_CALLS[name]
    torch.manual_seed(0)
    definite = name in ("cholesky", "eigh", "solve_triangular")
    a = _spd(128, 128) if definite else torch.randn(128, 128)
    normalize = _vector_signs if name in ("eigh", "svd") else _same
    prog = assert_on_targets(fn, (a,), rtol=1e-3, atol=1e-3, targets=("run", "torch", "jax"),
                             normalize=normalize)
    assert call in tdag.to_torch(prog).code


def test_onnx_refuses_past_the_unrolled_cap():
    prog = tdag.trace(lambda a: a.builder.emit(Op.linalg_inv, NoSpec(), a), S((128, 128)))
    with pytest.raises(tdag.ShapeError, match="at most 64"):
        tdag.to_onnx(prog)


def test_strip_batch_keeps_the_kernel():
    prog = tdag.trace(lambda a: a.builder.emit(Op.linalg_inv, NoSpec(), a), S(("b", 5, 5)))
    one = tdag.strip_batch(prog)
    a = torch.randn(1, 5, 5)
    assert [n.op for n in one.graph.nodes] == [Op.linalg_inv]
    torch.testing.assert_close(tdag.run(one, a[0]), torch.linalg.inv(a[0]))


def test_grad_differentiates_the_composition():
    """d sum(inv(A) * w) / dA through the kernel's decompose, against torch's autograd."""
    torch.manual_seed(0)
    a, w = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    prog = tdag.trace(lambda x, y: (x.builder.emit(Op.linalg_inv, NoSpec(), x) * y).sum(),
                      S((4, 4), "float64"), S((4, 4), "float64"))
    g = tdag.grad(prog, wrt=[prog.graph.inputs[0].name])
    _, got = tdag.run(g, a, w)
    x = a.clone().requires_grad_()
    (torch.linalg.inv(x) * w).sum().backward()
    torch.testing.assert_close(got, x.grad)


@pytest.mark.parametrize("upper", [False, True], ids=["lower", "upper"])
def test_only_the_named_triangle_is_read_on_every_target(upper):
    """The other triangle holds noise: torch reads one triangle (jnp.linalg would average)."""
    torch.manual_seed(0)
    noise = torch.randn(5, 5)
    a = _spd(5, 5) + (noise.tril(-1) if upper else noise.triu(1))
    uplo = "U" if upper else "L"
    assert_on_targets(lambda x: (torch.linalg.cholesky(x, upper=upper),
                                 torch.linalg.eigh(x, UPLO=uplo)[0]), (a,))
