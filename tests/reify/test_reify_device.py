"""Reified modules are device-agnostic: nothing in the generated code pins a tensor to the
CPU. Checked on the meta device here (which fails on any CPU-created tensor mixed in), and on
CUDA where a GPU is present."""
from __future__ import annotations

import pytest
import torch

import tdag

from support.torch_models import MODELS, make_model

DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(MODELS))
def test_reified_module_runs_on_device(name, device):
    model, inputs = make_model(name)
    args = inputs(2)
    prog = tdag.from_torch(model, args, dynamic_batch=True)
    module = tdag.to_torch(prog).to(device)
    with torch.no_grad():
        got = module(*(a.to(device) for a in args))
        want = model(*args)
    got, want = torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(want)
    assert [g.device.type for g in got] == [device] * len(got)
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    if device != "meta":
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w, rtol=1e-4, atol=1e-4)
