"""Every kernel's gradient, on every example of tests/support/kernel_cases.py: a kernel
without a ``vjp`` rule is differentiated through its composition (``tdag.refine.grad``
replays its ``decompose``).

For the scalar ``sum(kernel(x...) * w)`` (a fixed random ``w``, so every output element's
cotangent differs) ``tdag.grad``'s gradient of each floating-point operand is checked
against torch's autograd through the kernel record's evaluator and against central finite
differences of that evaluator. Operands are float64 where the kernel takes them (every
kernel but those whose operand types are pinned), else float32 with looser tolerances.

A kernel whose output is an integer or a bool (a label, a position, a quantized value) is
piecewise constant in its float operands: its gradient is zeros, as torch's autograd
gives none (checked below), and differentiating its output itself is refused with a
GradError.
"""
from __future__ import annotations

import pytest
import torch

import tdag
from support.kernel_cases import CASES, GAUGE_FREE, Case, case_id, draw_inputs
from tdag import ops
from tdag.ir.op import Op
from tdag.ir.record import record
from tdag.ir.symbols import as_dim
from tdag.ir.types import DType, TensorType
from tdag.ops.builder import Builder

# (rtol, atol against the largest reference value) per precision; a linear resize's
# composition takes its weights in float32 as torch's float32 kernel does, 1e-7 off in float64
TOLERANCES = {torch.float64: dict(eps=1e-6, autograd=(1e-6, 1e-8), fd=(1e-5, 1e-6)),
              torch.float32: dict(eps=1e-2, autograd=(1e-4, 1e-5), fd=(1e-2, 1e-3))}
# torch's scatter backward hands every write its cotangent, the overwritten duplicates too
# (kernel_cases draws put_along's index all 0): finite differences check those
AUTOGRAD_WRONG = (Op.put_along,)
FD_ELEMENTS = 24  # finite differences at this many seeded elements per operand (autograd: all)


def _types(case: Case, dtype: DType) -> list[TensorType]:
    """The operands' types, every float operand in ``dtype`` (a str axis stays a symbol)."""
    types = []
    for spec in case.specs():
        d = DType.of(spec.dtype)
        types.append(TensorType(tuple(as_dim(a) for a in spec.shape), dtype if d.is_float else d))
    return types


def _precision(case: Case) -> DType | None:
    """float64 where the kernel's shape rule takes it, else float32; None if its output is
    not floating point (nothing to differentiate)."""
    for dtype in (DType.f64, DType.f32):
        try:
            out = record(case.op).shape(case.spec, _types(case, dtype))
        except tdag.ShapeError:
            continue
        return dtype if out.dtype.is_float or out.dtype.is_complex else None
    return None


def _floats(case: Case) -> list[int]:
    return [i for i, t in enumerate(_types(case, DType.f32)) if t.dtype.is_float]


DIFFERENTIABLE = [c for c in CASES if _precision(c) is not None and _floats(c)
                  and c.op not in GAUGE_FREE]  # an order and phase of its own
PIECEWISE_CONSTANT = [c for c in CASES if _precision(c) is None and _floats(c)]


def _operands(case: Case, dtype: torch.dtype) -> list[torch.Tensor]:
    return [x.to(dtype) if x.is_floating_point() else x for x in draw_inputs(case)]


def _loss_program(case: Case, dtype: DType, cast: bool = False) -> tdag.Program:
    """``sum(kernel(x...) * w)`` over the program's inputs ``x0 ...`` and ``w``; ``cast``
    takes an integer output to ``dtype`` first; a complex output is summed as its pairs."""
    b = Builder()
    ins = [b.input(f"x{i}", t) for i, t in enumerate(_types(case, dtype))]
    y = b.emit(case.op, case.spec, *ins, name="y")
    if y.dtype.is_complex:
        y = ops.view_as_real(y)
    if cast:
        y = ops.cast(y, dtype)
    w = b.input("w", TensorType(y.shape, dtype))
    return tdag.Program.from_tdag(b.build([ops.sum(y * w)]))


def _evaluate(case: Case, xs) -> torch.Tensor:
    """The kernel's evaluator; a complex result as its (real, imaginary) pairs."""
    y = record(case.op).evaluate(case.spec, xs, int)
    return torch.view_as_real(y) if y.is_complex() else y


def _weights(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return (torch.rand(y.shape, generator=gen, dtype=torch.float64) + 0.5).to(dtype)


def _autograd(case: Case, xs, w, floats) -> list[torch.Tensor] | None:
    """torch's gradient through the kernel's evaluator; None where torch cannot
    differentiate the evaluator's ops."""
    if case.op in AUTOGRAD_WRONG:
        return None
    leaves = [x.clone().requires_grad_(i in floats) for i, x in enumerate(xs)]
    try:
        loss = (_evaluate(case, leaves).to(w.dtype) * w).sum()
        got = torch.autograd.grad(loss, [leaves[i] for i in floats], allow_unused=True)
    except RuntimeError:
        return None
    return [torch.zeros_like(xs[i]) if g is None else g for i, g in zip(floats, got)]


def _finite_differences(case: Case, xs, w, i: int, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """d loss / d xs[i] at ``FD_ELEMENTS`` seeded positions (all where there are fewer):
    (the flat positions, the derivatives)."""
    n = xs[i].numel()
    positions = torch.randperm(n, generator=torch.Generator().manual_seed(2))[:FD_ELEMENTS]
    out = torch.zeros(len(positions), dtype=torch.float64)
    for j, k in enumerate(positions.tolist()):
        values = []
        for sign in (1.0, -1.0):
            moved = [x.clone() for x in xs]
            moved[i].view(-1)[k] += sign * eps
            values.append((_evaluate(case, moved).to(torch.float64) * w).sum().item())
        out[j] = (values[0] - values[1]) / (2 * eps)
    return positions, out


def _gradients(case: Case, xs, w, dtype: DType, cast: bool = False) -> list[torch.Tensor]:
    prog = _loss_program(case, dtype, cast)
    wrt = [f"x{i}" for i in _floats(case)]
    return tdag.run(tdag.grad(prog, wrt=wrt), *xs, w)[1:]


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=[case_id(c) for c in DIFFERENTIABLE])
def test_kernel_gradient_matches_autograd_and_finite_differences(case: Case):
    dtype = _precision(case)
    tdtype = dtype.torch
    tol = TOLERANCES[tdtype]
    xs = _operands(case, tdtype)
    w = _weights(_evaluate(case, xs), tdtype)
    floats = _floats(case)
    grads = _gradients(case, xs, w, dtype)
    reference = _autograd(case, xs, w, floats)
    for k, i in enumerate(floats):
        got = grads[k]
        assert got.shape == xs[i].shape and got.dtype == tdtype, case_id(case)
        if reference is not None:
            rtol, atol = tol["autograd"]
            torch.testing.assert_close(got, reference[k], rtol=rtol, atol=atol,
                                       msg=f"{case_id(case)}: operand {i} vs autograd")
        rtol, atol = tol["fd"]
        positions, fd = _finite_differences(case, xs, w.to(torch.float64), i, tol["eps"])
        atol *= max(1.0, fd.abs().max().item())
        torch.testing.assert_close(got.to(torch.float64).flatten()[positions], fd, rtol=rtol,
                                   atol=atol,
                                   msg=f"{case_id(case)}: operand {i} vs finite differences")


@pytest.mark.parametrize("case", PIECEWISE_CONSTANT, ids=[case_id(c) for c in PIECEWISE_CONSTANT])
def test_integer_kernel_output_has_zero_gradient_and_refuses_differentiation(case: Case):
    """A label, a position or a quantized value: its float operands get zeros through a
    cast (autograd has no gradient for them either), and the output itself is refused."""
    xs = _operands(case, torch.float32)
    y = _evaluate(case, xs)
    w = _weights(y, torch.float32)
    grads = _gradients(case, xs, w, DType.f32, cast=True)
    for k, i in enumerate(_floats(case)):
        assert torch.equal(grads[k], torch.zeros_like(xs[i])), case_id(case)
    b = Builder()
    ins = [b.input(f"x{i}", t) for i, t in enumerate(_types(case, DType.f32))]
    prog = tdag.Program.from_tdag(b.build([ops.sum(b.emit(case.op, case.spec, *ins))]))
    with pytest.raises(tdag.GradError, match="must be a floating-point scalar"):
        tdag.grad(prog, wrt=[f"x{i}" for i in _floats(case)])


def test_every_kernel_is_differentiated():
    """A kernel goes through its own rule where it has one, else through its composition
    (``_replay`` in tdag/refine/grad/reverse.py); the big ones have differential cases."""
    assert all(record(c.op).vjp is not None or record(c.op).decompose is not None
               for c in CASES)
    assert {c.op for c in DIFFERENTIABLE} >= {Op.attention, Op.lstm, Op.conv, Op.layer_norm}
