"""to_onnx writes the forms onnxruntime fuses or runs as one kernel (issue 25): a clamp as
one Clip, which onnxruntime fuses into the Conv before it (FusedConv), where Max then Min
cost two more passes; an einsum of head-split operands (attention's scores and context on
[B, S, N, H]) as Transposes around one MatMul, which onnxruntime folds into FusedMatMul,
where its Einsum permutes both operands on every call. Each file passes ONNX's full checker
(``run_onnx``) and matches eager within 1e-5 relative, nan where eager has nan."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tdag
import tdag.lower
from support.guards import run_onnx
from support.targets import capture
from support.torch_models import Fn


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _optimised_ops(model: onnx.ModelProto, path) -> collections.Counter:
    """The op types of ``model`` after onnxruntime's optimiser (extended: no layout change)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return _ops(onnx.load(str(path)))


def _assert_close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5) -> None:
    scale = want[torch.isfinite(want)].abs().max().item()
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * scale, equal_nan=True)


# ReLU6 (MobileNet's), hardtanh, and clamps open on one side
CLAMPS = {"relu6": nn.ReLU6(), "hardtanh": nn.Hardtanh(-0.5, 0.25),
          "min_only": lambda x: x.clamp(min=-0.1), "max_only": lambda x: x.clamp(max=0.2)}


@pytest.mark.parametrize("name", CLAMPS)
def test_clamp_after_a_conv_is_one_clip_that_onnxruntime_fuses(name, tmp_path):
    torch.manual_seed(0)
    conv, clamp = nn.Conv2d(3, 8, 3, padding=1), CLAMPS[name]
    model = nn.Sequential(conv, clamp if isinstance(clamp, nn.Module) else Fn(clamp))
    x = torch.randn(2, 3, 10, 10)
    x[0, 1, 4, 4] = float("nan")  # torch.clamp keeps nan; so do onnxruntime's Clip and Conv
    with torch.no_grad():
        want = model.eval()(x)
    onnx_model = tdag.to_onnx(capture(model, (x,)))
    assert _ops(onnx_model)["Clip"] == 1 and not {"Max", "Min"} & set(_ops(onnx_model))
    assert want.isnan().any()
    _assert_close(run_onnx(onnx_model, x), want)
    fused = _optimised_ops(onnx_model, tmp_path / "opt.onnx")
    assert fused["FusedConv"] == 1 and "Clip" not in fused, fused


@pytest.mark.parametrize("name", CLAMPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_clamp_keeps_nan_and_the_open_sides_infinities(name, dtype):
    """A bound Clip is not given is the type's largest finite value in onnxruntime: the open
    side is written as an infinity, so clamp(inf, min=lo) stays inf, as in torch."""
    fn = CLAMPS[name]
    x = torch.tensor([[float("nan"), float("inf"), -float("inf"), -2.5, 0.1, 3.0, -0.0]],
                     dtype=dtype)
    onnx_model = tdag.to_onnx(capture(fn, (x,)))
    assert _ops(onnx_model)["Clip"] == 1
    torch.testing.assert_close(run_onnx(onnx_model, x), fn(x), rtol=0, atol=0, equal_nan=True)


# two operands, each with one row or column label and one summed label between them
HEADS = {"scores": ("bqnh,bknh->bnqk", (2, 5, 3, 4), (2, 7, 3, 4)),  # BERT's q k^T on [B, S, N, H]
         "context": ("bnqk,bknh->bqnh", (2, 3, 5, 7), (2, 7, 3, 4)),  # probs v back to [B, S, N, H]
         "batched_rows_last": ("bhq,bkh->bkq", (2, 4, 5), (2, 6, 4))}


@pytest.mark.parametrize("name", HEADS)
def test_einsum_of_head_split_operands_is_a_matmul(name, tmp_path):
    equation, a_shape, b_shape = HEADS[name]
    torch.manual_seed(0)
    a, b = torch.randn(a_shape), torch.randn(b_shape)
    fn = lambda a, b: torch.einsum(equation, a, b)  # noqa: E731
    onnx_model = tdag.to_onnx(capture(fn, (a, b)))
    assert "Einsum" not in _ops(onnx_model) and _ops(onnx_model)["MatMul"] == 1
    _assert_close(run_onnx(onnx_model, a, b), fn(a, b))
    assert "Einsum" not in _optimised_ops(onnx_model, tmp_path / "opt.onnx")


def test_einsum_summing_two_labels_still_matches():
    """Two summed labels (and an axis summed in one operand) leave the one-MatMul form: the
    file writes whatever holds them (an Einsum, or a reshaped MatMul), equal to eager."""
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, 5, 2), torch.randn(4, 5, 6)
    fn = lambda a, b: torch.einsum("pqrs,qrt->pt", a, b)  # noqa: E731
    got = run_onnx(tdag.to_onnx(capture(fn, (a, b))), a, b)
    _assert_close(got, fn(a, b))
    assert np.isfinite(got.numpy()).all()


class PositionMasked(nn.Module):
    """Attention under a mask made from positions in forward (transformers' causal mask,
    finfo.min where hidden); ``dead_row`` hides every key from the first query (-inf)."""

    def __init__(self, dead_row: bool):
        super().__init__()
        self.dead_row = dead_row

    def forward(self, q, k, v):
        rows, cols = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])
        keep = cols <= rows
        mask = torch.where(keep, 0.0, torch.finfo(q.dtype).min)
        if self.dead_row:
            mask = torch.where(rows == 0, float("-inf"), mask)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("dead_row", [False, True])
def test_a_constant_mask_that_keeps_a_key_everywhere_needs_no_dead_row_test(dead_row):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 6, 8) for _ in range(3))
    model = PositionMasked(dead_row)
    prog = capture(model, (q, k, v))
    assert any(n.op.value == "attention" for n in tdag.lower.lower(prog).graph.nodes)
    onnx_model = tdag.to_onnx(prog)
    # the safe softmax's test for rows with no key: Equal(ReduceMax(mask), -inf)
    assert ("Equal" in _ops(onnx_model)) == dead_row
    with torch.no_grad():
        want = model(q, k, v)
    assert not want.isnan().any()  # torch's safe softmax: a row with no key gives zeros
    _assert_close(run_onnx(onnx_model, q, k, v), want)


def test_weights_a_program_only_reads_are_initializers_not_inputs():
    """onnxruntime folds and pre-packs an initializer only when no input may override it:
    parameters and buffers that the program never writes (eval-mode BatchNorm's running
    statistics) stay plain initializers."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(64, 2))
    x = torch.randn(2, 3, 6, 6)
    onnx_model = tdag.to_onnx(capture(model.eval(), (x,)))
    assert [i.name for i in onnx_model.graph.input] == ["args_0"]
    assert onnx_model.graph.initializer
    with torch.no_grad():
        _assert_close(run_onnx(onnx_model, x), model(x))


# rms_norm over the last axis or two, with and without a weight (Llama's and T5's norms)
RMS = {"weighted": ((2, 5, 8), (8,), True), "plain": ((2, 5, 8), (8,), False),
       "two_axes": ((2, 5, 4, 6), (4, 6), True)}


@pytest.mark.parametrize("name", RMS)
def test_rms_norm_is_one_rms_normalization(name):
    """By default a program with an rms_norm is written at opset 23, whose RMSNormalization
    is one pass over the rows where the chain earlier opsets need (Mul, ReduceMean, Add,
    Sqrt, Reciprocal, Mul) is six; asked for opset 20, the file keeps the chain."""
    shape, normalized, weighted = RMS[name]
    torch.manual_seed(0)
    x, w = torch.randn(shape) * 3, torch.rand(normalized) + 0.5
    fn = lambda x, w: F.rms_norm(x, normalized, w if weighted else None, eps=1e-6)  # noqa: E731
    prog = capture(fn, (x, w))
    one, chain = tdag.to_onnx(prog), tdag.to_onnx(prog, opset=20)
    assert one.opset_import[0].version == 23 and _ops(one)["RMSNormalization"] == 1
    assert "RMSNormalization" not in _ops(chain) and _ops(chain)["ReduceMean"] == 1
    for model in (one, chain):
        _assert_close(run_onnx(model, x, w), fn(x, w))


def test_rms_norm_in_float64_keeps_the_chain():
    """RMSNormalization computes in float32 (its stash_type): a float64 norm stays the chain,
    exact in float64."""
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    fn = lambda x: F.rms_norm(x, (8,), eps=1e-6)  # noqa: E731
    model = tdag.to_onnx(capture(fn, (x,)))
    assert "RMSNormalization" not in _ops(model)
    _assert_close(run_onnx(model, x), fn(x), rtol=1e-12)
