"""A training step's AdamW update lowers to one adamw_update kernel per parameter, its
hyperparameters read back from the composition's constants (weight decay 0 included), and
the fused step tracks torch.optim.AdamW's loop."""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag import ops
from tdag.ir.op import Op
from tdag.lower import lower
from tdag.lower.kernels.optim import AdamWUpdate

from support.guards import assert_close

OPTIMIZERS = {  # name: (AdamW keywords, the spec the rule should read back)
    "defaults": (dict(lr=1e-3), AdamWUpdate(1e-3, 0.9, 0.999, 1e-8, 1e-2)),
    "no-decay": (dict(lr=1e-2, weight_decay=0.0), AdamWUpdate(1e-2, 0.9, 0.999, 1e-8, 0.0)),
    "custom": (dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
               AdamWUpdate(3e-3, 0.8, 0.95, 1e-6, 0.1)),
}


def _model():
    w, b = torch.randn(4, 3), torch.randn(4)
    return tdag.trace(lambda x: ops.sum(ops.tanh(ops.linear(x, ops.param("w", w),
                                                            ops.param("b", b))) ** 2),
                      tdag.TensorSpec((5, 3))), w, b


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_adamw_lowers_to_one_kernel_per_parameter(name):
    keywords, spec = OPTIMIZERS[name]
    prog, _, _ = _model()
    low = lower(tdag.train_step(prog, tdag.optim.AdamW(**keywords)))
    specs = [n.spec for g in low.graphs.values() for n in g.nodes if n.op is Op.adamw_update]
    assert specs == [spec, spec]


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_fused_step_tracks_torch_adamw(name):
    keywords, _ = OPTIMIZERS[name]
    prog, w, b = _model()
    module = tdag.to_torch(tdag.train_step(prog, tdag.optim.AdamW(**keywords)))
    lin = torch.nn.Linear(3, 4)
    with torch.no_grad():
        lin.weight.copy_(w), lin.bias.copy_(b)
    opt = torch.optim.AdamW(lin.parameters(), **keywords)
    for _ in range(20):
        x = torch.randn(5, 3)
        opt.zero_grad()
        loss = lin(x).tanh().pow(2).sum()
        loss.backward()
        opt.step()
        assert_close(module(x), loss.detach(), "loss")
    torch.testing.assert_close(module.w, lin.weight.detach(), rtol=1e-5, atol=1e-5)
