"""torch.linalg.eig / eigvals of real matrices through from_torch: one kernel, LAPACK's geev
on tdag.run and to_torch (torch.linalg.eig: the same values, order and phase as eager) and on
to_jax (jnp.linalg.eig, geev again: compared up to each vector's phase, as LAPACK fixes it
only as "largest entry real"); to_onnx and tdag.grad run its composition
(tdag/ops/linalg/eig.py, tests/ops/test_eig_composition.py), whose order of eigenvalues is
its own: compared after matching the values, the vectors by A V = V diag(L).

Tolerances: to_torch and tdag.run exactly; JAX within 1e-4 of the output's scale; ONNX's
values within 1e-5 of the largest, its residual within 1e-5 of max |a_ij|; the gradient of
sum(Re lambda) = trace(A), the identity, within 1e-5.
"""
from __future__ import annotations

import pytest
import torch

import tdag
from support.targets import capture, on_targets


def _unphased(vectors: torch.Tensor) -> torch.Tensor:
    """Each column divided by the phase of its largest entry: what geev leaves unfixed."""
    top = vectors.abs().argmax(-2, keepdim=True)
    phase = torch.gather(vectors, -2, top)
    return vectors * (phase.abs() / phase)


@pytest.mark.parametrize("shape", [(3, 5, 5), (6, 6)])
def test_eig_on_torch_run_and_jax(shape):
    torch.manual_seed(0)
    a = torch.randn(*shape)
    values, vectors = torch.linalg.eig(a)
    prog = capture(torch.linalg.eig, (a,))
    got = on_targets(prog, (a,), ("run", "torch", "jax"))
    for target in ("run", "torch"):
        assert torch.equal(got[target][0], values) and torch.equal(got[target][1], vectors)
    jax_values, jax_vectors = got["jax"]
    torch.testing.assert_close(jax_values, values, rtol=1e-4, atol=1e-4 * values.abs().max())
    torch.testing.assert_close(_unphased(jax_vectors), _unphased(vectors), rtol=1e-4,
                               atol=1e-4)
    assert torch.allclose(a.to(vectors.dtype) @ vectors, vectors * values.unsqueeze(-2),
                          atol=1e-4)


def test_eigvals_of_a_matrix_with_complex_pairs():
    """A rotation block and a real eigenvalue: geev's conjugate pair and its real one."""
    a = torch.tensor([[0.0, -2.0, 0.5], [2.0, 0.0, 1.0], [0.0, 0.0, 3.0]])
    prog = capture(torch.linalg.eigvals, (a,))
    got = on_targets(prog, (a,), ("run", "torch", "jax"))
    want = torch.linalg.eigvals(a)
    assert want.imag.abs().max() > 1.0
    for target, (values,) in got.items():
        torch.testing.assert_close(values, want, rtol=1e-5, atol=1e-5, msg=target)


def _as_pairs(fn):
    return lambda x: tuple(torch.view_as_real(y) for y in fn(x))


def test_eig_and_eigvals_on_onnx():
    """to_onnx runs the composition: its values matched to eager's, its vectors eigenvectors
    of unit norm; eigvals alone gives the same values."""
    a = torch.randn(2, 5, 5, generator=torch.Generator().manual_seed(1))
    want = torch.linalg.eigvals(a)
    (values, vectors), = on_targets(capture(_as_pairs(torch.linalg.eig), (a,)), (a,),
                                    ("onnx",)).values()
    (alone,), = on_targets(capture(_as_pairs(lambda x: (torch.linalg.eigvals(x),)), (a,)),
                           (a,), ("onnx",)).values()
    values, vectors, alone = (torch.view_as_complex(t.contiguous())
                              for t in (values, vectors, alone))
    for b in range(2):
        cost = (values[b][:, None] - want[b][None, :]).abs()
        assert cost.min(1).values.max() <= 1e-5 * want[b].abs().max()
        assert cost.min(0).values.max() <= 1e-5 * want[b].abs().max()
    residual = a.to(vectors.dtype) @ vectors - vectors * values.unsqueeze(-2)
    assert residual.abs().max() <= 1e-5 * a.abs().max()
    torch.testing.assert_close(vectors.abs().square().sum(-2), torch.ones(2, 5))
    torch.testing.assert_close(alone, values, rtol=0, atol=1e-6)


def test_grad_runs_the_composition():
    a = torch.randn(4, 4, generator=torch.Generator().manual_seed(2))
    loss = capture(lambda x: torch.linalg.eigvals(x).real.sum(), (a,))
    _, grad = tdag.run(tdag.grad(loss, wrt=[loss.inputs[0].name]), a)
    torch.testing.assert_close(grad, torch.eye(4), rtol=0, atol=1e-5)
