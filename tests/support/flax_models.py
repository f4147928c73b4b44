"""Flax models for the JAX front end's tests (tests/canonicalize/jax/test_from_jax.py) and its
benchmark (benchmarks/from_jax_speed.py): an MLP, a CNN with batch norms and pools, a
pre-norm transformer block; their variables drawn at random from one seeded generator.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np


RNG = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    """Standard normal values of ``shape`` from the shared seeded generator."""
    return RNG.standard_normal(shape).astype(dtype)


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(32)(x))
        x = nn.gelu(nn.Dense(32)(x))
        return nn.Dense(10)(x)


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.Conv(8, (3, 3), padding="SAME")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
        x = nn.Conv(16, (3, 3), strides=(2, 2), padding="VALID")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=True)(x))
        x = nn.avg_pool(x, (2, 2), strides=(1, 1))
        return nn.Dense(10)(x.reshape(x.shape[0], -1))


class TransformerBlock(nn.Module):
    @nn.compact
    def __call__(self, x):
        y = nn.LayerNorm()(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=4)(y, y)
        y = nn.Dense(64)(nn.LayerNorm()(x))
        return x + nn.Dense(x.shape[-1])(nn.gelu(y))


def random_variables(module, x):
    """The module's variables, random everywhere (BatchNorm's running statistics included,
    the variances positive) so that a wrong mapping of any of them shows; made in numpy
    from the shapes ``init`` would give (running ``init`` costs seconds per model)."""
    shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)

    def fresh(path, leaf):
        value = rand(*leaf.shape) * 0.5
        return np.abs(value) + 0.5 if "var" in jax.tree_util.keystr(path) else value
    return jax.tree_util.tree_map_with_path(fresh, shapes)
