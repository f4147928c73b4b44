"""ONNX control flow and recurrence through tdag: Loop, If, Scan, RNN, GRU, LSTM.

(a) ONNX's own backend conformance node cases for those ops, each through tdag.run,
tdag.to_torch and tdag.to_onnx on onnxruntime, against the expected outputs the case ships;
(b) every attribute of RNN / GRU / LSTM against onnxruntime on models built here (layout=1,
which onnxruntime refuses, against the layout=0 model on permuted tensors);
(c) a 2-layer bidirectional LSTM exported by torch.onnx.export with a dynamic sequence axis,
at three lengths, the Program the same size at every length.

Tolerances: float32 outputs within rtol 1e-4, atol 1e-5 (the cell math is the same, the
summation order of the matmuls differs from onnxruntime's kernels); integers exactly.
"""
from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import tdag

from support.guards import run_onnx
from support.onnx_cases import node_cases, only_tensors

RTOL, ATOL = 1e-4, 1e-5
PREFIXES = ("test_loop", "test_if", "test_scan", "test_rnn", "test_simple_rnn", "test_gru",
            "test_lstm")
# cases whose tensors are of types tdag lacks: it has tensors only, no sequences or optionals
EXCLUDED = {
    "test_loop13_seq": "a sequence carried by the loop (SequenceInsert)",
    "test_loop16_seq_none": "an optional sequence input (Optional*, Sequence* ops)",
    "test_if_seq": "branches return a sequence (SequenceConstruct)",
    "test_if_opt": "branches return an optional sequence (Optional, SequenceConstruct)",
}


# -- (a) conformance ----------------------------------------------------------------------------

CASES = node_cases(PREFIXES, modules=("loop", "if_", "scan", "rnn", "gru", "lstm"))
# (test_loop11's body slices x[i:i+1], i the iteration: from_onnx sees that the bounds differ
# by 1, so the slice has the static length 1 its carried value is declared with)
XFAIL: dict = {}
RUN = [pytest.param(n, marks=pytest.mark.xfail(reason=XFAIL[n], strict=True,
                                               raises=tdag.UnsupportedOpError))
       if n in XFAIL else n for n in sorted(set(CASES) - set(EXCLUDED))]


def test_the_exclusions_are_exactly_the_non_tensor_cases():
    assert len(CASES) >= 28, sorted(CASES)
    assert {n for n, (m, _, _) in CASES.items() if not only_tensors(m)} == set(EXCLUDED)


def _close(actual, expected) -> None:
    actual = actual.detach().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
    else:
        np.testing.assert_array_equal(actual, expected)


def _all_close(actual, expected) -> None:
    actual = list(actual) if isinstance(actual, (list, tuple)) else [actual]
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        _close(a, e)


def _tensors(arrays) -> list:
    return [torch.from_numpy(np.array(a)) for a in arrays]  # a copy, 0-d kept


@pytest.fixture(scope="module")
def programs():
    return {}


def _program(programs, name):
    if name not in programs:
        programs[name] = tdag.from_onnx(CASES[name][0])
    return programs[name]


@pytest.mark.parametrize("name", RUN)
def test_conformance_run(programs, name):
    _, ins, outs = CASES[name]
    prog = _program(programs, name)
    tdag.verify(prog)
    _all_close(tdag.run(prog, *_tensors(ins)), outs)


@pytest.mark.parametrize("name", RUN)
def test_conformance_to_torch(programs, name):
    _, ins, outs = CASES[name]
    _all_close(tdag.to_torch(_program(programs, name))(*_tensors(ins)), outs)


@pytest.mark.parametrize("name", RUN)
def test_conformance_to_onnx(programs, name):
    _, ins, outs = CASES[name]
    _all_close(run_onnx(tdag.to_onnx(_program(programs, name)), *_tensors(ins)), outs)


def test_recurrent_layers_become_one_loop():
    for name in [n for n in CASES if n.startswith(("test_rnn", "test_simple_rnn", "test_gru",
                                                 "test_lstm"))]:
        prog = tdag.from_onnx(CASES[name][0])
        loops = [s for s in prog.main.steps if isinstance(s, tdag.Loop)]
        assert len(loops) == 1 and loops[0].cond is None, name
        x = prog.main.inputs[0].type.shape
        layout = any(a.name == "layout" and a.i for a in CASES[name][0].graph.node[0].attribute)
        assert loops[0].count == x[1 if layout else 0], name  # the sequence length


# -- (b) attributes against onnxruntime ---------------------------------------------------------

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
S, B, I, H = 5, 3, 4, 6


def _recurrent(op, opset, direction="forward", layout=0, lens=None, init=True, bias=True,
               peepholes=False, seed=0, **attrs):
    """A one-node model (weights as initializers, X / lens / initial states as inputs with
    symbolic batch and sequence axes) and its feeds."""
    rng = np.random.default_rng(seed)
    nd, g = (2 if direction == "bidirectional" else 1), _GATES[op]
    inits, names = [], ["X", "W", "R", "", "", "", "", ""]

    def weight(name, shape):
        inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32),
                                             name))

    weight("W", (nd, g * H, I))
    weight("R", (nd, g * H, H))
    if bias:
        weight("B", (nd, 2 * g * H))
        names[3] = "B"
    if peepholes:
        weight("P", (nd, 3 * H))
        names[7] = "P"
    feeds = {"X": rng.standard_normal((B, S, I) if layout else (S, B, I)).astype(np.float32)}
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                            ["b", "s", I] if layout else ["s", "b", I])]
    if lens is not None:
        names[4] = "L"
        feeds["L"] = np.array(lens, np.int32)
        inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, ["b"]))
    states = ("h0", "c0") if op == "LSTM" else ("h0",)
    for k, state in enumerate(states if init else ()):
        names[5 + k] = state
        feeds[state] = rng.standard_normal((B, nd, H) if layout else (nd, B, H)).astype(
            np.float32)
        inputs.append(helper.make_tensor_value_info(
            state, TensorProto.FLOAT, ["b", nd, H] if layout else [nd, "b", H]))
    while not names[-1]:
        names.pop()
    outs = ["Y", "Y_h", "Y_c"][:1 + len(states)]
    if layout:
        attrs["layout"] = 1
    node = helper.make_node(op, names, outs, direction=direction, hidden_size=H, **attrs)
    graph = helper.make_graph([node], "g", inputs, [
        helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


def _ort(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


_ATTRS = [(op, opset, dict(direction=d, layout=0))
          for op in _GATES for d in ("forward", "reverse", "bidirectional")
          for opset in (7, 14, 22)] + \
    [(op, 14, dict(direction=d, lens=[5, 2, 3])) for op in _GATES
     for d in ("forward", "reverse", "bidirectional")] + \
    [(op, 14, dict(direction="bidirectional", lens=[1, 5, 4], init=False, bias=False))
     for op in _GATES] + \
    [(op, 14, dict(direction="bidirectional", clip=0.5)) for op in _GATES] + [
    ("GRU", 14, dict(direction="bidirectional", linear_before_reset=1)),
    ("GRU", 7, dict(direction="reverse", linear_before_reset=1, lens=[3, 5, 1])),
    ("LSTM", 14, dict(direction="bidirectional", peepholes=True)),
    ("LSTM", 14, dict(direction="forward", input_forget=1, peepholes=True)),
    ("LSTM", 14, dict(direction="reverse", peepholes=True, lens=[2, 4, 5], clip=1.0)),
    ("RNN", 14, dict(direction="bidirectional", activations=["Relu", "LeakyRelu"],
                     activation_alpha=[0.3])),
    ("RNN", 14, dict(activations=["ThresholdedRelu"], activation_alpha=[0.2])),
    ("RNN", 14, dict(activations=["ScaledTanh"], activation_alpha=[0.7], activation_beta=[1.5])),
    ("RNN", 14, dict(activations=["Softplus"])),
    ("GRU", 14, dict(activations=["HardSigmoid", "Softsign"], activation_alpha=[0.3],
                     activation_beta=[0.4])),
    ("LSTM", 14, dict(activations=["Sigmoid", "Elu", "Affine"], activation_alpha=[0.7, 0.5],
                      activation_beta=[0.1])),
]


def _id(case):
    op, opset, kw = case
    return f"{op}-{opset}-" + "-".join(f"{k}={v}" for k, v in kw.items())


@pytest.mark.parametrize("case", _ATTRS, ids=[_id(c) for c in _ATTRS])
def test_recurrent_attributes(case):
    op, opset, kw = case
    model, feeds = _recurrent(op, opset, **kw)
    expected = _ort(model, feeds)
    prog = tdag.from_onnx(model)
    args = _tensors(feeds.values())
    # unbounded activations (Relu) grow: compare on the output's scale
    scale = [max(1.0, float(np.abs(e).max())) for e in expected]
    for actual in (tdag.run(prog, *args), tdag.to_torch(prog)(*args)):
        for a, e, s in zip(actual, expected, scale):
            np.testing.assert_allclose(a.detach().numpy(), e, rtol=RTOL, atol=ATOL * s)


@pytest.mark.parametrize("op", list(_GATES))
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_batchwise_layout_matches_the_time_major_one(op, direction):
    """onnxruntime refuses layout=1; the layout=0 model on transposed tensors is the truth."""
    lens = [4, 5, 2]
    model1, feeds1 = _recurrent(op, 14, direction=direction, layout=1, lens=lens, seed=1)
    model0, _ = _recurrent(op, 14, direction=direction, layout=0, lens=lens, seed=1)
    feeds0 = {k: (np.ascontiguousarray(np.swapaxes(v, 0, 1)) if v.ndim == 3 else v)
              for k, v in feeds1.items()}
    expected = _ort(model0, feeds0)
    prog = tdag.from_onnx(model1)
    args = _tensors(feeds1.values())
    for actual in (tdag.run(prog, *args), tdag.to_torch(prog)(*args),
                   run_onnx(tdag.to_onnx(prog), *args)):
        y, *states = actual
        _close(y, np.transpose(expected[0], (2, 0, 1, 3)))
        for a, e in zip(states, expected[1:]):
            _close(a, np.swapaxes(e, 0, 1))


def test_recurrent_to_onnx_matches_onnxruntime():
    for op in _GATES:
        model, feeds = _recurrent(op, 14, direction="bidirectional", lens=[5, 1, 3])
        expected = _ort(model, feeds)
        _all_close(run_onnx(tdag.to_onnx(tdag.from_onnx(model)), *_tensors(feeds.values())),
                   expected)


def test_unknown_activation_is_unsupported():
    model, _ = _recurrent("RNN", 14, activations=["Gelu"])
    with pytest.raises(tdag.UnsupportedOpError, match="activation 'Gelu'"):
        tdag.from_onnx(model)


# -- (c) an exported LSTM at several lengths ----------------------------------------------------

class _Lstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 8, num_layers=2, bidirectional=True)

    def forward(self, x):
        y, (h, c) = self.lstm(x)
        return y, h, c


def _export_lstm(length: int) -> onnx.ModelProto:
    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Lstm().eval(), (torch.randn(length, 2, 4),), buffer, dynamo=False,
                          input_names=["x"], output_names=["y", "h", "c"], opset_version=17,
                          dynamic_axes={"x": {0: "seq"}, "y": {0: "seq"}})
    return onnx.load_from_string(buffer.getvalue())


def test_exported_lstm_runs_at_any_length():
    model = _export_lstm(5)
    prog = tdag.from_onnx(model)
    module, exported = tdag.to_torch(prog), tdag.to_onnx(prog)
    for length in (3, 9, 40):
        x = torch.randn(length, 2, 4)
        expected = _ort(model, {"x": x.numpy()})
        _all_close(tdag.run(prog, x), expected)
        _all_close(module(x), expected)
        _all_close(run_onnx(exported, x), expected)


def test_exported_lstm_program_does_not_grow_with_the_length():
    sizes = {length: tdag.from_onnx(_export_lstm(length)).num_nodes for length in (3, 9, 40)}
    assert len(set(sizes.values())) == 1, sizes


# -- (d) Loop, If and Scan built here: run-time trip counts, nesting, scan attributes ----------

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _vi(name, elem, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _check_all_ways(model, feeds):
    """tdag.run, to_torch and to_onnx against onnxruntime on the original model."""
    expected = _ort(model, feeds)
    prog = tdag.from_onnx(model)
    args = _tensors(feeds.values())
    _all_close(tdag.run(prog, *args), expected)
    _all_close(tdag.to_torch(prog)(*args), expected)
    _all_close(run_onnx(tdag.to_onnx(prog), *args), expected)
    return prog


def _counted_while_loop():
    """y += table[i] for i < M while sum(y) < limit, scanning y: M and the condition are
    inputs, so the trip count is known only at run time, and the loop may stop early."""
    body = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["row"], axis=0),
         helper.make_node("Add", ["y_in", "row"], ["y_out"]),
         helper.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
         helper.make_node("Less", ["total", "limit"], ["cond_out"]),
         helper.make_node("Identity", ["y_out"], ["scan_out"])], "body",
        [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("y_in", F32, [3])],
        [_vi("cond_out", BOOL, []), _vi("y_out", F32, [3]), _vi("scan_out", F32, [3])])
    nodes = [helper.make_node("Loop", ["M", "go", "y0"], ["y", "ys"], body=body)]
    graph = helper.make_graph(nodes, "g", [_vi("M", I64, []), _vi("go", BOOL, []),
                                           _vi("y0", F32, [3]), _vi("table", F32, [8, 3])],
                              [_vi("y", F32, [3]), _vi("ys", F32, None)],
                              [numpy_helper.from_array(np.float32(10.0), "limit")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("trips, go", [(5, True), (8, True), (2, True), (1, True)])
def test_loop_with_a_run_time_trip_count(trips, go):
    table = np.abs(np.random.default_rng(trips).standard_normal((8, 3))).astype(np.float32)
    feeds = {"M": np.array(trips, np.int64), "go": np.array(go), "y0": np.zeros(3, np.float32),
             "table": table}
    prog = _check_all_ways(_counted_while_loop(), feeds)
    loop = next(s for s in prog.main.steps if isinstance(s, tdag.Loop))
    assert loop.count is None and loop.cond is not None


def _nested():
    """If (sum(x) > 0) then a Loop of 3 steps doubling x, each step itself an If on i,
    else x - 1."""
    inner_if = helper.make_node(
        "If", ["odd"], ["v_out"],
        then_branch=helper.make_graph([helper.make_node("Mul", ["v_in", "two"], ["t"])], "t",
                                      [], [_vi("t", F32, None)]),
        else_branch=helper.make_graph([helper.make_node("Add", ["v_in", "x"], ["e"])], "e",
                                      [], [_vi("e", F32, None)]))
    body = helper.make_graph(
        [helper.make_node("Mod", ["i", "two_i"], ["rem"]),
         helper.make_node("Cast", ["rem"], ["odd"], to=BOOL), inner_if,
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Identity", ["v_out"], ["scan"])], "body",
        [_vi("i", I64, []), _vi("cond_in", BOOL, []), _vi("v_in", F32, None)],
        [_vi("cond_out", BOOL, []), _vi("v_out", F32, None), _vi("scan", F32, None)])
    then_g = helper.make_graph(
        [helper.make_node("Loop", ["three", "", "x"], ["v", "vs"], body=body),
         helper.make_node("ReduceSum", ["vs"], ["r"], axes=[0], keepdims=0),
         helper.make_node("Add", ["v", "r"], ["then_out"])], "then", [],
        [_vi("then_out", F32, None)])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["else_out"])], "else",
                               [], [_vi("else_out", F32, None)])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)]
    inits = [numpy_helper.from_array(np.float32(v), n)
             for n, v in (("two", 2), ("one", 1), ("zero", 0))] + \
        [numpy_helper.from_array(np.int64(v), n) for n, v in (("three", 3), ("two_i", 2))]
    graph = helper.make_graph(nodes, "g", [_vi("x", F32, ["n", 4])], [_vi("y", F32, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def test_nested_control_flow():
    rng = np.random.default_rng(0)
    for x in (np.abs(rng.standard_normal((2, 4))), -np.abs(rng.standard_normal((3, 4)))):
        _check_all_ways(_nested(), {"x": x.astype(np.float32)})


def _scan(opset, **attrs):
    """A running sum and product over a scan input, scanning the sum and the input * 2."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "e"], ["s_out"]),
         helper.make_node("Mul", ["p_in", "e"], ["p_out"]),
         helper.make_node("Mul", ["e", "two"], ["e2"]),
         helper.make_node("Identity", ["s_out"], ["scan_s"])], "body",
        [_vi("s_in", F32, [2]), _vi("p_in", F32, [2]), _vi("e", F32, [2])],
        [_vi("s_out", F32, [2]), _vi("p_out", F32, [2]), _vi("scan_s", F32, [2]),
         _vi("e2", F32, [2])])
    axis = (attrs.get("scan_input_axes") or [0])[0]
    x_shape = ["t", 2] if axis == 0 else [2, "t"]
    node = helper.make_node("Scan", ["s0", "p0", "x"], ["s", "p", "ys", "es"], body=body,
                            num_scan_inputs=1, **attrs)
    graph = helper.make_graph([node], "g", [_vi("s0", F32, [2]), _vi("p0", F32, [2]),
                                            _vi("x", F32, x_shape)],
                              [_vi(n, F32, None) for n in ("s", "p", "ys", "es")],
                              [numpy_helper.from_array(np.float32(2), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset, attrs", [
    (9, {}), (11, {"scan_input_directions": [1]}),
    (11, {"scan_input_axes": [1], "scan_output_axes": [1, -1]}),
    (16, {"scan_input_directions": [1], "scan_output_directions": [1, 0],
          "scan_output_axes": [0, 1]}),
], ids=["plain", "reverse-in", "axes", "reverse-out"])
def test_scan_attributes(opset, attrs):
    axis = (attrs.get("scan_input_axes") or [0])[0]
    for length in (1, 4):
        x = np.random.default_rng(length).standard_normal(
            (length, 2) if axis == 0 else (2, length)).astype(np.float32)
        prog = _check_all_ways(_scan(opset, **attrs), {"s0": np.zeros(2, np.float32),
                                                       "p0": np.ones(2, np.float32), "x": x})
    assert sum(isinstance(s, tdag.Loop) for s in prog.main.steps) == 1
