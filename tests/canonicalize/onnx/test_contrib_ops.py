"""onnxruntime's com.microsoft ops that tdag maps (onnx/ops/contrib.py): each a single node on
random inputs against onnxruntime (rtol 1e-5; FastGelu 1e-4), through tdag.run and tdag.to_onnx
on onnxruntime; BiasAdd, which onnxruntime's CPU provider lacks, against numpy. An unmapped
com.microsoft op is refused by name."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tdag
from tdag.canonicalize.onnx.load import ORT_DEFAULT_OPS
from tdag.canonicalize.onnx.ops import OPS
from tdag.errors import InvalidModelError, UnsupportedOpError

from support.guards import reproduces

RNG = np.random.default_rng(20)
MS = "com.microsoft"


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(op, inputs, outputs=1, domain=MS, **attrs):
    """One node of ``domain`` over graph inputs ``inputs`` (name, array); None skips one."""
    names = [name if value is not None else "" for name, value in inputs]
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], domain=domain,
                            name=f"{op.lower()}_0", **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, v.shape)
         for n, v in inputs if v is not None],
        [helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None)
         for i in range(outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model, [v for _, v in inputs if v is not None]


def _onnxruntime(model, args):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: a for i, a in zip(session.get_inputs(), args)})


def _check(model, args, expected=None, rtol=1e-5):
    """tdag.run and tdag.to_onnx (on onnxruntime) give onnxruntime's outputs."""
    expected = _onnxruntime(model, args) if expected is None else expected
    reproduces(model, args, expected, lambda g, e, what: np.testing.assert_allclose(
        np.asarray(g), e, rtol=rtol, atol=rtol, err_msg=what))


@pytest.mark.parametrize("beta,bias,outputs,skip_shape", [
    (True, True, 4, (2, 3, 8)), (False, False, 1, (2, 3, 8)), (True, False, 2, (3, 8)),
    (False, True, 3, (2, 3, 8))])
def test_skip_layer_norm(beta, bias, outputs, skip_shape):
    inputs = [("x", _r(2, 3, 8)), ("skip", _r(*skip_shape)), ("gamma", _r(8)),
              ("beta", _r(8) if beta else None), ("bias", _r(8) if bias else None)]
    while inputs[-1][1] is None:
        inputs.pop()
    _check(*_model("SkipLayerNormalization", inputs, outputs, epsilon=1e-5))


@pytest.mark.parametrize("bias,outputs", [(True, 1), (False, 4), (True, 4)])
def test_skip_simplified_layer_norm(bias, outputs):
    inputs = [("x", _r(2, 3, 8)), ("skip", _r(2, 3, 8)), ("gamma", _r(8))]
    inputs += [("bias", _r(8))] if bias else []
    model, args = _model("SkipSimplifiedLayerNormalization", inputs, outputs)
    if outputs > 1:  # the mean of an RMS norm is not computed: read only the other outputs
        model.graph.output.remove(model.graph.output[1])
    _check(model, args)


@pytest.mark.parametrize("axis,outputs", [(-1, 1), (1, 2)])
def test_simplified_layer_norm(axis, outputs):
    # onnxruntime's SimplifiedLayerNormalization is of the default domain, which onnx's checker
    # does not know: load.py admits it (ORT_DEFAULT_OPS) without changing the model
    x = _r(2, 3, 8)
    model, args = _model("SimplifiedLayerNormalization",
                         [("x", x), ("scale", _r(*x.shape[axis:]))],
                         outputs, domain="", axis=axis, epsilon=1e-6)
    before = model.SerializeToString()
    _check(model, args)
    assert model.SerializeToString() == before


def test_ort_default_ops_are_mapped():
    assert ORT_DEFAULT_OPS and all(op in OPS for op in ORT_DEFAULT_OPS)


def test_unknown_default_domain_op_is_refused():
    """Only ORT_DEFAULT_OPS pass the checker: any other op of the default domain it refuses."""
    model, _ = _model("FooBar", [("x", _r(2, 3, 8))], domain="")
    with pytest.raises(InvalidModelError,
                       match="malformed ONNX model: No Op registered for FooBar with "
                             "domain_version of 17"):
        tdag.from_onnx(model)


@pytest.mark.parametrize("op,inputs,attrs,rtol", [
    ("BiasGelu", 2, {}, 1e-5), ("FastGelu", 1, {}, 1e-4), ("FastGelu", 2, {}, 1e-4),
    ("Gelu", 1, {}, 1e-5), ("QuickGelu", 1, {}, 1e-5), ("QuickGelu", 1, {"alpha": 1.3}, 1e-5)])
def test_gelus(op, inputs, attrs, rtol):
    args = [("x", _r(2, 5, 16) * 3), ("bias", _r(16))][:inputs]
    _check(*_model(op, args, **attrs), rtol=rtol)


def test_bias_add():  # onnxruntime's CPU provider has no BiasAdd kernel: numpy is the oracle
    x, bias, skip = _r(2, 3, 8), _r(8), _r(2, 3, 8)
    model, args = _model("BiasAdd", [("x", x), ("bias", bias), ("skip", skip)])
    _check(model, args, [x + bias + skip])


@pytest.mark.parametrize("a_shape,b_shape,attrs", [
    ((2, 4, 3, 5), (2, 4, 5, 6), dict(alpha=0.5)),
    ((2, 5, 3), (6, 5), dict(transA=1, transB=1, alpha=2.0)),
    ((3, 2, 4, 5), (2, 4, 5, 6), dict(transBatchA=1)),
    ((5, 2, 4, 3), (5, 2, 4, 6), dict(transBatchA=1, transA=1, transBatchB=1)),
    ((2, 4, 3, 5), (6, 2, 4, 5), dict(transBatchB=1, transB=1, alpha=0.25))])
def test_fused_matmul(a_shape, b_shape, attrs):
    _check(*_model("FusedMatMul", [("a", _r(*a_shape)), ("b", _r(*b_shape))], **attrs))


@pytest.mark.parametrize("activation,params,bias,z", [
    ("Relu", [], True, False), ("Tanh", [], False, False), ("Sigmoid", [], True, True),
    ("LeakyRelu", [0.1], True, False), ("Clip", [-0.5, 0.7], False, True),
    ("HardSigmoid", [0.3, 0.4], True, False)])
def test_fused_conv(activation, params, bias, z):
    inputs = [("x", _r(1, 3, 6, 6)), ("w", _r(4, 3, 3, 3)), ("b", _r(4) if bias else None),
              ("z", _r(1, 4, 6, 6) if z else None)]
    while inputs[-1][1] is None:
        inputs.pop()
    attrs = dict(activation_params=params) if params else {}
    _check(*_model("FusedConv", inputs, activation=activation, pads=[1, 1, 1, 1], **attrs))


@pytest.mark.parametrize("op", ["SparseAttention", "DecoderMaskedMultiHeadAttention",
                                "LongformerAttention"])
def test_unmapped_contrib_op_is_refused(op):
    model, _ = _model(op, [("x", _r(2, 3, 8))])
    with pytest.raises(UnsupportedOpError, match=f"{op} .node '{op.lower()}_0', domain {MS}"):
        tdag.from_onnx(model)


def test_optimised_tiny_bert(tmp_path):
    """A one-layer BERT exported by torch.onnx (legacy, opset 17) and optimised by
    onnxruntime's transformers optimizer (SkipLayerNormalization, com.microsoft Gelu; no
    Attention is fused from this export) imports and matches onnxruntime."""
    pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model

    from support.hf_encoders import one_layer_bert_file

    feeds = one_layer_bert_file(tmp_path / "bert.onnx")
    ids, mask = feeds["input_ids"], feeds["attention_mask"]
    optimised = optimize_model(str(tmp_path / "bert.onnx"), model_type="bert", num_heads=2,
                               hidden_size=32)
    assert {n.op_type for n in optimised.model.graph.node if n.domain == MS} >= {
        "SkipLayerNormalization", "Gelu"}
    optimised.save_model_to_file(str(tmp_path / "opt.onnx"))
    options = ort.SessionOptions()  # onnxruntime 1.32 fails to re-optimise this file itself
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(tmp_path / "opt.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    got = tdag.run(tdag.from_onnx(str(tmp_path / "opt.onnx")), ids, mask)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
