"""A convolution's gradients lower to framework convolutions: the weight's to
conv_weight_grad (not an im2col einsum over unfolded windows) and the input's to
conv_transpose (not a windowed product overlap-added by folds), depthwise included, where the
product sums no channel. Each is checked against torch.autograd through to_torch and
to_onnx on onnxruntime.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tdag
from tdag import ops
from tdag.ir.op import Op
from tdag.lower import lower

from support.guards import assert_close, run_onnx

CONVS = {  # name: (x shape, w shape, conv keywords)
    "plain": ((2, 3, 9, 9), (4, 3, 3, 3), dict(padding=1)),
    "strided": ((2, 3, 9, 9), (4, 3, 3, 3), dict(stride=2, padding=1)),
    "grouped-dilated": ((2, 4, 9), (6, 2, 3), dict(dilation=2, groups=2)),
    "depthwise": ((2, 8, 7, 7), (8, 1, 3, 3), dict(padding=1, groups=8)),
    "depthwise-7x7": ((2, 6, 8, 8), (6, 1, 7, 7), dict(padding=3, groups=6)),
    "pointwise": ((2, 4, 5, 5), (6, 4, 1, 1), {}),
}


@pytest.mark.parametrize("name", list(CONVS))
def test_conv_gradients_are_framework_convolutions(name):
    torch.manual_seed(0)
    x_shape, w_shape, kw = CONVS[name]
    w = torch.randn(w_shape)
    prog = tdag.trace(lambda x: ops.sum(ops.conv(x, ops.param("w", w), **kw) ** 2),
                      tdag.TensorSpec(x_shape))
    g = tdag.grad(prog, wrt=[prog.inputs[0].name, "w"])
    used = {n.op for n in lower(g).graph.nodes}
    assert {Op.conv_weight_grad, Op.conv_transpose} <= used, (name, used)
    assert not used & {Op.unfold, Op.fold, Op.einsum}, (name, used)
    x = torch.randn(x_shape, requires_grad=True)
    wt = w.clone().requires_grad_()
    conv = {3: F.conv1d, 4: F.conv2d}[len(x_shape)]
    loss = conv(x, wt, **kw).pow(2).sum()
    want = (loss, *torch.autograd.grad(loss, (x, wt)))
    want = tuple(t.detach() for t in want)
    assert_close(tdag.to_torch(g)(x.detach()), want, f"torch {name}")
    assert_close(run_onnx(tdag.to_onnx(g), x.detach()), want, f"onnx {name}")
