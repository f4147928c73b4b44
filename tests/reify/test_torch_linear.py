"""The reified module's large float32 projections run by oneDNN (``_rt.linear``,
tdag/lower/kernels/contraction.py): emitted from ``ONEDNN_MACS`` multiply-adds, F.linear
below, with a ReLU or GELU that alone reads the product applied inside the call; the same
values as F.linear; autograd and torch.compile fall back to F.linear; ``tdag.memory``
still matches MemTracker."""
from __future__ import annotations

import torch
from torch import nn

import tdag
from tdag.lower.kernels.contraction import onednn_linear
from support.guards import assert_close
from support.mem_tracker import measured_peak


def _mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))


def test_large_projections_use_onednn_small_ones_f_linear():
    x = torch.randn(4, 32, 256)  # 128 x 256 x 1024: 2**25 multiply-adds each
    model = _mlp(256).eval()
    module = tdag.to_torch(tdag.from_torch(model, (x,)))
    assert module.code.count("_rt.linear(") == 2 and "F.linear(" not in module.code
    assert ", 'gelu', 'none')" in module.code and "F.gelu" not in module.code  # fused
    with torch.inference_mode():
        assert_close(module(x), model(x), "oneDNN")
    small = _mlp(16).eval()
    xs = torch.randn(4, 16)
    code = tdag.to_torch(tdag.from_torch(small, (xs,))).code
    assert "_rt.linear(" not in code and code.count("F.linear(") == 2


def test_onednn_linear_equals_f_linear_on_every_operand_form():
    w, b = torch.randn(24, 40), torch.randn(24)
    for x in (torch.randn(40), torch.randn(3, 40), torch.randn(2, 3, 5, 40),
              torch.randn(2, 40, 3).mT, torch.randn(0, 40)):
        for weight in (w, w.t().contiguous().mT):  # a transposed const's view, as emitted
            for bias in (b, None):
                assert_close(onednn_linear(x, weight, bias), nn.functional.linear(x, weight, bias))


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
    """A ReLU, a SiLU and a tanh GELU each fused into the product they alone read; a GELU
    whose product is also read elsewhere stays on its own line."""
    torch.manual_seed(0)
    x = torch.randn(4, 32, 256)
    model = _Branches().eval()
    prog = tdag.from_torch(model, (x,))
    module = tdag.to_torch(prog)
    assert ", 'relu', '')" in module.code and ", 'gelu', 'tanh')" in module.code
    assert ", 'swish', '')" in module.code and "F.silu" not in module.code
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
    assert ", 'gelu', 'tanh')" in module.code and "F.gelu" not in module.code
    with torch.inference_mode():
        assert_close(module(x), model(x), "fused")
    assert abs(tdag.memory(prog).peak / measured_peak(module, (x,)) - 1) <= 0.01
    with torch.enable_grad():
        assert_close(module(x), model(x), "autograd")


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
