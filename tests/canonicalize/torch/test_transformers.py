"""Real architectures from ``transformers`` (small configs, random weights: nothing is
downloaded), and the float literals they need written exactly in generated code.

T5 masks attention with float32's lowest value; as its shortest float32 decimal,
-3.4028235e+38, that value lies past float32's range as a Python float and torch refuses it,
so the generated code must write the exact value, -3.4028234663852886e+38.
"""
from __future__ import annotations

import pytest
import torch
import transformers

from support.guards import run_onnx

import tdag
from tdag.deinops.codegen import literal
from tdag.ir.types import DType

# torch reifies with torch's own kernels and the same op order: T5's output (norms and
# softmaxes in float32) agrees with eager to rounding; onnxruntime may reorder sums
RTOL, ATOL = 1e-4, 1e-5




def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


@pytest.fixture(scope="module")
def t5_encoder():
    torch.manual_seed(0)
    config = transformers.T5Config(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4,
                                   vocab_size=100)
    model = transformers.T5EncoderModel(config).eval()
    input_ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        expected = model(input_ids).last_hidden_state
    return tdag.from_torch(model, (input_ids,)), input_ids, expected


def test_t5_encoder_to_torch(t5_encoder):
    prog, input_ids, expected = t5_encoder
    module = tdag.to_torch(prog)
    assert "-3.4028234663852886e+38" in module.code  # the attention mask's fill, exact
    with torch.no_grad():
        got = _first(module(input_ids))
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)


def test_t5_encoder_to_onnx(t5_encoder):
    prog, input_ids, expected = t5_encoder
    got = _first(run_onnx(tdag.to_onnx(prog), input_ids))
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)


class NanToNum(torch.nn.Module):
    def forward(self, x):
        return torch.nan_to_num(x)  # posinf / neginf: the dtype's max and lowest


class ClampAtLowest(torch.nn.Module):
    """A clamp bound and a masked fill at the dtype's lowest: a spec value and an operand."""

    def forward(self, x):
        lowest = torch.finfo(x.dtype).min
        return torch.clamp(x, min=lowest) + x.masked_fill(x > 1, lowest)


@pytest.mark.parametrize("make, dtype", [(NanToNum, torch.float32),
                                         (ClampAtLowest, torch.float32),
                                         (ClampAtLowest, torch.float16)])
def test_extreme_literals_reify(make, dtype):
    x = torch.tensor([[1.0, float("nan"), float("inf"), float("-inf"), -2.5, 0.0]], dtype=dtype)
    expected = make()(x)
    prog = tdag.from_torch(make(), (x,))
    got = tdag.to_torch(prog)(x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)
    if dtype is torch.float32:  # onnxruntime's CPU kernels are float32 here
        got = _first(run_onnx(tdag.to_onnx(prog), x))
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [DType.f32, DType.f16, DType.bf16])
def test_literal_is_exact_and_in_range(dtype):
    """Every finite value of the dtype, as its shortest float32 decimal or exactly, prints as
    a literal torch reads back to the same value without an overflow."""
    info = torch.finfo(dtype.torch)
    values = torch.tensor([info.min, info.max, info.tiny, -info.tiny, 0.1, 1e-5, -0.0],
                          dtype=dtype.torch)
    for v in values:
        for approx in (v.item(), float(str(v.float().numpy()))):
            text = literal(approx, dtype)
            back = torch.full((), eval(text), dtype=dtype.torch)  # refuses an overflow
            assert torch.equal(back, v), (approx, text)
            assert text.startswith("-") == (str(v.item()).startswith("-"))
