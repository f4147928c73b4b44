"""The reified module's oneDNN and MKL calls (tdag/lower/kernels/onednn.py): large float32
projections (``_rt.linear``, from ``PACKED_MACS`` multiply-adds on a packed weight and
``ONEDNN_MACS`` on another, F.linear below; MKL's packed sgemm on an Intel CPU) and 2-d
convolutions (``_rt.conv2d``) on weights packed once and kept beside them, with a SiLU, GELU
or hardswish that alone reads the result applied inside the call (not a ReLU or clamp:
oneDNN's turn NaN into 0). The same values as torch's ops; autograd, torch.compile and
export fall back to them; the packs follow the weights (load_state_dict, in-place updates,
``tdag_unpack``) and are never copied; ``tdag.memory`` still matches MemTracker."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import tdag
from tdag.lower.kernels import onednn
from tdag.lower.kernels.activations import gelu_tanh
from tdag.lower.kernels.onednn import conv1x1 as onednn_conv1x1
from tdag.lower.kernels.onednn import conv2d as onednn_conv2d
from tdag.lower.kernels.onednn import linear as onednn_linear
from support.guards import assert_close
from support.mem_tracker import measured_peak
from support.torch_models import UNetBlock


def _mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


def test_large_projections_use_onednn_small_ones_f_linear():
    x = torch.randn(4, 32, 256)  # 128 x 256 x 1024: 2**25 multiply-adds each
    model = _mlp(256).eval()
    module = tdag.to_torch(tdag.from_torch(model, (x,)))
    assert module.code.count("_rt.linear(") == 2 and "F.linear(" not in module.code
    assert "('gelu', [], 'none'))" in module.code and "F.gelu" not in module.code  # fused
    with torch.inference_mode():
        assert_close(module(x), model(x), "oneDNN")
    small = _mlp(16).eval()
    xs = torch.randn(4, 16)
    code = tdag.to_torch(tdag.from_torch(small, (xs,))).code
    assert "_rt.linear(" not in code and code.count("F.linear(") == 2


def test_mid_sized_projections_use_onednn_only_on_a_packed_weight():
    """[128, 256] x [256, 256] (2**23): packed, oneDNN saves MKL's packing on each call."""
    torch.manual_seed(0)
    model, x = nn.Linear(256, 256).eval(), torch.randn(128, 256)
    prog = tdag.from_torch(model, (x,))
    packed = tdag.to_torch(prog)
    assert "_rt.linear(" in packed.code and "self._tdag_packs" in packed.code
    assert "_rt.linear(" not in tdag.to_torch(prog, prepack=False).code
    with torch.inference_mode():
        assert_close(packed(x), model(x), "oneDNN")


def test_onednn_linear_equals_f_linear_on_every_operand_form():
    w, b = torch.randn(24, 40), torch.randn(24)
    for x in (torch.randn(40), torch.randn(3, 40), torch.randn(2, 3, 5, 40),
              torch.randn(2, 40, 3).mT, torch.randn(0, 40)):
        for weight in (w, w.t().contiguous().mT):  # a transposed const's view, as emitted
            for bias in (b, None):
                want = nn.functional.linear(x, weight, bias)
                assert_close(onednn_linear(x, weight, bias), want)
                packs = {}
                for _ in range(2):  # packed on the first call, read from the packs after
                    assert_close(onednn_linear(x, weight, bias, packs, "k"), want)
                assert packs["k"][1].is_mkldnn


def _packer(packs: dict, key: str):
    """The function that made the pack under ``key`` (the stamp's first part)."""
    return packs[key][0][0]


@pytest.mark.skipif(not torch._C.has_mkl, reason="torch built without MKL")
def test_mkl_packed_product_equals_f_linear_and_narrow_ones_stay_onednn(monkeypatch):
    """Where ``MKL_PACKED`` (an Intel CPU; forced here on any), a product of at least 128
    input and 128 output features runs MKL's prepacked sgemm: F.linear's kernels, so the
    same bits where F.linear runs sgemm too (rows past a handful), on every operand form;
    narrower ones keep oneDNN's call with its post-op."""
    monkeypatch.setattr(onednn, "MKL_PACKED", True)
    torch.manual_seed(0)
    w, b = torch.randn(256, 192), torch.randn(256)
    for x in (torch.randn(128, 192), torch.randn(2, 3, 5, 192), torch.randn(2, 192, 40).mT,
              torch.randn(192), torch.randn(0, 192)):
        for weight in (w, w.t().contiguous().mT):
            for bias in (b, None):
                want, packs = nn.functional.linear(x, weight, bias), {}
                for _ in range(2):
                    got = onednn_linear(x, weight, bias, packs, "k")
                    assert_close(got, want, f"{tuple(x.shape)}")
                    if x.numel() // 192 >= 30:
                        assert torch.equal(got, want)
                assert _packer(packs, "k") is onednn._pack_mkl and packs["k"][1].is_mkldnn
    x = torch.randn(128, 192)
    gelu = ("gelu", [], "none")
    packs = {}
    assert_close(onednn_linear(x, w, b, packs, "wide", gelu),
                 nn.functional.gelu(nn.functional.linear(x, w, b)))
    narrow = torch.randn(64, 192)  # 64 outputs: oneDNN's product, the GELU inside it
    assert_close(onednn_linear(x, narrow, None, packs, "narrow", gelu),
                 nn.functional.gelu(nn.functional.linear(x, narrow)))
    assert _packer(packs, "wide") is onednn._pack_mkl
    assert _packer(packs, "narrow") is onednn._pack_linear


@pytest.mark.skipif(not torch._C.has_mkl, reason="torch built without MKL")
def test_a_pack_is_never_read_by_the_other_library(monkeypatch):
    """A pack is stamped with the function that made it: switching ``MKL_PACKED`` between
    calls packs again (MKL's sgemm handed oneDNN's blocks would crash the process), and
    MKL's call on other rows than its pack's runs F.linear's."""
    torch.manual_seed(0)
    x, w, b = torch.randn(128, 256), torch.randn(256, 256), torch.randn(256)
    want, packs = nn.functional.linear(x, w, b), {}
    for flag in (False, True, False, True):
        monkeypatch.setattr(onednn, "MKL_PACKED", flag)
        assert_close(onednn_linear(x, w, b, packs, "k"), want, f"MKL_PACKED={flag}")
        assert _packer(packs, "k") is (onednn._pack_mkl if flag else onednn._pack_linear)
    fewer = x[:40]
    assert torch.equal(onednn_linear(fewer, w, b, packs, "k"),
                       nn.functional.linear(fewer, w, b))


def test_onednn_conv2d_equals_f_conv2d_on_every_form():
    """3x3, strided, dilated, depthwise and 1x1 convolutions, channels-last and not, with
    and without a bias, packed and not: the values and the layout of F.conv2d."""
    torch.manual_seed(0)
    cases = [((2, 8, 9, 9), (16, 8, 3, 3), (1, 1), (1, 1), (1, 1), 1),
             ((2, 8, 9, 9), (16, 8, 3, 3), (2, 2), (0, 1), (1, 1), 1),
             ((2, 8, 9, 9), (8, 4, 3, 3), (1, 1), (2, 2), (2, 2), 2),
             ((2, 8, 9, 9), (8, 1, 3, 3), (2, 2), (1, 1), (1, 1), 8),
             ((2, 8, 5, 7), (12, 8, 1, 1), (1, 1), (0, 0), (1, 1), 1),
             ((4, 64, 32, 32), (64, 64, 1, 1), (1, 1), (0, 0), (1, 1), 1)]  # a packed 1x1
    for xs, ws, stride, padding, dilation, groups in cases:
        for layout in (torch.contiguous_format, torch.channels_last):
            x = torch.randn(xs).contiguous(memory_format=layout)
            w = torch.randn(ws).contiguous(memory_format=layout)
            for bias in (torch.randn(ws[0]), None):
                want = nn.functional.conv2d(x, w, bias, stride, padding, dilation, groups)
                packs, pointwise = {}, ws[2:] == (1, 1) and groups == 1 and stride == (1, 1)
                for _ in range(2):
                    got = onednn_conv2d(x, w, bias, stride, padding, dilation, groups, packs, "k")
                    assert_close(got, want, f"{xs} {ws} {stride} {padding} {groups}")
                    assert got.is_contiguous(memory_format=layout)
                    if pointwise:
                        got = onednn_conv1x1(x, w, bias, packs, "p")
                        assert_close(got, want, f"1x1 {xs} {ws}")
                        assert got.is_contiguous(memory_format=layout)


def _packed_mlp():
    """An input, the 256-wide MLP and its module, called once (so its weights are packed)."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 256)
    model = _mlp(256).eval()
    module = tdag.to_torch(tdag.from_torch(model, (x,)))
    with torch.inference_mode():
        module(x)
    return x, model, module


def test_packs_follow_the_weights():
    """Reused across calls; packed anew after load_state_dict and an in-place update;
    dropped by ``.float()`` (any ``_apply``) and ``tdag_unpack``; never copied by
    deepcopy."""
    x, model, module = _packed_mlp()
    packs = dict(module._tdag_packs)
    assert len(packs) == 2 and all(p.is_mkldnn for _, p, _ in packs.values())
    with torch.inference_mode():
        module(x)
    assert all(module._tdag_packs[k][1] is packs[k][1] for k in packs)  # kept
    trained = _mlp(256).eval()
    with torch.no_grad():
        for p in trained.parameters():
            p.mul_(1.5)
    module.load_state_dict(trained.state_dict())
    with torch.inference_mode():
        assert_close(module(x), trained(x), "after load_state_dict")
    with torch.no_grad():
        next(module.parameters()).add_(0.25)  # an in-place update the version counter sees
        assert_close(module(x), _eager(module, x), "after add_")
    clone = copy.deepcopy(module)
    assert clone._tdag_packs == {} and module._tdag_packs
    with torch.inference_mode():
        assert_close(clone(x), module(x), "deepcopy")
    module.float()
    assert module._tdag_packs == {}
    with torch.inference_mode():
        module(x)
    assert len(module._tdag_packs) == 2
    module.tdag_unpack()
    assert module._tdag_packs == {}


def _eager(module, x):
    """``module``'s values without oneDNN (autograd recording: torch's own ops)."""
    with torch.enable_grad():
        return module(x).detach()


def test_relu_and_clamp_keep_nan():
    """oneDNN's relu and clip post-ops give 0 for NaN; torch keeps NaN, so ReLU and ReLU6
    stay outside the call."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Conv1d(32, 32, 1)).eval()
    conv = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU6(), nn.Conv2d(16, 8, 3),
                         nn.ReLU()).eval()
    for net, x in ((model, torch.randn(4, 32, 256)), (conv, torch.randn(2, 8, 16, 16))):
        module = tdag.to_torch(tdag.from_torch(net, (x,)))
        assert "'relu'" not in module.code and "'hardtanh'" not in module.code
        x[0, 0, 0] = float("nan")
        with torch.inference_mode():
            got, want = module(x), net(x)
        assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()


def test_autograd_falls_back_to_f_linear():
    x = torch.randn(3, 8, requires_grad=True)
    w = torch.randn(5, 8, requires_grad=True)
    onednn_linear(x, w, None).sum().backward()
    assert_close(x.grad, w.sum(0).expand(3, 8))
    assert_close(w.grad, x.detach().sum(0).expand(5, 8))


def test_compiled_and_exported_modules_use_f_linear():
    """Inductor lowers oneDNN's op only for frozen weights; export records aten.linear."""
    x = torch.randn(4, 32, 256)
    model = _mlp(256).eval()
    module = tdag.to_torch(tdag.from_torch(model, (x,)))
    with torch.no_grad():
        assert_close(torch.compile(module)(x), model(x), "compiled")
        exported = torch.export.export(module, (x,))
    assert "mkldnn" not in str(exported.graph)
    with torch.no_grad():
        assert_close(exported.module()(x), model(x), "exported")


def test_fused_activations_equal_eager_and_memory_matches():
    """A SiLU and a tanh GELU each fused into the product they alone read; a GELU whose
    product is also read elsewhere stays on its own line, and so does the ReLU."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 256)
    model = _Branches().eval()
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    _assert_tanh_gelu_placed(module.code)
    assert "torch.relu(" in module.code
    assert "('swish', [], ''))" in module.code and "F.silu" not in module.code
    assert module.code.count("F.gelu(") == 1  # its product is also added to the output
    with torch.inference_mode():
        assert_close(module(x), model(x), "fused")
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
    with torch.enable_grad():  # autograd: F.linear, then the activation
        assert_close(module(x), model(x), "autograd")


def test_activation_read_through_a_reshape_is_fused():
    """GPT-2's Conv1D: addmm of the rows, viewed back to [B, S, N], then the GELU: the GELU
    goes inside the product all the same (an elementwise op commutes with a reshape)."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 256)
    model = _RowProduct().eval()
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    _assert_tanh_gelu_placed(module.code)
    assert "F.gelu" not in module.code
    with torch.inference_mode():
        assert_close(module(x), model(x), "fused")
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
    with torch.enable_grad():
        assert_close(module(x), model(x), "autograd")


def _assert_tanh_gelu_placed(code: str) -> None:
    """A tanh GELU after a 256 -> 1024 product: inside oneDNN's call, or where MKL's packed
    sgemm runs the product (an Intel CPU), on its own line as ``_rt.gelu_tanh``."""
    if onednn.MKL_PACKED:
        assert "_rt.gelu_tanh(" in code and "('gelu', [], 'tanh'))" not in code
    else:
        assert "('gelu', [], 'tanh'))" in code and "_rt.gelu_tanh(" not in code


def test_tanh_gelu_fast_form_equals_f_gelu():
    """``_rt.gelu_tanh``: x * sigmoid(2c (x + 0.044715 x^3)) in five passes from 4096
    elements, float64's values within 2e-6 relative (F.gelu's own lose digits by the
    origin), infinities and NaN as F.gelu's; F.gelu under autograd and below the size."""
    torch.manual_seed(0)
    x = torch.cat([torch.randn(8192) * 4, torch.linspace(-12, 12, 4001),
                   torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0, 1e30,
                                 -1e30, 1e-30])])
    want = nn.functional.gelu(x.double(), approximate="tanh")
    got = gelu_tanh(x)
    assert got.dtype is torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-6, equal_nan=True)
    finite = want.isfinite()
    ours = ((got.double() - want).abs() / (want.abs() + 1e-6))[finite].max()
    torch_own = ((nn.functional.gelu(x, approximate="tanh").double() - want).abs() /
                 (want.abs() + 1e-6))[finite].max()
    assert ours < 2e-6 < torch_own  # F.gelu's tanh form loses digits by the origin
    small = torch.randn(64)
    assert torch.equal(gelu_tanh(small), nn.functional.gelu(small, approximate="tanh"))
    leaf = torch.randn(8192, requires_grad=True)
    gelu_tanh(leaf).sum().backward()
    reference = leaf.detach().clone().requires_grad_()
    nn.functional.gelu(reference, approximate="tanh").sum().backward()
    assert torch.equal(leaf.grad, reference.grad)


class _RowProduct(nn.Module):
    def __init__(self):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(256, 1024) / 16), nn.Parameter(torch.randn(1024))

    def forward(self, x):
        y = torch.addmm(self.b, x.view(-1, 256), self.w).view(4, 32, 1024)
        return nn.functional.gelu(y, approximate="tanh")


class _Branches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(256, 1024) for _ in range(4))

    def forward(self, x):
        shared = self.c(x)
        return (torch.relu(self.a(x)) + nn.functional.gelu(self.b(x), approximate="tanh") +
                nn.functional.gelu(shared) + shared + nn.functional.silu(self.d(x)))


def test_a_leaky_relu_runs_inside_its_convolution_or_product_keeping_nan():
    """YOLO's and GANs' conv + LeakyReLU: the slope is oneDNN's leaky_relu post-op inside
    the packed 3x3 and 1x1 convolutions (x > 0 ? x : slope x, so a NaN stays NaN as in
    torch); values as eager's, a NaN pixel included, and tdag.memory within 1%."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.LeakyReLU(0.1),
                          nn.Conv2d(16, 32, 1), nn.LeakyReLU(0.2), nn.Flatten(),
                          nn.Linear(32 * 16 * 16, 64), nn.LeakyReLU()).eval()
    x = torch.randn(2, 3, 16, 16)
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    for post in ("('leaky_relu', [0.1", "('leaky_relu', [0.2"):
        assert post in module.code, module.code
    # the 2-row product runs F.linear (not worth a pack), its activation in place after it
    assert module.code.count("F.leaky_relu(") == 2, module.code
    x[1, 0, 3, 3] = float("nan")
    with torch.inference_mode():
        assert_close(module(x), model(x), "leaky relu inside")
        assert module(x)[1].isnan().all() and not module(x)[0].isnan().any()
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01


def test_convolutions_run_packed_with_their_activations_and_memory_matches():
    """A CNN's 2-d convolutions: ``_rt.conv2d`` on weights packed once, a hardswish, SiLU
    or GELU inside the call, a 1x1 convolution as a product of the channels-last rows; the
    values of eager, and ``tdag.memory``'s replay within 1% of MemTracker."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.Hardswish(),
                          nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.SiLU(),
                          nn.Conv2d(16, 32, 1), nn.GELU(), nn.Conv2d(32, 8, 3)).eval()
    x = torch.randn(2, 3, 32, 32)
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    assert module.code.count("_rt.conv2d(") == 3 and module.code.count("_rt.conv1x1(") == 1
    assert "F.conv2d" not in module.code
    for post in ("('hardswish', [], ''))", "('swish', [], ''))", "('gelu', [], 'none'))"):
        assert post in module.code
    with torch.inference_mode():
        for _ in range(2):
            got = module(x)
            assert_close(got, model(x), "packed")
            assert got.is_contiguous()  # the (N, C, H, W) output, as eager's
    assert len(module._tdag_packs) == 3  # the 1x1's 2**18 multiply-adds run by F.linear
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
    unpacked = tdag.to_torch(prog, prepack=False)
    assert "_tdag_packs" not in unpacked.code and unpacked.code.count("None, None, (") == 3
    with torch.inference_mode():
        assert_close(unpacked(x), model(x), "prepack=False")


class _AudioFront(nn.Module):
    """Whisper's encoder front: two 1-d convolutions with GELUs, frames to (N, W, C); then a
    dilated depthwise one and a residual, as wav2vec's positional convolution."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(16, 64, 3, padding=1)
        self.c2 = nn.Conv1d(64, 64, 3, stride=2, padding=1)
        self.dw = nn.Conv1d(64, 64, 5, padding=4, dilation=2, groups=64)

    def forward(self, x):
        y = nn.functional.gelu(self.c2(nn.functional.gelu(self.c1(x))))
        z = torch.relu(self.dw(y)) + y
        return z.permute(0, 2, 1) * 2.0, z


def test_conv1d_runs_packed_channels_last_and_memory_matches():
    """1-d convolutions: ``_rt.conv1d`` (oneDNN's 2-d convolution of one row) on weights
    packed once, the GELU inside the call, each result (N, C, W) on (N, W, C) storage; the
    input copied so once, an (N, C, W) output returned contiguous as eager's; eager's values
    at every batch size, under autograd (F.conv1d) and without packs; ``tdag.memory``'s
    replay equal to MemTracker's peak."""
    torch.manual_seed(0)
    model = _AudioFront().eval()
    x = torch.randn(4, 16, 64)
    prog = tdag.from_torch(model, (x,), dynamic_batch=True)
    module = tdag.to_torch(prog)
    assert module.code.count("_rt.conv1d(") == 3 and "F.conv1d" not in module.code
    assert module.code.count("('gelu', [], 'none'))") == 2 and "F.gelu" not in module.code
    assert "x = _rt.channels_last(x)" in module.code
    with torch.inference_mode():
        for batch in (4, 2, 4):
            xb = torch.randn(batch, 16, 64)
            frames, z = module(xb)
            want = model(xb)
            assert_close(frames, want[0], f"packed, batch {batch}")
            assert_close(z, want[1], f"packed, batch {batch}")
            assert z.is_contiguous()
    assert len(module._tdag_packs) == 3
    assert tdag.memory(prog, batch=4).peak == measured_peak(module, (x,))
    with torch.enable_grad():
        assert_close(module(x), model(x), "autograd")
    unpacked = tdag.to_torch(prog, prepack=False)
    with torch.inference_mode():
        assert_close(unpacked(x), model(x), "prepack=False")
        module.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})
        model.load_state_dict(module.state_dict())
        assert_close(module(x), model(x), "repacked after load_state_dict")


def test_wav2vec2_feature_convolutions_run_packed():
    """Hugging Face's wav2vec2 (random weights, a small config): its feature extractor's 1-d
    convolutions run by ``_rt.conv1d``, the one behind a group norm too (its (N, C, W)
    result copied inside the call); the weight-normed positional convolution, its weight
    computed per call, by F.conv1d; eager's values, and ``tdag.memory`` within 1% of
    MemTracker."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4)
    model = transformers.Wav2Vec2Model(config).eval()
    audio = torch.randn(2, 400)
    prog = tdag.from_torch(model, (audio,))
    module = tdag.to_torch(prog)
    assert module.code.count("_rt.conv1d(") == 2 and module.code.count("F.conv1d(") == 1
    with torch.inference_mode():
        got = module(audio)
        assert_close(got[0], model(audio).last_hidden_state, "wav2vec2")
    assert abs(tdag.memory(prog).peak / measured_peak(module, (audio,)) - 1) <= 0.01


def test_packs_made_in_inference_mode_serve_other_modes():
    """Packs made under inference_mode are read under no_grad and with autograd on but no
    tensor requiring grad; with grad required, torch's ops run (and differentiate)."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 256)
    model = _mlp(256).eval()
    module = tdag.to_torch(tdag.from_torch(model, (x,)))
    with torch.inference_mode():
        want = model(x)
        assert_close(module(x), want, "inference_mode")
    with torch.no_grad():
        assert_close(module(x), want, "no_grad")
    for p in module.parameters():
        p.requires_grad_(False)
    assert_close(module(x), want, "grad on, nothing requires it")
    xg = x.clone().requires_grad_()
    module(xg).sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0


def test_a_module_built_under_inference_mode_runs_and_packs():
    """Its weights are ordinary tensors (an inference tensor keeps no version counter to
    stamp a pack with); an inference-tensor weight loaded later runs unpacked."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 256)
    model = _mlp(256).eval()
    prog = tdag.from_torch(model, (x,))
    with torch.inference_mode():
        module = tdag.to_torch(prog)
        assert not any(p.is_inference() for p in module.parameters())
        assert_close(module(x), model(x), "built in inference_mode")
        assert module._tdag_packs
        module.load_state_dict({k: v.clone() for k, v in model.state_dict().items()},
                               assign=True)
        assert any(p.is_inference() for p in module.parameters())
        module.tdag_unpack()
        assert_close(module(x), model(x), "inference-tensor weights")
        assert not module._tdag_packs


def test_a_weight_replaced_between_calls_is_packed_anew():
    """A new parameter object, even one that could reuse the old one's address: the pack
    holds the old storage, so the new weight never matches its stamp."""
    x, model, module = _packed_mlp()
    for _ in range(3):
        with torch.no_grad():
            w = torch.randn_like(module._modules["0"].weight)
            module._modules["0"].weight = nn.Parameter(w)
            model[0].weight = nn.Parameter(w.clone())
            assert_close(module(x), model(x), "replaced")


def test_jit_trace_records_torch_ops():
    """torch.jit.trace records F.conv2d and F.linear: a traced graph holding oneDNN's
    packs could not be saved, nor run elsewhere."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.SiLU(), nn.Conv2d(16, 32, 1),
                          nn.Flatten(), nn.Linear(32 * 16 * 16, 1024), nn.GELU()).eval()
    x = torch.randn(2, 3, 16, 16)
    module = tdag.to_torch(tdag.from_torch(model, (x,)))
    with torch.no_grad():
        traced = torch.jit.trace(module, (x,))
        assert_close(traced(x), model(x), "traced")
    assert not [n for n in traced.inlined_graph.nodes() if "mkldnn" in n.kind()]


def test_a_split_convs_weight_slices_are_packed_and_follow_the_weight():
    """A UNet's 1x1 join split over its pieces reads slices of its weight: each slice is
    packed as a view, and packed again when load_state_dict writes the weight."""
    torch.manual_seed(0)
    model, x = UNetBlock(16).eval(), torch.randn(4, 16, 64, 64)
    module = tdag.to_torch(tdag.from_torch(model, (x,)))
    assert "torch.cat" not in module.code and module.code.count("_rt.conv1x1(") == 2
    with torch.inference_mode():
        assert_close(module(x), model(x), "split")
        assert sum(key.startswith("main/86") for key in module._tdag_packs) == 2
        state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
        model.load_state_dict(state)
        module.load_state_dict(state)
        assert_close(module(x), model(x), "reloaded")


class _NormedConvs(nn.Module):
    """Convolutions each read by an eval-mode batch norm alone: a 3x3 without bias, a
    depthwise one with a bias, a norm without affine, a large 1x1 (a packed product) and a
    small one (F.linear), then a SiLU after a norm (not fused: the norm reads the conv)."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64)
        self.dw, self.bn1 = nn.Conv2d(64, 64, 3, padding=1, groups=64), nn.BatchNorm2d(64)
        self.dw2, self.plain = nn.Conv2d(64, 64, 3, padding=1, groups=64), \
            nn.BatchNorm2d(64, affine=False)
        self.wide, self.bn2 = nn.Conv2d(64, 256, 1, bias=False), nn.BatchNorm2d(256)
        self.narrow, self.bn3 = nn.Conv2d(256, 8, 1), nn.BatchNorm2d(8)
        for bn in (self.bn0, self.bn1, self.plain, self.bn2, self.bn3):  # statistics of a model
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)
            if bn.affine:
                nn.init.uniform_(bn.weight, 0.5, 1.5)
                nn.init.uniform_(bn.bias, -0.5, 0.5)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        x = self.plain(self.dw2(x)) + self.bn1(self.dw(x))
        x = nn.functional.silu(self.bn2(self.wide(x)))
        return self.bn3(self.narrow(x))


def test_batch_norms_fold_into_their_convolutions_packs():
    """Each norm that alone reads a packed convolution goes into the call (``norm=``) and
    into its pack: the weight scaled per channel, the bias shifted. The values of eager;
    ``tdag.memory`` within 1% of MemTracker; the pack follows the statistics
    (load_state_dict, an in-place update of a running mean); autograd and prepack=False
    compute the norm themselves."""
    torch.manual_seed(0)
    model, x = _NormedConvs().eval(), torch.randn(2, 3, 32, 32)
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    assert module.code.count("norm=(") == 5 and "batch_norm(" not in module.code
    with torch.inference_mode():
        assert_close(module(x), model(x), "folded")
        assert_close(module(x), model(x), "from the packs")
    assert sum(isinstance(made, tuple) for _, made, _ in module._tdag_packs.values()) == 5
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
    other = _NormedConvs().eval()
    state = {k: v for k, v in other.state_dict().items()  # a count the program never reads
             if not k.endswith("num_batches_tracked")}
    module.load_state_dict(state)
    with torch.inference_mode():
        assert_close(module(x), other(x), "after load_state_dict")
    with torch.no_grad():
        module.get_buffer("bn2.running_mean").add_(0.5)
        other.bn2.running_mean.add_(0.5)
    with torch.inference_mode():
        assert_close(module(x), other(x), "after a running mean's update")
    with torch.enable_grad():
        assert_close(module(x).detach(), other(x).detach(), "autograd")
    unpacked = tdag.to_torch(prog, prepack=False)
    unpacked.load_state_dict(module.state_dict())
    with torch.inference_mode():
        assert_close(unpacked(x), other(x), "prepack=False")


def test_batch_norm_written_over_a_result_equals_f_batch_norm():
    """``onednn.batch_norm`` in place (on a channels-last image, and on rows whose last axis
    is the channel) computes F.batch_norm's values."""
    torch.manual_seed(0)
    y = torch.randn(2, 8, 5, 5).contiguous(memory_format=torch.channels_last)
    mean, var, weight, bias = torch.randn(8), torch.rand(8) + 0.5, torch.randn(8), torch.randn(8)
    for norm in ((mean, var, weight, bias, 1e-3), (mean, var, None, None, 1e-5)):
        want = nn.functional.batch_norm(y, *norm[:4], False, 0.0, norm[4])
        assert_close(onednn.batch_norm(y.clone(), norm, inplace=True), want)
        rows = y.permute(0, 2, 3, 1).clone()
        assert_close(onednn.batch_norm(rows, norm, inplace=True, axis=-1).permute(0, 3, 1, 2),
                     want)


def test_an_onnx_files_batch_norm_runs_and_differentiates_with_autograd_on():
    """An ONNX file's running statistics are initializers, so its module's parameters:
    torch's batch norm refuses to run where autograd would differentiate them. The module
    runs with autograd on (the convolution's norm unfolded, as the lowered kernel and the
    unlowered program compute it), onnxruntime's values, and the gradients of the same
    normalisation written out in float64 for every input and weight, statistics included."""
    from onnx import TensorProto, helper, numpy_helper
    from support.guards import run_onnx
    gen = torch.Generator().manual_seed(0)
    weights = {"w": torch.randn(8, 3, 3, 3, generator=gen), "gamma": torch.randn(8, generator=gen),
               "beta": torch.randn(8, generator=gen), "mean": torch.randn(8, generator=gen),
               "var": torch.rand(8, generator=gen) + 0.5}
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["n"],
                          epsilon=1e-3),
         helper.make_node("Relu", ["n"], ["y"])], "conv_bn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8, 8, 8])],
        [numpy_helper.from_array(t.numpy(), name) for name, t in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = torch.randn(2, 3, 8, 8, generator=gen)

    def reference(x, w, gamma, beta, mean, var):
        scale = (gamma * torch.rsqrt(var + 1e-3)).view(-1, 1, 1)
        c = nn.functional.conv2d(x, w, padding=1)
        return torch.relu((c - mean.view(-1, 1, 1)) * scale + beta.view(-1, 1, 1))

    leaves = [t.double().requires_grad_() for t in (x, *weights.values())]
    reference(*leaves).sum().backward()
    for lower in (True, False):
        module = tdag.to_torch(tdag.from_onnx(model), lower=lower)
        xg = x.clone().requires_grad_()
        got = module(xg)
        assert_close(got.detach(), run_onnx(model, x), f"lower={lower}")
        got.sum().backward()
        params = dict(module.named_parameters())
        for name, leaf in zip(("x", *weights), leaves):
            grad = xg.grad if name == "x" else params[name].grad
            torch.testing.assert_close(grad.double(), leaf.grad, rtol=1e-4, atol=1e-4,
                                       msg=lambda m, n=name: f"d/d{n}, lower={lower}: {m}")


def test_an_activation_after_a_folded_norm_runs_inside_the_call():
    """Conv -> batch norm -> SiLU (EfficientNet's and YOLO's block) and a 1x1 conv -> norm ->
    hardswish: one call each, the norm folded into the pack and the activation inside it;
    a ReLU after a norm stays outside (oneDNN's turns NaN into 0). The values of eager,
    memory within 1% of MemTracker, autograd and prepack=False too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32),
                          nn.SiLU(), nn.Conv2d(32, 256, 1), nn.BatchNorm2d(256),
                          nn.Hardswish(), nn.Conv2d(256, 16, 3, padding=1),
                          nn.BatchNorm2d(16), nn.ReLU()).eval()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 32, 32)
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    code = module.code
    assert "('swish', [], ''), norm=(" in code and "('hardswish', [], ''), norm=(" in code
    assert code.count("norm=(") == 3 and "F.silu" not in code and "hardswish(" not in code
    assert "batch_norm(" not in code and "relu" in code
    with torch.inference_mode():
        assert_close(module(x), model(x), "conv, norm, activation")
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
    with torch.enable_grad():
        assert_close(module(x).detach(), model(x).detach(), "autograd")
    with torch.inference_mode():
        assert_close(tdag.to_torch(prog, prepack=False)(x), model(x), "prepack=False")
