"""Every primitive's gradient rule (``OpRecord.vjp``) on its differential cases
(tests/support/primitive_cases.py), in float64: against torch's autograd through the
record's own evaluator, and against central finite differences where the op is smooth at
the drawn inputs (no ties, infinities or NaN drawn).

The scalar differentiated is ``sum(y * w)`` for a fixed random ``w``, so every output
element's cotangent differs.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tdag
from support.primitive_cases import CASES, Case
from tdag import ops
from tdag.ir.record import record
from tdag.ir.symbols import as_dim, evaluate
from tdag.ir.types import DType, TensorType
from tdag.ops.builder import Builder

EPS = 1e-6
RTOL, ATOL = 1e-6, 1e-8
MAX_ELEMENTS = 64  # finite differences perturb each element: keep the cases small


def _f64(dtype: DType) -> DType:
    return DType.f64 if dtype.is_float else dtype


def _differentiable(c: Case) -> bool:
    arity = record(c.op).arity
    ins = c.ins[:arity if isinstance(arity, int) else len(c.ins)]
    floats = [x for x in ins if x.dtype.is_float]
    return bool(floats) and all(x.dtype is not DType.f16 for x in floats) and \
        _out_is_float(c)


def _out_is_float(c: Case) -> bool:
    types = [TensorType(x.shape, _f64(x.dtype)) for x in c.ins]
    try:
        arity = record(c.op).arity
        n = arity if isinstance(arity, int) else len(types)
        return record(c.op).shape(c.spec, types[:n]).dtype.is_float
    except tdag.ShapeError:
        return False


CASES_WITH_GRADIENTS = [c for c in CASES if _differentiable(c)]


def _operands(c: Case, dims: dict, rng) -> list[torch.Tensor]:
    """Every input of the case drawn (those past the op's arity only bind symbols), floats
    in float64."""
    xs = []
    for x in c.ins:
        value = torch.as_tensor(np.asarray(x.draw(rng, dims)))
        xs.append(value.to(torch.float64) if x.dtype.is_float else value)
    return xs


def _arity(c: Case) -> int:
    arity = record(c.op).arity
    return arity if isinstance(arity, int) else len(c.ins)


def _loss_program(c: Case, xs: list[torch.Tensor]) -> tdag.Program:
    """``sum(op(x...) * w)``, every drawn value an input."""
    b = Builder()
    ins = [b.input(f"x{i}", TensorType(x.shape, DType.of(xs[i].dtype)))
           for i, x in enumerate(c.ins)]
    y = b.emit(c.op, c.spec, *ins[:_arity(c)], name="y")
    w = b.input("w", y.type)
    return tdag.Program.from_tdag(b.build([ops.sum(y * w)]))


def _resolver(dims: dict):
    return lambda d: int(evaluate(as_dim(d), dims))


def _torch_loss(c: Case, xs, w, dims):
    y = record(c.op).evaluate(c.spec, xs[:_arity(c)], _resolver(dims))
    return (y * w).sum()


@pytest.mark.parametrize("c", CASES_WITH_GRADIENTS, ids=[c.id for c in CASES_WITH_GRADIENTS])
def test_vjp_matches_autograd_and_finite_differences(c: Case):
    dims = c.bindings[-1]
    rng = np.random.default_rng(0)
    xs = _operands(c, dims, rng)
    prog = _loss_program(c, xs)
    floats = [i for i, x in enumerate(xs[:_arity(c)]) if x.is_floating_point()]
    wrt = [prog.inputs[i].name for i in floats]
    y = record(c.op).evaluate(c.spec, xs[:_arity(c)], _resolver(dims))
    w = torch.as_tensor(rng.uniform(0.5, 1.5, tuple(y.shape))).to(y.dtype)
    grads = tdag.run(tdag.grad(prog, wrt=wrt), *xs, w)[1:]
    finite = all(torch.isfinite(xs[i]).all() for i in floats)
    reference = _autograd(c, xs, w, dims, floats)
    for k, i in enumerate(floats):
        got = grads[k]
        assert got.shape == xs[i].shape and got.dtype == torch.float64, c.id
        if reference is not None and finite:
            torch.testing.assert_close(got, reference[k], rtol=RTOL, atol=ATOL, equal_nan=True,
                                       msg=f"{c.id}: operand {i} vs autograd")
        if finite and y.dtype == torch.float64 and _smooth(xs[i]) and \
                xs[i].numel() <= MAX_ELEMENTS:
            fd = _finite_differences(c, xs, w, dims, i)
            torch.testing.assert_close(got, fd, rtol=1e-5, atol=1e-6,
                                       msg=f"{c.id}: operand {i} vs finite differences")


# torch's index_copy backward hands a duplicate write the cotangent of another position;
# the overwritten rows have none (finite differences check them)
AUTOGRAD_WRONG = ("scatter-replace",)


def _autograd(c: Case, xs, w, dims, floats) -> list[torch.Tensor] | None:
    """torch's gradient through the record's evaluator; None where torch has no derivative
    for the evaluator's ops, or a wrong one."""
    if c.id.startswith(AUTOGRAD_WRONG):
        return None
    leaves = [x.clone().requires_grad_(i in floats) for i, x in enumerate(xs)]
    try:
        loss = _torch_loss(c, leaves, w, dims)
        if not loss.requires_grad:
            return [torch.zeros_like(xs[i]) for i in floats]
        got = torch.autograd.grad(loss, [leaves[i] for i in floats], allow_unused=True)
    except RuntimeError:
        return None
    return [torch.zeros_like(xs[i]) if g is None else g for i, g in zip(floats, got)]


def _smooth(x: torch.Tensor) -> bool:
    """No two elements equal (ties make max, sort and comparisons non-smooth) and none
    within EPS of an integer-valued kink (floor, sign at 0)."""
    flat = x.flatten()
    return flat.unique().numel() == flat.numel() and bool((flat.abs() > 1e-3).all())


def _finite_differences(c: Case, xs, w, dims, i: int) -> torch.Tensor:
    out = torch.zeros_like(xs[i])
    flat = out.view(-1)
    for k in range(xs[i].numel()):
        values = []
        for sign in (1.0, -1.0):
            moved = [x.clone() for x in xs]
            moved[i].view(-1)[k] += sign * EPS
            values.append(_torch_loss(c, moved, w, dims).item())
        flat[k] = (values[0] - values[1]) / (2 * EPS)
    return out


def test_gradient_of_integer_values_is_refused():
    b = Builder()
    x = b.input("x", TensorType((3,), DType.i64))
    prog = tdag.Program.from_tdag(b.build([ops.sum(ops.cast(x, "f32"))]))
    with pytest.raises(tdag.GradError, match="only floating-point"):
        tdag.grad(prog, wrt=["x"])


def test_output_must_be_a_scalar():
    prog = tdag.trace(lambda x: x * 2.0, tdag.TensorSpec((3,)))
    with pytest.raises(tdag.GradError, match="not a scalar"):
        tdag.grad(prog, wrt=[prog.inputs[0].name])
