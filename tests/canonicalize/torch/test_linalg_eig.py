"""torch.linalg.eig / eigvals of real matrices through from_torch: one kernel, LAPACK's geev
on tdag.run and to_torch (torch.linalg.eig: the same values, order and phase as eager) and on
to_jax (jnp.linalg.eig, geev again: compared up to each vector's phase, as LAPACK fixes it
only as "largest entry real"); to_onnx and tdag.grad refuse it by name (no composition).

Tolerances: to_torch and tdag.run exactly; JAX within 1e-4 of the output's scale.
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


def test_onnx_and_grad_refuse_eig_by_name():
    a = torch.randn(4, 4)
    prog = capture(lambda x: torch.view_as_real(torch.linalg.eigvals(x)), (a,))
    with pytest.raises(tdag.UnsupportedOpError, match="linalg_eig"):
        tdag.to_onnx(prog)
    loss = capture(lambda x: torch.linalg.eigvals(x).real.sum(), (a,))
    with pytest.raises(tdag.UnsupportedOpError, match="linalg_eig"):
        tdag.grad(loss, wrt=[loss.inputs[0].name])
