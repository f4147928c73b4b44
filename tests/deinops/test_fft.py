"""The ``fft`` primitive's cost and gradient rule. Its evaluator, torch code, ONNX and JAX
are checked on its differential cases (tests/support/complex_cases.py); the gradient test of
every primitive (tests/refine/test_vjp_rules.py) takes real operands and results only, so
here each kind is differentiated inside a real-valued program, against torch's autograd."""
from __future__ import annotations

import math

import pytest
import torch

import tdag
from tdag import ops


def test_cost_of_an_fft_is_5_n_log2_n():
    prog = tdag.trace(lambda x: ops.fft(x, 0), tdag.TensorSpec((4096,), "c64"))
    assert tdag.cost(prog).flops == 5 * 4096 * math.log2(4096)


def test_cost_of_a_symbolic_length_is_symbolic():
    prog = tdag.trace(lambda x: ops.fft(x, 1, kind="r2c"), tdag.TensorSpec((3, "n")))
    flops = tdag.cost(prog).flops
    (n,) = flops.free_symbols
    assert flops.subs(n, 1024).simplify() == 3 * 5 * 1024 * 10


GRADIENT_CASES = {
    # every kind and norm, each inside a real program: real in, real out
    "c2c": lambda x, m, norm: m(m.view_as_real(m.fft(m.cast(x, "c64"), 1, norm=norm))),
    "c2c-inverse": lambda x, m, norm: m(m.view_as_real(m.fft(m.cast(x, "c64"), 1, True,
                                                           norm=norm))),
    "r2c": lambda x, m, norm: m(m.view_as_real(m.fft(x, 1, norm=norm, kind="r2c"))),
    "c2r": lambda x, m, norm: m(m.fft(m.fft(x, 1, kind="r2c"), 1, True, 8, norm, "c2r")),
    "c2r-odd": lambda x, m, norm: m(m.fft(m.fft(x[:, :7], 1, kind="r2c"), 1, True, 7, norm,
                                        "c2r")),
}


class _Torch:
    """tdag.ops' names over torch, so that one lambda builds both programs."""

    def __init__(self, w):
        self.w = w

    def __call__(self, y):
        return (y * self.w.flatten()[:y.numel()].reshape(y.shape)).sum()

    @staticmethod
    def cast(x, dtype):
        return x.to(torch.complex64)

    @staticmethod
    def view_as_real(x):
        return torch.view_as_real(x)

    @staticmethod
    def fft(x, axis, inverse=False, n=None, norm="backward", kind="c2c"):
        fn = {("c2c", False): torch.fft.fft, ("c2c", True): torch.fft.ifft,
              ("r2c", False): torch.fft.rfft, ("c2r", True): torch.fft.irfft}[kind, inverse]
        return fn(x, n=n, dim=axis, norm=norm)


class _Ops(_Torch):
    def __call__(self, y):
        shape = tuple(int(d) for d in y.shape)
        w = ops.const(self.w.flatten()[:math.prod(shape)].reshape(shape))
        return ops.sum(y * w)

    cast = staticmethod(ops.cast)
    view_as_real = staticmethod(ops.view_as_real)
    fft = staticmethod(ops.fft)


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("name", sorted(GRADIENT_CASES))
def test_gradient_matches_autograd(name, norm):
    torch.manual_seed(0)
    fn, x, w = GRADIENT_CASES[name], torch.randn(3, 8), torch.rand(3, 8, 2) + 0.5
    prog = tdag.trace(lambda t: fn(t, _Ops(w), norm), tdag.TensorSpec((3, 8)))
    got = tdag.run(tdag.grad(prog, wrt=[prog.inputs[0].name]), x)[1]
    leaf = x.clone().requires_grad_()
    fn(leaf, _Torch(w), norm).backward()
    torch.testing.assert_close(got, leaf.grad, rtol=1e-5, atol=1e-5)
