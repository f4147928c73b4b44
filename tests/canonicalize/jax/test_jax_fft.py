"""tdag.from_jax of jnp.fft's transforms (the jaxpr ``fft`` primitive, every fft_type) and
the complex parts, through tdag.run, to_torch, to_jax and (as (real, imaginary) pairs, ONNX
having no complex inputs or outputs) to_onnx on onnxruntime, against jax.jit on random
inputs: 1e-5 of the output's largest value (float32 transforms of <= 16 points)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import tdag  # noqa: E402
from support.flax_models import rand  # noqa: E402
from support.guards import run_onnx  # noqa: E402

TOL = 1e-5


def _pairs(y):
    return jnp.stack([jnp.real(y), jnp.imag(y)], -1) if jnp.iscomplexobj(y) else y


def _complex(shape):
    return (rand(*shape) + 1j * rand(*shape)).astype(np.complex64)


CASES = {
    "fft": (jnp.fft.fft, (3, 8), False),
    "fft of a real signal": (jnp.fft.fft, (3, 8), True),
    "ifft": (jnp.fft.ifft, (3, 7), False),
    "rfft": (jnp.fft.rfft, (3, 8), True),
    "rfft odd, n=": (lambda x: jnp.fft.rfft(x, n=6), (2, 9), True),
    "irfft": (jnp.fft.irfft, (3, 5), False),
    "irfft n=9": (lambda x: jnp.fft.irfft(x, n=9), (3, 5), False),
    "fft2": (jnp.fft.fft2, (2, 4, 6), False),
    "rfft2": (jnp.fft.rfft2, (2, 4, 6), True),
    "irfftn": (lambda x: jnp.fft.irfftn(x, axes=(0, 1)), (4, 5), False),
    "fft over axis 0": (lambda x: jnp.fft.fft(x, axis=0), (8, 3), False),
    "parts": (lambda x: jnp.real(x) * 2 + jnp.imag(jnp.conj(x)), (3, 4), False),
    "complex": (lambda x: jnp.fft.ifft(lax_complex(x, x * 2)), (3, 4), True),
    "fft ortho": (lambda x: jnp.fft.fft(x, norm="ortho"), (3, 8), True),
    "ifft forward": (lambda x: jnp.fft.ifft(x, norm="forward"), (3, 7), False),
    "rfft forward": (lambda x: jnp.fft.rfft(x, norm="forward"), (3, 8), True),
    "irfft ortho": (lambda x: jnp.fft.irfft(x, norm="ortho"), (3, 5), False),
}


def lax_complex(re, im):
    return jax.lax.complex(re, im)


def _close(got, expected, what: str):
    got = np.asarray(got.detach() if isinstance(got, torch.Tensor) else got)
    expected = np.asarray(expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype, \
        (what, got.shape, got.dtype, expected.shape, expected.dtype)
    scale = max(np.abs(expected).max(), 1.0)
    assert np.abs(got - expected).max() <= TOL * scale, what


@pytest.mark.parametrize("name", sorted(CASES))
def test_fft_matches_jax_through_every_target(name):
    fn, shape, real = CASES[name]
    x = rand(*shape) if real else _complex(shape)
    prog = tdag.from_jax(fn, x)
    tdag.verify(prog)
    expected = jax.jit(fn)(x)
    xt = torch.from_numpy(x)
    _close(tdag.run(prog, xt), expected, "tdag.run")
    _close(tdag.to_torch(prog)(xt), expected, "to_torch")
    _close(tdag.to_jax(prog)(x), expected, "to_jax")
    if real:  # ONNX takes no complex input: the pairs of the result only
        paired = tdag.from_jax(lambda v: _pairs(fn(v)), x)
        _close(run_onnx(tdag.to_onnx(paired), xt), _pairs(expected), "to_onnx")


def test_fft_primitive_is_one_transform_per_axis():
    prog = tdag.from_jax(jnp.fft.fft2, _complex((4, 6)))
    specs = [n.spec for n in prog.graph.nodes if n.op.value == "fft"]
    assert [(s.axis, int(s.n), s.inverse) for s in specs] == [(0, 4, False), (1, 6, False)]


def test_constants_only_equations_fold_at_import():
    """jnp.fft scales "ortho" and "forward" outside the primitive, by the square root of a
    complex product of the lengths (a reduction the IR has no complex form of): an equation
    whose operands are all constants is computed by jax at import, so one scale remains."""
    prog = tdag.from_jax(lambda x: jnp.fft.ifft(x, norm="ortho"), _complex((3, 7)))
    ops = [n.op.value for n in prog.graph.nodes]
    assert "reduce" not in ops and ops.count("fft") == 1, ops
    big = tdag.from_jax(lambda x: x + jnp.arange(8192.0, dtype=jnp.float32).sum(),
                        rand(3))
    assert any(n.op.value == "reduce" for n in big.graph.nodes)  # 8,192 elements: kept
