"""to_onnx(..., runtime="onnxruntime"): onnxruntime's com.microsoft fused kernels where a
lowered kernel matches one, never by default; the outputs are onnxruntime's on the original.

The BERT files are the real-file corpus's (tests/support/real_files.py): torch.onnx's export
and onnxruntime's transformers optimizer's (EmbedLayerNormalization, Attention with
mask_index, SkipLayerNormalization, BiasGelu), and the latter after quantize_dynamic
(QAttention, QEmbedLayerNormalization).
"""
from __future__ import annotations

import collections
import contextlib

import numpy as np
import onnxruntime as ort
import pytest
import torch

import tdag
from tdag import ops

from support.real_files import bert, dynamic_quantized, quiet, transformers_optimised
from support.torch_models import Fn

FUSED = {"Attention", "Gelu"}
# slower on onnxruntime's CPU provider than the Sum and norm they replace: never written
SKIP_NORMS = {"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"}


def _session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _ops(model) -> collections.Counter:
    return collections.Counter((n.domain, n.op_type) for n in model.graph.node)


def _relative(got, want) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


@pytest.fixture(scope="module")
def bert_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    base = bert(folder)
    return [base, transformers_optimised(base, "bert", 2, 32)]


def test_bert_fused_only_when_asked_and_matches_the_original(bert_files):
    for file in bert_files:
        with quiet():
            prog = tdag.from_onnx(str(file.path))
        fused, plain = tdag.to_onnx(prog, runtime="onnxruntime"), tdag.to_onnx(prog)
        assert {op for domain, op in _ops(fused) if domain == "com.microsoft"} >= FUSED, \
            file.name
        assert not SKIP_NORMS & {op for _, op in _ops(fused)}, file.name
        assert not any(domain for domain, _ in _ops(plain)), file.name
        assert "com.microsoft" in {o.domain for o in fused.opset_import}
        assert "com.microsoft" not in {o.domain for o in plain.opset_import}
        original = _session(str(file.path))
        for feeds in file.feeds:  # two batch sizes and lengths, two padded keys per row
            want = original.run(None, feeds)[0]
            for model in (fused, plain):
                assert _relative(_session(model).run(None, feeds)[0], want) < 1e-4, file.name


def test_bert_prologue_becomes_embed_layer_normalization_with_lengths(bert_files):
    """The optimised file's EmbedLayerNormalization and mask_index are written back; rows
    with no key kept, or a mask value other than 0 and 1, still match the original (its
    lengths count ones; a length-0 row softmaxes scores shifted by -10000)."""
    file = bert_files[1]
    with quiet():
        prog = tdag.from_onnx(str(file.path))
    model = tdag.to_onnx(prog, runtime="onnxruntime")
    kinds = _ops(model)
    assert kinds["com.microsoft", "EmbedLayerNormalization"] == 1
    assert all(len(n.input) == 4 for n in model.graph.node if n.op_type == "Attention")
    assert not {"Equal", "ReduceSum", "Less", "Expand"} & {op for _, op in kinds}
    assert ("com.microsoft", "EmbedLayerNormalization") not in _ops(tdag.to_onnx(prog))
    feeds = dict(file.feeds[0])
    mask = feeds["attention_mask"].copy()
    mask[0], mask[1, 1] = 0, 2
    feeds["attention_mask"] = mask
    want = _session(str(file.path)).run(None, feeds)[0]
    assert _relative(_session(model).run(None, feeds)[0], want) < 1e-4


@pytest.fixture(scope="module")
def quantized_bert(bert_files):
    with contextlib.chdir(bert_files[1].path.parent):  # the quantizer writes <uuid>.data here
        file = dynamic_quantized(bert_files[1])
    assert not file.failed, file.failed
    return file


def test_quantized_bert_keeps_its_integer_attention_and_embedding(quantized_bert):
    """quantize_dynamic's QAttention (an integer q/k/v projection of the dynamically
    quantized input by int8 weights) and QEmbedLayerNormalization (int8 tables) are written
    back when asked, never by default; both match the original, a row with no key kept and
    a mask value of 2 included."""
    file = quantized_bert
    with quiet():
        prog = tdag.from_onnx(str(file.path))
    fused, plain = tdag.to_onnx(prog, runtime="onnxruntime"), tdag.to_onnx(prog)
    kinds = _ops(fused)
    assert kinds["com.microsoft", "QAttention"] == 2
    assert kinds["com.microsoft", "QEmbedLayerNormalization"] == 1
    assert not {"Attention", "EmbedLayerNormalization", "Gather"} & {op for _, op in kinds}
    assert not any(domain for domain, _ in _ops(plain))
    feeds = dict(file.feeds[0])
    mask = feeds["attention_mask"].copy()
    mask[0], mask[1, 1] = 0, 2
    feeds["attention_mask"] = mask
    original = _session(str(file.path))
    for feed in (*file.feeds, feeds):
        want = original.run(None, feed)[0]
        for model in (fused, plain):
            assert _relative(_session(model).run(None, feed)[0], want) < 1e-4


class Block(torch.nn.Module):
    """A BERT layer's attention: q, k, v projections split into heads, a residual,
    layer_norm and a tanh gelu; the [B, S] mask of keys to keep made additive (finfo.min
    where hidden, as transformers does) or passed as a bool mask."""

    def __init__(self, additive: bool):
        super().__init__()
        self.additive = additive
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x, keep):
        b, s, _ = x.shape
        mask = keep[:, None, None, :]
        if self.additive:
            mask = torch.where(mask, 0.0, torch.finfo(torch.float32).min)
        q, k, v = (p(x).reshape(b, s, 2, 4).transpose(1, 2) for p in self.qkv)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, mask)
        merged = att.transpose(1, 2).reshape(b, s, 8)
        return torch.nn.functional.gelu(self.norm(merged + x), approximate="tanh")


def _fused_kernels(additive: bool) -> set:
    """The com.microsoft kernels of Block re-emitted for onnxruntime, after checking its
    output against the module's on two batch sizes and lengths, the first row with no key
    to attend to."""
    torch.manual_seed(0)
    block = Block(additive).eval()
    b, s = torch.export.Dim("b", max=64), torch.export.Dim("s", max=64)
    prog = tdag.from_torch(block, (torch.randn(2, 5, 8), _keep(2, 5)),
                           dynamic_shapes=({0: b, 1: s}, {0: b, 1: s}))
    model = tdag.to_onnx(prog, runtime="onnxruntime")
    session = _session(model)
    for n, length in ((2, 5), (3, 7)):
        args = (torch.randn(n, length, 8), _keep(n, length))
        feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
        with torch.no_grad():
            want = block(*args).numpy()
        np.testing.assert_allclose(session.run(None, feeds)[0], want, rtol=1e-4, atol=1e-5)
    return {op for domain, op in _ops(model) if domain == "com.microsoft"}


def _keep(n: int, length: int) -> torch.Tensor:
    """Keys to attend to: all but the last two of each row, none in the first row."""
    keep = torch.ones(n, length, dtype=torch.bool)
    keep[:, -2:] = False
    keep[0] = False
    return keep


def test_finite_mask_goes_to_attention_with_packed_weights():
    fused = _fused_kernels(additive=True)
    assert fused >= {"Attention", "FastGelu"} and not SKIP_NORMS & fused


def test_a_mask_that_can_hide_every_key_keeps_the_standard_attention():
    """onnxruntime's Attention averages a row whose every key is masked; tdag (torch's safe
    softmax) gives zeros: a bool mask is not fused."""
    fused = _fused_kernels(additive=False)
    assert "Attention" not in fused and "FastGelu" in fused


def _rms(x, y, w):
    return ops.rms_norm(ops.add(x, y), (8,), w, eps=1e-6), ops.rms_norm(x, (8,), w, eps=1e-6)


def test_rms_norm_becomes_the_simplified_kernel_after_a_sum():
    spec = tdag.TensorSpec
    prog = tdag.trace(_rms, spec(("b", 3, 8)), spec(("b", 3, 8)), spec((8,)))
    args = (torch.randn(2, 3, 8), torch.randn(2, 3, 8), torch.rand(8) + 0.5)
    want = tdag.run(prog, *args)
    model = tdag.to_onnx(prog, runtime="onnxruntime")
    ops_ = _ops(model)
    assert ops_[("", "SimplifiedLayerNormalization")] == 2 and not SKIP_NORMS & {
        op for _, op in ops_}
    session = _session(model)
    got = session.run(None, {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5)
    assert not any(domain for domain, _ in _ops(tdag.to_onnx(prog)))


def _inverse_session(n: int, batch: int = 2, dtype=torch.float32):
    a = torch.randn(batch, n, n, dtype=dtype)
    prog = tdag.from_torch(Fn(torch.linalg.inv), (a,))
    model = tdag.to_onnx(prog, runtime="onnxruntime")
    assert _ops(model)[("com.microsoft", "Inverse")] == 1
    return _session(model)


@pytest.mark.parametrize("n,dtype", [(8, torch.float32), (96, torch.float32),
                                     (5, torch.float64)])
def test_inverse_is_one_kernel_at_any_size(n, dtype):
    """Standard ONNX unrolls the LU (refused past n = 64); onnxruntime's Inverse takes any
    n, within float32 rounding of torch's on well-conditioned matrices."""
    session = _inverse_session(n, dtype=dtype)
    a = torch.randn(2, n, n, dtype=dtype) + n * torch.eye(n, dtype=dtype)
    got = session.run(None, {session.get_inputs()[0].name: a.numpy()})[0]
    np.testing.assert_allclose(got, torch.linalg.inv(a).numpy(), rtol=1e-5, atol=1e-6)


def test_inverse_of_a_singular_matrix_fails_as_torch_raises():
    session = _inverse_session(4)
    a = torch.randn(2, 4, 4)
    a[1, 3] = 2 * a[1, 2]  # rank 3: an exactly zero pivot
    with pytest.raises(Exception, match="ConstantOfShape"):
        session.run(None, {session.get_inputs()[0].name: a.numpy()})
    nan = torch.full((2, 4, 4), float("nan"))  # NaN in, NaN out: torch does not raise
    got = session.run(None, {session.get_inputs()[0].name: nan.numpy()})[0]
    assert np.isnan(got).all()


def test_unknown_runtime_is_refused():
    prog = tdag.trace(lambda x: ops.exp(x), tdag.TensorSpec((2,)))
    with pytest.raises(ValueError, match="runtime"):
        tdag.to_onnx(prog, runtime="tensorrt")
