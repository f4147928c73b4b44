"""from_onnx: ONNX models canonicalized into tdag Programs, compared with onnxruntime.

(a) torch.onnx.export of small models with a dynamic batch axis, at two batch sizes;
(b) the round trip tdag.to_onnx -> from_onnx; (c) a table of single-op models built with
onnx.helper, opset variants included; (d) errors. Outputs match within rtol 1e-4 of the
output's scale (summation order differs from onnxruntime's kernels).
"""
from __future__ import annotations

import io
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import tdag
from tdag.canonicalize.onnx.load import symbol_name, tdag_name
from tdag.ir.names import NameMap

from support.torch_models import CNN, MLP

F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _close(actual, expected, rtol=1e-4):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if not np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_array_equal(actual, expected)
        return
    scale = max(1.0, float(np.abs(expected).max(initial=0.0)))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=rtol * scale)


def _run_both(model: onnx.ModelProto, *arrays):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(sess.get_inputs(), arrays)}
    expected = sess.run(None, feeds)
    prog = tdag.from_onnx(model)
    tdag.verify(prog)
    actual = tdag.run(prog, *[torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
    actual = actual if isinstance(actual, (list, tuple)) else [actual]
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        _close(a.numpy(), e)
    return prog


# -- (a) torch.onnx.export --------------------------------------------------------------------

def _legacy_export(model, x, opset):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (x,), buffer, dynamo=False, input_names=["x"],
                          output_names=["y"], opset_version=opset,
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return onnx.load_from_string(buffer.getvalue())


def _tiny_vit():
    from tdag.models import tiny_vit
    return tiny_vit()[0]


@pytest.mark.parametrize("make, shape, opset", [
    (MLP, (3, 16), 17),
    (CNN, (2, 3, 16, 16), 17),
    (CNN, (2, 3, 16, 16), 11),
    (_tiny_vit, (2, 3, 32, 32), 17),
    (_tiny_vit, (2, 3, 32, 32), 14),
], ids=["mlp", "cnn", "cnn-opset11", "tinyvit", "tinyvit-opset14"])
def test_torch_export_legacy(make, shape, opset):
    torch.manual_seed(0)
    model = _legacy_export(make(), torch.randn(*shape), opset)
    for batch in (2, 5):
        prog = _run_both(model, np.random.randn(batch, *shape[1:]).astype(np.float32))
    assert [str(t) for t in prog.input_types] == [f"f32[batch,{','.join(map(str, shape[1:]))}]"]


class _ShapeOps(torch.nn.Module):
    """arange/triu/einsum/cumsum/expand/argmax/interpolate/reflect pad over a dynamic
    sequence axis: the legacy exporter's Shape/Range/ConstantOfShape/Where chains."""

    def forward(self, x, img):
        b, s, _ = x.shape
        y = x + torch.arange(s).float()[None, :, None]
        scores = torch.einsum("bid,bjd->bij", y, y) - torch.triu(torch.ones(s, s), 1) * 1e4
        z = scores.softmax(-1) @ y
        z = z.cumsum(1) + z.expand(b, -1, -1)
        up = torch.nn.functional.interpolate(img, scale_factor=2, mode="nearest")
        up2 = torch.nn.functional.interpolate(img, size=(7, 9), mode="bilinear")
        padded = torch.nn.functional.pad(img, (1, 2, 0, 1), mode="reflect")
        return (z.reshape(b, -1), z.argmax(-1), up, up2, padded.sum(dim=(2, 3)),
                torch.clamp(y, -0.5, 0.5).flatten(1))


@pytest.mark.parametrize("opset", [14, 17])
def test_torch_export_shape_chains(opset):
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_ShapeOps(), (torch.randn(2, 5, 4), torch.randn(2, 3, 4, 4)), buffer,
                          dynamo=False, input_names=["x", "img"], opset_version=opset,
                          dynamic_axes={"x": {0: "batch", 1: "seq"}, "img": {0: "batch"}})
    model = onnx.load_from_string(buffer.getvalue())
    for batch, seq in ((2, 5), (3, 7)):
        prog = _run_both(model, _r(batch, seq, 4), _r(batch, 3, 4, 4))
    assert [str(t) for t in prog.graph.output_types] == [
        "f32[batch,4*seq]", "i64[batch,seq]", "f32[batch,3,8,8]", "f32[batch,3,7,9]",
        "f32[batch,3]", "f32[batch,4*seq]"]


def test_torch_export_dynamo_transformer_layer():
    """torch's TransformerEncoderLayer (the legacy exporter cannot trace it in torch 2.13)."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = torch.onnx.export(layer, (torch.randn(2, 5, 16),), dynamo=True, verbose=False,
                                     dynamic_shapes=({0: torch.export.Dim("batch")},))
    model = exported.model_proto
    for batch in (2, 7):
        prog = _run_both(model, np.random.randn(batch, 5, 16).astype(np.float32))
    assert str(prog.input_types[0]) == "f32[batch,5,16]"


def test_names_and_provenance():
    model = _legacy_export(_tiny_vit(), torch.randn(2, 3, 32, 32), 17)
    prog = tdag.from_onnx(model)
    graph = prog.graph
    params = {k for k, w in graph.weights.items() if w.kind is tdag.TensorKind.parameter}
    assert "patch_embed.weight" in params and "blocks.0.norm1.weight" in params
    scopes = {n.origin.scope for n in graph.nodes}
    assert "blocks.0.attn" in scopes
    assert all(n.origin.op.startswith("onnx.") for n in graph.nodes)


# -- (b) round trip ---------------------------------------------------------------------------

@pytest.mark.parametrize("lower", [True, False])
def test_round_trip_tiny_vit(lower):
    from tdag.models import tiny_vit
    model, args = tiny_vit()
    prog = tdag.from_torch(model, args, dynamic_batch=True)
    back = tdag.from_onnx(tdag.to_onnx(prog, lower=lower))
    tdag.verify(back)
    x = torch.randn(3, 3, 32, 32)
    _close(tdag.run(back, x).numpy(), tdag.run(prog, x).numpy())


def test_round_trip_traced_ops():
    from tdag import ops

    def fn(x, y):
        return ops.softmax(ops.matmul(x, ops.transpose(y, 1, 2)), -1) + ops.cumsum(x, 1)[:, :, :1]

    prog = tdag.trace(fn, tdag.TensorSpec(("b", 4, 6)), tdag.TensorSpec(("b", 4, 6)))
    back = tdag.from_onnx(tdag.to_onnx(prog))
    x, y = torch.randn(2, 4, 6), torch.randn(2, 4, 6)
    _close(tdag.run(back, x, y).numpy(), tdag.run(prog, x, y).numpy())


# -- (c) single ops ---------------------------------------------------------------------------

def _r(*shape, dtype=np.float32, low=None):
    rng = np.random.default_rng(sum(shape) + len(shape))
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-5, 6, size=shape).astype(dtype)
    x = rng.standard_normal(shape).astype(dtype)
    return np.abs(x) + 0.1 if low == "positive" else x


def _i(*values):
    return np.array(values, dtype=np.int64)


def _model(op, inputs, attrs=None, opset=17, consts=None, outputs=1, out_type=None, domain=""):
    """One node; ``inputs`` are graph inputs (arrays), ``consts`` initializers (name -> array,
    None for an omitted optional input), in the node's input order: inputs first."""
    consts = consts or {}
    names = [f"x{i}" for i in range(len(inputs))]
    names += [k if v is not None else "" for k, v in consts.items()]
    graph_inputs = [helper.make_tensor_value_info(
        f"x{i}", helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for i, a in enumerate(inputs)]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items() if v is not None]
    if out_type is None:
        out_type = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    graph = helper.make_graph([node], op, graph_inputs,
                              [helper.make_tensor_value_info(o, out_type, None) for o in outs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


X = _r(2, 3, 4)
IMG = _r(1, 2, 6, 6)
B = dict(out_type=TensorProto.BOOL)

CASES = {
    # elementwise
    **{op: (op, [X, _r(3, 4)]) for op in ("Add", "Sub", "Mul")},
    "Div": ("Div", [X, _r(4, low="positive")]),
    "Div-int": ("Div", [_r(6, dtype=np.int64), np.array([2, 3, 4, 5, 2, 3])]),
    "Pow": ("Pow", [_r(3, 4, low="positive"), _r(4)]),
    **{op: (op, [X]) for op in ("Neg", "Abs", "Exp", "Tanh", "Sigmoid", "Relu", "Erf", "Sin",
                                "Cos", "Floor", "Ceil", "Sign")},
    **{op: (op, [_r(2, 3, low="positive")]) for op in ("Sqrt", "Reciprocal", "Log")},
    "LeakyRelu": ("LeakyRelu", [X], dict(alpha=0.2)),
    "Elu": ("Elu", [X], dict(alpha=0.5)),
    "Gelu": ("Gelu", [X], {}, 20),
    "Gelu-tanh": ("Gelu", [X], dict(approximate="tanh"), 20),
    "HardSigmoid": ("HardSigmoid", [X]),
    **{op: (op, [X, _r(4)], {}, 17, None, 1, TensorProto.BOOL)
       for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")},
    "Not": ("Not", [X > 0]),
    "And": ("And", [X > 0, X < 0.5]),
    "Or": ("Or", [X > 0, X < -0.5]),
    "Where": ("Where", [X > 0, X, _r(4)], {}, 17, None, 1, F32),
    "Cast": ("Cast", [X * 10], dict(to=TensorProto.INT32), 17, None, 1, TensorProto.INT32),
    "Cast-bool": ("Cast", [X], dict(to=TensorProto.BOOL), 17, None, 1, TensorProto.BOOL),
    "Clip": ("Clip", [X], {}, 17, {"lo": np.float32(-0.5), "hi": np.float32(0.5)}),
    "Clip-min-only": ("Clip", [X], {}, 17, {"lo": np.float32(-0.5)}),
    "Clip-opset6": ("Clip", [X], dict(min=-0.3, max=0.2), 6),
    "Min": ("Min", [X, _r(4), _r(3, 4)]),
    "Max": ("Max", [X, _r(4)]),
    # contractions
    "MatMul": ("MatMul", [X, _r(4, 5)]),
    "MatMul-batched": ("MatMul", [_r(2, 1, 3, 4), _r(3, 4, 2)]),
    "Gemm": ("Gemm", [_r(3, 4), _r(5, 4)], dict(transB=1, alpha=0.5, beta=2.0), 17,
             {"c": _r(5)}),
    "Gemm-transA": ("Gemm", [_r(4, 3), _r(4, 5)], dict(transA=1)),
    "Einsum": ("Einsum", [_r(2, 3, 4), _r(2, 4, 5)], dict(equation="bij,bjk->bik"), 12),
    # conv and pooling
    "Conv": ("Conv", [IMG, _r(4, 2, 3, 3)], dict(pads=[1, 1, 1, 1], strides=[2, 2]), 17,
             {"b": _r(4)}),
    "Conv-asym-pads": ("Conv", [IMG, _r(4, 2, 3, 3)], dict(pads=[0, 1, 1, 2])),
    "Conv-same-upper": ("Conv", [IMG, _r(3, 2, 3, 3)], dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "Conv-groups-dil": ("Conv", [IMG, _r(4, 1, 3, 3)], dict(group=2, dilations=[2, 2])),
    "Conv1d": ("Conv", [_r(2, 3, 9), _r(4, 3, 3)], dict(pads=[1, 1])),
    "ConvTranspose": ("ConvTranspose", [IMG, _r(2, 3, 3, 3)],
                      dict(strides=[2, 2], pads=[1, 1, 1, 1]),
                      17, {"b": _r(3)}),
    "ConvTranspose-outpad": ("ConvTranspose", [IMG, _r(2, 2, 4, 4)],
                             dict(strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1])),
    "MaxPool": ("MaxPool", [IMG], dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    "MaxPool-ceil": ("MaxPool", [IMG], dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),
    "MaxPool-asym": ("MaxPool", [IMG], dict(kernel_shape=[2, 2], pads=[0, 0, 1, 1])),
    "AveragePool": ("AveragePool", [IMG], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "AveragePool-incl": ("AveragePool", [IMG], dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                                                     count_include_pad=1, strides=[2, 2])),
    "GlobalAveragePool": ("GlobalAveragePool", [IMG]),
    # norms and softmax
    "BatchNormalization": ("BatchNormalization", [IMG], dict(epsilon=1e-3), 15,
                           {"s": _r(2), "b": _r(2), "m": _r(2), "v": _r(2, low="positive")}),
    "LayerNormalization": ("LayerNormalization", [X], {}, 17, {"s": _r(4), "b": _r(4)}),
    "LayerNormalization-axis": ("LayerNormalization", [X], dict(axis=1, epsilon=1e-3), 17,
                                {"s": _r(3, 4)}),
    "InstanceNormalization": ("InstanceNormalization", [IMG], {}, 17, {"s": _r(2), "b": _r(2)}),
    "GroupNormalization-21": ("GroupNormalization", [_r(2, 4, 3, 3)], dict(num_groups=2), 21,
                              {"s": _r(4), "b": _r(4)}),
    "Softmax": ("Softmax", [X], dict(axis=1)),
    "Softmax-opset11": ("Softmax", [X], dict(axis=1), 11),
    "LogSoftmax": ("LogSoftmax", [X]),
    "LogSoftmax-opset11": ("LogSoftmax", [X], {}, 11),
    # reductions
    "ReduceSum": ("ReduceSum", [X], dict(keepdims=0), 17, {"axes": _i(1, -1)}),
    "ReduceSum-opset11": ("ReduceSum", [X], dict(axes=[1]), 11),
    "ReduceSum-all": ("ReduceSum", [X], {}, 17),
    "ReduceMean": ("ReduceMean", [X], dict(axes=[-1]), 17),
    "ReduceMean-18": ("ReduceMean", [X], {}, 18, {"axes": _i(0, 2)}),
    "ReduceMax": ("ReduceMax", [X], dict(axes=[1], keepdims=0), 13),
    "ReduceMin-18": ("ReduceMin", [X], dict(keepdims=0), 18, {"axes": _i(2)}),
    "ReduceProd": ("ReduceProd", [X], dict(axes=[0]), 13),
    "ArgMax": ("ArgMax", [X], dict(axis=1), 17, None, 1, I64),
    "ArgMax-nokeep": ("ArgMax", [X], dict(axis=-1, keepdims=0), 17, None, 1, I64),
    "CumSum": ("CumSum", [X], {}, 17, {"axis": np.int64(1)}),
    "CumSum-rev-excl": ("CumSum", [X], dict(reverse=1, exclusive=1), 17, {"axis": np.int64(2)}),
    # movement
    "Reshape": ("Reshape", [X], {}, 17, {"shape": _i(0, -1, 2)}),
    "Reshape-opset1": ("Reshape", [X], dict(shape=[6, 4]), 4),
    "Flatten": ("Flatten", [X], dict(axis=2)),
    "Transpose": ("Transpose", [X], dict(perm=[2, 0, 1])),
    "Transpose-default": ("Transpose", [X]),
    "Squeeze": ("Squeeze", [_r(2, 1, 3, 1)], {}, 17, {"axes": _i(1)}),
    "Squeeze-opset11": ("Squeeze", [_r(2, 1, 3, 1)], dict(axes=[-1]), 11),
    "Squeeze-all": ("Squeeze", [_r(2, 1, 3, 1)]),
    "Unsqueeze": ("Unsqueeze", [X], {}, 17, {"axes": _i(0, -1)}),
    "Unsqueeze-opset11": ("Unsqueeze", [X], dict(axes=[1]), 11),
    "Concat": ("Concat", [X, _r(2, 2, 4)], dict(axis=1)),
    "Split": ("Split", [_r(2, 6)], dict(axis=1), 17, {"split": _i(1, 2, 3)}, 3),
    "Split-equal": ("Split", [_r(2, 6)], dict(axis=1), 17, None, 2),
    "Split-opset11": ("Split", [_r(2, 6)], dict(axis=1, split=[4, 2]), 11, None, 2),
    "Split-num-outputs": ("Split", [_r(2, 7)], dict(axis=1, num_outputs=3), 18, None, 3),
    "Slice": ("Slice", [_r(4, 6)], {}, 17, {"s": _i(1, -4), "e": _i(3, 2 ** 62), "a": _i(0, 1)}),
    "Slice-steps": ("Slice", [_r(5, 7)], {}, 17, {"s": _i(0), "e": _i(7), "a": _i(1), "st": _i(2)}),
    "Slice-neg-step": ("Slice", [_r(5, 7)], {}, 17,
                       {"s": _i(-1), "e": _i(-2 ** 62), "a": _i(1), "st": _i(-2)}),
    "Slice-opset9": ("Slice", [_r(4, 6)], dict(starts=[1], ends=[3], axes=[1]), 9),
    "Gather": ("Gather", [X], dict(axis=1), 17, {"i": _i(2, 0, -1)}),
    "Gather-scalar": ("Gather", [X], dict(axis=2), 17, {"i": np.int64(1)}),
    "Gather-data-index": ("Gather", [_r(5, 3), np.array([[0, 4], [2, -1]])], {}),
    "Expand": ("Expand", [_r(3, 1)], {}, 17, {"shape": _i(2, 1, 4)}),
    "Tile": ("Tile", [_r(2, 3)], {}, 17, {"r": _i(2, 3)}),
    "Pad": ("Pad", [X], {}, 17, {"p": _i(0, 1, 2, 0, 0, 1), "v": np.float32(1.5)}),
    "Pad-reflect": ("Pad", [X], dict(mode="reflect"), 17, {"p": _i(0, 0, 2, 0, 0, 1)}),
    "Pad-edge": ("Pad", [X], dict(mode="edge"), 17, {"p": _i(0, 1, 1, 0, 1, 2)}),
    "Pad-axes": ("Pad", [X], {}, 18, {"p": _i(1, 2), "v": None, "axes": _i(-1)}),
    "Pad-opset2": ("Pad", [X], dict(pads=[0, 1, 0, 0, 1, 0], value=2.0), 2),
    "Identity": ("Identity", [X]),
    "Dropout": ("Dropout", [X], {}, 13),
    "Trilu": ("Trilu", [_r(3, 4)]),
    "Trilu-lower-k": ("Trilu", [_r(2, 4, 4)], dict(upper=0), 17, {"k": np.int64(-1)}),
    # resize
    "Resize-nearest": ("Resize", [IMG], dict(mode="nearest"), 13,
                       {"roi": None, "sc": np.array([1, 1, 2, 2], np.float32)}),
    "Resize-nearest-torch": ("Resize", [IMG], dict(mode="nearest", nearest_mode="floor",
                             coordinate_transformation_mode="asymmetric"), 13,
                             {"roi": None, "sc": np.array([1, 1, 1.5, 2], np.float32)}),
    "Resize-linear": ("Resize", [IMG], dict(mode="linear"), 13,
                      {"roi": None, "sc": np.array([1, 1, 2, 0.5], np.float32)}),
    "Resize-linear-align": ("Resize", [IMG], dict(mode="linear",
                            coordinate_transformation_mode="align_corners"), 13,
                            {"roi": None, "sc": None, "sz": _i(1, 2, 9, 4)}),
    "Resize-linear-sizes": ("Resize", [IMG], dict(mode="linear",
                            coordinate_transformation_mode="pytorch_half_pixel"), 13,
                            {"roi": None, "sc": None, "sz": _i(1, 2, 11, 3)}),
    # LRN (AlexNet, Inception-v1): an odd and an even window (ONNX centres it differently)
    "LRN": ("LRN", [_r(2, 7, 3, 3)], dict(size=5, alpha=1e-2, beta=0.75, bias=2.0)),
    # Inception-v1's pool: asymmetric pads that count only the real cells
    "AveragePool-asymmetric": ("AveragePool", [IMG], dict(kernel_shape=[3, 3],
                               strides=[2, 2], pads=[0, 0, 1, 1])),
    "AveragePool-asymmetric-ceil": ("AveragePool", [_r(1, 2, 7, 7)], dict(
        kernel_shape=[3, 3], strides=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1)),
}


def test_lrn_even_window_follows_the_spec():
    """onnxruntime and onnx's reference evaluator take odd LRN sizes only; the operator's
    definition covers an even one: channels [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    x, size, alpha, beta, bias = _r(1, 6, 4), 4, 0.5, 0.6, 1.0
    square_sum = np.stack([(x[:, max(0, c - 1):c + 3] ** 2).sum(1) for c in range(6)], 1)
    expected = x / (bias + alpha / size * square_sum) ** beta
    model = _model("LRN", [x], dict(size=size, alpha=alpha, beta=beta))
    _close(tdag.run(tdag.from_onnx(model), torch.from_numpy(x)), expected)


@pytest.mark.parametrize("case", sorted(CASES))
def test_single_op(case):
    op, inputs, *rest = CASES[case]
    attrs, opset, consts, outputs, out_type = (rest + [{}, 17, None, 1, None][len(rest):])
    _run_both(_model(op, inputs, attrs, opset, consts, outputs, out_type), *inputs)


def _graph_model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def test_shape_values_fold_to_symbolic_shapes():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape; ConstantOfShape, Range, Expand."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
        helper.make_node("Mul", ["n", "two"], ["n2"]),
        helper.make_node("Range", ["zero", "n2", "one"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=F32),
        helper.make_node("Unsqueeze", ["n2", "ax0"], ["n2v"]),
        helper.make_node("ConstantOfShape", ["n2v"], ["ones"],
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Add", ["rf", "ones"], ["r1"]),
        helper.make_node("Concat", ["b1", "n2v"], ["bn"], axis=0),
        helper.make_node("Expand", ["r1", "bn"], ["grid"]),
    ]
    consts = [numpy_helper.from_array(np.int64(v), k) for k, v in
              (("zero", 0), ("one", 1), ("two", 2))]
    consts += [numpy_helper.from_array(_i(0), "ax0"), numpy_helper.from_array(_i(-1), "minus1")]
    model = _graph_model(nodes, [helper.make_tensor_value_info("x", F32, ["batch size", 3, 4])],
                         [helper.make_tensor_value_info("flat", F32, None),
                          helper.make_tensor_value_info("grid", F32, None)], consts)
    for batch in (1, 3):
        prog = _run_both(model, _r(batch, 3, 4))
    assert [str(t) for t in prog.graph.output_types] == ["f32[batch_size,12]", "f32[batch_size,6]"]


def test_name_sanitising_is_stable():
    names = NameMap(sanitize=tdag_name)
    assert names("/encoder/Add_output_0") == "encoder_Add_output_0"
    assert names("onnx::MatMul_12") == "onnx::MatMul_12"
    assert names("a b") == "a_b" and names("a/b") == "a_b_1" and names("a b") == "a_b"
    assert symbol_name("batch size") == "batch_size" and symbol_name("2n") == "d2n"


# -- (d) errors -------------------------------------------------------------------------------

def test_unsupported_ops_are_listed_together():
    nodes = [helper.make_node("Bernoulli", ["x"], ["nz"], name="find"),
             helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("FusedGemm", ["r", "r"], ["y"], name="fused", domain="com.microsoft"),
             helper.make_node("RandomUniformLike", ["x"], ["u"], name="uniq")]
    model = _graph_model(nodes, [helper.make_tensor_value_info("x", F32, [4])],
                         [helper.make_tensor_value_info("y", F32, None),
                          helper.make_tensor_value_info("nz", F32, None),
                          helper.make_tensor_value_info("u", F32, None)])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(tdag.UnsupportedOpError) as info:
        tdag.from_onnx(model)
    message = str(info.value)
    for expected in ("Bernoulli", "'find'", "FusedGemm", "'fused'", "com.microsoft",
                     "RandomUniformLike", "'uniq'"):
        assert expected in message
    assert len(info.value.problems) == 3


def test_unsupported_attribute_is_collected():
    # align_corners over a fractional output length (6 * 1.3): the ONNX reference and
    # onnxruntime disagree, so tdag refuses
    model = _model("Resize", [IMG], dict(mode="linear", coordinate_transformation_mode=
                                         "align_corners"), 13,
                   {"roi": None, "sc": np.array([1, 1, 1.3, 1.3], np.float32)})
    with pytest.raises(tdag.UnsupportedOpError, match="align_corners"):
        tdag.from_onnx(model)


def _model_with_external_data(folder, location):
    weight = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    model = _graph_model([helper.make_node("Add", ["x", "w"], ["y"])],
                         [helper.make_tensor_value_info("x", F32, [4])],
                         [helper.make_tensor_value_info("y", F32, [4])], [weight])
    path = os.path.join(folder, "m.onnx")
    onnx.save(model, path, save_as_external_data=True, location="w.bin",
              size_threshold=0, all_tensors_to_one_file=True)
    if location != "w.bin":
        model = onnx.load(path, load_external_data=False)
        for entry in model.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = location
        onnx.save(model, path)
    return path


def test_external_data_inside_the_folder_loads(tmp_path):
    prog = tdag.from_onnx(_model_with_external_data(str(tmp_path), "w.bin"))
    out = tdag.run(prog, torch.ones(4))
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("location", ["../w.bin", "sub/../../w.bin", "/etc/passwd"])
def test_external_data_escaping_the_folder_is_refused(tmp_path, location):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "w.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    with pytest.raises(tdag.InvalidModelError, match="outside the model's folder"):
        tdag.from_onnx(_model_with_external_data(str(folder), location))


def test_external_data_through_a_link_is_refused(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (tmp_path / "secret.bin").write_bytes(np.arange(4, dtype=np.float32).tobytes())
    os.symlink(tmp_path / "secret.bin", folder / "link.bin")
    with pytest.raises(tdag.InvalidModelError, match="outside"):
        tdag.from_onnx(_model_with_external_data(str(folder), "link.bin"))


def test_damaged_file_is_a_file_format_error(tmp_path):
    good = _model("Relu", [X]).SerializeToString()
    for i, data in enumerate([b"\x08\x07garbage\xff\xff\xff", good[: len(good) // 2], b""]):
        path = tmp_path / f"bad{i}.onnx"
        path.write_bytes(data)
        with pytest.raises(tdag.FileFormatError):
            tdag.from_onnx(str(path))


def test_malformed_model_is_an_invalid_model_error():
    nodes = [helper.make_node("Relu", ["nowhere"], ["y"])]
    model = _graph_model(nodes, [helper.make_tensor_value_info("x", F32, [4])],
                         [helper.make_tensor_value_info("y", F32, [4])])
    with pytest.raises(tdag.InvalidModelError):
        tdag.from_onnx(model)
    with pytest.raises(tdag.InvalidModelError):
        tdag.from_onnx(42)


def test_cli_reads_onnx(tmp_path, capsys):
    from tdag.cli import main
    path = tmp_path / "m.onnx"
    onnx.save(_model("Relu", [X]), str(path))
    assert main(["verify", str(path)]) == 0
    assert "ok:" in capsys.readouterr().out


# -- control flow -----------------------------------------------------------------------------

def _if_model(cond_nodes, cond_inits=()):
    """y = (h * w if cond else h - x) + h, with h = relu(x); the branches read outer values."""
    then_g = helper.make_graph([helper.make_node("Mul", ["h", "w"], ["t_out"])], "then", [],
                               [helper.make_tensor_value_info("t_out", F32, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["h", "x"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", F32, None)])
    nodes = [helper.make_node("Relu", ["x"], ["h"]), *cond_nodes,
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["y", "h"], ["z"])]
    inits = [numpy_helper.from_array(np.arange(4, dtype=np.float32), "w"), *cond_inits]
    return _graph_model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 4])],
                        [helper.make_tensor_value_info("z", F32, None)], inits)


def test_if_becomes_a_controller():
    model = _if_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                       helper.make_node("Greater", ["s", "zero"], ["c"])],
                      [numpy_helper.from_array(np.float32(0), "zero")])
    for x in (np.abs(_r(3, 4)), -np.abs(_r(2, 4))):
        prog = _run_both(model, x)
    assert any(isinstance(step, tdag.If) for step in prog.main.steps)


def test_if_on_a_shape_is_inlined():
    model = _if_model([helper.make_node("Shape", ["x"], ["s"]),
                       helper.make_node("Gather", ["s", "one"], ["four"], axis=0),
                       helper.make_node("Equal", ["four", "one"], ["c"])],
                      [numpy_helper.from_array(np.int64(1), "one")])
    prog = _run_both(model, _r(3, 4))
    assert len(prog.graphs) == 1


def test_loop_becomes_a_controller():
    """Three iterations of acc += x (x read from the outer graph), scanning acc * i."""
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "x"], ["acc_out"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F32),
         helper.make_node("Mul", ["acc_out", "fi"], ["scan"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F32, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F32, None),
         helper.make_tensor_value_info("scan", F32, None)])
    nodes = [helper.make_node("Relu", ["x"], ["x0"]),
             helper.make_node("Loop", ["M", "", "x0"], ["acc", "scans"], body=body)]
    model = _graph_model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 4])],
                         [helper.make_tensor_value_info("acc", F32, None),
                          helper.make_tensor_value_info("scans", F32, None)],
                         [numpy_helper.from_array(np.int64(3), "M")])
    prog = _run_both(model, _r(2, 4))
    loop = next(step for step in prog.main.steps if isinstance(step, tdag.Loop))
    assert loop.count == 3 and loop.scanned == 1


def test_if_round_trip():
    model = _if_model([helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                       helper.make_node("Greater", ["s", "zero"], ["c"])],
                      [numpy_helper.from_array(np.float32(0), "zero")])
    prog = tdag.from_onnx(model)
    back = tdag.from_onnx(tdag.to_onnx(prog))
    tdag.verify(back)
    for x in (torch.ones(3, 4), -torch.ones(2, 4)):
        _close(tdag.run(back, x).numpy(), tdag.run(prog, x).numpy())


def test_while_loop_with_a_condition():
    """acc *= 2 while sum(acc) < 50 (the condition a [1]-shaped bool, as exporters write it)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc_in", "two"], ["acc_out"]),
         helper.make_node("ReduceSum", ["acc_out"], ["s"], keepdims=1),
         helper.make_node("Less", ["s", "limit"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", I64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F32, None)],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, None),
         helper.make_tensor_value_info("acc_out", F32, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s0"], keepdims=0),
             helper.make_node("Less", ["s0", "limit0"], ["go"]),
             helper.make_node("Loop", ["", "go", "x"], ["acc"], body=body)]
    inits = [numpy_helper.from_array(np.float32(2), "two"),
             numpy_helper.from_array(np.array([50.0], np.float32), "limit"),
             numpy_helper.from_array(np.float32(50), "limit0")]
    model = _graph_model(nodes, [helper.make_tensor_value_info("x", F32, [4])],
                         [helper.make_tensor_value_info("acc", F32, None)], inits)
    for x in (np.full(4, 0.5, np.float32), np.full(4, 20.0, np.float32)):
        _run_both(model, x)


def test_outputs_that_are_inputs_shapes_or_initializers():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Relu", ["x"], ["r"])]
    outputs = [helper.make_tensor_value_info(name, t, None)
               for name, t in (("x", F32), ("s", I64), ("w", F32), ("r", F32))]
    model = _graph_model(nodes, [helper.make_tensor_value_info("x", F32, ["n", 4])], outputs,
                         [numpy_helper.from_array(np.ones(3, np.float32), "w")])
    for n in (1, 3):
        _run_both(model, _r(n, 4))
