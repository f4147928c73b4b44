"""Elementwise results written over a dying operand in the reified torch code
(tdag/deinops/inplace.py): only an operand nothing reads afterwards, of the result's type, a
node's own storage (not an input, weight or view); only while autograd does not record.
The values of eager, gradients through the module, and ``tdag.memory``'s replay of the
in-place code within 1% of MemTracker."""
from __future__ import annotations

import torch
from torch import nn

import tdag
from support.guards import assert_close
from support.mem_tracker import measured_peak


class _Block(nn.Module):
    """ReLU after a product; a residual add of a product; ReLU6 of a value read again."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 64), nn.Linear(64, 64)

    def forward(self, x):
        h = torch.relu(self.a(x))        # the product dies here: written over
        y = self.b(h) + h                # the product dies here: written over; h does not
        z = nn.functional.relu6(y)       # y is read again below: a new tensor
        return z * y, torch.sigmoid(x)   # x is an input: never written over


def test_dying_operands_are_written_over_and_others_are_not():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(8, 64)
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    code = module.code
    assert "torch.relu_(" in code and ".add_(" in code and ".mul_(" in code
    assert "torch.clamp_(" not in code and "torch.sigmoid_(" not in code
    x_before = x.clone()
    with torch.inference_mode():
        for got, want in zip(module(x), model(x)):
            assert_close(got, want, "in place")
    assert torch.equal(x, x_before)
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01


def test_autograd_runs_the_fresh_code():
    """Recording autograd, the code writes new tensors: an in-place ReLU over a value the
    backward pass saved would raise."""
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(8, 64, requires_grad=True)
    module = tdag.to_torch(tdag.from_torch(model.eval(), (x.detach(),)))
    got = sum(t.sum() for t in module(x))
    (gx,) = torch.autograd.grad(got, x)
    want = sum(t.sum() for t in model(x))
    (wx,) = torch.autograd.grad(want, x)
    assert_close(gx, wx, "grad")


def test_a_cnn_writes_its_activations_over_the_convolutions():
    """ReLU6 and residual adds after convolutions, as MobileNet's blocks: in place, the
    values of eager, channels-last inside and (N, C, H, W) out."""
    torch.manual_seed(0)
    conv = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU6(), nn.Conv2d(8, 8, 1)).eval()

    class Residual(nn.Module):
        def forward(self, x):
            return conv(x) + x[:, :, :, :].relu()

    model, x = Residual().eval(), torch.randn(2, 8, 16, 16)
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    assert "torch.clamp_(" in module.code and ".add_(" in module.code
    with torch.inference_mode():
        got = module(x)
    assert_close(got, model(x), "cnn")
    assert got.is_contiguous()
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01


def test_activations_after_norms_write_over_the_norms():
    """A norm's result is a new tensor (F.batch_norm in eval mode, F.layer_norm, F.group_norm,
    or the convolution a batch norm is folded into): the ReLU6 or SiLU after it clamps or
    activates in place, as MobileNet's blocks; the values of eager; ``tdag.memory``'s replay
    within 1% of MemTracker."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                          nn.ReLU6(), nn.GroupNorm(4, 16), nn.SiLU(), nn.Flatten(2),
                          nn.LayerNorm(256), nn.ReLU()).eval()
    x = torch.randn(2, 8, 16, 16)
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    code = module.code
    assert "torch.clamp_(" in code and "torch.relu_(" in code and "inplace=True" in code
    with torch.inference_mode():
        assert_close(module(x), model(x), "after norms")
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01


def test_a_view_of_an_input_is_never_written_over():
    """A complex input's real part (a cast that torch runs as ``.real``, a view) and a
    reshape of an input: the ReLUs after them write new tensors, the inputs stay."""

    class Parts(nn.Module):
        def forward(self, z, x):
            return torch.relu(z.real) + 1.0, torch.relu(x.reshape(8, 8)) * 2.0

    z, x = torch.randn(4, 4, dtype=torch.complex64), torch.randn(64)
    model = Parts().eval()
    module = tdag.to_torch(tdag.from_torch(model, (z, x)))
    z0, x0 = z.clone(), x.clone()
    with torch.inference_mode():
        for got, want in zip(module(z, x), model(z, x)):
            assert_close(got, want, "views")
    assert torch.equal(z, z0) and torch.equal(x, x0)
    assert "torch.relu_(" not in module.code
