"""Sizes that only data decides (tdag/deinops/runtime.py): nonzero, masked_select, unique and
boolean-mask indexing from torch models, and ONNX NonZero / Compress / Unique, each matching
eager at two inputs whose results have different sizes, through tdag.run, tdag.to_torch and
tdag.to_onnx on onnxruntime; the fresh symbols in the text form, the verifier and the cost.
"""
from __future__ import annotations


import pytest
import torch
from onnx import TensorProto, helper

import tdag
from tdag import ops
from tdag.ops.builder import Builder
from tdag.deinops.runtime import NonZero
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.types import DType, TensorType

from support.guards import run_onnx
from support.torch_models import Fn

X1 = torch.tensor([[1.0, -2.0, 1.0], [3.0, -2.0, 0.0]])
X2 = torch.tensor([[-1.0, 2.0, 5.0], [4.0, 5.0, 6.0]])  # other counts of positives and values


MODELS = {
    "nonzero": lambda x: torch.nonzero(x > 0),
    "masked_select": lambda x: torch.masked_select(x, x > 0) * 2,
    "mask_rows": lambda x: x[x.sum(1) > 0] + 1,
    "mask_elements": lambda x: x[x > 0].sum(0, keepdim=True) + x[x > 0],
    "unique": lambda x: torch.unique(x, return_inverse=True, return_counts=True),
    "unique_values": lambda x: torch.unique(x) * 3,
}


def _as_tuple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _equal(got, expected, what):
    got, expected = _as_tuple(got), _as_tuple(expected)
    assert len(got) == len(expected), what
    for g, e in zip(got, expected):
        assert g.shape == e.shape and torch.equal(g, e), (what, g, e)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_torch_model_matches_eager_at_two_sizes(name):
    fn = MODELS[name]
    prog = tdag.from_torch(Fn(fn), (X1,))
    tdag.verify(prog)
    assert tdag.parse(str(prog)) == prog
    module, model = tdag.to_torch(prog), tdag.to_onnx(prog)
    sizes = set()
    for x in (X1, X2):
        expected = fn(x)
        sizes.add(_as_tuple(expected)[0].shape)
        _equal(tdag.run(prog, x), expected, f"run {name}")
        _equal(module(x), expected, f"to_torch {name}")
        _equal(run_onnx(model, x), expected, f"to_onnx {name}")
    assert len(sizes) == 2, "the two inputs should give results of different sizes"


class Item(torch.nn.Module):
    """A size read from data with ``.item()`` (torch's unbacked u0): the first k rows, and a
    zeros block of k rows."""

    def forward(self, x, n):
        k = n.item()
        torch._check(k >= 0)
        torch._check(k <= x.shape[0])
        return x[:k] * 2 + torch.zeros(k, x.shape[1])


def test_a_size_read_with_item_is_a_fresh_size():
    x = torch.randn(6, 3)
    prog = tdag.from_torch(Item(), (x, torch.tensor(3)))
    tdag.verify(prog)
    assert tdag.parse(str(prog)) == prog
    assert not tdag.ir.symbols.is_static(prog.graph.output_types[0].shape[0])
    module, model = tdag.to_torch(prog), tdag.to_onnx(prog)
    for n in (torch.tensor(2), torch.tensor(5)):
        expected = Item()(x, n)
        _equal(tdag.run(prog, x, n), expected, "run")
        _equal(module(x, n), expected, "to_torch")
        _equal(run_onnx(model, x, n), expected, "to_onnx")
    with pytest.raises(tdag.TdagError):  # a negative size is refused, never answered
        tdag.run(prog, x, torch.tensor(-1))


def _nonzero_program():
    return tdag.trace(lambda x: ops.masked_select(x, ops.gt(x, 0.0)),
                      tdag.TensorSpec(("n",), "float32"))


def test_cost_is_symbolic_and_bounded():
    report = tdag.cost(_nonzero_program())
    (count,) = report.bounds
    assert count in str(report.bytes_written)  # symbolic in the fresh size
    assert str(report.bounds[count]) == "n"     # at most every element
    assert count not in str(report.upper_bound().bytes_written)
    assert report.upper_bound().evaluate(n=10).bytes_written >= \
        report.evaluate(n=10, **{count: 3}).bytes_written


def test_text_form_round_trips_and_names_the_fresh_size():
    prog = _nonzero_program()
    text = str(prog)
    assert 'nonzero(' in text and 'count="' in text
    assert tdag.parse(text) == prog


def test_verify_refuses_a_fresh_size_defined_twice_or_used_before():
    b = Builder()
    x = b.input("x", TensorType((4,), DType.bool))
    b.emit(Op.nonzero, NonZero("k"), x)
    b.emit(Op.nonzero, NonZero("k"), x)
    with pytest.raises(tdag.InvalidModelError, match="defined twice"):
        tdag.verify(b.build([]))
    graph = _nonzero_program().graph
    early = Node("early", Op.iota, (), tdag.deinops.indexing.Iota(graph.nodes[-1].type.shape[0]),
                 TensorType(graph.nodes[-1].type.shape, DType.i64))
    with pytest.raises(tdag.InvalidModelError, match="before the node"):
        tdag.verify(graph.replace(nodes=(early,) + graph.nodes))


def test_a_negative_size_is_refused_everywhere():
    prog = tdag.trace(lambda t: ops.arange_of(t), tdag.TensorSpec((), "int64"))
    t = torch.tensor(-2)
    with pytest.raises(tdag.TdagError):
        tdag.run(prog, t)
    with pytest.raises(RuntimeError):
        tdag.to_torch(prog)(t)
    with pytest.raises(Exception, match="ConstantOfShape|shape"):
        run_onnx(tdag.to_onnx(prog), t)
    assert torch.equal(tdag.to_torch(prog)(torch.tensor(3)), torch.arange(3))


# -- ONNX --------------------------------------------------------------------------------------

def _one_node(op, inputs, outputs, **attrs):
    node = helper.make_node(op, [i[0] for i in inputs], [o[0] for o in outputs], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


ONNX_CASES = {
    "NonZero": (_one_node("NonZero", [("x", TensorProto.FLOAT, [2, 3])],
                          [("y", TensorProto.INT64)]),
                lambda x: torch.nonzero(x).T, (X1,), (X2,)),
    "Compress": (_one_node("Compress", [("x", TensorProto.FLOAT, [2, 3]),
                                        ("c", TensorProto.BOOL, [2])],
                           [("y", TensorProto.FLOAT)], axis=1),
                 lambda x, c: x[:, :2][:, c], (X1, torch.tensor([True, False])),
                 (X2, torch.tensor([True, True]))),
    "Unique": (_one_node("Unique", [("x", TensorProto.FLOAT, [2, 3])],
                         [("y", TensorProto.FLOAT), ("i", TensorProto.INT64),
                          ("inv", TensorProto.INT64), ("n", TensorProto.INT64)], sorted=1),
               None, (X1,), (X2,)),
}


def _unique_ref(x):
    values, inverse, counts = torch.unique(x.reshape(-1), return_inverse=True,
                                           return_counts=True)
    flat = x.reshape(-1).tolist()
    first = torch.tensor([flat.index(v) for v in values.tolist()])
    return values, first, inverse, counts


def _matches_everywhere(prog, ref, inputs, name):
    """tdag.run, the torch module and the ONNX model equal ``ref`` on every input set."""
    tdag.verify(prog)
    module, reified = tdag.to_torch(prog), tdag.to_onnx(prog)
    for args in inputs:
        expected = ref(*args)
        _equal(tdag.run(prog, *args), expected, f"run {name}")
        _equal(module(*args), expected, f"to_torch {name}")
        _equal(run_onnx(reified, *args), expected, f"to_onnx {name}")


@pytest.mark.parametrize("name", sorted(ONNX_CASES))
def test_onnx_data_sized_ops(name):
    model, ref, *inputs = ONNX_CASES[name]
    ref = ref or _unique_ref
    _matches_everywhere(tdag.from_onnx(model), ref, inputs, name)


# -- pinned inputs: from_onnx(model, inputs=...) ------------------------------------------------

def _reduce_model():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                      helper.make_tensor_value_info("axes", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_pinned_input_is_a_const_the_program_no_longer_takes():
    model = _reduce_model()
    with pytest.raises(tdag.UnsupportedOpError, match="axes"):
        tdag.from_onnx(model)  # the axes decide the output's rank: no type for every value
    for axes, expected in (([1], X1.sum(1)), ([-2], X1.sum(0))):
        prog = tdag.from_onnx(model, inputs={"axes": axes})
        assert [v.name for v in prog.graph.inputs] == ["x"]
        _equal(tdag.run(prog, X1), expected, "run")
        _equal(tdag.to_torch(prog)(X1), expected, "to_torch")
        _equal(run_onnx(tdag.to_onnx(prog), X1), expected, "to_onnx")
    with pytest.raises(tdag.InvalidModelError, match="'ax' is not an input"):
        tdag.from_onnx(model, inputs={"ax": [1]})
    with pytest.raises(tdag.ShapeError, match="declared of shape"):
        tdag.from_onnx(model, inputs={"axes": [0, 1]})


# -- ONNX shapes, pads, repeats and bounds given at run time (canonicalize/onnx/runtime.py) -----

I64 = TensorProto.INT64
RUNTIME_SHAPED = {  # model, torch reference, two inputs whose results differ in shape
    "Reshape": (_one_node("Reshape", [("x", TensorProto.FLOAT, [2, 3]), ("s", I64, [2])],
                          [("y", TensorProto.FLOAT)]),
                lambda x, s: x.reshape(*[int(v) or x.shape[i] for i, v in enumerate(s)]),
                (X1, torch.tensor([3, -1])), (X2, torch.tensor([0, 3]))),
    "Expand": (_one_node("Expand", [("x", TensorProto.FLOAT, [2, 1]), ("s", I64, [3])],
                         [("y", TensorProto.FLOAT)]),
               lambda x, s: x.expand(*[int(v) for v in s]),
               (X1[:, :1], torch.tensor([3, 2, 4])), (X2[:, :1], torch.tensor([1, 2, 1]))),
    "Tile": (_one_node("Tile", [("x", TensorProto.FLOAT, [2, 3]), ("r", I64, [2])],
                       [("y", TensorProto.FLOAT)]),
             lambda x, r: x.repeat(*[int(v) for v in r]),
             (X1, torch.tensor([1, 2])), (X2, torch.tensor([3, 0]))),
    "Pad": (_one_node("Pad", [("x", TensorProto.FLOAT, [2, 3]), ("p", I64, [4])],
                      [("y", TensorProto.FLOAT)], mode="reflect"),
            lambda x, p: torch.nn.functional.pad(x[None], (int(p[1]), int(p[3]), int(p[0]),
                                                          int(p[2])), mode="reflect")[0],
            (X1, torch.tensor([1, 2, 0, 1])), (X2, torch.tensor([0, -1, 1, 0]))),
    "Range": (_one_node("Range", [("a", I64, []), ("b", I64, []), ("d", I64, [])],
                        [("y", I64)]),
              lambda a, b, d: torch.arange(int(a), int(b), int(d)),
              (torch.tensor(1), torch.tensor(9), torch.tensor(3)),
              (torch.tensor(5), torch.tensor(-1), torch.tensor(-2))),
}


@pytest.mark.parametrize("name", sorted(RUNTIME_SHAPED))
def test_onnx_runtime_shaped_ops(name):
    model, ref, *inputs = RUNTIME_SHAPED[name]
    _matches_everywhere(tdag.from_onnx(model), ref, inputs, name)


@pytest.mark.parametrize("name, args", [
    ("Reshape", (X1, torch.tensor([4, 1]))),   # 4 elements of 6: never a silent truncation
    ("Reshape", (X1, torch.tensor([-1, -1]))),
    ("Expand", (X1[:, :1].expand(2, 3), torch.tensor([2, 2]))),  # 3 does not broadcast to 2
    ("Range", (torch.tensor(0), torch.tensor(3), torch.tensor(0))),
])
def test_a_bad_runtime_shape_raises_everywhere(name, args):
    model = RUNTIME_SHAPED[name][0]
    if name == "Expand":  # an input of 3 columns
        model.graph.input[0].type.tensor_type.shape.dim[1].dim_value = 3
        model.graph.input[1].type.tensor_type.shape.dim[0].dim_value = 2
    prog = tdag.from_onnx(model)
    with pytest.raises(tdag.TdagError):
        tdag.run(prog, *args)
    with pytest.raises(RuntimeError):
        tdag.to_torch(prog)(*args)
    with pytest.raises(Exception, match="ConstantOfShape|shape|Shape"):
        run_onnx(tdag.to_onnx(prog), *args)


def test_a_slice_between_i_and_i_plus_1_has_length_1_and_checks_its_start():
    nodes = [helper.make_node("Constant", [], ["one"], value=helper.make_tensor(
                 "one", I64, [1], [1])),
             helper.make_node("Add", ["s", "one"], ["e"]),
             helper.make_node("Slice", ["x", "s", "e"], ["y"])]
    graph = helper.make_graph(nodes, "g", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [5]),
        helper.make_tensor_value_info("s", I64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    prog = tdag.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert str(prog.graph.output_types[0]) == "f32[1]"
    x = torch.arange(5.0)
    module, reified = tdag.to_torch(prog), tdag.to_onnx(prog)
    for s in (0, 4, -2):
        expected = x[s:s + 1] if s != -2 else x[3:4]
        for run in (lambda *a: tdag.run(prog, *a), module, lambda *a: run_onnx(reified, *a)):
            _equal(run(x, torch.tensor([s])), expected, f"start {s}")
    for s in (5, -1, -6):  # clamped by ONNX to another length: refused, never answered
        with pytest.raises(tdag.TdagError):
            tdag.run(prog, x, torch.tensor([s]))
        with pytest.raises(RuntimeError):
            module(x, torch.tensor([s]))
        with pytest.raises(Exception, match="ConstantOfShape|shape|Shape"):
            run_onnx(reified, x, torch.tensor([s]))
