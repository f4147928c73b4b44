"""Quantized ONNX files as onnxruntime.quantization writes them, from tiny random models:
a BERT quantized dynamically (DynamicQuantizeLinear + MatMulInteger) and a CNN quantized
statically in QDQ format (QuantizeLinear/DequantizeLinear around float Conv and Gemm)."""
from __future__ import annotations

import logging
import warnings

import numpy as np
import torch
import transformers
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)


class _Encoder(torch.nn.Module):
    """BertModel's last hidden state from positional ids and mask (the legacy exporter
    cannot pass BertModel's keyword-only options)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, mask):
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def _export(module, args, path, names, outputs, axes=None) -> None:
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), input_names=names, output_names=outputs,
                          dynamic_axes=axes, opset_version=17, dynamo=False)


def bert_dynamic(tmp_path, hidden: int = 32, layers: int = 2):
    """(path of the dynamically quantized BERT, a feed of batch 2 x 8 tokens)."""
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(
        vocab_size=100, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
        intermediate_size=2 * hidden, max_position_embeddings=64)).eval()
    ids = torch.randint(0, 100, (2, 8))
    axes = {n: {0: "b", 1: "s"} for n in ("ids", "mask")}
    _export(_Encoder(model), (ids, torch.ones_like(ids)), tmp_path / "bert.onnx",
            ["ids", "mask"], ["out"], axes)
    out = tmp_path / "bert_q.onnx"
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process the model
    quantize_dynamic(str(tmp_path / "bert.onnx"), str(out), weight_type=QuantType.QInt8)
    rng = np.random.default_rng(0)
    return out, {"ids": rng.integers(0, 100, (2, 8)), "mask": np.ones((2, 8), np.int64)}


class _Random(CalibrationDataReader):
    def __init__(self, shape, count: int = 4):
        rng = np.random.default_rng(1)
        self.feeds = iter([{"x": rng.standard_normal(shape).astype(np.float32)}
                           for _ in range(count)])

    def get_next(self):
        return next(self.feeds, None)


def cnn_qdq(tmp_path, channels: int = 8, size: int = 16, fmt: str = "QDQ",
            per_channel: bool = False):
    """(path of the CNN quantized in ``fmt``, QDQ or QOperator, a feed of one image)."""
    torch.manual_seed(0)
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(3, channels, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(channels, channels, 3, stride=2), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(channels * ((size - 3) // 2 + 1) ** 2, 10)).eval()
    shape = (1, 3, size, size)
    _export(cnn, (torch.randn(shape),), tmp_path / "cnn.onnx", ["x"], ["y"])
    out = tmp_path / f"cnn_q{'' if fmt == 'QDQ' else '_' + fmt}{'_pc' if per_channel else ''}.onnx"
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(str(tmp_path / "cnn.onnx"), str(out), _Random(shape),
                    quant_format=getattr(QuantFormat, fmt), per_channel=per_channel)
    return out, {"x": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
