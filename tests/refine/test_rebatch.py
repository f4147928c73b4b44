"""Re-batching files: a model exported to ONNX at batch 1 by the legacy exporter (every
Reshape's shape baked in) gets a symbolic batch from ``add_batch(strip_batch(prog))``, runs at
any batch size through the interpreter, torch and onnxruntime, and re-emits a dynamic axis."""
from __future__ import annotations

import warnings

import onnx
import pytest
import torch
import transformers as T

import tdag
from tdag.cli import main

from support.guards import run_onnx
from support.hf_encoders import LastHidden, tokens, whisper_encoder


def _images(size):
    return lambda b: (torch.randn(b, 3, size, size),)


# tiny configs, random weights, nothing downloaded: (module, batch -> example args)
ENCODERS = {
    "resnet": lambda: (T.ResNetModel(T.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic")),
        _images(32)),
    "vit": lambda: (T.ViTModel(T.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=16, patch_size=8), add_pooling_layer=False), _images(16)),
    # weights of std 0.3: at the default 0.02 the output is ~1e-27, which any answer matches
    "mobilenet_v2": lambda: (T.MobileNetV2Model(T.MobileNetV2Config(
        image_size=32, depth_multiplier=0.25, initializer_range=0.3, finegrained_output=False)),
        _images(32)),
    "convnext": lambda: (T.ConvNextModel(T.ConvNextConfig(
        hidden_sizes=[8, 16], depths=[1, 1], num_stages=2)), _images(32)),
    "t5_encoder": lambda: (T.T5EncoderModel(T.T5Config(
        vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2)), tokens),
    "whisper_encoder": whisper_encoder,
}


def encoder(name: str):
    torch.manual_seed(0)
    module, args = ENCODERS[name]()
    return LastHidden(module.eval()).eval(), args


def export_batch_1(module, args, path) -> str:
    """torch.onnx's legacy exporter at batch 1: every shape is a constant."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args(1), str(path), dynamo=False)
    return str(path)


def check_outputs(got, expected, atol=1e-4):
    # against eager, 1e-4: the exported file itself is that far (MobileNet's batch norms
    # folded into its convolutions: 3e-5 on onnxruntime at batch 1, before any re-batching)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=atol)


def per_sample(prog, example):
    """The batch-1 program run on each sample, stacked."""
    return torch.cat([tdag.run(prog, *(a[i:i + 1] for a in example))
                      for i in range(example[0].shape[0])])


@pytest.mark.parametrize("name", ENCODERS)
def test_a_batch_1_onnx_file_rebatched_runs_at_any_batch(name, tmp_path):
    module, args = encoder(name)
    prog = tdag.from_onnx(export_batch_1(module, args, tmp_path / f"{name}.onnx"))
    assert prog.input_types[0].shape[0] == 1
    rebatched = tdag.add_batch(tdag.strip_batch(prog), "batch")
    tdag.verify(rebatched)
    assert str(rebatched.input_types[0].shape[0]) == "batch"
    reified = tdag.to_torch(rebatched)
    emitted = tdag.to_onnx(rebatched)
    dim = emitted.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param == "batch" and not dim.HasField("dim_value")
    for b in (3, 7):
        example = args(b)
        with torch.no_grad():
            expected = module(*example)
            check_outputs(tdag.run(rebatched, *example), per_sample(prog, example), atol=1e-5)
            check_outputs(tdag.run(rebatched, *example), expected)
            check_outputs(reified(*example), expected)
        check_outputs(run_onnx(emitted, *example), expected)


def test_rebatch_on_the_command_line(tmp_path, capsys):
    module, args = encoder("vit")
    path = export_batch_1(module, args, tmp_path / "vit.onnx")
    out = tmp_path / "dynamic.onnx"
    assert main(["rebatch", path, "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    model = onnx.load(str(out))
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    example = args(5)
    with torch.no_grad():
        check_outputs(run_onnx(model, *example), module(*example))


def test_rebatch_of_a_file_that_mixes_samples_is_one_line(tmp_path, capsys):
    # a sum over the batch axis has no per-sample form
    path = tmp_path / "mix.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(SumOverBatch(), (torch.randn(1, 4),), str(path), dynamo=False)
    assert main(["rebatch", str(path), "-o", str(tmp_path / "out.onnx")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tdag: error:")
    assert "mixes samples" in err[0] and "reduces over the batch axis" in err[0]


class SumOverBatch(torch.nn.Module):
    def forward(self, x):
        return x - x.sum(0, keepdim=True)
