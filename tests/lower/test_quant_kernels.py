"""Quantized files keep their integer kernels when re-emitted (tdag/lower/quant.py).

Files written by onnxruntime.quantization from tiny random models (tests/support/
quantized_files.py): a dynamically quantized BERT and a QDQ CNN. Imported, lowered and
re-emitted by ``tdag.to_onnx``, the file holds the integer ops again (MatMulInteger,
ConvInteger and one DynamicQuantizeLinear per input; Q/DQ around the float Conv and Gemm,
which onnxruntime fuses), not their float rebuild, and
computes what onnxruntime computes on the original: the CNN within one step of its output's
quantization, the BERT within float tolerance. The lowered program through ``tdag.run``
(the kernels' evaluators) matches the imported compositions.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx.numpy_helper import to_array
from onnxruntime.quantization import QuantType, quantize_dynamic

import tdag
import tdag.lower
from tdag.ir.op import Op

from support.quantized_files import bert_dynamic, cnn_qdq


def _ort(model, feed):
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed)[0]


def _initializer(path, name: str) -> float:
    return float(next(to_array(t) for t in onnx.load(str(path)).graph.initializer
                      if t.name == name))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("quantized")
    cnn = cnn_qdq(tmp)
    dynamic = tmp / "cnn_dynamic.onnx"  # the float CNN cnn_qdq exported: ConvInteger
    quantize_dynamic(str(tmp / "cnn.onnx"), str(dynamic), weight_type=QuantType.QInt8)
    return {"bert": bert_dynamic(tmp), "cnn": cnn, "cnn-dynamic": (dynamic, cnn[1])}


def _ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node)


def test_dynamic_bert_keeps_matmul_integer(files):
    path, feed = files["bert"]
    original = onnx.load(str(path))
    out = tdag.to_onnx(tdag.from_onnx(path))
    ops = _ops(out)
    assert ops["MatMulInteger"] == _ops(original)["MatMulInteger"] > 0, ops
    # each DynamicQuantizeLinear is one op again, not its scale and zero point rebuilt
    assert ops["DynamicQuantizeLinear"] == _ops(original)["DynamicQuantizeLinear"] > 0, ops
    assert not ops["ReduceMin"] and not ops["QuantizeLinear"], ops
    want = _ort(str(path), feed)
    np.testing.assert_allclose(_ort(out, feed), want, atol=1e-4 * np.abs(want).max())


def _optimised_ops(model, tmp_path) -> Counter:
    """The op types onnxruntime's session optimiser leaves in ``model``."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimised.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return _ops(onnx.load(options.optimized_model_filepath))


def test_dynamic_bert_fuses_as_the_original_does_on_onnxruntime(files, tmp_path):
    """Each i32 accumulator is scaled by Cast + Mul, the form onnxruntime fuses into
    MatMulIntegerToFloat, and with the DynamicQuantizeLinear before it into
    DynamicQuantizeMatMul (a DequantizeLinear of it is one pass but fuses into nothing: the
    re-emitted file was 13% slower than the original)."""
    path, _ = files["bert"]
    fused = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat")
    original = _optimised_ops(onnx.load(str(path)), tmp_path)
    ops = _optimised_ops(tdag.to_onnx(tdag.from_onnx(path)), tmp_path)
    assert [ops[k] for k in fused] == [original[k] for k in fused], (ops, original)
    assert sum(ops[k] for k in fused) == _ops(onnx.load(str(path)))["MatMulInteger"]
    assert not ops["MatMulInteger"] and ops["DequantizeLinear"] == original["DequantizeLinear"]


def test_qdq_cnn_keeps_q_dq_around_conv(files):
    path, feed = files["cnn"]
    out = tdag.to_onnx(tdag.from_onnx(path))
    producers = {o: n.op_type for n in out.graph.node for o in n.output}
    convs = [n for n in out.graph.node if n.op_type in ("Conv", "Gemm")]
    assert len(convs) == 3 and _ops(out)["QuantizeLinear"] == _ops(onnx.load(str(path)))[
        "QuantizeLinear"]
    for node in convs:  # input, weight and bias each come dequantized, as ORT fuses them
        assert [producers[i] for i in node.input] == ["DequantizeLinear"] * 3, node
    step = _initializer(path, "y_scale")
    np.testing.assert_allclose(_ort(out, feed), _ort(str(path), feed), atol=step * 1.001)


def test_dynamic_cnn_keeps_conv_integer(files):
    path, feed = files["cnn-dynamic"]
    original = onnx.load(str(path))
    out = tdag.to_onnx(tdag.from_onnx(path))
    ops = _ops(out)
    assert ops["ConvInteger"] == _ops(original)["ConvInteger"] == 2 and not ops["Conv"], ops
    assert ops["DynamicQuantizeLinear"] == _ops(original)["DynamicQuantizeLinear"], ops
    want = _ort(str(path), feed)
    np.testing.assert_allclose(_ort(out, feed), want, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("name", ["bert", "cnn", "cnn-dynamic"])
def test_lowered_kernels_compute_the_composition(files, name):
    """The kernels' evaluators give exactly what the compositions give (which the ONNX
    conformance tests check against onnx's reference evaluator; that evaluator itself
    refuses these files: a [1] bias scale under DequantizeLinear's default axis)."""
    path, feed = files[name]
    prog = tdag.from_onnx(path)
    low = tdag.lower.lower(prog)
    kernels = {n.op for n in low.graph.nodes}
    assert {"cnn": {Op.quantize, Op.dequantize}, "bert": {Op.matmul_integer, Op.dynamic_quantize},
            "cnn-dynamic": {Op.conv_integer, Op.dynamic_quantize}}[name] <= kernels, kernels
    args = [torch.from_numpy(feed[v.name]) for v in low.graph.inputs]
    got, want = tdag.run(low, *args), tdag.run(prog, *args)
    step = _initializer(path, "y_scale") if name == "cnn" else 1e-5 * want.abs().max().item()
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=step * 1.001)


# -- QLinearConv and QLinearMatMul ------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True])
def test_qoperator_cnn_keeps_qlinear_conv(tmp_path, per_channel):
    """A QOperator CNN (QLinearConv, com.microsoft QGemm) is re-emitted with its QLinearConv
    nodes, not their float rebuild, and computes what the original computes (the same kernels)."""
    path, feed = cnn_qdq(tmp_path, fmt="QOperator", per_channel=per_channel)
    prog = tdag.from_onnx(path)
    out = tdag.to_onnx(prog)
    assert _ops(out)["QLinearConv"] == _ops(onnx.load(str(path)))["QLinearConv"] == 2, _ops(out)
    assert not _ops(out)["Floor"] and not _ops(out)["Conv"], _ops(out)  # no f64 rounding left
    np.testing.assert_array_equal(_ort(out, feed), _ort(str(path), feed))
    low = tdag.lower.lower(prog)
    assert sum(n.op is Op.qlinear_conv for n in low.graph.nodes) == 2
    x = torch.from_numpy(feed["x"])
    torch.testing.assert_close(tdag.run(low, x), tdag.run(prog, x), rtol=0, atol=0)


def _qlinear_matmul_model(b_dtype, per_column: bool) -> onnx.ModelProto:
    """x -> QuantizeLinear (uint8) -> QLinearMatMul by an 8-bit weight -> DequantizeLinear."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    info = np.iinfo(b_dtype)
    consts = {"xs": np.float32(0.03), "xz": np.uint8(120),
              "w": rng.integers(info.min, info.max + 1, (16, 6)).astype(b_dtype),
              "ws": (rng.random(6 if per_column else ()) * 0.02 + 0.005).astype(np.float32),
              "wz": np.zeros(6 if per_column else (), b_dtype) + b_dtype(3),
              "ys": np.float32(0.5), "yz": np.uint8(128)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"]),
             helper.make_node("QLinearMatMul", ["q", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
                              ["qy"]),
             helper.make_node("DequantizeLinear", ["qy", "ys", "yz"], ["y"])]
    graph = helper.make_graph(
        nodes, "qlinear_matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                ["b", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 6])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


@pytest.mark.parametrize("b_dtype,per_column", [(np.int8, False), (np.uint8, True)])
def test_qlinear_matmul_round_trips(b_dtype, per_column):
    model = _qlinear_matmul_model(b_dtype, per_column)
    prog = tdag.from_onnx(model)
    out = tdag.to_onnx(prog)
    assert _ops(out)["QLinearMatMul"] == 1 and not _ops(out)["Floor"], _ops(out)
    feed = {"x": np.random.default_rng(4).standard_normal((5, 16)).astype(np.float32) * 3}
    step = 0.5  # onnxruntime requantizes in f32: a tie can round one step the other way
    np.testing.assert_allclose(_ort(out, feed), _ort(model, feed), atol=step * 1.001)
    x = torch.from_numpy(feed["x"])
    torch.testing.assert_close(tdag.run(tdag.lower.lower(prog), x), tdag.run(prog, x), rtol=0,
                               atol=0)
