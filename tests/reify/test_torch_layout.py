"""The reified module's channels-last convolutions (tdag/reify/torch/layout.py): the conv
weights stored channels-last, the input copied so once, the (N, C, H, W) layout of a 4-d
result restored; outputs equal eager's, and ``tdag.memory`` still matches MemTracker."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import tdag
from tdag.reify.torch import runtime
from tdag.reify.torch.layout import channels_last_weights
from tdag.reify.torch.module import lowered
from support.guards import assert_close
from support.mem_tracker import measured_peak
from support.torch_models import CNN, UNetBlock

CL = torch.channels_last


class Stem(nn.Module):
    """ResNet's stem and a residual block: the 4-d result computed from convs."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 7, stride=2, padding=3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                                   nn.Conv2d(8, 8, 3, padding=1, groups=8))

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, 2, 1)
        return F.relu(self.block(x) + x)


def _module(model, args):
    torch.manual_seed(0)
    prog = tdag.from_torch(model.eval(), args)
    return prog, tdag.to_torch(prog)


def test_conv_weights_input_and_result_layouts():
    model, x = Stem(), torch.randn(2, 3, 32, 32)
    prog, module = _module(model, (x,))
    params = dict(module.named_parameters())
    assert params["conv.weight"].is_contiguous(memory_format=CL)
    assert params["block.2.weight"].is_contiguous(memory_format=CL)  # depthwise too
    assert "x = _rt.channels_last(x)" in module.code
    assert ".contiguous(),)" in module.code  # the result's layout restored
    pool = next(line for line in module.code.splitlines() if "max_pool2d" in line)
    assert "memory_format" not in pool  # already channels-last: pooled as it is
    with torch.no_grad():
        out = module(x)
        assert out.is_contiguous()
        assert_close(out, model(x), "stem")


def test_outputs_equal_eager_across_cnn_ops():
    for model, x in ((CNN(3, 5), torch.randn(2, 3, 16, 16)),
                     (UNetBlock(4), torch.randn(2, 4, 16, 16))):
        prog, module = _module(model, (x,))
        assert channels_last_weights(lowered(prog))
        with torch.no_grad():
            assert_close(module(x), model(x), type(model).__name__)


def test_state_dict_loads_into_channels_last_weights():
    model, x = Stem(), torch.randn(2, 3, 32, 32)
    _, module = _module(model, (x,))
    other = Stem().eval()
    missing, _ = module.load_state_dict(other.state_dict(), strict=False)  # num_batches_tracked
    assert not missing
    assert module.conv.weight.is_contiguous(memory_format=CL)
    with torch.no_grad():
        assert_close(module(x), other(x), "loaded")


def test_a_training_step_keeps_its_parameters_layout():
    """Its parameters are read by their gradients and the optimizer too."""
    x = torch.randn(2, 3, 32, 32)
    step = tdag.train_step(tdag.from_torch(_Mean(Stem()).eval(), (x,)), tdag.optim.SGD(lr=0.1))
    assert not channels_last_weights(lowered(step))
    assert "x = x.contiguous(memory_format" not in tdag.to_torch(step).code


class _Mean(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).mean()


def test_memory_replays_the_copies():
    """The input's channels-last copy, the pool on it and the result's copy back: the
    prediction is MemTracker's peak."""
    for model, x in ((Stem(), torch.randn(2, 3, 32, 32)),
                     (UNetBlock(4), torch.randn(2, 4, 16, 16))):
        prog, module = _module(model, (x,))
        report = tdag.memory(prog)
        assert abs(report.peak / measured_peak(module, (x,)) - 1) <= 0.01, type(model).__name__


class _Nhwc(nn.Module):
    """An image given (N, H, W, C), permuted for its conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x.permute(0, 3, 1, 2)))


def test_an_input_permuted_for_its_conv_is_not_copied():
    model, x = _Nhwc(), torch.randn(2, 8, 8, 3)
    prog, module = _module(model, (x,))
    assert "x = x.contiguous(memory_format" not in module.code
    assert module.conv.weight.is_contiguous(memory_format=CL)
    with torch.no_grad():
        assert_close(module(x), model(x), "nhwc")
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01


@pytest.mark.parametrize("shape,dtype", [((2, 16, 32, 32), torch.float32),
                                         ((2, 20, 32, 64), torch.float32),
                                         ((2, 16, 16, 32), torch.float64),
                                         ((2, 16, 30, 30), torch.float32),
                                         ((1, 8, 32, 32), torch.float32),
                                         ((3, 1, 1, 1), torch.float32)])
def test_input_copy_in_channel_chunks(shape, dtype):
    """The method's input copy takes 8 channels at a time where planes alias in the cache
    (a multiple of 4 KiB), the plain copy elsewhere: the same values and strides."""
    x = torch.randn(shape, dtype=dtype)
    got = runtime.channels_last(x)
    want = x.contiguous(memory_format=torch.channels_last)
    assert torch.equal(got, want) and got.stride() == want.stride()
    leaf = x.clone().requires_grad_()
    runtime.channels_last(leaf).sum().backward()  # recorded by autograd as one copy
    assert torch.equal(leaf.grad, torch.ones(shape, dtype=dtype))


def test_a_unet_input_is_copied_in_chunks_and_replayed():
    """A chunked copy allocates its result once, as the plain copy: the replay still fits."""
    model = UNetBlock(16).eval()
    args = (torch.randn(2, 16, 32, 32),)
    module = tdag.to_torch(tdag.from_torch(model, args))
    assert "x = _rt.channels_last(x)" in module.code
    with torch.no_grad():
        assert_close(module(*args), model(*args), "unet")
    report = tdag.memory(tdag.from_torch(model, args))
    assert abs(report.peak / measured_peak(module, args) - 1) <= 0.01


class _SamePadded(nn.Module):
    """MobileNet-v2's stride-2 block as Hugging Face writes it: a ReLU6 after the expansion,
    then TensorFlow's "same" padding (one more row and column after) before the depthwise
    convolution; and a ReLU before a padded max pool."""

    def __init__(self):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(8, 32, 1, bias=False), nn.BatchNorm2d(32))
        self.depthwise = nn.Conv2d(32, 32, 3, stride=2, groups=32)
        self.pool = nn.MaxPool2d(2)

    def forward(self, x):
        y = F.pad(F.relu6(self.expand(x)), (0, 1, 0, 1))
        z = F.pad(torch.relu(self.depthwise(y)), (1, 1, 1, 1), value=-1.0)
        return self.pool(z)


def test_a_clamp_before_a_pad_is_written_into_the_padded_tensor():
    """``_rt.clamped_pad``: the ReLU6 (and the ReLU) written into the interior of the pad that
    alone reads it, one pass where clamp then pad made two; eager's values, NaN kept, and
    ``tdag.memory``'s replay within 1% of MemTracker."""
    torch.manual_seed(0)
    model = _SamePadded().eval()
    x = torch.randn(2, 8, 16, 16)
    x[0, 0, 3, 4] = float("nan")
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    assert module.code.count("_rt.clamped_pad(") == 2 and "F.pad" not in module.code
    assert "0.0, 6.0)" in module.code and "-1.0, 0.0, None)" in module.code
    with torch.inference_mode():
        got = module(x)
        assert_close(got, model(x), "clamped pad")
        assert got.isnan().any()
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
    with torch.enable_grad():
        assert_close(module(x), model(x), "autograd")


@pytest.mark.parametrize("layout", [torch.contiguous_format, CL])
@pytest.mark.parametrize("pads", [[0, 1, 0, 1], [2, 0, 1, 3, 0, 0, 1, 0], [1, 1]])
def test_clamped_pad_equals_clamp_then_pad(layout, pads):
    x = torch.randn(2, 3, 5, 6).contiguous(memory_format=layout) * 8
    x[0, 1, 2, 3] = float("nan")
    got = runtime.clamped_pad(x, pads, 0.5, 0.0, 6.0)
    want = F.pad(torch.clamp(x, 0.0, 6.0), pads, value=0.5)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert got.is_contiguous(memory_format=layout) == want.is_contiguous(memory_format=layout)
    relu = runtime.clamped_pad(x[0], [1, 2], -3.0, 0.0)  # a 3-d one, a ReLU
    assert torch.equal(relu.nan_to_num(), F.pad(torch.relu(x[0]), [1, 2], value=-3.0).nan_to_num())


class _QuantizedPools(nn.Module):
    """A quantized model's int8 max pools after a conv: on an input's codes and on the conv's
    result quantized, both in the module's channels-last layout (the input is copied so for
    the conv); ``conv=False``: on the codes of an (N, C, H, W) input, the module's own."""

    def __init__(self, conv: bool = True):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1) if conv else None

    def forward(self, x):
        codes = torch.round(x * 20).clamp(-128, 127).to(torch.int8)
        pooled = F.max_pool2d(codes, 3, 2, 1)
        if self.conv is None:
            return pooled
        y = torch.round(self.conv(x) * 20).clamp(-128, 127).to(torch.int8)
        return pooled, F.max_pool2d(y, 3, 2, 1).to(torch.float32) / 20


@pytest.mark.parametrize("conv", [True, False], ids=["channels-last", "n-c-h-w"])
def test_an_8_bit_max_pool_runs_on_n_c_h_w(conv):
    """torch's channels-last max pooling refuses int8 and uint8 (a quantized ResNet's pool
    failed in the module); those pool on (N, C, H, W), a value held channels-last copied
    there and back: eager's values, and tdag.memory still MemTracker's peak."""
    x = torch.randn(2, 3, 16, 16)
    prog, module = _module(_QuantizedPools(conv), (x,))
    pools = [line for line in module.code.splitlines() if "F.max_pool2d(" in line]
    assert len(pools) == 1 + conv and all(("channels_last" in p) == conv for p in pools)
    model = _QuantizedPools(conv)
    model.load_state_dict(module.state_dict())
    with torch.no_grad():
        for got, want in zip(*(torch.utils._pytree.tree_leaves(r)
                               for r in (module(x), model.eval()(x)))):
            assert got.dtype == want.dtype
            assert_close(got, want)
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
