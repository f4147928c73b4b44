"""The text form: a golden snippet, print -> parse -> print round trips for traced and
hand-built programs (every primitive's spec, symbolic dims, If / Loop / state, provenance,
odd names, inline consts), and malformed text that names its line."""
from __future__ import annotations

import math

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.io_programs import control_program, core_program, dtype_program, tiny_program

import tdag
from tdag import FileFormatError, InvalidModelError, Program
from tdag.ops.builder import Builder
from tdag.deinops.bitcast import BitCast
from tdag.deinops.elementwise import Cast, Compare, CompareKind, Divide, DivideMode
from tdag.deinops.indexing import Gather, Iota
from tdag.deinops.extent import Pad, Repeat, Select, Slice
from tdag.deinops.movement import Group, Permute, Squeeze, Ungroup, Unsqueeze
from tdag.deinops.windows import Fold, Unfold
from tdag.ir.record import NoSpec
from tdag.deinops.runtime import Arange, NonZero
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.scan import Scan
from tdag.deinops.scatter import Scatter
from tdag.deinops.fft import Fft, FftKind, FftNorm
from tdag.deinops.sort import Sort
from tdag.ir.graph import TDAG, Node, Value, Weight
from tdag.ir.op import Op
from tdag.ir.record import Trait, ops_with
from tdag.ir.parser import parse
from tdag.ir.printer import format_tdag
from tdag.ir.symbols import symbol
from tdag.ir.types import DType, Origin, TensorKind, TensorType

GOLDEN = """\
tdag main(%x: f32[b,3]) {
  param %w: f32[3]
  const %c3: f32[] = 0.5
  %0: f32[1,3] = unsqueeze(%w, axes=(0,))  # aten.mul @ layer.0 (model.py:7)
  %1: f32[b,3] = repeat(%0, axes=(0,), sizes=(b,))  # aten.mul @ layer.0 (model.py:7)
  %2: f32[b,3] = multiply(%x, %1)  # aten.mul @ layer.0 (model.py:7)
  %4: f32[1,1] = unsqueeze(%c3, axes=(0, 1))
  %5: f32[b,3] = repeat(%4, axes=(0, 1), sizes=(b, 3))
  %6: f32[b,3] = multiply(%2, %5)
  %7: f32[b] = reduce[sum](%6, axes=(1,))
  return %7
}

program(%x: f32[b,3]) {
  %out0 = call main(%x)
  return %out0
}
"""


def assert_round_trip(prog: Program) -> Program:
    """print -> parse -> print is identical, the parse equals the original, and inline const
    values (which equality skips) came back bit for bit."""
    text = str(prog)
    back = parse(text)
    assert back == prog
    assert str(back) == text
    for name, graph in prog.graphs.items():
        for wname, weight in graph.weights.items():
            got = back.graphs[name].weights[wname].value
            small = weight.value is not None and weight.value.numel() <= 16
            if weight.kind is TensorKind.const and small:
                assert got.dtype == weight.value.dtype
                assert torch.equal(got.view(-1).view(torch.uint8),
                                   weight.value.reshape(-1).view(torch.uint8))
            else:
                assert got is None  # bigger weights travel in the .tdag file, not the text
    return back


def test_golden_text():
    assert str(tiny_program()) == GOLDEN


@pytest.mark.parametrize("make", [tiny_program, core_program, dtype_program, control_program])
def test_round_trip(make):
    prog = make()
    tdag.verify(prog)
    back = assert_round_trip(prog)
    tdag.verify(back)


def test_parsed_program_runs_like_the_original():
    prog = control_program()  # its weights are all small consts, so the text carries them
    prog = prog.replace(state={})
    prog = prog.replace(main=prog.main.__class__(prog.main.inputs, prog.main.steps[:-1],
                                                 prog.main.outputs[:-1]))
    x, z = torch.tensor([1.0, -2.0, 3.0, 0.5]), torch.zeros(5)
    for a, b in zip(tdag.run(prog, x, z), tdag.run(parse(str(prog)), x, z)):
        assert torch.equal(a, b)


def test_a_lone_tdag_parses_as_a_program():
    graph = core_program().graph
    text = str(graph)
    assert text.startswith("tdag main(") and "program(" not in text
    assert parse(text) == Program.from_tdag(graph, "main")
    assert format_tdag(parse(text).graph, "main") == text


def _every_spec_graph() -> TDAG:
    """One node per primitive, with symbolic dims in specs and types."""
    b, s = symbol("b"), symbol("s")
    bl = Builder()
    x = bl.input("x", TensorType((b, s, 6), DType.f32))
    i = bl.input("i", TensorType((s,), DType.i64))
    e = bl.emit
    p = e(Op.permute, Permute((2, 0, 1)), x)
    g = e(Op.group, Group(0, 2), p)
    e(Op.ungroup, Ungroup(0, (-1, 2)), g)
    u = e(Op.unsqueeze, Unsqueeze((0, 3)), x)
    e(Op.squeeze, Squeeze((0,)), u)
    e(Op.slice, Slice((1, 2), (1, 0), (s - 1, 6), (2, 3)), x)
    e(Op.pad, Pad(((0, 0), (b, 1), (2, 0)), -math.inf), x)
    e(Op.select, Select(1, s - 1), x)
    e(Op.repeat, Repeat((0, 3), (sympy.Max(b, 2), 2 * s)), u)
    e(Op.pad, Pad(((0, sympy.Mod(s, 3)), (0, 0), (0, 0)), 0.0), x)
    w = e(Op.unfold, Unfold(1, 3, 2, 2), x)
    e(Op.fold, Fold(1, 2, 2, s), w)
    for kind in ReduceKind:
        e(Op.reduce, Reduce(kind, (0, 2)), x)
    for op in sorted(ops_with(Trait.UNARY), key=lambda o: o.value):
        e(op, NoSpec(), x)
    for op in (Op.add, Op.multiply, Op.pow):
        e(op, NoSpec(), x, x)
    for mode in DivideMode:
        e(Op.divide, Divide(mode), x, x)
    masks = [e(Op.compare, Compare(kind), x, x) for kind in CompareKind]
    e(Op.where, NoSpec(), masks[0], x, x)
    for dtype in DType:
        e(Op.cast, Cast(dtype), x)
    e(Op.bitcast, BitCast(DType.i32), x)
    e(Op.gather, Gather(1), x, i)
    e(Op.scatter, Scatter(1, "add"), x, i, x)
    e(Op.sort, Sort(2, True), x)
    e(Op.scan, Scan(1, "max", True), x)
    e(Op.fft, Fft(1, False, s, FftNorm.ortho, FftKind.r2c), x)
    e(Op.iota, Iota(2 * s + 1, DType.f32))
    nz = e(Op.nonzero, NonZero("nz"), masks[0])
    n = e(Op.arange, Arange("n"), e(Op.select, Select(0, 0), e(Op.select, Select(1, 0), nz)))
    e(Op.slice, Slice((0,), (0,), (symbol("n"),), (1,)), e(Op.add, NoSpec(), n, n))
    return bl.build([w])


def test_every_primitive_spec_round_trips():
    graph = _every_spec_graph()
    assert {n.op for n in graph.nodes} == set(tdag.PRIMITIVES)
    prog = Program.from_tdag(graph)
    tdag.verify(prog)
    assert_round_trip(prog)
    text = str(prog)
    for snippet in ("reduce[prod](%x, axes=(0, 2))", "divide[floor]", "compare[ge]",
                    "cast[bf16]", "value=-inf", "sizes=(-1, 2)", "stops=(s-1, 6)",
                    "index=s-1", "iota(length=2*s+1, dtype=f32)", "length=s)",
                    "widths=((0, 0), (b, 1), (2, 0))", "sizes=(Max(2,b), 2*s)",
                    "f32[b+Mod(s,3),s,6]", 'count="nz"', 'arange(%',
                    "n=s, norm=ortho, kind=r2c"):
        assert snippet in text, snippet


_NO_ORIGIN = Origin()


def _one_node_program(origin=_NO_ORIGIN, names=("x", "y"), graph_name="main",
                      pad_value=0.0) -> Program:
    t = TensorType((2,), DType.f32)
    node = Node(names[1], Op.pad, (names[0],), Pad(((1, 0),), pad_value),
                TensorType((3,), DType.f32), origin)
    graph = TDAG((Value(names[0], t),), {}, (node,), (names[1],))
    return Program.from_tdag(graph, graph_name)


@pytest.mark.parametrize("origin", [
    Origin("aten.sum", "encoder.layer.3", "model.py:12"),
    Origin("aten.sum"), Origin(scope="a.b"), Origin(location="x.py:1"),
    Origin("f(x)"), Origin("a @ b", "c"), Origin("op", "", "(nested) loc"),
    Origin('"quoted"'), Origin("multi\nline", "tab\tscope", "\u2028sep"),
    Origin(" padded ", "", ""), Origin("# hash", "s # t", "(l)"), Origin("", "@", ")"),
])
def test_origin_round_trips(origin):
    assert_round_trip(_one_node_program(origin))


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=12), st.text(max_size=12), st.text(max_size=12))
def test_any_origin_round_trips(op, scope, location):
    assert_round_trip(_one_node_program(Origin(op, scope, location)))


@pytest.mark.parametrize("names,graph_name", [
    (("a:b", "c.d"), "encoder.layer:1"),
    (("ends:", "ends."), "1starts_with_digit"),
    (("0", "a.b:c"), "if"),
    (("_", "9:"), "True"),
])
def test_odd_names_are_quoted_and_round_trip(names, graph_name):
    assert_round_trip(_one_node_program(names=names, graph_name=graph_name))


@pytest.mark.parametrize("names", [("with space", "b"), ("a", 'quote"'), ("ünïcode", "b")])
def test_names_verify_refuses_print_but_do_not_parse(names):
    """The printer quotes any name, so even a malformed program prints; parse verifies what
    it read, and a value name outside letters, digits, ``_ . :`` is refused there."""
    text = str(_one_node_program(names=names, graph_name="g"))
    with pytest.raises(InvalidModelError, match="invalid name"):
        parse(text)


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=False))
def test_spec_floats_round_trip_exactly(value):
    back = parse(str(_one_node_program(pad_value=value)))
    got = back.graph.nodes[0].spec.value
    assert got == value and math.copysign(1, got) == math.copysign(1, value)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(width=16, allow_nan=False), min_size=1, max_size=16),
       st.sampled_from([DType.f32, DType.f16, DType.bf16, DType.f64]))
def test_inline_const_values_are_bit_exact(values, dtype):
    value = torch.tensor(values, dtype=dtype.torch)
    t = TensorType(tuple(value.shape), dtype)
    graph = TDAG((), {"c": Weight(TensorKind.const, t, value)}, (), ("c",))
    assert_round_trip(Program.from_tdag(graph))


def test_const_of_every_dtype_and_empty_shapes_round_trip():
    weights = {f"c_{d.value}": Weight(TensorKind.const, TensorType((2, 2), d),
                                      torch.tensor([[1, 0], [0, 1]]).to(d.torch))
               for d in DType}
    for shape in [(0,), (2, 0), (0, 3)]:
        weights[f"e{len(weights)}"] = Weight(TensorKind.const, TensorType(shape, DType.f32),
                                             torch.zeros(shape))
    graph = TDAG((), weights, (), tuple(weights))
    assert_round_trip(Program.from_tdag(graph))


def test_shape_only_weights_print_types_only():
    t = TensorType((2,), DType.f32)
    graph = TDAG((), {"p": Weight(TensorKind.parameter, t), "k": Weight(TensorKind.const, t)},
                 (), ("p", "k"))
    text = str(Program.from_tdag(graph))
    assert "param %p: f32[2]\n" in text and "const %k: f32[2]\n" in text
    assert_round_trip(Program.from_tdag(graph))


# -- malformed text ---------------------------------------------------------------------------

def _mutate(old: str, new: str) -> str:
    assert old in GOLDEN
    return GOLDEN.replace(old, new, 1)


@pytest.mark.parametrize("text,line,fragment", [
    (_mutate("reduce[sum]", "reduce[avg]"), 10, "avg"),
    (_mutate("%6: f32[b,3] = multiply", "%6: f33[b,3] = multiply"), 9, "dtype"),
    (_mutate("multiply(%2, %5)", "frobnicate(%2, %5)"), 9, "unknown op"),
    (_mutate("axes=(1,)", "axes=(1)"), 10, "trailing comma"),
    (_mutate("axes=(1,)", "axez=(1,)"), 10, "no argument"),
    (_mutate("%7: f32[b]", "%7: f32[b+]"), 10, "dimension"),
    (_mutate("%7: f32[b]", "%7: f32[b] $"), 10, "unexpected character"),
    (_mutate("const %c3: f32[] = 0.5", "const %c3: f32[2] = [0.5]"), 3, "values"),
    (_mutate("const %c3", "constant %c3"), 3, "expected a weight"),
    (_mutate("param %w: f32[3]", "param %w: f32[3]\n  param %w: f32[3]"), 3, "twice"),
    (_mutate("%out0 = call main(%x)", "%out0 = jump main(%x)"), 15, "expected 'call'"),
    (_mutate("return %out0\n}\n", "return %out0\n"), 16, "ends"),
    (_mutate("%7: f32[b]", "%7: f32[__import__('os').getcwd()]"), 10, "unexpected"),
    (_mutate("%7: f32[b]", "%7: f32[exec(b)]"), 10, "dimension"),
    ("hello world\n", 1, "expected 'tdag'"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "")
def test_malformed_text_names_the_line(text, line, fragment):
    with pytest.raises(FileFormatError, match=rf"^line {line}: .*{fragment}") as info:
        parse(text)
    error = info.value  # no chained traceback from deep inside the parser
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


@pytest.mark.parametrize("text", ["", "\n\n", "# just a comment\n",
                                  GOLDEN.replace("program", "tdag second", 1)])
def test_text_without_a_program_is_rejected(text):
    with pytest.raises(FileFormatError):
        parse(text)
