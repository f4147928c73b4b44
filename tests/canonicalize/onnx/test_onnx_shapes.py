"""ONNX graphs that compute their own shapes: ``Shape`` -> ``Gather``/``Slice`` -> integer
arithmetic -> ``Concat`` -> ``Reshape``/``Expand``/``ConstantOfShape``/``Range``, on inputs
whose sizes are symbols (``dim_param``). from_onnx follows those values as Dims
(canonicalize/onnx/values.py), so each graph imports with its symbols kept in the types (no
fresh run-time size), and the Program matches onnxruntime on the original model at two
different sizes through tdag.run, tdag.to_torch and tdag.to_onnx.
"""
from __future__ import annotations


import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as T
from onnx import helper

import tdag
from tdag.canonicalize.onnx.values import Known, cast_known, mod, trunc_div
from tdag.ir.op import Op
from tdag.ir.symbols import dims_equal, symbol
from tdag.ir.types import DType

from support.guards import run_onnx

SIZES = ({"batch": 2, "seq": 3}, {"batch": 3, "seq": 5})  # two sizes each graph runs at


def _ints(name: str, values) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, T.INT64, [len(values)], list(values)))


def _scalar(name: str, value: int) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name],
                            value=helper.make_tensor(name, T.INT64, [], [value]))


def _dims(shape_name: str, *axes: int) -> list:
    """``Shape(x)[axis]`` as a 1-d value ``{shape_name}{axis}``, one Gather per axis."""
    nodes = []
    for axis in axes:
        nodes += [_ints(f"i{axis}", [axis]),
                  helper.make_node("Gather", [shape_name, f"i{axis}"], [f"{shape_name}{axis}"])]
    return nodes


def _model(nodes: list, inputs: list, output: tuple) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "shapes", inputs,
                              [helper.make_tensor_value_info(*output)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


X = helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", 12])


def heads() -> onnx.ModelProto:
    """Split the last axis into 3 heads and back: [b, n, 3, -1] then [b, n, 3 * 4]."""
    return _model([
        helper.make_node("Shape", ["x"], ["s"]), *_dims("s", 0, 1),
        _ints("three", [3]), _ints("four", [4]), _ints("minus", [-1]),
        helper.make_node("Concat", ["s0", "s1", "three", "minus"], ["split"], axis=0),
        helper.make_node("Reshape", ["x", "split"], ["h"]),
        helper.make_node("Transpose", ["h"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Transpose", ["r"], ["u"], perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["three", "four"], ["width"]),
        helper.make_node("Concat", ["s0", "s1", "width"], ["merge"], axis=0),
        helper.make_node("Reshape", ["u", "merge"], ["y"]),
    ], [X], ("y", T.FLOAT, [None] * 3))


def flatten_by_product() -> onnx.ModelProto:
    """Flatten all but the first axis with the product of the shape's tail (ReduceProd)."""
    return _model([
        helper.make_node("Shape", ["x"], ["s"]), _ints("one", [1]), _ints("zero", [0]),
        _ints("end", [2 ** 62]),
        helper.make_node("Slice", ["s", "one", "end"], ["tail"]),
        helper.make_node("ReduceProd", ["tail"], ["n"], keepdims=1),
        helper.make_node("Slice", ["s", "zero", "one"], ["head"]),
        helper.make_node("Concat", ["head", "n"], ["flat"], axis=0),
        helper.make_node("Reshape", ["x", "flat"], ["y"]),
    ], [X], ("y", T.FLOAT, [None] * 2))


def positions() -> onnx.ModelProto:
    """GPT-2's position ids: Range(0, seq) expanded to [batch, seq], added to a row sum."""
    return _model([
        helper.make_node("Shape", ["x"], ["s"]), *_dims("s", 0, 1),
        _scalar("zero", 0), _scalar("step", 1), _ints("axes0", [0]),
        helper.make_node("Squeeze", ["s1", "axes0"], ["n"]),
        helper.make_node("Range", ["zero", "n", "step"], ["r"]),
        helper.make_node("Unsqueeze", ["r", "axes0"], ["row"]),
        helper.make_node("Concat", ["s0", "s1"], ["bn"], axis=0),
        helper.make_node("Expand", ["row", "bn"], ["ids"]),
        helper.make_node("Cast", ["ids"], ["f"], to=T.FLOAT),
        _ints("last", [-1]),
        helper.make_node("ReduceSum", ["x", "last"], ["sums"], keepdims=0),
        helper.make_node("Add", ["sums", "f"], ["y"]),
    ], [X], ("y", T.FLOAT, [None] * 2))


def arithmetic() -> onnx.ModelProto:
    """Size / batch, seq % seq, max and min, a decided Where and ConstantOfShape: the
    elements per sample as a Reshape target, zeros of [batch, seq] added."""
    return _model([
        helper.make_node("Shape", ["x"], ["s"]), *_dims("s", 0, 1),
        helper.make_node("Size", ["x"], ["size"]),
        helper.make_node("Div", ["size", "s0"], ["per"]),  # seq * 12 (0-d / 1-d)
        helper.make_node("Mod", ["s1", "s1"], ["zero"]),
        helper.make_node("Equal", ["zero", "zero"], ["yes"]),
        helper.make_node("Max", ["s0", "zero"], ["b"]),
        helper.make_node("Min", ["per", "per"], ["p"]),
        helper.make_node("Where", ["yes", "b", "zero"], ["rows"]),
        helper.make_node("Concat", ["rows", "p"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Concat", ["s0", "s1"], ["bn"], axis=0),
        helper.make_node("ConstantOfShape", ["bn"], ["zeros"],
                         value=helper.make_tensor("v", T.FLOAT, [1], [0.5])),
        _ints("twelve", [12]), _ints("two", [2]),
        helper.make_node("Unsqueeze", ["zeros", "two"], ["z3"]),
        helper.make_node("Concat", ["s0", "s1", "twelve"], ["back"], axis=0),
        helper.make_node("Reshape", ["flat", "back"], ["x3"]),
        helper.make_node("Add", ["x3", "z3"], ["y"]),
    ], [X], ("y", T.FLOAT, [None] * 3))


GRAPHS = {"heads": (heads, "f32[batch,seq,12]"),
          "flatten_by_product": (flatten_by_product, "f32[batch,12*seq]"),
          "positions": (positions, "f32[batch,seq]"),
          "arithmetic": (arithmetic, "f32[batch,seq,12]")}


def _fresh_sizes(prog) -> list:
    """The nodes that turn a value read from data into a size (ops.arange_of)."""
    return [n for g in prog.graphs.values() for n in g.nodes if n.op is Op.arange]


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_symbolic_shape_arithmetic_matches_onnxruntime(name):
    build, out_type = GRAPHS[name]
    model = build()
    prog = tdag.from_onnx(model)
    text = str(prog)
    print(text)
    assert [str(t) for t in prog.input_types] == ["f32[batch,seq,12]"]
    assert [str(t) for t in prog.graph.output_types] == [out_type]
    assert not _fresh_sizes(prog), "a size the graph computes became a run-time one"
    module, exported = tdag.to_torch(prog), tdag.to_onnx(prog)
    rng = np.random.default_rng(0)
    for sizes in SIZES:
        x = rng.standard_normal((sizes["batch"], sizes["seq"], 12)).astype(np.float32)
        expected = torch.from_numpy(_ort(model, x))
        for how, got in (("run", lambda t: tdag.run(prog, t)), ("to_torch", module),
                         ("to_onnx", lambda t: run_onnx(exported, t))):
            actual = got(torch.from_numpy(x))
            assert actual.shape == expected.shape, (how, sizes, actual.shape)
            torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5,
                                       msg=f"{name} through {how} at {sizes}")


# -- the integer arithmetic on Dims, against numpy's (ONNX's) on ints ---------------------------

PAIRS = [(a, b) for a in (-7, -6, -1, 0, 1, 5, 6, 7) for b in (-3, -2, 1, 2, 3)]


@pytest.mark.parametrize("a,b", PAIRS)
def test_integer_division_and_mod_match_onnx(a, b):
    # ONNX Div on integers truncates; Mod takes the divisor's sign, fmod=1 the dividend's
    assert trunc_div(a, b) == int(np.trunc(a / b))
    assert mod(a, b, truncated=False) == int(np.mod(a, b))
    assert mod(a, b, truncated=True) == int(np.fmod(a, b))


def test_symbolic_division_keeps_symbols_or_declines():
    s, t = symbol("s"), symbol("t")
    assert dims_equal(trunc_div(12 * s, 3), 4 * s)
    assert dims_equal(trunc_div(-2 * s, 2), -s)
    assert mod(s, s, truncated=False) == 0
    assert dims_equal(mod(-3 * s, 3 * s, truncated=False), 0)
    # where the sign is open (s - t) or the divisor may be 0, the tensors compute it
    assert trunc_div(s - t, 2) is None and trunc_div(s, 0) is None
    assert mod(s - t, 2, truncated=False) is None


# -- ONNX function bodies (*_expanded conformance cases) at a symbolic batch ---------------------

# case -> (the generator module, the inputs whose first axis becomes the symbol ``batch``)
EXPANDED = {
    "test_attention_3d_expanded": ("attention", (0, 1, 2)),
    "test_attention_4d_gqa_expanded": ("attention", (0, 1, 2)),
    "test_layer_normalization_3d_axis1_epsilon_expanded": ("layernormalization", (0,)),
    "test_rotary_embedding_expanded": ("rotaryembedding", (0, 3)),
    "test_group_normalization_example_expanded": ("groupnormalization", (0,)),
    "test_sce_mean_expanded": ("softmax_cross_entropy_loss", (0, 1)),
    "test_nllloss_NCd1_weight_expanded": ("negativeloglikelihoodloss", (0, 1)),
}


def _batch_symbolic(model: onnx.ModelProto, inputs) -> onnx.ModelProto:
    """The model with the first axis of ``inputs`` named ``batch``, its outputs unshaped
    and its value_info dropped (they name the case's sizes)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for k in inputs:
        dim = out.graph.input[k].type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "batch"
    for value in out.graph.output:
        value.type.tensor_type.ClearField("shape")
    del out.graph.value_info[:]
    return out


@pytest.mark.parametrize("name", sorted(EXPANDED))
def test_expanded_function_body_at_a_symbolic_batch(name):
    from support.onnx_cases import node_cases  # noqa: PLC0415  (imports the generators it names)
    module_name, batched = EXPANDED[name]
    model, ins, _ = node_cases((name,), modules=(module_name,))[name]
    model = _batch_symbolic(model, batched)
    prog = tdag.from_onnx(model)
    assert all(prog.input_types[k].shape[0] == symbol("batch") for k in batched)
    assert not _fresh_sizes(prog), "a size the graph computes became a run-time one"
    module, exported = tdag.to_torch(prog), tdag.to_onnx(prog)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [v.name for v in model.graph.input]
    for grow in (0, 1):  # the case's batch, and one more sample (its first, again)
        args = [np.concatenate([a, a[:grow]]) if k in batched else a
                for k, a in enumerate(ins)]
        expected = session.run(None, dict(zip(names, args)))
        tensors = [torch.from_numpy(np.array(a)) for a in args]
        for how, got in (("run", lambda *t: tdag.run(prog, *t)), ("to_torch", module),
                         ("to_onnx", lambda *t: run_onnx(exported, *t))):
            actual = got(*tensors)
            actual = list(actual) if isinstance(actual, (tuple, list)) else [actual]
            for a, e in zip(actual, expected):
                torch.testing.assert_close(a, torch.from_numpy(np.asarray(e)), rtol=1e-4,
                                           atol=1e-5, msg=f"{name} through {how}")


def test_a_cast_of_a_shape_value_folds_only_where_onnx_would_not_wrap():
    s = symbol("s")
    sizes = Known(np.array([s, 0, 300], dtype=object), DType.i64)
    assert cast_known(sizes, DType.bool).dims() == [True, False, True]
    assert cast_known(sizes, DType.i32).dims() == [s, 0, 300]
    assert cast_known(sizes, DType.i8) is None  # 300 wraps: the tensors cast it
    flags = Known(np.array([True, False], dtype=object), DType.bool)
    assert cast_known(flags, DType.i64).dims() == [1, 0]
    assert cast_known(Known(np.array([s - symbol("t")], dtype=object), DType.i64),
                      DType.bool) is None  # s - t may be 0


# -- a shape part known, part read from data ------------------------------------------------------

def partly_known() -> onnx.ModelProto:
    """[batch] beside a size k given at run time: Reshape to [batch, k, -1], ConstantOfShape
    and Expand to [batch, k], summed per sample; batch stays the symbol (also where Gather
    takes it back out of [batch, k]), k and the -1 become fresh sizes."""
    k = helper.make_tensor_value_info("k", T.INT64, [1])
    return _model([
        helper.make_node("Shape", ["x"], ["s"]), _ints("zero", [0]), _ints("one", [1]),
        helper.make_node("Slice", ["s", "zero", "one"], ["b"]),
        _ints("minus", [-1]),
        helper.make_node("Concat", ["b", "k", "minus"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Concat", ["b", "k"], ["bk"], axis=0),
        helper.make_node("ConstantOfShape", ["bk"], ["c"],
                         value=helper.make_tensor("v", T.FLOAT, [1], [2.0])),
        _ints("axes", [1, 2]),
        helper.make_node("ReduceSum", ["x", "axes"], ["col"], keepdims=1),
        _ints("last", [2]),
        helper.make_node("Squeeze", ["col", "last"], ["col2"]),
        helper.make_node("Expand", ["col2", "bk"], ["e"]),
        helper.make_node("Add", ["c", "e"], ["ce"]),  # one fresh size for k in both
        helper.make_node("ReduceSum", ["r", "axes"], ["rs"], keepdims=0),
        helper.make_node("ReduceSum", ["ce", "one"], ["cs"], keepdims=0),
        helper.make_node("Gather", ["bk", "zero"], ["b0"]),  # batch: known again
        helper.make_node("Concat", ["b0", "minus"], ["rows"], axis=0),
        helper.make_node("Reshape", ["x", "rows"], ["flat"]),
        helper.make_node("ReduceSum", ["flat", "one"], ["fs"], keepdims=0),
        helper.make_node("Add", ["rs", "cs"], ["rc"]),
        helper.make_node("Add", ["rc", "fs"], ["y"]),
    ], [X, k], ("y", T.FLOAT, [None]))


def test_a_shape_partly_read_from_data_keeps_the_known_sizes():
    model = partly_known()
    prog = tdag.from_onnx(model)
    assert str(prog.graph.output_types[0]) == "f32[batch]"
    assert len(_fresh_sizes(prog)) == 3  # k (shared by ConstantOfShape and Expand), k and -1
    module, exported = tdag.to_torch(prog), tdag.to_onnx(prog)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for sizes, k in ((SIZES[0], 4), (SIZES[1], 6)):  # 12 * seq split as k by the rest
        x = rng.standard_normal((sizes["batch"], sizes["seq"], 12)).astype(np.float32)
        kk = np.array([k], dtype=np.int64)
        expected = torch.from_numpy(session.run(None, {"x": x, "k": kk})[0])
        args = (torch.from_numpy(x), torch.from_numpy(kk))
        for how, got in (("run", lambda *t: tdag.run(prog, *t)), ("to_torch", module),
                         ("to_onnx", lambda *t: run_onnx(exported, *t))):
            torch.testing.assert_close(got(*args), expected, rtol=1e-5, atol=1e-5,
                                       msg=f"through {how} at {sizes}, k={k}")
