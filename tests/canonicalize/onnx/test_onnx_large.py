"""Models past protobuf's 2 GiB: their weights live in external data beside the model.
tdag checks them as a skeleton (onnx's checker and shape inference serialize the model) and
writes them back with external data, confined to the model's folder.

The default run lowers both thresholds so that a small model takes the same paths; the real
2.2 GB model is behind ``-m slow``.
"""
from __future__ import annotations

import importlib
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import tdag
from tdag.canonicalize.onnx import load as onnx_load
from tdag.reify import write_onnx

# the module, which tdag.reify's function of the same name hides
to_onnx_module = importlib.import_module("tdag.reify.onnx.model")


def _matmul_model(folder, rows: int, cols: int) -> tuple[str, np.ndarray]:
    """``folder/model.onnx`` computing relu(x @ w), w in ``model.onnx.data`` beside it
    (written directly: a model past 2 GiB cannot be serialized whole to begin with)."""
    w = np.random.default_rng(0).random((rows, cols), dtype=np.float32)
    w.tofile(folder / "model.onnx.data")
    weight = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[rows, cols])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "model.onnx.data"), ("offset", "0"),
                       ("length", str(w.nbytes))):
        weight.external_data.add(key=key, value=value)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", rows])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, folder / "model.onnx")
    return str(folder / "model.onnx"), w


def _round_trip(tmp_path, rows, cols):
    (tmp_path / "in").mkdir()
    src, w = _matmul_model(tmp_path / "in", rows, cols)
    prog = tdag.from_onnx(src)
    x = torch.rand(3, rows, generator=torch.Generator().manual_seed(0))
    expected = torch.relu(x @ torch.from_numpy(w))
    torch.testing.assert_close(tdag.run(prog, x), expected, rtol=1e-4, atol=1e-3)
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    write_onnx(tdag.to_onnx(prog), out)
    assert sorted(os.listdir(out.parent)) == ["model.onnx", "model.onnx.data"]
    assert os.path.getsize(out) < 2**20  # the weights went beside it
    onnx.checker.check_model(str(out))  # by path: a model past 2 GiB is checked in place
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])  # weights from the folder
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)
    assert tdag.from_onnx(out).graph.output_types == prog.graph.output_types  # and back in
    return prog


def test_a_model_past_the_limit_is_checked_as_a_skeleton_and_written_with_external_data(
        tmp_path, monkeypatch):
    monkeypatch.setattr(onnx_load, "PROTO_LIMIT", 2**20)
    monkeypatch.setattr(to_onnx_module, "EXTERNAL_ABOVE", 2**20)
    prog = _round_trip(tmp_path, 600, 700)
    assert str(prog.graph.output_types[0]) == "f32[b,700]"


@pytest.mark.slow
def test_a_model_over_2_gib_imports_and_re_emits(tmp_path):
    _round_trip(tmp_path, 24_000, 24_000)  # 2.3 GB of float32
