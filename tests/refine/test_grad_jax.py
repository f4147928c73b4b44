"""tdag.grad on flax models imported with ``tdag.from_jax`` equals ``jax.grad``.

The loss ``sum(apply(variables, x) * w)`` (a fixed random ``w``) is imported with its
variables as weights: the leaves under ``params`` are parameters, BatchNorm's
``batch_stats`` buffers (no gradient). ``tdag.grad`` differentiates every parameter; the
gradients, run through ``tdag.run`` and ``tdag.to_jax``, equal ``jax.grad`` of the same
function in float32 within 1e-4 of the largest gradient of the model (as
tests/refine/test_grad_models.py holds the torch models).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

jax = pytest.importorskip("jax")
pytest.importorskip("flax")
import jax.numpy as jnp  # noqa: E402

import tdag  # noqa: E402
from support.flax_models import CNN, MLP, TransformerBlock, rand, random_variables  # noqa: E402

RELATIVE = 1e-4
MODELS = {"mlp": (MLP, (4, 16)), "cnn": (CNN, (2, 16, 16, 3)),
          "transformer": (TransformerBlock, (2, 10, 32))}


def _loss_case(name: str):
    """(loss function, variables, input): the loss a weighted sum of the model's outputs."""
    cls, shape = MODELS[name]
    module, x = cls(), rand(*shape)
    variables = random_variables(module, x)
    w = jnp.asarray(rand(*jax.eval_shape(module.apply, variables, x).shape))

    def loss(variables, x):
        return jnp.sum(module.apply(variables, x) * w)
    return loss, variables, x


def _jax_gradients(loss, variables, x) -> dict[str, np.ndarray]:
    """jax.grad of ``loss`` by the dotted names from_jax gives the parameters."""
    grads = jax.grad(loss)(variables, x)["params"]
    flat = jax.tree_util.tree_flatten_with_path(grads)[0]
    return {"params." + ".".join(str(k.key) for k in path): np.asarray(g) for path, g in flat}


def _assert_close(got: dict, want: dict, what: str) -> None:
    assert sorted(got) == sorted(want), what
    scale = max(float(np.abs(g).max()) for g in want.values())
    for name, expected in want.items():
        err = float(np.abs(np.asarray(got[name]) - expected).max())
        assert err <= RELATIVE * scale, f"{what}: {name} off by {err:.2e} (scale {scale:.2e})"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_flax_gradients_equal_jax_grad(name):
    loss, variables, x = _loss_case(name)
    prog = tdag.from_jax(loss, variables, x)
    grad = tdag.grad(prog)
    names = [n[len("grad."):] for n in grad.main.outputs[1:]]
    want = _jax_gradients(loss, variables, x)
    value = float(jax.jit(loss)(variables, x))

    outs = tdag.run(grad, torch.from_numpy(x))
    assert abs(outs[0].item() - value) <= RELATIVE * max(1.0, abs(value))
    _assert_close({n: g.numpy() for n, g in zip(names, outs[1:])}, want, "tdag.run")

    outs = tdag.to_jax(grad)(jnp.asarray(x))
    _assert_close(dict(zip(names, outs[1:])), want, "to_jax")
