"""Shape arithmetic as exporters write it, each pattern in a graph of a few nodes (the real
files that bring them are in test_exported_files.py): ``Range(past, past + seq)`` over a
symbolic past length, a Slice from a negative symbolic bound to INT64_MAX (T5's
``position_bias[:, :, -seq:, :]`` in transformers 4) and GPT-2's causal-mask buffer
``bias[:, :, k - q:k, :k]`` (transformers 4), ConstantOfShape of an empty or a
run-time shape, and a named input size that a weight fixes (``num_channels`` at a Conv,
features at a MatMul). Each matches onnxruntime at two sizes through tdag.run and to_onnx.
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
from tdag.errors import TdagError

from support.guards import assert_close

END = 2 ** 63 - 1  # "to the end", as torch.onnx.export writes it


def _ints(name: str, values, scalar: bool = False) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, T.INT64, [] if scalar else [len(values)], list(values)))


def _model(nodes, inputs, output_type, inits=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "shapes", inputs,
                              [helper.make_tensor_value_info("y", output_type, None)],
                              initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _input(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _check(model: onnx.ModelProto, *feeds) -> tdag.Program:
    """tdag.run and to_onnx on onnxruntime match onnxruntime on ``model`` for each feed."""
    prog = tdag.from_onnx(model)
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    emitted = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in original.get_inputs()]
    for arrays in feeds:
        ref = [torch.from_numpy(r) for r in original.run(None, dict(zip(names, arrays)))]
        assert_close(tdag.run(prog, *[torch.from_numpy(a) for a in arrays]), ref, "tdag.run")
        again = emitted.run(None, dict(zip(names, arrays)))
        assert_close([torch.from_numpy(r) for r in again], ref, "to_onnx")
    return prog


def _rand(*shape):
    return np.random.default_rng(sum(shape)).standard_normal(shape, np.float32)


def positions_past_the_cache() -> onnx.ModelProto:
    """``Range(past, past + seq)``: the positions of the new tokens (a KV-cache step)."""
    return _model([
        helper.make_node("Shape", ["past"], ["sp"]), helper.make_node("Shape", ["ids"], ["si"]),
        _ints("two", [2], scalar=True), _ints("one", [1], scalar=True),
        helper.make_node("Gather", ["sp", "two"], ["p"]),
        helper.make_node("Gather", ["si", "one"], ["s"]),
        helper.make_node("Add", ["p", "s"], ["t"]),
        helper.make_node("Range", ["p", "t", "one"], ["r"]),
        _ints("zero", [0]), helper.make_node("Unsqueeze", ["r", "zero"], ["r2"]),
        helper.make_node("Add", ["ids", "r2"], ["y"]),
    ], [_input("past", T.FLOAT, ["b", 2, "p", 4]), _input("ids", T.INT64, ["b", "s"])], T.INT64)


def test_range_from_a_symbolic_past_length():
    prog = _check(positions_past_the_cache(),
                  [_rand(2, 2, 4, 4), np.ones((2, 3), np.int64)],
                  [_rand(3, 2, 9, 4), np.ones((3, 1), np.int64)])
    assert str(prog.graph.output_types[0]) == "i64[b,s]"  # no fresh size: the count is s


def _slice_from_end(shape_of: str, x_shape, add: bool) -> onnx.ModelProto:
    """``x[:, :, -n:, :]`` with n = Shape(shape_of)[2], INT64_MAX as the end (T5's bias)."""
    inputs = [_input("x", T.FLOAT, x_shape)]
    if shape_of != "x":
        inputs.append(_input(shape_of, T.FLOAT, [1, 2, "s", "k"]))
    return _model([
        helper.make_node("Shape", [shape_of], ["sq"]), _ints("i2", [2]),
        helper.make_node("Gather", ["sq", "i2"], ["n"]), helper.make_node("Neg", ["n"], ["neg"]),
        _ints("end", [END]), _ints("axis", [2]),
        helper.make_node("Slice", ["x", "neg", "end", "axis"], ["sl" if add else "y"]),
        *([helper.make_node("Add", ["sl", "x"], ["y"])] if add else []),
    ], inputs, T.FLOAT)


def test_a_slice_from_minus_the_axis_size_keeps_the_size():
    """[1,2,S,S][:, :, -S:] is [1,2,S,S] (it was [1,2,2*S,S], and the Add refused)."""
    prog = _check(_slice_from_end("x", [1, 2, "s", "s"], add=True),
                  [_rand(1, 2, 5, 5)], [_rand(1, 2, 3, 3)])
    assert str(prog.graph.output_types[0]) == "f32[1,2,s,s]"


def test_a_slice_from_minus_another_size_keeps_that_size_and_checks_it():
    """-s on an axis of t is [t - s, t) when s <= t (the shape the exporter meant, which
    broadcasts against s); where s > t ONNX would clamp: tdag.run refuses it."""
    model = _slice_from_end("q", [1, 2, "t", "k"], add=False)
    prog = _check(model, [_rand(1, 2, 7, 4), _rand(1, 2, 3, 4)],
                  [_rand(1, 2, 6, 3), _rand(1, 2, 6, 3)])
    assert str(prog.graph.output_types[0]) == "f32[1,2,s,k]"
    with pytest.raises(TdagError):
        tdag.run(prog, torch.randn(1, 2, 2, 3), torch.randn(1, 2, 6, 3))


@pytest.mark.parametrize("start,end", [(-2, END), (1, END), (2, -1), (-END, 3), (3, 1)])
def test_static_bounds_on_a_symbolic_axis_clamp_as_onnx_does(start, end):
    """In range they match onnxruntime; where ONNX would clamp a bound the symbols leave
    open (``-2:`` of a single element), tdag.run raises instead of a wrong shape."""
    model = _model([_ints("b", [start]), _ints("e", [end]), _ints("axis", [1]),
                    helper.make_node("Slice", ["x", "b", "e", "axis"], ["y"])],
                   [_input("x", T.FLOAT, [2, "n"])], T.FLOAT)
    prog = _check(model, [_rand(2, 3)], [_rand(2, 6)])
    if (start, end) == (1, END):  # 1 <= n for every size: nothing left open
        _check(model, [_rand(2, 1)])
    else:
        with pytest.raises(TdagError):
            tdag.run(prog, torch.randn(2, 1))


def test_a_slice_whose_bounds_the_symbols_leave_open_is_sliced_at_run_time():
    """``t - s`` may count from the end or not: the length is a fresh size, still right."""
    model = _model([
        helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Shape", ["q"], ["sq"]),
        _ints("i1", [1]), helper.make_node("Gather", ["sx", "i1"], ["t"]),
        helper.make_node("Gather", ["sq", "i1"], ["s"]), helper.make_node("Sub", ["t", "s"], ["b"]),
        _ints("end", [END]), helper.make_node("Slice", ["x", "b", "end", "i1"], ["y"]),
    ], [_input("x", T.FLOAT, [2, "t"]), _input("q", T.FLOAT, [1, "s"])], T.FLOAT)
    _check(model, [_rand(2, 5), _rand(1, 2)], [_rand(2, 2), _rand(1, 5)])


def test_a_causal_mask_buffer_sliced_to_the_sequence():
    """A static [1,1,64,64] buffer sliced to [k - q, k) and [0, k): [1,1,s,s], which
    broadcasts against the scores; past 64 positions ONNX's own graph fails too."""
    bias = onnx.numpy_helper.from_array(np.tril(np.ones((64, 64), bool))[None, None], "bias")
    model = _model([
        helper.make_node("Shape", ["scores"], ["sh"]), _ints("i2", [2]), _ints("i3", [3]),
        helper.make_node("Gather", ["sh", "i2"], ["q"]),
        helper.make_node("Gather", ["sh", "i3"], ["k"]),
        helper.make_node("Sub", ["k", "q"], ["kq"]),
        _ints("zero", [0]), helper.make_node("Slice", ["bias", "kq", "k", "i2"], ["rows"]),
        helper.make_node("Slice", ["rows", "zero", "k", "i3"], ["mask"]),
        helper.make_node("Constant", [], ["low"], value=helper.make_tensor("low", T.FLOAT, [],
                                                                            [-1e9])),
        helper.make_node("Where", ["mask", "scores", "low"], ["y"]),
    ], [_input("scores", T.FLOAT, ["b", 2, "s", "s"])], T.FLOAT, [bias])
    prog = _check(model, [_rand(1, 2, 3, 3)], [_rand(2, 2, 7, 7)])
    assert str(prog.graph.output_types[0]) == "f32[b,2,s,s]"
    with pytest.raises(TdagError):
        tdag.run(prog, torch.randn(1, 2, 65, 65))


@pytest.mark.parametrize("given", ["empty", "run-time", "symbolic"])
def test_constant_of_shape(given):
    fill = helper.make_tensor("v", T.FLOAT, [1], [1.5])
    if given == "empty":  # a scalar (torch.onnx.export writes it for GPT-2's mask)
        model = _model([helper.make_node("Constant", [], ["shape"], value=helper.make_tensor(
            "shape", T.INT64, [0], [])),
            helper.make_node("ConstantOfShape", ["shape"], ["c"], value=fill),
            helper.make_node("Add", ["x", "c"], ["y"])],
            [_input("x", T.FLOAT, ["n"])], T.FLOAT)
        _check(model, [_rand(3)], [_rand(5)])
    elif given == "run-time":
        model = _model([helper.make_node("ConstantOfShape", ["shape"], ["y"], value=fill)],
                       [_input("shape", T.INT64, [2])], T.FLOAT)
        _check(model, [np.array([2, 3], np.int64)], [np.array([4, 1], np.int64)])
    else:
        model = _model([helper.make_node("Shape", ["x"], ["s"]),
                        helper.make_node("ConstantOfShape", ["s"], ["y"], value=fill)],
                       [_input("x", T.FLOAT, ["a", 2, "b"])], T.FLOAT)
        _check(model, [_rand(1, 2, 3)], [_rand(4, 2, 2)])


def _weight(name, *shape):
    return helper.make_tensor(name, T.FLOAT, shape, _rand(*shape).reshape(-1).tolist())


def test_a_conv_weight_fixes_the_channels_an_input_names():
    """num_channels becomes 3 in every input that names it; batch_size, which two inputs
    share, stays one symbol."""
    pixels = _input("pixel_values", T.FLOAT, ["batch_size", "num_channels", "height", "width"])
    extra = _input("extra", T.FLOAT, ["batch_size", "num_channels", 1, 1])
    model = _model([helper.make_node("Add", ["pixel_values", "extra"], ["x"]),
                    helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                   [pixels, extra], T.FLOAT, [_weight("w", 4, 3, 3, 3)])
    prog = _check(model, [_rand(2, 3, 5, 6), _rand(2, 3, 1, 1)],
                  [_rand(1, 3, 4, 4), _rand(1, 3, 1, 1)])
    assert [str(t) for t in prog.input_types] == ["f32[batch_size,3,height,width]",
                                                   "f32[batch_size,3,1,1]"]


def test_a_matmul_weight_fixes_the_features_an_input_names():
    model = _model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                   [_input("x", T.FLOAT, ["batch", "hidden"])], T.FLOAT, [_weight("w", 8, 4)])
    prog = _check(model, [_rand(2, 8)], [_rand(5, 8)])
    assert str(prog.input_types[0]) == "f32[batch,8]"


@pytest.mark.parametrize("op", ["Add", "Max", "Where"])
def test_a_size_broadcast_against_a_fixed_one_is_checked_at_run_time(op):
    """``x[b, n] op w[1, 4]`` with n a named size: ONNX broadcasts at run time, so n may be 4
    or 1 (the row repeated); any other n is refused, by tdag.run as by onnxruntime."""
    w = helper.make_tensor("w", T.FLOAT, [1, 4], [0.5, -1.0, 2.0, 3.0])
    inputs = [_input("x", T.FLOAT, ["b", "n"])]
    if op == "Where":
        inputs.append(_input("c", T.BOOL, ["b", "n"]))
    node = helper.make_node(op, ["c", "x", "w"] if op == "Where" else ["x", "w"], ["y"])
    model = _model([node], inputs, T.FLOAT, [w])
    feeds = [[_rand(2, n)] + ([_rand(2, n) > 0] if op == "Where" else []) for n in (4, 1)]
    prog = _check(model, *feeds)
    with pytest.raises(TdagError):
        tdag.run(prog, *[torch.from_numpy(a) for a in
                         [_rand(2, 3)] + ([_rand(2, 3) > 0] if op == "Where" else [])])
