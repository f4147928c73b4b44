"""onnxruntime's com.microsoft quantized ops (onnx/ops/contrib_quant.py), each a single node on
random inputs against onnxruntime's CPU kernels, through tdag.run and tdag.to_onnx on
onnxruntime. A quantized output is within one quantization step of onnxruntime's (the
largest integer difference is at most 1: its lookup tables and fixed-point requantization
round some near-ties the other way); a float output within 1e-4 relative (of the output's
largest magnitude) where the op dequantizes."""
from __future__ import annotations

import warnings

import ml_dtypes  # onnx's dependency: numpy's float8 types
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, ValueInfoProto, helper, numpy_helper

import tdag
from tdag.errors import UnsupportedOpError

from support.guards import reproduces, run_onnx

RNG = np.random.default_rng(20)
MS = "com.microsoft"


def _u8(*shape):
    return RNG.integers(0, 256, shape, dtype=np.uint8)


def _i8(*shape):
    return RNG.integers(-128, 128, shape, dtype=np.int8)


def _f(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _s(value, dtype=np.float32):
    return np.array(value, dtype)


def _model(op, inputs, outputs=1, **attrs):
    """One com.microsoft node over ``inputs``, (name, array) in the node's order: a name
    starting with "w" is an initializer, any other a graph input; an array of None skips an
    optional input."""
    node = helper.make_node(op, [n if v is not None else "" for n, v in inputs],
                            [f"y{i}" for i in range(outputs)], domain=MS,
                            name=f"{op.lower()}_0", **attrs)
    feeds = [(n, v) for n, v in inputs if v is not None and not n.startswith("w")]
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds],
        [ValueInfoProto(name=f"y{i}") for i in range(outputs)],
        [numpy_helper.from_array(v, n) for n, v in inputs if v is not None and n.startswith("w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    for value, info in zip(model.graph.output, _session(model).get_outputs()):
        value.CopyFrom(helper.make_tensor_value_info(value.name, _ORT_TYPES[info.type], None))
    return model, [v for _, v in feeds]


# onnxruntime's names of the element types these ops output (an output declared without a
# type, which onnxruntime accepts, is typed from its session: onnx's checker requires one)
_ORT_TYPES = {"tensor(float)": TensorProto.FLOAT, "tensor(uint8)": TensorProto.UINT8,
              "tensor(int8)": TensorProto.INT8, "tensor(int32)": TensorProto.INT32}


def _session(model):
    options = ort.SessionOptions()
    # onnxruntime fuses DequantizeLinear(4-bit) + MatMul into MatMulNBits at accuracy level 4
    # by default, which quantizes the activations to int8; level 1 computes what the file says
    options.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "1")
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _onnxruntime(model, args):
    session = _session(model)
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), args)})


def assert_quantized_close(got, expected, what=""):
    """Integers within one quantization step (exact for most); floats within 1e-4 of the
    largest magnitude."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype, \
        (what, got.shape, expected.shape, got.dtype, expected.dtype)
    if expected.dtype.kind in "iu":
        steps = np.abs(got.astype(np.int32) - expected.astype(np.int32))
        assert steps.max(initial=0) <= 1, (what, steps.max())
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-4,
                                   atol=1e-4 * np.abs(expected).max(initial=1.0), err_msg=what)


def _check(model, args):
    """tdag.run and tdag.to_onnx (on onnxruntime) give onnxruntime's outputs."""
    expected = _onnxruntime(model, args)
    reproduces(model, args, expected, assert_quantized_close)


# -- elementwise, softmax, pooling, concat ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(op, dtype):
    q = _u8 if dtype == np.uint8 else _i8
    zero = 128 if dtype == np.uint8 else 3
    _check(*_model(op, [("a", q(2, 3, 8)), ("w_as", _s(0.05)), ("w_az", _s(zero - 5, dtype)),
                        ("b", q(8)), ("w_bs", _s(0.03)), ("w_bz", _s(zero + 2, dtype)),
                        ("w_cs", _s(0.07 if op == "QLinearAdd" else 0.5)),
                        ("w_cz", _s(zero, dtype))]))


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {}),
                                      ("QLinearLeakyRelu", {"alpha": 0.3})])
def test_qlinear_unary(op, attrs):
    for dtype, q, zero in ((np.uint8, _u8, 120), (np.int8, _i8, -4)):
        out_scale = 1 / 256 if op == "QLinearSigmoid" else 0.04
        _check(*_model(op, [("x", q(2, 5, 7)), ("w_xs", _s(0.05)), ("w_xz", _s(zero, dtype)),
                            ("w_ys", _s(out_scale)), ("w_yz", _s(zero // 2, dtype))], **attrs))


@pytest.mark.parametrize("axis,opset", [(-1, 13), (1, 13), (1, 12)])
def test_qlinear_softmax(axis, opset):
    _check(*_model("QLinearSoftmax", [("x", _u8(2, 4, 6)), ("w_xs", _s(0.08)),
                                      ("w_xz", _s(130, np.uint8)), ("w_ys", _s(1 / 256)),
                                      ("w_yz", _s(0, np.uint8))], axis=axis, opset=opset))


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(channels_last):
    _check(*_model("QLinearGlobalAveragePool",
                   [("x", _u8(2, 5, 4, 3)), ("w_xs", _s(0.05)), ("w_xz", _s(128, np.uint8)),
                    ("w_ys", _s(0.02)), ("w_yz", _s(120, np.uint8))],
                   channels_last=channels_last))


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3]), dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
    dict(kernel_shape=[3, 2], pads=[1, 0, 1, 1], channels_last=1)])
def test_qlinear_average_pool(attrs):
    _check(*_model("QLinearAveragePool",
                   [("x", _i8(2, 3, 7, 6)), ("w_xs", _s(0.05)), ("w_xz", _s(-3, np.int8)),
                    ("w_ys", _s(0.03)), ("w_yz", _s(2, np.int8))], **attrs))


def test_qlinear_concat():
    _check(*_model("QLinearConcat",
                   [("w_ys", _s(0.05)), ("w_yz", _s(128, np.uint8)),
                    ("a", _u8(2, 3, 4)), ("w_as", _s(0.05)), ("w_az", _s(128, np.uint8)),
                    ("b", _u8(2, 5, 4)), ("w_bs", _s(0.11)), ("w_bz", _s(100, np.uint8))],
                   axis=1))


# -- integer products ------------------------------------------------------------------------------

@pytest.mark.parametrize("b_dtype,per_column,bias", [
    (np.int8, False, True), (np.uint8, True, False), (np.int8, True, True)])
def test_matmul_integer_to_float(b_dtype, per_column, bias):
    n, q = 6, (_i8 if b_dtype == np.int8 else _u8)
    b_scale = np.abs(_f(n)) * 0.01 + 0.001 if per_column else _s(0.02)
    b_zero = q(n) if per_column else _s(3, b_dtype)
    _check(*_model("MatMulIntegerToFloat",
                   [("a", _u8(2, 3, 5)), ("w_b", q(5, n)), ("w_as", _s(0.04)), ("w_bs", b_scale),
                    ("w_az", _s(120, np.uint8)), ("w_bz", b_zero),
                    ("w_bias", _f(n) if bias else None)]))


@pytest.mark.parametrize("b_dtype,per_column,bias", [
    (np.int8, False, True), (np.uint8, True, False)])
def test_dynamic_quantize_matmul(b_dtype, per_column, bias):
    n, q = 6, (_i8 if b_dtype == np.int8 else _u8)
    b_scale = np.abs(_f(n)) * 0.01 + 0.001 if per_column else _s(0.02)
    _check(*_model("DynamicQuantizeMatMul",
                   [("a", _f(2, 3, 5)), ("w_b", q(5, n)), ("w_bs", b_scale),
                    ("w_bz", q(n) if per_column else _s(0, b_dtype)),
                    ("w_bias", _f(n) if bias else None)]))


@pytest.mark.parametrize("signed,trans_b,bias,quantized,per_column", [
    (False, 0, True, True, False), (True, 1, False, True, True), (False, 1, True, False, True),
    (True, 0, False, False, False)])
def test_qgemm(signed, trans_b, bias, quantized, per_column):
    q, dtype = (_i8, np.int8) if signed else (_u8, np.uint8)
    m, k, n = 3, 7, 5
    b_scale = np.abs(_f(n)) * 0.01 + 0.001 if per_column else _s(0.02)
    b_zero = (np.zeros(n, np.int8) if signed else _u8(n)) if per_column else _s(0, np.int8) \
        if signed else _s(128, np.uint8)
    inputs = [("a", q(k, m)), ("w_as", _s(0.05)), ("w_az", _s(1 if signed else 125, dtype)),
              ("w_b", q(n, k) if trans_b else q(k, n)), ("w_bs", b_scale), ("w_bz", b_zero),
              ("w_c", RNG.integers(-500, 500, (n,), dtype=np.int32) if bias else None)]
    if quantized:
        inputs += [("w_ys", _s(0.3)), ("w_yz", _s(-2 if signed else 130, dtype))]
    _check(*_model("QGemm", inputs, transA=1, transB=trans_b, alpha=0.75))


# -- block-quantized weights -----------------------------------------------------------------------

def _nbits(k, n, block, bits):
    """A packed weight, its scales and packed zero points, MatMulNBits' layout."""
    blocks = -(-k // block)
    b = _u8(n, blocks, block * bits // 8)
    scales = np.abs(_f(n, blocks)) * 0.05 + 0.01
    zero_bytes = -(-blocks * bits // 8)
    return b, scales, _u8(n, zero_bytes)


@pytest.mark.parametrize("bits,k,zero,bias", [
    (4, 64, "packed", True), (4, 80, None, False), (4, 40, "float", True),
    (8, 48, "packed", False), (2, 64, "packed", True)])
def test_matmul_nbits(bits, k, zero, bias):
    n, block = 12, 16 if bits != 4 else 32
    b, scales, zeros = _nbits(k, n, block, bits)
    zeros = {"packed": zeros, "float": _f(*scales.shape), None: None}[zero]
    _check(*_model("MatMulNBits",
                   [("a", _f(2, 3, k)), ("w_b", b), ("w_scales", scales.reshape(-1)),
                    ("w_zeros", zeros), ("w_gidx", None), ("w_bias", _f(n) if bias else None)],
                   K=k, N=n, bits=bits, block_size=block))


def test_matmul_nbits_g_idx_is_refused():
    b, scales, zeros = _nbits(32, 4, 16, 4)
    model, _ = _model("MatMulNBits", [("a", _f(1, 32)), ("w_b", b), ("w_scales", scales),
                                      ("w_zeros", zeros),
                                      ("w_gidx", np.arange(32, dtype=np.int32) // 16)],
                      K=32, N=4, bits=4, block_size=16)
    with pytest.raises(UnsupportedOpError, match="g_idx"):
        tdag.from_onnx(model)


@pytest.mark.parametrize("bits,zero,indices", [
    (4, True, [[0, 3], [-1, 7]]), (4, False, [5, 2, 2]), (8, True, [1, -2]),
    (2, False, [[4]]), (4, True, [0, 9, -11])])  # 9 and -11: out of range, a row of zeros
def test_gather_block_quantized(bits, zero, indices):
    rows, width, block = 8, 48, 16
    blocks = width // block
    data = _u8(rows, width * bits // 8)
    zeros = _u8(rows, -(-blocks * bits // 8)) if zero else None
    _check(*_model("GatherBlockQuantized",
                   [("w_data", data), ("ids", np.array(indices, np.int64)),
                    ("w_scales", np.abs(_f(rows, blocks)) + 0.1), ("w_zeros", zeros)],
                   bits=bits, block_size=block, gather_axis=0, quantize_axis=1))


def test_com_microsoft_quantize_dequantize():
    """onnxruntime's quantizer may write com.microsoft QuantizeLinear / DequantizeLinear: the
    default domain's entries."""
    x = _f(2, 6, 3)
    _check(*_model("QuantizeLinear", [("x", x), ("w_s", _s(0.02)), ("w_z", _s(3, np.int8))]))
    _check(*_model("DequantizeLinear", [("x", _u8(2, 6)), ("w_s", np.abs(_f(6)) + 0.1),
                                        ("w_z", _u8(6))], axis=1))


def test_matmul_nbits_real_size_is_linear_beyond_the_matmul():
    """A 4096 x 4096 int4 weight: the unpacking and dequantization cost a few operations per
    weight, nothing quadratic beyond the matmul itself."""
    k = n = 4096
    b, scales, zeros = _nbits(k, n, 32, 4)
    model, _ = _model("MatMulNBits", [("a", _f(1, 4, k)), ("w_b", b), ("w_scales", scales),
                                      ("w_zeros", zeros)], K=k, N=n, bits=4, block_size=32)
    cost = tdag.cost(tdag.from_onnx(model))
    assert cost.matmul_flops == 2 * 4 * k * n
    assert cost.flops - cost.matmul_flops <= 8 * k * n


# -- files written by onnxruntime's quantizers -----------------------------------------------------

def _ort_file(path, feeds, optimise=True):
    options = ort.SessionOptions()
    if not optimise:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _ops(path):
    return {(n.domain or "ai.onnx", n.op_type) for n in onnx.load(str(path)).graph.node}


def _check_file(path, feeds, step):
    """tdag.run and tdag.to_onnx of the file within ``step`` of onnxruntime on the file."""
    expected = _ort_file(path, feeds)
    prog = tdag.from_onnx(str(path))
    args = [torch.from_numpy(v) for v in feeds.values()]
    for what, got in (("tdag.run", tdag.run(prog, *args)),
                      ("to_onnx", run_onnx(tdag.to_onnx(prog), *args))):
        error = np.abs(np.asarray(got) - expected).max()
        assert error <= step, (what, error, step)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """A one-layer BERT exported by torch.onnx (legacy, opset 17): its path and feeds."""
    pytest.importorskip("transformers")
    from support.hf_encoders import one_layer_bert_file

    path = tmp_path_factory.mktemp("bert") / "bert.onnx"
    feeds = one_layer_bert_file(path)
    return path, {k: v.numpy() for k, v in feeds.items()}


def test_dynamically_quantized_bert(tiny_bert, tmp_path):
    """quantize_dynamic writes DynamicQuantizeLinear + MatMulInteger (default domain); a
    session's extended optimisation fuses them into DynamicQuantizeMatMul and
    MatMulIntegerToFloat. Both files within one quantization step of the output (its range
    over 255, the uint8 step DynamicQuantizeLinear would give it; measured: 1e-6)."""
    from onnxruntime.quantization import quantize_dynamic

    path, feeds = tiny_bert
    quantize_dynamic(str(path), str(tmp_path / "q.onnx"))
    assert {("ai.onnx", "DynamicQuantizeLinear"), ("ai.onnx", "MatMulInteger")} <= \
        _ops(tmp_path / "q.onnx")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "fused.onnx")
    ort.InferenceSession(str(tmp_path / "q.onnx"), options, providers=["CPUExecutionProvider"])
    assert {(MS, "DynamicQuantizeMatMul"), (MS, "MatMulIntegerToFloat")} <= \
        _ops(tmp_path / "fused.onnx")
    for name in ("q.onnx", "fused.onnx"):
        expected = _ort_file(tmp_path / name, feeds)
        _check_file(tmp_path / name, feeds, (expected.max() - min(expected.min(), 0)) / 255)


class _SmallCNN(torch.nn.Module):
    """Conv, residual add, average pool, sigmoid gate, leaky ReLU, concat, global pool,
    linear and softmax: what quantize_static turns into QLinear* ops."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(16, 5)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        z = torch.nn.functional.avg_pool2d(self.c2(y) + y, 2)
        z = torch.sigmoid(self.c3(z)) * z
        z = torch.cat([torch.nn.functional.leaky_relu(z, 0.1), z], 1)
        return torch.softmax(self.fc(torch.nn.functional.adaptive_avg_pool2d(z, 1).flatten(1)),
                             -1)


def test_statically_quantized_cnn(tmp_path):
    """quantize_static in the QOperator format (uint8 activations, int8 weights, calibrated on
    random data): QLinearConv and com.microsoft QLinearAdd, QLinearAveragePool, QLinearSigmoid,
    QLinearMul, QLinearLeakyRelu, QLinearConcat, QLinearGlobalAveragePool, QGemm,
    QLinearSoftmax; within one step of the output's DequantizeLinear scale (measured: 0)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.batches = iter({"x": _f(2, 3, 8, 8)} for _ in range(4))

        def get_next(self):
            return next(self.batches, None)

    torch.manual_seed(20)
    x = torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_SmallCNN().eval(), (x,), tmp_path / "cnn.onnx", dynamo=False,
                          input_names=["x"], opset_version=17)
    quantize_static(str(tmp_path / "cnn.onnx"), str(tmp_path / "q.onnx"), Reader(),
                    quant_format=QuantFormat.QOperator)
    written = _ops(tmp_path / "q.onnx")
    assert {(MS, op) for op in ("QLinearAdd", "QLinearAveragePool", "QLinearSigmoid",
                                "QLinearMul", "QLinearLeakyRelu", "QLinearConcat",
                                "QLinearGlobalAveragePool", "QGemm", "QLinearSoftmax")} <= written
    model = onnx.load(str(tmp_path / "q.onnx"))
    last = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    scale = next(numpy_helper.to_array(t) for t in model.graph.initializer
                 if t.name == last.input[1])
    _check_file(tmp_path / "q.onnx", {"x": x.numpy()}, float(scale))


@pytest.mark.parametrize("symmetric", [True, False])
def test_matmul_nbits_quantized_mlp(tmp_path, symmetric):
    """MatMulNBitsQuantizer (4 bits, block_size 32; asymmetric: packed zero points) on an
    embedding (GatherBlockQuantized over int4 or uint4) + MLP: float outputs within 1e-4 of the
    output's largest magnitude (measured: 7e-7)."""
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    torch.manual_seed(20)
    mlp = torch.nn.Sequential(torch.nn.Embedding(50, 64), torch.nn.Linear(64, 96),
                              torch.nn.GELU(), torch.nn.Linear(96, 64, bias=False),
                              torch.nn.LayerNorm(64), torch.nn.Linear(64, 50)).eval()
    ids = torch.randint(0, 50, (2, 5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(mlp, (ids,), tmp_path / "mlp.onnx", dynamo=False,
                          input_names=["ids"], opset_version=17)
    quantizer = MatMulNBitsQuantizer(onnx.load(str(tmp_path / "mlp.onnx")), block_size=32,
                                     is_symmetric=symmetric,
                                     op_types_to_quantize=("MatMul", "Gather"))
    quantizer.process()
    quantizer.model.save_model_to_file(str(tmp_path / "q.onnx"))
    # the embedding's GatherBlockQuantized holds int4 (symmetric) or uint4 data, which tdag
    # reads one element a byte (onnx/load.py WIDENED)
    assert {(MS, "MatMulNBits"), (MS, "GatherBlockQuantized")} <= _ops(tmp_path / "q.onnx")
    expected = _ort_file(tmp_path / "q.onnx", {"ids": ids.numpy()})
    _check_file(tmp_path / "q.onnx", {"ids": ids.numpy()}, 1e-4 * np.abs(expected).max())


@pytest.mark.parametrize("per_column,mask,unidirectional,outputs", [
    (False, True, 0, 1), (True, False, 1, 1), (True, True, 0, 2)])
def test_qattention(per_column, mask, unidirectional, outputs):
    """Outputs the attention and, asked, ``present`` (this step's keys and values)."""
    hidden = 16
    w_scale = np.abs(_f(3 * hidden)) * 0.01 + 0.002 if per_column else _s(0.01)
    w_zero = _i8(3 * hidden) if per_column else _s(2, np.int8)
    _check(*_model("QAttention",
                   [("x", _u8(2, 5, hidden)), ("w_w", _i8(hidden, 3 * hidden)),
                    ("w_bias", _f(3 * hidden)), ("w_xs", _s(0.02)), ("w_ws", w_scale),
                    ("mask", np.array([5, 3], np.int32) if mask else None),
                    ("w_xz", _s(128, np.uint8)), ("w_wz", w_zero)],
                   outputs, num_heads=2, unidirectional=unidirectional))


def test_gather_block_quantized_float8():
    """float8 data: symmetric, data * scale; block_size 0 is one block per row."""
    data = (_f(6, 32) * 4).astype(ml_dtypes.float8_e4m3fn)
    _check(*_model("GatherBlockQuantized",
                   [("w_data", data), ("ids", np.array([[5, 0], [2, 2]], np.int64)),
                    ("w_scales", np.abs(_f(6, 1)) + 0.1)], block_size=0))


@pytest.mark.parametrize("dtype", [TensorProto.INT4, TensorProto.UINT4])
def test_blockwise_dequantize_linear_of_4_bit_weights(dtype):
    """The default domain's DequantizeLinear (opset 21) over an int4/uint4 weight in blocks of
    16 along its rows, then MatMul: the 4-bit constant is read one element a byte."""
    low, high = (-8, 7) if dtype == TensorProto.INT4 else (0, 15)
    w = RNG.integers(low, high + 1, (32, 8))
    scale = (np.abs(_f(2, 8)) + 0.05).astype(np.float32)
    zero = RNG.integers(low, high + 1, (2, 8))
    inits = [helper.make_tensor("w", dtype, [32, 8], w.flatten().tolist()),
             numpy_helper.from_array(scale, "s"),
             helper.make_tensor("z", dtype, [2, 8], zero.flatten().tolist())]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], axis=0, block_size=16),
         helper.make_node("MatMul", ["x", "wf"], ["y"])], "dq4",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    x = _f(3, 32)
    expected = _onnxruntime(model, [x])
    prog = tdag.from_onnx(model)
    assert_quantized_close(tdag.run(prog, torch.from_numpy(x)), expected[0], "tdag.run")
    assert_quantized_close(_onnxruntime(tdag.to_onnx(prog), [x])[0], expected[0], "to_onnx")


@pytest.mark.parametrize("segments,mask", [(True, True), (False, False)])
def test_qembed_layer_normalization(segments, mask):
    """Gathered 8-bit rows dequantized, summed and layer-normed, as onnxruntime's kernel."""
    hidden, vocab = 16, 30

    def table(rows):
        return [_u8(rows, hidden), _s(0.02), _s(128, np.uint8)]
    word, pos, seg, gamma, beta = table(vocab), table(12), table(2), table(1), table(1)
    gamma[0], beta[0] = gamma[0][0], beta[0][0]
    ids = RNG.integers(0, vocab, (2, 7)).astype(np.int32)
    inputs = [("ids", ids), ("seg", RNG.integers(0, 2, (2, 7)).astype(np.int32) if segments
                             else None),
              ("w_word", word[0]), ("w_pos", pos[0]), ("w_seg", seg[0] if segments else None),
              ("w_gamma", gamma[0]), ("w_beta", beta[0]),
              ("mask", (RNG.random((2, 7)) < 0.8).astype(np.int32) if mask else None)]
    tables = {"word": word, "pos": pos, "seg": seg if segments else [None] * 3,
              "gamma": gamma, "beta": beta}
    inputs += [(f"w_{n}_scale", t[1]) for n, t in tables.items()]
    inputs += [(f"w_{n}_zero", t[2]) for n, t in tables.items()]
    _check(*_model("QEmbedLayerNormalization", inputs, outputs=2, epsilon=1e-12))
