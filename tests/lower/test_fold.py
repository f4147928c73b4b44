"""The lowering pass "fold": batch norms and channel affines folded into fixed conv / linear
weights, exact cast chains collapsed, nodes of weights alone made consts. Each case runs on
tdag.run, to_torch and to_onnx against eager (1e-5 relative: the folds round once, in float64),
checks which ops are left, and a training step is left exactly as it was."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

import tdag
from tdag import ops
from tdag.ir.op import Op
from tdag.ir.types import TensorKind
from tdag.lower import lower
from tdag.reify.torch.module import lowered

from support.targets import on_targets

def _randomised(module: nn.Module) -> nn.Module:
    """``module`` in eval mode with running statistics and affines far from the identity."""
    torch.manual_seed(0)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
            if m.affine:
                nn.init.normal_(m.weight)
                nn.init.normal_(m.bias)
    return module.eval()


class ChannelAffine(nn.Module):
    """conv(x) * s + t with fixed per-channel vectors, as a frozen norm or a layer scale."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.register_buffer("s", torch.randn(6))
        self.register_buffer("t", torch.randn(6))

    def forward(self, x):
        return self.conv(x) * self.s[:, None, None] + self.t[:, None, None]


class LayerScale(nn.Module):
    """ConvNeXt's block end: a linear layer times a learned per-channel scale."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 6)
        self.gamma = nn.Parameter(torch.randn(6))

    def forward(self, x):
        return self.gamma * self.fc(x)


class TiedConv(nn.Module):
    """One conv weight read twice, once before a batch norm: the folded weight is a copy."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) + nn.functional.conv2d(x.relu(), self.conv.weight,
                                                            padding=1)


CASES = {
    "conv-bn": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6)),
                (2, 3, 8, 8)),
    "conv-no-bias-bn-relu": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3, bias=False),
                                                   nn.BatchNorm2d(6), nn.ReLU()), (2, 3, 8, 8)),
    "depthwise-bn": (lambda: nn.Sequential(nn.Conv2d(6, 6, 3, groups=6, stride=2),
                                           nn.BatchNorm2d(6)), (2, 6, 9, 9)),
    "conv1d-bn-no-affine": (lambda: nn.Sequential(nn.Conv1d(3, 5, 3),
                                                  nn.BatchNorm1d(5, affine=False)), (2, 3, 16)),
    "conv-transpose-bn": (lambda: nn.Sequential(nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2),
                                                nn.BatchNorm2d(6)), (2, 4, 5, 5)),
    "linear-bn": (lambda: nn.Sequential(nn.Linear(8, 6), nn.BatchNorm1d(6)), (4, 8)),
    "channel-affine": (ChannelAffine, (2, 3, 8, 8)),
    "layer-scale": (LayerScale, (2, 5, 8)),
    "tied-conv": (TiedConv, (2, 4, 6, 6)),
}


def _check_targets(prog, args, want):
    for target, got in on_targets(prog, args, ("run", "torch", "onnx")).items():
        torch.testing.assert_close(got[0], want, rtol=1e-5, atol=1e-5 * want.abs().max().item(),
                                   msg=lambda m, t=target: f"{t}: {m}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_affine_folds_into_weights(name):
    make, shape = CASES[name]
    model = _randomised(make())
    args = (torch.randn(*shape),)
    with torch.no_grad():
        want = model(*args)
    prog = tdag.from_torch(model, args)
    low = lower(prog, check=True)
    tdag.verify(low)
    left = Counter(n.op for n in low.graph.nodes)
    assert left[Op.batch_norm] == 0 and left[Op.multiply] == 0, left
    assert not any(w.kind is TensorKind.parameter for w in low.graph.weights.values()
                   if name != "tied-conv"), "a folded parameter stayed"
    _check_targets(prog, args, want)


def _zero_bias(make):
    def build():
        model = make()
        for m in model.modules():
            if getattr(m, "bias", None) is not None and not isinstance(m, nn.BatchNorm2d):
                nn.init.zeros_(m.bias)
        return model.eval()
    return build


# fresh models' zero biases (transformers and torchvision initialise them so): the fold
# of a fresh BatchNorm (mean 0, beta 0) is a zero bias too
ZERO_BIAS = {
    "conv-fresh-bn": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3, bias=False),
                                            nn.BatchNorm2d(6)).eval(), (2, 3, 8, 8), Op.conv),
    "conv": (_zero_bias(lambda: nn.Conv2d(3, 6, 3)), (2, 3, 8, 8), Op.conv),
    "conv-transpose": (_zero_bias(lambda: nn.ConvTranspose2d(4, 6, 3, stride=2)),
                       (2, 4, 5, 5), Op.conv_transpose),
    "linear": (_zero_bias(lambda: nn.Linear(8, 6)), (2, 5, 8), Op.einsum),
}


@pytest.mark.parametrize("name", sorted(ZERO_BIAS))
def test_zero_bias_is_no_bias(name):
    """A fixed all-zero bias goes, as torch.onnx.export's optimiser drops it: a file adds
    nothing on every call. The torch module keeps its parameters (they are not folded)."""
    make, shape, op = ZERO_BIAS[name]
    torch.manual_seed(0)
    model = make()
    args = (torch.randn(*shape),)
    with torch.no_grad():
        want = model(*args)
    prog = tdag.from_torch(model, args)
    kernels = [n for n in lower(prog, check=True).graph.nodes if n.op is op]
    assert len(kernels) == 1 and len(kernels[0].inputs) == 2, kernels
    _check_targets(prog, args, want)


def test_training_step_left_unchanged():
    """The parameters a step trains are its inputs: no fold touches them."""
    model = _randomised(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten()))

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, x):
            return self.m(x).pow(2).mean()

    args = (torch.randn(2, 3, 6, 6),)
    step = tdag.train_step(tdag.from_torch(Loss().eval(), args), tdag.optim.AdamW(lr=1e-3))
    assert str(lower(step, final=())) == str(lower(step))
    grad = tdag.grad(tdag.from_torch(Loss().eval(), args))
    assert str(lower(grad, final=())) == str(lower(grad))


def _cast_chain(x, via, back):
    return ops.cast(ops.cast(ops.neg(x), via), back)


@pytest.mark.parametrize("via, casts", [("float64", 0), ("float16", 2)])
def test_cast_chain(via, casts):
    """f32 -> f64 -> f32 is the identity; f32 -> f16 -> f32 rounds and stays."""
    prog = tdag.trace(lambda x: _cast_chain(x, via, "float32"), tdag.TensorSpec((3, 5)))
    low = lower(prog, check=True)
    assert Counter(n.op for n in low.graph.nodes)[Op.cast] == casts
    x = torch.randn(3, 5)
    want = (-x).to(getattr(torch, via)).float()
    _check_targets(prog, (x,), want)


def test_cast_chain_keeps_the_last_cast():
    """f16 -> f32 -> f64 is one f16 -> f64 cast."""
    prog = tdag.trace(lambda x: _cast_chain(x, "float32", "float64"),
                      tdag.TensorSpec((4,), "float16"))
    low = lower(prog, check=True)
    assert Counter(n.op for n in low.graph.nodes)[Op.cast] == 1
    x = torch.randn(4).half()
    _check_targets(prog, (x,), (-x).double())


class WeightMath(nn.Module):
    """A weight the module computes from parameters on every call (a transposed, rescaled
    weight, a positive scale): done once by the fold."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 8))
        self.log_scale = nn.Parameter(torch.randn(6))

    def forward(self, x):
        w = (self.w * 0.5).t().contiguous()
        return (x @ w) * self.log_scale.exp() + self.log_scale.sigmoid()


def test_weight_only_nodes_become_consts():
    model = WeightMath().eval()
    args = (torch.randn(3, 8),)
    with torch.no_grad():
        want = model(*args)
    prog = tdag.from_torch(model, args)
    low = lower(prog, check=True)
    left = Counter(n.op for n in low.graph.nodes)
    assert left[Op.exp] == 0 and left[Op.permute] == 0, left
    _check_targets(prog, args, want)


def test_shared_weight_is_not_copied():
    """A weight read by a computed node too stays as it is: folding its transpose would keep
    two copies (tied embeddings)."""
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(10, 6))

        def forward(self, ids):
            h = self.w[ids]
            return h @ self.w.t()

    model, args = Tied().eval(), (torch.randint(0, 10, (2, 3)),)
    with torch.no_grad():
        want = model(*args)
    prog = tdag.from_torch(model, args)
    low = lower(prog)
    assert low.graph.weights["w"].kind is TensorKind.parameter
    assert not any(w.kind is TensorKind.const and w.type.numel == 60
                   for w in low.graph.weights.values()), "a copy of w"
    _check_targets(prog, args, want)


def test_linear_weight_stored_as_read():
    """nn.Linear on 3-d input: the file holds W^T and runs one MatMul, no Transpose."""
    model = nn.Sequential(nn.Linear(8, 6), nn.GELU(), nn.Linear(6, 4)).eval()
    args = (torch.randn(2, 5, 8),)
    with torch.no_grad():
        want = model(*args)
    prog = tdag.from_torch(model, args)
    ops_in_file = Counter(n.op_type for n in tdag.to_onnx(prog).graph.node)
    assert ops_in_file["Transpose"] == 0 and ops_in_file["MatMul"] == 2, ops_in_file
    _check_targets(prog, args, want)


def test_file_folds_and_module_keeps_its_parameters():
    """to_onnx's file holds the folded weight as a const under the conv's name; to_torch's
    module keeps conv and batch norm parameters, loadable by their source names."""
    model = _randomised(nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    prog = tdag.from_torch(model, (torch.randn(1, 3, 6, 6),))
    file = tdag.to_onnx(prog)
    assert "BatchNormalization" not in {n.op_type for n in file.graph.node}
    assert {"const_0.weight", "const_0.bias"} <= {i.name for i in file.graph.initializer}
    module = tdag.to_torch(prog)
    assert {"0.weight", "1.weight", "1.running_var"} <= set(module.state_dict())
    missing, _ = module.load_state_dict(model.state_dict(), strict=False)
    assert not missing


class SkipJoin(nn.Module):
    """A UNet's skip join: a 1x1 conv of the skip and the upsampled path, concatenated."""

    def __init__(self, kernel=1, groups=1, bias=True, read_again=False, width=16):
        super().__init__()
        self.up = nn.Conv2d(16, width, 3, padding=1)
        self.fuse = nn.Conv2d(16 + width, 8, kernel, padding=kernel // 2, groups=groups,
                              bias=bias)
        self.read_again = read_again

    def forward(self, x):
        joined = torch.cat([x, self.up(x)], 1)
        y = self.fuse(joined)
        return y + joined.sum(1, keepdim=True) if self.read_again else y


@pytest.mark.parametrize("bias", [True, False])
def test_concat_1x1_conv_splits_over_its_pieces(bias):
    model = SkipJoin(bias=bias).eval()
    args = (torch.randn(2, 16, 8, 8),)
    with torch.no_grad():
        want = model(*args)
    low = lower(tdag.from_torch(model, args), check=True)
    tdag.verify(low)
    left = Counter(n.op for n in low.graph.nodes)
    assert left[Op.concat] == 0 and left[Op.conv] == 3, left
    # the bias joins the first piece's call, not an add of its own
    assert sum(len(n.inputs) == 3 for n in low.graph.nodes if n.op is Op.conv) == 1 + bias
    # neither slice takes the weight's name: a file's "fuse.weight" would be half of it
    assert "fuse.weight" not in low.graph.weights
    _check_targets(low, args, want)


def test_a_3x3_conv_of_a_concat_splits_in_the_file_alone():
    """``lower`` (the ONNX file's) splits any kernel; to_torch's lowering 1x1 alone (its 3x3
    convolutions ran slower split)."""
    model = SkipJoin(kernel=3).eval()
    args = (torch.randn(2, 16, 8, 8),)
    with torch.no_grad():
        want = model(*args)
    prog = tdag.from_torch(model, args)
    assert Counter(n.op for n in lower(prog, check=True).graph.nodes)[Op.concat] == 0
    assert Counter(n.op for n in lowered(prog).graph.nodes)[Op.concat] == 1
    _check_targets(prog, args, want)


@pytest.mark.parametrize("case", [dict(groups=2), dict(read_again=True), dict(width=8)])
def test_concat_conv_kept_where_a_split_gains_nothing(case):
    """Groups; a concat read again is written anyway; a piece of 8 channels runs unfused in
    onnxruntime."""
    model = SkipJoin(**case).eval()
    args = (torch.randn(2, 16, 8, 8),)
    with torch.no_grad():
        want = model(*args)
    low = lower(tdag.from_torch(model, args), check=True)
    assert Counter(n.op for n in low.graph.nodes)[Op.concat] == 1
    _check_targets(low, args, want)
