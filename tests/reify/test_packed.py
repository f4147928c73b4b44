"""The reified module's linear layers on oneDNN's packed weights (tdag/reify/torch/packed.py):
the same outputs as eager wherever the packed path runs, eager's gradients where autograd
records (the packed kernel has none), a new packed copy after ``load_state_dict``, copies of
the module that run, and small or run-time weights left to ``F.linear``."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

import tdag
from tdag import ops
from tdag.canonicalize import from_torch
from tdag.reify import to_torch
from tdag.reify.torch.packed import PACK_MIN

from support.guards import assert_close

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                reason="oneDNN is not built into this torch")


def _model(width: int = 256) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, 10)).eval()


def _reified(model: nn.Module, x: torch.Tensor) -> nn.Module:
    return to_torch(from_torch(model, (x,)))


def test_large_weights_run_packed_with_eager_outputs():
    x = torch.randn(5, 7, 256)
    model = _model()
    module = _reified(model, x)
    assert module.code.count("_rt.linear(") == 1  # 256 x 256 packs, 256 x 10 does not
    assert module.code.count("F.linear(") == 1
    with torch.inference_mode():
        assert_close(module(x), model(x), "inference mode")
    with torch.no_grad():
        assert_close(module(x), model(x), "no_grad")
    assert module._tdag_packed.slots  # the packed path ran


def test_gradients_fall_back_to_eager():
    x = torch.randn(3, 256, requires_grad=True)
    model = _model()
    module = _reified(model, x.detach())
    module(x).square().sum().backward()
    want = x.grad.clone()
    x.grad = None
    model(x).square().sum().backward()
    assert_close(want, x.grad, "input gradient")
    assert not module._tdag_packed.slots  # autograd recorded: nothing packed
    weight = dict(module.named_parameters())["0.weight"]
    assert_close(weight.grad, model[0].weight.grad, "weight gradient")


def test_load_state_dict_repacks():
    x = torch.randn(4, 256)
    module = _reified(_model(), x)
    other = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-0.5)
        module(x)  # packs the first weights
        module.load_state_dict(other.state_dict())
        assert_close(module(x), other(x), "after load_state_dict")


def test_copies_of_a_packed_module_run():
    """The packed tensors are opaque to deepcopy and pickle: copies start with none."""
    x = torch.randn(4, 256)
    model = _model()
    module = _reified(model, x)
    with torch.no_grad():
        module(x)
        twin = copy.deepcopy(module)
        assert not twin._tdag_packed.slots
        assert_close(twin(x), model(x), "deepcopy")
    assert not pickle.loads(pickle.dumps(module._tdag_packed)).slots


def test_weights_given_at_run_time_stay_unpacked():
    prog = tdag.trace(lambda x, w: ops.relu(x @ w), tdag.TensorSpec((4, 512)),
                      tdag.TensorSpec((512, 512)))
    module = to_torch(prog)
    assert "_rt.linear(" not in module.code
    x, w = torch.randn(4, 512), torch.randn(512, 512)
    with torch.no_grad():
        assert_close(module(x, w), torch.relu(x @ w), "run-time weight")
    assert 512 * 512 >= PACK_MIN


def test_any_batch_and_onednn_switched_off():
    """One packed copy serves every batch of a symbolic one; with oneDNN switched off by
    torch's flags the module runs F.linear."""
    model = _model()
    module = to_torch(from_torch(model, (torch.randn(4, 256),), dynamic_batch=True))
    assert "_rt.linear(" in module.code
    with torch.no_grad():
        for n in (1, 9, 33):
            x = torch.randn(n, 256)
            assert_close(module(x), model(x), f"batch {n}")
        assert len(module._tdag_packed.slots) == 1
        module._tdag_packed.slots.clear()
        with torch.backends.mkldnn.flags(enabled=False):
            assert_close(module(x), model(x), "oneDNN off")
        assert not module._tdag_packed.slots
