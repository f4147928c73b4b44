"""tdag.cost: matmul flops against torch's FlopCounterMode, fused traffic of single kernels,
symbolic totals, control flow, and the scope tree."""
from __future__ import annotations

import pytest
import sympy
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import tdag
import tdag.lower
from tdag import ops
from tdag.ir.graph import TDAG, Value
from tdag.ir.op import Op
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.symbols import symbol
from tdag.ir.types import DType, TensorType
from tdag.refine import cost

from support.refine_programs import MODELS, from_torch, model, scoped_mlp

F32 = 4


def torch_flops(fn, *args) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def checked_cost(prog):
    tdag.verify(prog)
    report = cost(prog)
    tdag.verify(prog)
    return report


# -- matmul flops: torch's convention -----------------------------------------------------

W = torch.randn(24, 40)
CONV_W = torch.randn(6, 4, 3, 3)

# (name, tdag fn, torch fn, operands): each a computation whose contractions torch counts
TRACED = [
    ("matmul", lambda a, b: ops.matmul(a, b), torch.matmul,
     (torch.randn(8, 40), torch.randn(40, 24))),
    ("bmm", lambda a, b: ops.matmul(a, b), torch.matmul,
     (torch.randn(3, 8, 40), torch.randn(3, 40, 5))),
    ("linear", lambda x: ops.linear(x, ops.param("w", W), ops.param("b", torch.randn(24))),
     lambda x: F.linear(x, W, torch.randn(24)), (torch.randn(2, 7, 40),)),
    ("einsum", lambda a, b: ops.einsum("bij,bjk->bik", a, b),
     lambda a, b: torch.einsum("bij,bjk->bik", a, b),
     (torch.randn(2, 5, 6), torch.randn(2, 6, 7))),
    ("conv", lambda x: ops.conv(x, ops.param("w", CONV_W), stride=2, padding=1),
     lambda x: F.conv2d(x, CONV_W, stride=2, padding=1), (torch.randn(2, 4, 9, 9),)),
    ("grouped_conv", lambda x: ops.conv(x, ops.param("w", CONV_W[:, :2]), groups=2),
     lambda x: F.conv2d(x, CONV_W[:, :2], groups=2), (torch.randn(2, 4, 9, 9),)),
    ("mlp_gelu",
     lambda x: ops.linear(ops.gelu(ops.linear(x, ops.param("w", W))), ops.param("v", W.T)),
     lambda x: F.linear(F.gelu(F.linear(x, W)), W.T), (torch.randn(3, 40),)),
]


@pytest.mark.parametrize("name,fn,ref,args", TRACED, ids=[t[0] for t in TRACED])
def test_matmul_flops_equal_flop_counter_on_traced(name, fn, ref, args):
    prog = tdag.trace(fn, *(tdag.TensorSpec(tuple(a.shape)) for a in args))
    assert checked_cost(prog).matmul_flops == torch_flops(ref, *args)


def test_matvec_is_counted_where_flop_counter_misses_it():
    a, v = torch.randn(8, 40), torch.randn(40)
    assert torch_flops(torch.matmul, a, v) == 0  # aten.mv has no flop formula
    prog = tdag.trace(lambda a, v: ops.matmul(a, v), tdag.TensorSpec((8, 40)),
                      tdag.TensorSpec((40,)))
    assert checked_cost(prog).matmul_flops == 2 * 8 * 40


def test_matmul_flops_are_not_elementwise_products():
    # x*x summed (a variance) and a scale are not contractions
    prog = tdag.trace(lambda x: ops.var(x * 3.0, axis=-1) + ops.layer_norm(x, (8,)).sum(-1),
                      tdag.TensorSpec((4, 8)))
    report = checked_cost(prog)
    assert report.matmul_flops == 0 and report.flops > 0


def _attention_flops(b, heads, s, head_dim, layers) -> int:
    # q @ k^T and p @ v: 2 * (2*b*h*s*s*d); torch's counter misses CPU sdpa altogether
    return layers * 2 * (2 * b * heads * s * s * head_dim)


def _lstm_flops(b, s, d, hidden, layers=2, directions=2) -> int:
    flops, width = 0, d
    for _ in range(layers):
        flops += directions * s * 2 * b * 4 * hidden * (width + hidden)
        width = directions * hidden
    return flops


# where torch's counter misses a contraction, the hand-computed figure it misses
MISSED = {
    "encoder": lambda b: _attention_flops(b, 4, 6, 8, 2),
    "decoder": lambda b: _attention_flops(b, 4, 7, 8, 2),
    "tagger": lambda b: _lstm_flops(b, 5, 16, 24),
}


@pytest.mark.parametrize("name", MODELS)
def test_matmul_flops_equal_flop_counter_on_models(name):
    module, args = model(name)
    report = checked_cost(from_torch(name))
    for b in (2, 3):
        counted = torch_flops(module, *args(b))
        missed = MISSED.get(name, lambda b: 0)(b)
        assert report.evaluate(batch=b).matmul_flops == counted + missed


def test_attention_is_missed_by_flop_counter_and_counted_by_tdag():
    q = torch.randn(2, 4, 7, 8)
    assert torch_flops(F.scaled_dot_product_attention, q, q, q) == 0
    prog = tdag.trace(lambda q, k, v: ops.scaled_dot_product_attention(q, k, v),
                      *[tdag.TensorSpec((2, 4, 7, 8))] * 3)
    assert checked_cost(prog).matmul_flops == 2 * (2 * 2 * 4 * 7 * 7 * 8)


def test_lowered_kernels_count_the_same_matmul_flops_and_traffic():
    # the fused figure approximates what the lowered program moves; its single-pass
    # softmax and norm kernels read their input once where the model reads it twice, and
    # its max_pool reads each window once where the composition reduces it three times (its
    # max, the first max's position, the sum that gives the first max its gradient)
    for name, over in (("mlp", 1.25), ("cnn", 2.1), ("decoder", 1.25)):
        prog = from_torch(name)
        before = cost(prog).evaluate(batch=3)
        # without the deployment folds, which drop work (a batch norm into its conv)
        after = checked_cost(tdag.lower.lower(prog, final=())).evaluate(batch=3)
        assert after.matmul_flops == before.matmul_flops
        assert after.fused_bytes <= before.fused_bytes <= over * after.fused_bytes, name
        assert after.unfused_bytes < before.unfused_bytes


def test_lstm_kernel_counts_its_gate_products_as_matmul_flops():
    """The lowered LSTM kernel's gate products are the unrolled cells' contractions."""
    prog = from_torch("tagger")
    lowered = tdag.lower.lower(prog)
    assert Op.lstm in {node.op for node in lowered.graph.nodes}
    before, after = cost(prog).evaluate(batch=3), checked_cost(lowered).evaluate(batch=3)
    assert after.matmul_flops == before.matmul_flops == _lstm_flops(3, 5, 16, 24) + \
        2 * 3 * 5 * 48 * 7  # the classifier


# -- fused traffic: one kernel moves inputs + weights + output ------------------------------

def test_fused_bytes_of_a_large_matmul_are_inputs_weights_output():
    m, k, n = 512, 1024, 768
    weight, bias = torch.empty(n, k), torch.empty(n)
    prog = tdag.trace(lambda x: ops.linear(x, ops.param("w", weight), ops.param("b", bias)),
                      tdag.TensorSpec((m, k)))
    report = checked_cost(prog)
    assert report.fused_read == (m * k + n * k + n) * F32
    assert report.fused_written == m * n * F32
    assert report.matmul_flops == 2 * m * k * n
    # unfused, the [m,k,n] product is written and read back
    assert report.unfused_bytes > 2 * m * k * n * F32


@pytest.mark.parametrize("stride,padding,bias", [(1, 1, True), (2, 0, False), (1, 2, True)])
def test_fused_bytes_of_a_convolution_are_inputs_weights_output(stride, padding, bias):
    x_shape, w_shape = (4, 16, 32, 32), (32, 16, 3, 3)
    w, b = torch.empty(w_shape), torch.empty(32)
    prog = tdag.trace(lambda x: ops.conv(x, ops.param("w", w), ops.param("b", b) if bias else None,
                                         stride=stride, padding=padding),
                      tdag.TensorSpec(x_shape))
    out = prog.graph.output_types[0]
    report = checked_cost(prog)
    expected = (4 * 16 * 32 * 32 + 32 * 16 * 9 + (32 if bias else 0) + out.numel) * F32
    assert report.fused_bytes == expected
    assert report.matmul_flops == torch_flops(
        lambda x: F.conv2d(x, w, b if bias else None, stride=stride, padding=padding),
        torch.empty(x_shape))


def test_fused_softmax_reads_its_input_twice_and_writes_once():
    prog = tdag.trace(lambda x: ops.softmax(x, -1), tdag.TensorSpec((64, 128)))
    report = checked_cost(prog)
    big = 64 * 128 * F32
    # a max pass, then one kernel: x - max, exp, sum, divide; only [64] maxima in between
    assert 2 * big <= report.fused_read <= 2 * big + 3 * 64 * F32
    assert big <= report.fused_written <= big + 2 * 64 * F32


def test_views_of_outputs_are_free():
    prog = tdag.trace(lambda x: ops.permute(ops.exp(x), 1, 0), tdag.TensorSpec((8, 4)))
    report = checked_cost(prog)
    assert report.fused_bytes == 2 * 32 * F32 and report.unfused_bytes == 4 * 32 * F32
    assert report.bytes == 2 * 32 * F32  # run op by op, the permute is a strided view


# -- symbols, control flow ------------------------------------------------------------------

def test_symbolic_totals_evaluate_like_static_programs():
    symbolic = checked_cost(scoped_mlp(batch="b"))
    b = symbol("b")
    assert isinstance(symbolic.flops, sympy.Expr) and symbolic.flops.free_symbols == {b}
    for size in (5, 8):  # (a batch of 1 traces without the broadcasts over it)
        static = cost(scoped_mlp(batch=size))
        evaluated = symbolic.evaluate(b=size)
        for field in ("flops", "matmul_flops", "bytes_read", "bytes_written", "fused_read",
                      "fused_written"):
            assert getattr(evaluated, field) == getattr(static, field), field
        assert evaluated["flops"] == static.flops
        assert evaluated.fused_intensity == pytest.approx(static.fused_intensity)


def _step_graph() -> TDAG:
    body = tdag.trace(lambda i, h: (ops.tanh(ops.matmul(h, ops.param("w", torch.randn(8, 8)))),),
                      tdag.TensorSpec((), "int64"), tdag.TensorSpec((4, 8)))
    return body.graph


def _loop_program(count) -> Program:
    graph = _step_graph()
    i, h = graph.inputs
    body = Block((Value("i", i.type), Value("h", h.type)), (Call("step", ("i", "h"), ("h1",)),),
                 ("h1",))
    loop = Loop(("h0",), body, ("hn",), count=count)
    return Program({"step": graph}, Block((Value("h0", h.type),), (loop,), ("hn",)))


def test_a_loop_multiplies_its_body_by_the_trip_count():
    one = cost(_step_graph())
    for count in (5, "t"):
        prog = _loop_program(count)
        report = checked_cost(prog)
        assert report.flops == one.flops * (symbol(count) if isinstance(count, str) else count)
        assert report.per_graph["step"] == report.total
    assert checked_cost(_loop_program("t")).evaluate(t=3).matmul_flops == 3 * 2 * 4 * 8 * 8
    while_loop = _loop_program(None).main.steps[0]
    cond = Value("go", TensorType((), DType.bool))
    graph = _loop_program(None).graphs["step"]
    step = tdag.trace(lambda h: ops.sum(h) > 0.0, tdag.TensorSpec((4, 8))).graph
    body = Block(while_loop.body.inputs, while_loop.body.steps + (Call("more", ("h1",), ("go1",)),),
                 ("go1", "h1"))
    prog = Program({"step": graph, "more": step},
                   Block((Value("h0", TensorType((4, 8), DType.f32)), cond),
                         (Loop(("h0",), body, ("hn",), cond="go"),), ("hn",)))
    tdag.verify(prog)
    assert cost(prog).flops.free_symbols == {symbol("trips_hn")}


def test_an_if_counts_its_costlier_branch():
    cheap = tdag.trace(lambda x: ops.neg(x), tdag.TensorSpec((4, 8))).graph
    dear = tdag.trace(lambda x: ops.exp(ops.exp(x)), tdag.TensorSpec((4, 8))).graph
    x, c = Value("x", TensorType((4, 8), DType.f32)), Value("c", TensorType((), DType.bool))
    branch = lambda g: Block((x,), (Call(g, ("x",), ("y",)),), ("y",))  # noqa: E731
    prog = Program({"cheap": cheap, "dear": dear},
                   Block((x, c), (If("c", ("x",), branch("cheap"), branch("dear"), ("y",)),),
                         ("y",)))
    report = checked_cost(prog)
    assert report.flops == 64
    assert report.per_graph["cheap"].flops == 32 and report.per_graph["dear"].flops == 64


def test_a_tdag_called_twice_costs_twice():
    graph = _step_graph()
    h = graph.inputs[1]
    i = Value("i", graph.inputs[0].type)
    steps = (Call("step", ("i", "h0"), ("h1",)), Call("step", ("i", "h1"), ("h2",)))
    prog = Program({"step": graph}, Block((i, Value("h0", h.type)), steps, ("h2",)))
    report = checked_cost(prog)
    assert report.flops == 2 * cost(graph).flops
    assert sum(f.flops for f in report.per_node.values()) == report.flops


# -- per node, op, scope; the table ---------------------------------------------------------

def test_breakdowns_add_up_to_the_totals():
    report = checked_cost(from_torch("decoder")).evaluate(batch=2)
    for table in (report.per_op, report.per_node, report.per_graph):
        assert sum(f.flops for f in table.values()) == report.flops
        assert sum(f.fused_bytes for f in table.values()) == report.fused_bytes
    assert report.scopes.total == report.total


def test_scopes_form_a_tree():
    report = checked_cost(scoped_mlp(depth=3))
    encoder = report.scopes.find("encoder")
    assert list(encoder.children) == ["layer"]
    layers = encoder.find("layer").children
    assert list(layers) == ["0", "1", "2"]
    assert layers["1"].path == "encoder.layer.1"
    assert report.per_scope["encoder.layer.1"].matmul_flops == 2 * 16 * 16 * symbol("b")
    total = sum((c.total.flops for c in layers.values()), 0)
    assert sympy.expand(report.per_scope["encoder"].flops - total) == 0
    assert sympy.expand(report.per_scope["encoder"].flops + report.per_scope["head"].flops
                        + report.scopes.own.flops - report.flops) == 0


def test_model_scopes_nest():
    report = cost(from_torch("encoder")).evaluate(batch=2)
    layer = report.scopes.find("encoder.layers.0")
    assert {"self_attn", "linear1", "linear2", "norm1", "norm2"} <= set(layer.children)
    assert layer.total.matmul_flops == (2 * 12 * 32 * 96 + 2 * 12 * 32 * 32 + 2 * 2 * 12 * 32 * 64
                                        + _attention_flops(2, 4, 6, 8, 1))


def test_table_prints_every_view():
    report = cost(scoped_mlp())
    for by in ("layer", "op", "scope", "graph", "node"):
        text = report.table(by=by, b=4)
        assert text.splitlines()[-1].startswith("total")
    scope_table = report.table(by="layer", b=4)  # the tree; "scope" lists paths flat
    assert "  layer" in scope_table and "    1" in scope_table
    assert "multiply" in report.table(by="op")  # symbolic figures print as expressions
    with pytest.raises(tdag.TdagError):
        report.table(by="module")
