"""The real-file corpus of issue 20: ONNX files written by the tools people use, each from a
tiny model with random weights (nothing downloaded), built into a folder on demand.

A group builds one model's file with torch.onnx.export (the legacy exporter with dynamic
axes, decoders with their KV cache as ``past_key_values.*`` -> ``present.*``; the dynamo
exporter for a Llama step) and the files other tools derive from it: onnxslim,
onnxruntime's transformers optimizer, a session's own graph optimisation saved with
``SessionOptions.optimized_model_filepath`` (ORT_ENABLE_EXTENDED), ``quantize_dynamic``,
``quantize_static`` (QDQ and QOperator), the MatMulNBits (int4) quantizer; scikit-learn models
go through skl2onnx (ZipMap included). Each file carries its feeds (numpy arrays by input
name; decoders at two past lengths) and whether it is quantized.

benchmarks/real_files.py measures every file (import, errors, re-emitted/original time);
tests/canonicalize/onnx/test_corpus.py checks the quick float ones.
"""
from __future__ import annotations

import contextlib
import io
import logging
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

LAYERS = 2


@dataclass(frozen=True)
class File:
    """One file of the corpus: what made it, where it is and what it runs on."""

    name: str
    tool: str
    path: Path
    feeds: tuple  # tuple[dict[str, np.ndarray], ...]
    quantized: bool = False
    failed: str = ""  # why the tool could not write it (then there is no file)


@contextlib.contextmanager
def quiet():
    """The exporters' and quantizers' warnings and chatter off."""
    level = logging.root.level
    logging.disable(logging.WARNING)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)
            logging.root.setLevel(level)


def _export(module, args, path: Path, inputs, outputs, axes=None, shapes=None) -> None:
    """torch.onnx.export: legacy with ``axes`` (dynamic_axes), dynamo with ``shapes``."""
    dynamo = shapes is not None
    with torch.no_grad(), quiet():
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs,
                          opset_version=18 if dynamo else 17, dynamo=dynamo,
                          dynamic_axes=axes, dynamic_shapes=shapes)


# -- derived files --------------------------------------------------------------------------------

def derive(base: File, tool: str, make, quantized: bool = False) -> File:
    """``make(src, dst)`` writes a file from ``base``'s; it keeps base's feeds."""
    path = base.path.with_name(f"{base.path.stem}.{tool}.onnx")
    failed = ""
    try:
        # in the file's folder: onnxruntime's quantization pre-processing leaves a
        # <uuid>.data in the working directory
        with quiet(), contextlib.chdir(path.parent):
            make(str(base.path), str(path))
    except Exception as exc:  # noqa: BLE001  (a tool's own failure is reported, not ours)
        failed = f"{type(exc).__name__}: {exc}"[:160]
    return replace(base, name=f"{base.name}+{tool}", tool=tool, path=path, quantized=quantized,
                   failed=failed)


def slimmed(base: File) -> File:
    import onnxslim
    return derive(base, "onnxslim", lambda src, dst: onnx.save(onnxslim.slim(src), dst))


def session_optimised(base: File) -> File:
    """What onnxruntime itself runs: its graph optimisation at ORT_ENABLE_EXTENDED (the
    com.microsoft fusions), saved (``SessionOptions.optimized_model_filepath``)."""
    def make(src, dst):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = dst
        ort.InferenceSession(src, options, providers=["CPUExecutionProvider"])
    return derive(base, "ort-extended", make)


def transformers_optimised(base: File, model_type: str, heads: int, hidden: int) -> File:
    from onnxruntime.transformers.optimizer import optimize_model

    def make(src, dst):
        optimize_model(src, model_type=model_type, num_heads=heads, hidden_size=hidden,
                       opt_level=0).save_model_to_file(dst)
    return derive(base, "ort-transformers", make)


def dynamic_quantized(base: File) -> File:
    """quantize_dynamic to int8 weights, after onnxruntime's pre-processing where its
    symbolic shape inference succeeds (without it, the quantizer cannot type the values of a
    file its transformers optimizer fused; with it, it fails on the plain BERT)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    def make(src, dst):
        try:
            quant_pre_process(src, dst, skip_optimization=True)
            src = dst
        except Exception:  # noqa: BLE001  ("Incomplete symbolic shape inference")
            pass
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8)
    return derive(base, "quantize_dynamic", make, quantized=True)


def static_quantized(base: File, fmt: str) -> File:
    """quantize_static in ``fmt`` (QDQ or QOperator), calibrated on the file's feeds."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Feeds(CalibrationDataReader):
        def __init__(self):
            self.rest = iter(base.feeds)

        def get_next(self):
            return next(self.rest, None)

    from onnxruntime.quantization.shape_inference import quant_pre_process

    def make(src, dst):  # the pre-processing onnxruntime's documentation asks for
        quant_pre_process(src, dst)
        quantize_static(dst, dst, Feeds(), quant_format=getattr(QuantFormat, fmt))
    return derive(base, f"quantize_static-{fmt}", make, quantized=True)


def nbits_quantized(base: File) -> File:
    """MatMulNBits: int4 weights in blocks of 16 (the model builder's and genai's kernel)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    def make(src, dst):
        quantizer = MatMulNBitsQuantizer(onnx.load(src), bits=4, block_size=16,
                                         is_symmetric=True)
        quantizer.process()
        quantizer.model.save_model_to_file(dst)
    return derive(base, "matmulnbits", make, quantized=True)


# -- torch models -----------------------------------------------------------------------------

class Field(torch.nn.Module):
    """A transformers model with one tensor out: the named field of its output."""

    def __init__(self, model, field: str):
        super().__init__()
        self.model, self.field = model, field

    def forward(self, *args):
        return getattr(self.model(*args), self.field)


PAST = [f"past_key_values.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]
PRESENT = [f"present.{i}.{kv}" for i in range(LAYERS) for kv in ("key", "value")]


def _decoder_feeds(heads: int, size: int, seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    return tuple({"input_ids": rng.integers(0, 100, (b, s)),
                  "attention_mask": np.ones((b, p + s), np.int64),
                  **{n: rng.standard_normal((b, heads, p, size), np.float32) for n in PAST}}
                 for b, s, p in ((2, 3, 4), (3, 1, 9)))


def decoder(folder: Path, name: str, make, heads: int, size: int, dynamo=False) -> File:
    """A decoder step with its KV cache, exported with dynamic batch and lengths."""
    torch.manual_seed(0)
    from support.cached_decoders import CachedStep  # transformers: only where a decoder is made

    step = CachedStep(make().eval())
    args = (torch.randint(0, 100, (2, 3)), torch.ones(2, 7, dtype=torch.long),
            *[torch.randn(2, heads, 4, size) for _ in PAST])
    path = folder / f"{name}{'-dynamo' if dynamo else ''}.onnx"
    if dynamo:  # one named Dim per size, so the key's and value's past lengths are one
        b, s, p, t = (torch.export.Dim(n, min=1, max=64) for n in (
            "batch_size", "sequence_length", "past_sequence_length", "total_sequence_length"))
        shapes = ({0: b, 1: s}, {0: b, 1: t}, tuple({0: b, 2: p} for _ in PAST))
        _export(step, args, path, ["input_ids", "attention_mask", *PAST], ["logits", *PRESENT],
                shapes=shapes)
    else:
        axes = {"input_ids": {0: "batch_size", 1: "sequence_length"},
                "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
                "logits": {0: "batch_size", 1: "sequence_length"},
                **{n: {0: "batch_size", 2: "past_sequence_length"} for n in PAST},
                **{n: {0: "batch_size", 2: "total_sequence_length"} for n in PRESENT}}
        _export(step, args, path, ["input_ids", "attention_mask", *PAST], ["logits", *PRESENT],
                axes=axes)
    tool = "torch.onnx dynamo" if dynamo else "torch.onnx legacy"
    return File(path.stem, tool, path, _decoder_feeds(heads, size, 1))


def gpt2():
    import transformers
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=LAYERS, n_head=2, n_embd=32, vocab_size=100, n_positions=64))


def llama():
    import transformers
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def bert(folder: Path) -> File:
    import transformers
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=LAYERS, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32,
        attn_implementation="eager")).eval()  # the attention onnxruntime's optimizer fuses
    path = folder / "bert.onnx"
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch_size", 1: "sequence_length"} for n in names}
    _export(Field(model, "last_hidden_state"), (torch.randint(0, 100, (2, 8)),
                                                torch.ones(2, 8, dtype=torch.long),
                                                torch.zeros(2, 8, dtype=torch.long)),
            path, names, ["last_hidden_state"],
            axes={**axes, "last_hidden_state": {0: "batch_size", 1: "sequence_length"}})
    rng = np.random.default_rng(2)
    feeds = tuple({"input_ids": rng.integers(0, 100, (b, s)),
                   "attention_mask": np.concatenate([np.ones((b, s - 2), np.int64),
                                                     np.zeros((b, 2), np.int64)], 1),
                   "token_type_ids": rng.integers(0, 2, (b, s))} for b, s in ((2, 8), (3, 5)))
    return File("bert", "torch.onnx legacy", path, feeds)


def t5(folder: Path) -> File:
    import transformers
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=LAYERS,
        num_decoder_layers=LAYERS, num_heads=4, relative_attention_num_buckets=8,
        relative_attention_max_distance=16, decoder_start_token_id=0)).eval()
    path = folder / "t5.onnx"
    enc, dec = {0: "batch_size", 1: "encoder_sequence_length"}, \
        {0: "batch_size", 1: "decoder_sequence_length"}
    names = ["input_ids", "attention_mask", "decoder_input_ids"]
    _export(Field(model, "logits"), (torch.randint(0, 100, (2, 5)),
                                     torch.ones(2, 5, dtype=torch.long),
                                     torch.randint(0, 100, (2, 3))), path, names, ["logits"],
            axes={"input_ids": enc, "attention_mask": enc, "decoder_input_ids": dec,
                  "logits": dec})
    rng = np.random.default_rng(3)
    feeds = tuple(dict(zip(names, (rng.integers(0, 100, (b, e)), np.ones((b, e), np.int64),
                                   rng.integers(0, 100, (b, d)))))
                  for b, e, d in ((2, 5, 3), (3, 9, 1)))
    return File("t5", "torch.onnx legacy", path, feeds)


def resnet(folder: Path) -> File:
    """A ResNet whose input is declared [batch_size, num_channels, height, width]."""
    import transformers
    torch.manual_seed(0)
    model = transformers.ResNetModel(transformers.ResNetConfig(
        num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
        layer_type="basic")).eval()
    path = folder / "resnet.onnx"
    _export(Field(model, "pooler_output"), (torch.randn(2, 3, 32, 32),), path,
            ["pixel_values"], ["pooled"],
            axes={"pixel_values": {0: "batch_size", 1: "num_channels", 2: "height",
                                   3: "width"}, "pooled": {0: "batch_size"}})
    rng = np.random.default_rng(4)
    feeds = tuple({"pixel_values": rng.standard_normal((b, 3, h, w), np.float32)}
                  for b, h, w in ((2, 32, 32), (3, 40, 24)))
    return File("resnet", "torch.onnx legacy", path, feeds)


# -- scikit-learn -------------------------------------------------------------------------------

def sklearn_files(folder: Path) -> list[File]:
    """Classifiers with their ZipMap (labels not 0..C-1), a regressor and a pipeline."""
    import skl2onnx
    from sklearn import ensemble, linear_model, pipeline, preprocessing, svm

    rng = np.random.default_rng(5)
    x = rng.standard_normal((60, 4)).astype(np.float32)
    y = np.digitize(x[:, 2] + 0.3 * x[:, 3], [-0.5, 0.5]).astype(np.int64) * 2 + 1
    models = {
        "LogisticRegression": linear_model.LogisticRegression().fit(x, y),
        "RandomForestClassifier": ensemble.RandomForestClassifier(
            n_estimators=5, max_depth=4, random_state=0).fit(x, y),
        "GradientBoostingRegressor": ensemble.GradientBoostingRegressor(
            n_estimators=5, max_depth=2, random_state=0).fit(x, x[:, 0] - x[:, 1]),
        "Pipeline-scaler-SVC": pipeline.make_pipeline(
            preprocessing.StandardScaler(), svm.SVC()).fit(x, y),
    }
    feeds = tuple({"X": rng.standard_normal((n, 4)).astype(np.float32)} for n in (9, 1))
    files = []
    for name, model in models.items():
        path = folder / f"sklearn-{name}.onnx"
        with quiet():
            onnx.save(skl2onnx.to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3}),
                      str(path))
        files.append(File(f"sklearn-{name}", "skl2onnx", path, feeds))
    return files


# -- the corpus -------------------------------------------------------------------------------

def _gpt2_group(folder):
    base = decoder(folder, "gpt2", gpt2, 2, 16)
    return [base, slimmed(base), transformers_optimised(base, "gpt2", 2, 32),
            session_optimised(base), nbits_quantized(base)]


def _llama_group(folder):
    base = decoder(folder, "llama", llama, 2, 8)
    return [base, slimmed(base), nbits_quantized(base)]


def _bert_group(folder):
    base = bert(folder)
    fused = transformers_optimised(base, "bert", 2, 32)  # Attention, EmbedLayerNormalization
    return [base, slimmed(base), fused, session_optimised(base), dynamic_quantized(base),
            dynamic_quantized(fused)]  # QAttention, QEmbedLayerNormalization


def _resnet_group(folder):
    base = resnet(folder)
    return [base, slimmed(base), session_optimised(base), static_quantized(base, "QDQ"),
            static_quantized(base, "QOperator"), dynamic_quantized(base)]


# name -> (builder of its files, whether it is slow to build: the dynamo exporter, ~10 s)
GROUPS = {
    "gpt2": (_gpt2_group, False),
    "llama": (_llama_group, False),
    "llama-dynamo": (lambda folder: [decoder(folder, "llama", llama, 2, 8, dynamo=True)], True),
    "t5": (lambda folder: [t5(folder)], False),
    "bert": (_bert_group, False),
    "resnet": (_resnet_group, False),
    "sklearn": (sklearn_files, False),
}


def build(folder: Path, groups=None) -> list[File]:
    """The files of ``groups`` (names of GROUPS; default all), written into ``folder``."""
    files = []
    for name in groups or GROUPS:
        files += GROUPS[name][0](Path(folder))
    return files
