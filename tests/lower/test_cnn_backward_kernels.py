"""Gradient programs of CNNs lower their ReLU, ReLU6, SiLU, max-pooling and batch-norm input
gradients to relu_backward, clamp_backward, silu_backward, max_pool_backward and
batch_norm_backward (tdag/lower/cnn_backward.py), and still equal torch.autograd through
to_torch and onnxruntime (1e-4 relative to the largest gradient, float32); the kernels keep
ops.relu's and ops.clamp's derivative at the edges, and max pooling's gradient goes to each window's
first maximum, as torch's does."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import tdag
from tdag.ir.op import Op
from tdag.ir.record import NoSpec, record
from tdag.lower.kernels.activations import Clamp
from tdag.lower.kernels.windows import Pool
from tdag.lower.pipeline import lower

pytest.importorskip("transformers")
from support.grad_models import assert_lowered_gradients, onnx_outputs  # noqa: E402

# ResNet: five ReLUs (the stem's, two per basic block) and six batch norms; MobileNet-v2:
# all 35 ReLU6s (each follows a convolution whose weight needs a gradient) and all 52 batch
# norms (inference form: the step's model runs in eval mode); the UNet block: three SiLUs
KERNELS = {"resnet": {Op.relu_backward: 5, Op.max_pool_backward: 1,
                      Op.batch_norm_backward: 6},
           "mobilenet-v2": {Op.clamp_backward: 35, Op.batch_norm_backward: 52},
           "unet-block": {Op.silu_backward: 3}}


@pytest.mark.parametrize("name", list(KERNELS))
def test_cnn_gradients_use_backward_kernels(name):
    assert_lowered_gradients(name, KERNELS[name])


EDGES = torch.tensor([-float("inf"), -1.0, -1e-45, -0.0, 0.0, 1e-45, 3.0, 6.0, 7.0,
                      float("inf"), float("nan")])


@pytest.mark.parametrize("op, spec", [(Op.relu_backward, NoSpec()),
                                      (Op.clamp_backward, Clamp(0.0, 6.0)),
                                      (Op.clamp_backward, Clamp(0.0, None))])
def test_kernel_equals_its_chain_at_the_edges(op, spec):
    """Zeros of both signs, subnormals, the bounds themselves, infinities and nan: the
    framework call passes dy exactly where tdag.grad's chain does."""
    rec = record(op)
    dy = torch.arange(1.0, len(EDGES) + 1)
    prog = tdag.trace(lambda d, x: rec.decompose(spec, d, x),
                      *[tdag.TensorSpec((len(EDGES),))] * 2)
    want = tdag.run(prog, dy, EDGES)
    got = rec.evaluate(spec, (dy, EDGES), int)
    assert torch.equal(got, want), (got, want)


class _Pooled(torch.nn.Module):
    """A ReLU then max pooling: the zeros the ReLU leaves tie in most windows."""

    def __init__(self, pool: torch.nn.Module, spatial: int):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 4).reshape(
            (1, 4) + (1,) * spatial))
        self.pool = pool

    def forward(self, x):
        y = self.pool(torch.relu(x * self.scale))
        return (y * torch.arange(1.0, y[0].numel() + 1).reshape(y.shape[1:])).sum()


@pytest.mark.parametrize("pool", [torch.nn.MaxPool2d(3, 2, 1), torch.nn.MaxPool2d(2),
                                  torch.nn.MaxPool3d(2, 1, dilation=(1, 2, 1))],
                         ids=["3x3-s2-p1", "2x2", "3d-dilated"])
def test_max_pool_gradient_goes_to_the_first_maximum(pool):
    """Tied maxima (zeros after a ReLU, and whole windows of ones): tdag's gradient, as one
    max_pool_backward through to_torch and as its composition on onnxruntime, equals
    torch.autograd's, which gives each window's cotangent to its first maximum."""
    spatial = 2 if isinstance(pool, torch.nn.MaxPool2d) else 3
    model = _Pooled(pool, spatial)
    x = torch.randn(2, 4, *(6,) * spatial)
    x[:, :, :2] = 1.0
    x.requires_grad_(True)
    g = tdag.grad(tdag.from_torch(model, (x.detach(),)), wrt=["x", "scale"])
    assert [n.op for n in lower(g).graph.nodes].count(Op.max_pool_backward) == 1
    model(x).backward()
    for outs in (tdag.to_torch(g)(x.detach()), onnx_outputs(g, (x.detach(),))):
        for got, want in zip(outs[1:], (x.grad, model.scale.grad)):
            torch.testing.assert_close(torch.as_tensor(got), want, rtol=1e-5, atol=1e-5)


def test_max_pool_backward_in_jax_picks_the_first_maximum():
    """JAX's transpose of reduce_window's max (select_and_scatter_add) on tied windows
    equals the composition, which gives each window's cotangent to its first maximum."""
    jnp = pytest.importorskip("jax.numpy")
    spec = Pool((3, 3), (2, 2), (1, 1), (1, 1))
    rec = record(Op.max_pool_backward)
    prog = tdag.trace(lambda dy, x: rec.decompose(spec, dy, x),
                      tdag.TensorSpec((2, 3, 4, 4)), tdag.TensorSpec((2, 3, 8, 8)))
    x, dy = torch.randn(2, 3, 8, 8).relu().round(), torch.randn(2, 3, 4, 4)
    got = tdag.to_jax(lower(prog))(jnp.asarray(dy.numpy()), jnp.asarray(x.numpy()))
    torch.testing.assert_close(torch.tensor(np.asarray(got)), tdag.run(prog, dy, x))


def test_jax_max_pool_gradient_goes_to_the_first_maximum():
    """from_jax's reduce_window max, differentiated by tdag.grad on tied windows, equals
    jax.grad (XLA's select_and_scatter gives each window's cotangent to its first max)."""
    jax = pytest.importorskip("jax")
    x = np.maximum(np.round(np.random.default_rng(0).normal(size=(2, 6, 6, 3))), 0)
    x = x.astype(np.float32)
    w = np.random.default_rng(1).normal(size=(2, 3, 3, 3)).astype(np.float32)
    variables = {"params": {"p": np.ones_like(x)}}

    def loss(variables, x):
        y = jax.lax.reduce_window(x * variables["params"]["p"], -np.inf, jax.lax.max,
                                  (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
        return (y * w).sum()
    grad = tdag.grad(tdag.from_jax(loss, variables, x))
    want = np.asarray(jax.grad(loss)(variables, x)["params"]["p"])
    torch.testing.assert_close(tdag.run(grad, torch.from_numpy(x))[1], torch.tensor(want))
