"""The float part of issue 20's real-file corpus (tests/support/real_files.py), checked as
benchmarks/real_files.py measures it: each file imports, and tdag.run, the file tdag.to_onnx
writes and the module tdag.to_torch makes compute what onnxruntime computes on the original,
within 1e-4 of the output's scale, on every feed (decoders at two past lengths). The files:
a GPT-2 step with its KV cache (torch.onnx, legacy exporter) and onnxslim's rewrite of it, a
BERT and onnxslim's, onnxruntime's session-optimised (FusedMatMul, BiasGelu) and
transformers-optimised (Attention, EmbedLayerNormalization, SkipLayerNormalization) ones, a
ResNet and its session-optimised one (FusedConv), and scikit-learn models through skl2onnx
(ZipMap written back). The quantized files are compared with onnxruntime and timed by the
benchmark; here the statically quantized ResNets' modules compute what tdag.run computes.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("onnxslim")
pytest.importorskip("skl2onnx")
pytest.importorskip("transformers")

from real_files import FLOAT_BOUND, check  # noqa: E402  (benchmarks/, on the path)
from support import real_files as corpus  # noqa: E402

import tdag  # noqa: E402
from support.guards import assert_close  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    gpt2 = corpus.decoder(folder, "gpt2", corpus.gpt2, 2, 16)
    bert, resnet = corpus.bert(folder), corpus.resnet(folder)
    made = [gpt2, corpus.slimmed(gpt2), bert, corpus.slimmed(bert),
            corpus.session_optimised(bert), corpus.transformers_optimised(bert, "bert", 2, 32),
            resnet, corpus.session_optimised(resnet), *corpus.sklearn_files(folder)]
    return {f.name: f for f in made}


NAMES = ["gpt2", "gpt2+onnxslim", "bert", "bert+onnxslim", "bert+ort-extended",
         "bert+ort-transformers", "resnet", "resnet+ort-extended",
         "sklearn-LogisticRegression", "sklearn-RandomForestClassifier",
         "sklearn-GradientBoostingRegressor", "sklearn-Pipeline-scaler-SVC"]


@pytest.mark.parametrize("name", NAMES)
def test_a_real_file_imports_and_matches_onnxruntime(files, name):
    row = check(files[name])
    assert "import_error" not in row, row["import_error"]
    assert row["run_error"] <= FLOAT_BOUND, ("tdag.run", row["run_error"])
    assert row["onnx_error"] <= FLOAT_BOUND, ("tdag.to_onnx", row["onnx_error"])
    assert row["torch_error"] <= FLOAT_BOUND, ("tdag.to_torch", row["torch_error"])


def test_an_onnxruntime_only_file_re_emits_as_standard_onnx_too(files):
    """The benchmark sets a file holding com.microsoft ops (onnxruntime's transformers
    optimizer's) beside to_onnx's file for onnxruntime; the standard file computes the same."""
    name = "bert+ort-transformers"
    assert check(files[name])["emit"] == "ort"
    row = check(files[name], runtime="standard")
    assert row["emit"] == "std" and row["onnx_error"] <= FLOAT_BOUND, row["onnx_error"]


@pytest.mark.parametrize("fmt", ["QDQ", "QOperator"])
def test_a_statically_quantized_resnets_module_computes_what_run_computes(files, fmt):
    """onnxruntime's quantize_static: QDQ pairs around float ops, or QLinearConv,
    QLinearAdd and an int8 MaxPool (which torch's channels-last pooling refuses)."""
    file = corpus.static_quantized(files["resnet"], fmt)
    assert not file.failed, file.failed
    prog = tdag.from_onnx(str(file.path))
    args = [torch.from_numpy(a) for a in file.feeds[0].values()]
    with torch.no_grad():
        assert_close(tdag.to_torch(prog)(*args), tdag.run(prog, *args), fmt)


@pytest.mark.parametrize("name", ["gpt2", "gpt2+onnxslim", "bert+ort-transformers", "resnet"])
def test_a_real_files_module_differentiates_with_finite_gradients(files, name):
    """With autograd on, the module computes what it computes without, and every parameter's
    gradient (the file's initializers, exponents and scales included) is finite: onnxslim's
    GELU cube once had the gradient x^3 log(x) of an exponent held as a weight."""
    file = files[name]
    module = tdag.to_torch(tdag.from_onnx(str(file.path)))
    args = [torch.from_numpy(a) for a in file.feeds[0].values()]
    with torch.no_grad():
        want = torch.utils._pytree.tree_leaves(module(*args))
    got = torch.utils._pytree.tree_leaves(module(*args))
    for g, w in zip(got, want):
        assert_close(g.detach(), w, name)
    sum(g.float().sum() for g in got if g.requires_grad).backward()
    grads = {n: p.grad for n, p in module.named_parameters() if p.grad is not None}
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads.values()), \
        [n for n, g in grads.items() if not torch.isfinite(g).all()]
