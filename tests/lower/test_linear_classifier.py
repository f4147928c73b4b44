"""ai.onnx.ml's LinearClassifier keeps onnxruntime's native op when re-emitted.

The importer writes its label (the first highest score's, NaN skipped as onnxruntime scans)
and its transformed scores as compositions; lowering makes them the linear_classifier
kernel's two parts, which to_onnx writes back as one LinearClassifier (a transform the kernel
does not take stays a composition after it). Each file is checked against onnxruntime on the
original, labels exactly and scores to 1e-6, through tdag.run, to_onnx, to_torch and to_jax,
on rows that make every score NaN, only the first score NaN (inf times a zero weight), and
tie two classes."""
from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import tdag
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.symbols import symbol
from tdag.ops.builder import Builder
from tdag.ops.ml import linear_label, linear_scores

TOL = 1e-6
# classes 1 and 2 weigh alike (a tie: the first wins); class 0 ignores feature 2
WEIGHT = np.array([[0.5, -1.0, 0.0], [1.5, 0.25, -0.5], [1.5, 0.25, -0.5], [-2.0, 0.75, 1.0]],
                  np.float32)
BIAS = [0.1, -0.2, -0.2, 0.3]
LABELS = [7, 3, 5, 11]


def _model(transform: str):
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
                            coefficients=WEIGHT.ravel().tolist(), intercepts=BIAS,
                            classlabels_ints=LABELS, post_transform=transform)
    graph = helper.make_graph([node], "linear", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])], [
        helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    model.ir_version = 8
    return model


def _rows() -> np.ndarray:
    x = np.random.default_rng(7).standard_normal((9, 3)).astype(np.float32)
    x[1, 0] = np.nan  # every score NaN: label 7 (column 0 kept)
    x[2, 2] = np.inf  # column 0 is inf * 0 = NaN, the others +-inf: still column 0
    x[3, 2] = -np.inf
    return x


def _ort(model, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def _same(got, expected, what: str) -> None:
    for g, e in zip(got, expected):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape, (what, g.shape, e.shape)
        if e.dtype.kind == "i":
            np.testing.assert_array_equal(g.astype(np.int64), e, err_msg=what)
        else:
            np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL, err_msg=what)


def _numpy(out) -> list[np.ndarray]:
    return [np.asarray(t.detach().numpy() if isinstance(t, torch.Tensor) else t) for t in out]


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO"])
def test_linear_classifier_is_one_native_op(transform):
    model, x = _model(transform), _rows()
    expected = _ort(model, x)
    prog = tdag.from_onnx(model)
    kernels = [n.spec for n in tdag.lower.lower(prog).graph.nodes
               if n.op is Op.linear_classifier]
    assert tuple(LABELS) in [s.labels for s in kernels], kernels  # the label part, always
    emitted = tdag.to_onnx(prog)
    kinds = [n.op_type for n in emitted.graph.node]
    assert kinds.count("LinearClassifier") == 1 and "ArgMax" not in kinds, kinds
    if transform in ("LOGISTIC", "SOFTMAX"):  # the kernel's transforms: nothing else
        assert kinds == ["LinearClassifier"], kinds
    _same(_ort(emitted, x), expected, "to_onnx")
    _same(_numpy(tdag.run(prog, torch.from_numpy(x))), expected, "tdag.run")
    _same(_numpy(tdag.to_torch(prog)(torch.from_numpy(x))), expected, "to_torch")
    pytest.importorskip("jax")
    _same(_numpy(tdag.to_jax(prog)(x)), expected, "to_jax")


def test_logistic_regression_file_is_linear_classifier_and_normalizer():
    """skl2onnx's LogisticRegression (LinearClassifier, Cast, Normalizer) re-emitted: the
    LinearClassifier and the Normalizer, nothing of the argmax or the softmax."""
    skl2onnx = pytest.importorskip("skl2onnx")
    from sklearn import linear_model

    rng = np.random.default_rng(21)
    fit = rng.standard_normal((80, 3)).astype(np.float32)
    y = np.digitize(fit[:, 1], [-0.5, 0.5]) * 2 + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = skl2onnx.to_onnx(linear_model.LogisticRegression().fit(fit, y), fit[:1],
                                 target_opset={"": 17, "ai.onnx.ml": 3},
                                 options={"zipmap": False})
    emitted = tdag.to_onnx(tdag.from_onnx(model))
    assert [n.op_type for n in emitted.graph.node] == ["LinearClassifier", "Normalizer"]
    _same(_ort(emitted, _rows()), _ort(model, _rows()), "LogisticRegression")


def test_a_weight_that_is_not_constant_is_written_as_onnx_ops():
    """A traced classifier whose weight and bias are inputs lowers to the same kernel;
    to_onnx writes it as ONNX ops (LinearClassifier takes them as attributes), NaN rules
    kept."""
    builder = Builder()
    with builder.active():
        x, w, b = (builder.input(n, tdag.TensorType(s, tdag.DType.f32)) for n, s in
                   (("x", (symbol("n"), 3)), ("w", (3, 4)), ("b", (4,))))
        outs = [linear_label(x, w, b, tuple(LABELS)), linear_scores(x, w, b, "LOGISTIC")]
    prog = Program.from_tdag(builder.build(outs))
    assert [n.op for n in tdag.lower.lower(prog).graph.nodes] == [Op.linear_classifier] * 2
    emitted = tdag.to_onnx(prog)
    assert "LinearClassifier" not in {n.op_type for n in emitted.graph.node}
    args = (_rows(), WEIGHT.T.copy(), np.array(BIAS, np.float32))
    session = ort.InferenceSession(emitted.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip([i.name for i in session.get_inputs()], args)))
    _same(got, _ort(_model("LOGISTIC"), args[0]), "to_onnx of a traced classifier")
