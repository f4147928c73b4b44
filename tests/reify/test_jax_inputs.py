"""tdag.to_jax takes JAX's own arrays: without x64 (JAX's default) JAX holds an i64 as int32
and an f64 as float32; the function widens them (exactly) rather than refuse them, with x64
off and on. Other dtype mismatches are still refused. Results against tdag.run: exact for the
integer lookup, rtol 1e-12 in f64."""
from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import tdag  # noqa: E402
from tdag import ops  # noqa: E402
from tdag.errors import ShapeError  # noqa: E402


def _lookup():
    """An embedding lookup plus an i64 offset: both inputs are i64."""
    table = torch.randn(10, 3)
    return tdag.trace(lambda ids, shift: ops.gather(ops.param("table", table), ids + shift),
                      tdag.TensorSpec((4,), "i64"), tdag.TensorSpec((), "i64"))


@pytest.mark.parametrize("x64", [False, True])
def test_an_i64_input_given_as_int32_is_widened(x64):
    prog = _lookup()
    ids, shift = np.array([0, 3, 7, 2]), np.array(1)
    want = tdag.run(prog, torch.from_numpy(ids), torch.from_numpy(shift))
    fn = tdag.to_jax(prog)
    with jax.enable_x64(x64):
        given = jnp.asarray(ids, dtype=jnp.int32), jnp.asarray(shift, dtype=jnp.int32)
        assert given[0].dtype == np.int32
        got = fn(*given)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())


@pytest.mark.parametrize("x64", [False, True])
def test_an_f64_input_given_as_float32_is_widened(x64):
    prog = tdag.trace(lambda x: ops.exp(x) * 2.0, tdag.TensorSpec((5,), "f64"))
    x = np.random.default_rng(0).standard_normal(5).astype(np.float32)
    want = tdag.run(prog, torch.from_numpy(x).double())
    with jax.enable_x64(x64):
        got = tdag.to_jax(prog)(jnp.asarray(x))
    assert np.asarray(got).dtype == np.float64
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-12)


@pytest.mark.parametrize("declared, given", [("i32", np.int64), ("f32", np.float64),
                                             ("i64", np.int16)])
def test_other_dtype_mismatches_are_still_refused(declared, given):
    prog = tdag.trace(lambda x: x + x, tdag.TensorSpec((3,), declared))
    with pytest.raises(ShapeError, match="%x"):
        tdag.to_jax(prog)(np.arange(3).astype(given))
