"""Files torch.onnx.export writes for transformers models, as users make them: decoders with
their KV cache as inputs and outputs (``past_key_values.*`` -> ``present.*``, the past length
a named dynamic axis), T5's relative position bias, and a ResNet whose input is declared
``[batch_size, num_channels, height, width]`` (the Conv's weight fixes num_channels to 3).

Each model is built from a tiny random config (nothing downloaded), exported into tmp_path,
imported with ``tdag.from_onnx(path)``, and run at two past lengths or batch sizes through
tdag.run and through ``tdag.to_onnx`` on onnxruntime, against onnxruntime on the original
file (float tolerance 1e-4 of the output's scale, support.guards.assert_close).

The legacy exporter (``dynamo=False`` with ``dynamic_axes``) makes the default cases, a few
seconds each. The dynamo exporter (``dynamo=True`` with named ``torch.export.Dim``s) works
here on the cached Llama step but takes ~10 s (three times the legacy one), so it is marked
slow. It refuses a dynamic channel axis (the trace fixes it at 3), so the ResNet case is the
legacy exporter's only; and with ``Dim.DYNAMIC`` per input it names the key's and the
value's past lengths apart, which no import can join (the file does not say they are equal).
"""
from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
import transformers

import tdag

from support.cached_decoders import CachedStep
from support.guards import assert_close

LAYERS = 2


def _gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=LAYERS, n_head=2, n_embd=32, vocab_size=100, n_positions=64, bos_token_id=0,
        eos_token_id=1))


def _llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


DECODERS = {"gpt2": (_gpt2, 2, 16), "llama": (_llama, 2, 8)}  # make, kv heads, head size
PAST_NAMES = [f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
PRESENT_NAMES = [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]


def _export(module, args, path, inputs, outputs, dynamo=False, **axes) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          opset_version=18 if dynamo else 17, dynamo=dynamo, **axes)


def _decoder_file(tmp_path, name: str, dynamo: bool = False):
    make, heads, size = DECODERS[name]
    torch.manual_seed(0)
    step = CachedStep(make().eval())
    batch, seq, past = 2, 3, 4
    args = (torch.randint(0, 100, (batch, seq)), torch.ones(batch, past + seq, dtype=torch.long),
            *[torch.randn(batch, heads, past, size) for _ in PAST_NAMES])
    path = tmp_path / f"{name}.onnx"
    if dynamo:  # one named Dim per size, so the key's and value's past lengths are one
        b, s, p, t = (torch.export.Dim(n, min=1, max=64) for n in (
            "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"))
        shapes = ({0: b, 1: s}, {0: b, 1: t}, tuple({0: b, 2: p} for _ in PAST_NAMES))
        _export(step, args, path, ["input_ids", "attention_mask", *PAST_NAMES],
                ["logits", *PRESENT_NAMES], dynamo=True, dynamic_shapes=shapes)
    else:
        axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
                "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                "logits": {0: "batch_size", 1: "sequence_length"},
                **{n: {0: "batch_size", 2: "past_sequence_length"} for n in PAST_NAMES},
                **{n: {0: "batch_size", 2: "total_sequence_length"} for n in PRESENT_NAMES}}
        _export(step, args, path, ["input_ids", "attention_mask", *PAST_NAMES],
                ["logits", *PRESENT_NAMES], dynamic_axes=axes)
    rng = np.random.default_rng(1)
    feeds = []
    for batch, seq, past in ((2, 3, 4), (3, 1, 9)):  # a prefill-like and a one-token step
        feeds.append([rng.integers(0, 100, (batch, seq)),
                      np.ones((batch, past + seq), np.int64),
                      *[rng.standard_normal((batch, heads, past, size), np.float32)
                        for _ in PAST_NAMES]])
    return path, feeds


def _matches_onnxruntime(path, feeds: list) -> tdag.Program:
    """tdag.run and the re-emitted model on onnxruntime, against onnxruntime on the file."""
    original = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    prog = tdag.from_onnx(str(path))
    emitted = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in original.get_inputs()]
    assert [i.name for i in emitted.get_inputs()] == names
    for arrays in feeds:
        arrays = [np.asarray(a, np.int64) if a.dtype.kind == "i" else a for a in arrays]
        ref = [torch.from_numpy(r) for r in original.run(None, dict(zip(names, arrays)))]
        got = tdag.run(prog, *[torch.from_numpy(a) for a in arrays])
        assert_close(got, ref, f"tdag.run on {path.name}")
        again = [torch.from_numpy(r) for r in emitted.run(None, dict(zip(names, arrays)))]
        assert_close(again, ref, f"to_onnx of {path.name}")
    return prog


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_decoder_with_its_kv_cache_runs_at_any_past_length(tmp_path, name):
    """``Range(past, past + seq)`` over the symbolic past length (issue 20's TypeError)."""
    path, feeds = _decoder_file(tmp_path, name)
    prog = _matches_onnxruntime(path, feeds)
    first, last = prog.input_types[2], prog.input_types[-1]  # past_key_values.0.key, 1.value
    # a size two inputs share stays one symbol
    assert str(first.shape[2]) == str(last.shape[2]) == "past_sequence_length"
    assert str(first.shape[0]) == str(prog.input_types[0].shape[0]) == "batch_size"


@pytest.mark.slow
def test_the_dynamo_exporters_cached_llama_step(tmp_path):
    path, feeds = _decoder_file(tmp_path, "llama", dynamo=True)
    _matches_onnxruntime(path, feeds)


def test_t5_with_its_relative_position_bias(tmp_path):
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=LAYERS,
        num_decoder_layers=LAYERS, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, decoder_start_token_id=0)).eval()

    class Logits(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids, mask, decoder_ids):
            return self.model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                              use_cache=False).logits

    path = tmp_path / "t5.onnx"
    enc, dec = {0: "batch_size", 1: "encoder_sequence_length"}, \
        {0: "batch_size", 1: "decoder_sequence_length"}
    _export(Logits(), (torch.randint(0, 100, (2, 5)), torch.ones(2, 5, dtype=torch.long),
                       torch.randint(0, 100, (2, 3))), path,
            ["input_ids", "attention_mask", "decoder_input_ids"], ["logits"],
            dynamic_axes={"input_ids": enc, "attention_mask": enc, "decoder_input_ids": dec,
                          "logits": dec})
    rng = np.random.default_rng(2)
    feeds = [[rng.integers(0, 100, (b, e)), np.ones((b, e), np.int64),
              rng.integers(0, 100, (b, d))] for b, e, d in ((2, 5, 3), (3, 9, 1))]
    _matches_onnxruntime(path, feeds)


def test_a_resnet_whose_input_names_its_channels(tmp_path):
    """``[batch_size, num_channels, height, width]``: the stem Conv's weight pins
    num_channels to 3; the other names stay symbols."""
    torch.manual_seed(0)
    model = transformers.ResNetModel(transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
        layer_type="basic")).eval()

    class Pooled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, pixel_values):
            return self.model(pixel_values=pixel_values).pooler_output

    path = tmp_path / "resnet.onnx"
    _export(Pooled(), (torch.randn(2, 3, 32, 32),), path, ["pixel_values"], ["pooled"],
            dynamic_axes={"pixel_values": {0: "batch_size", 1: "num_channels", 2: "height",
                                           3: "width"}, "pooled": {0: "batch_size"}})
    rng = np.random.default_rng(3)
    feeds = [[rng.standard_normal((b, 3, h, w), np.float32)] for b, h, w in ((2, 32, 32),
                                                                            (3, 40, 24))]
    prog = _matches_onnxruntime(path, feeds)
    assert str(prog.input_types[0]) == "f32[batch_size,3,height,width]"


def test_a_vit_with_dynamic_height_and_width(tmp_path):
    """Dynamic height and width make the patch count ``floor(h/8)*floor(w/8) + 1``, added to a
    position table of 17 rows: ONNX broadcasts at run time, so any image of 16 patches runs
    (32x32, 16x64) and any other is refused, as onnxruntime refuses it, never answered."""
    torch.manual_seed(0)
    model = transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=4, intermediate_size=64,
        image_size=32, patch_size=8, num_channels=3), add_pooling_layer=False).eval()
    path = tmp_path / "vit.onnx"
    _export(model, (torch.randn(1, 3, 32, 32),), path, ["pixel_values"], ["last_hidden_state"],
            dynamic_axes={"pixel_values": {0: "batch_size", 2: "height", 3: "width"}})
    rng = np.random.default_rng(4)
    feeds = [[rng.standard_normal(shape, np.float32)] for shape in ((2, 3, 32, 32),
                                                                   (1, 3, 16, 64),
                                                                   (1, 3, 39, 33))]
    prog = _matches_onnxruntime(path, feeds)
    assert str(prog.input_types[0]) == "f32[batch_size,3,height,width]"
    with pytest.raises(tdag.TdagError):
        tdag.run(prog, torch.randn(1, 3, 32, 64))  # 32 patches against 16 positions
