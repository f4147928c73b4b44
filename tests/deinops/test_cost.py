"""Cost formulas checked by hand: ``REGISTRY[op].cost(spec, in_types, out_type)``.

Conventions (tdag/deinops/primitive.py): an elementwise op costs one flop per output element;
a reduction or fold one per input element; movement no flops. Bytes are unfused: each input
read once, the output written once; a gather reads only the rows it picks. A traced matmul
[m,k]x[k,n] (multiply + reduce-sum) sums to 2*m*k*n flops, the convention of
``torch.utils.flop_counter.FlopCounterMode``. Symbolic shapes give sympy costs.
"""
from __future__ import annotations

import pytest
import sympy
import torch
from torch.utils.flop_counter import FlopCounterMode

import tdag
from tdag.ir.record import REGISTRY, Cost
from tdag import ops as C
from tdag.deinops.bitcast import BitCast
from tdag.deinops.elementwise import Cast, Compare, CompareKind, Divide, DivideMode
from tdag.deinops.indexing import Gather, Iota
from tdag.deinops.extent import Pad, Repeat, Select, Slice
from tdag.deinops.movement import Group, Permute, Squeeze, Ungroup, Unsqueeze
from tdag.deinops.windows import Fold, Unfold
from tdag.ir.record import NoSpec
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.scan import Scan
from tdag.deinops.scatter import Scatter
from tdag.deinops.fft import Fft, FftKind
from tdag.deinops.sort import Sort
from tdag.ir.op import Op
from tdag.ir.record import Trait, ops_with
from tdag.ir.symbols import as_dim, symbol
from tdag.ir.types import DType, TensorType


def T(*shape, dtype="f32"):
    return TensorType(shape, dtype)


def node_cost(op, spec, *ins) -> Cost:
    prim = REGISTRY[op]
    out = prim.shape(spec, list(ins))
    return prim.cost(spec, list(ins), out)


# (op, spec, operand types, expected Cost(flops, bytes_read, bytes_written)), all by hand
HAND = [
    # unary: one flop per element; f32[2,3] is 24 bytes
    *[(op, NoSpec(), [T(2, 3)], Cost(6, 24, 24)) for op in sorted(ops_with(Trait.UNARY), key=str)],
    (Op.exp, NoSpec(), [T(4, dtype="f16")], Cost(4, 8, 8)),
    (Op.neg, NoSpec(), [T(5, dtype="i64")], Cost(5, 40, 40)),
    # binary: both operands read
    (Op.add, NoSpec(), [T(2, 3), T(2, 3)], Cost(6, 48, 24)),
    (Op.multiply, NoSpec(), [T(10, dtype="bool")] * 2, Cost(10, 20, 10)),
    (Op.divide, Divide(DivideMode.floor), [T(3, dtype="f64")] * 2, Cost(3, 48, 24)),
    (Op.divide, Divide(DivideMode.remainder), [T(3, dtype="i32")] * 2, Cost(3, 24, 12)),
    (Op.pow, NoSpec(), [T(2, 2)] * 2, Cost(4, 32, 16)),
    # where reads a 1-byte mask and both branches
    (Op.where, NoSpec(), [T(4, dtype="bool"), T(4), T(4)], Cost(4, 36, 16)),
    # compare writes 1-byte bools
    (Op.compare, Compare(CompareKind.lt), [T(5), T(5)], Cost(5, 40, 5)),
    # cast moves bytes, no flops
    (Op.cast, Cast(DType.f16), [T(10)], Cost(0, 40, 20)),
    (Op.cast, Cast(DType.i64), [T(10, dtype="bool")], Cost(0, 10, 80)),
    (Op.bitcast, BitCast(DType.i32), [T(10)], Cost(0, 40, 40)),
    # gather: the index and the picked rows only (5 of 1000 rows of 16 f32)
    (Op.gather, Gather(0), [T(1000, 16), T(5, dtype="i64")], Cost(0, 5 * 8 + 5 * 64, 5 * 64)),
    (Op.gather, Gather(1), [T(2, 100), T(3, dtype="i32")], Cost(0, 12 + 24, 24)),
    # iota writes only
    (Op.iota, Iota(7), [], Cost(0, 0, 56)),
    (Op.iota, Iota(7, DType.i32), [], Cost(0, 0, 28)),
    # reduce: one flop per input element
    (Op.reduce, Reduce(ReduceKind.sum, (1,)), [T(2, 3, 4)], Cost(24, 96, 32)),
    (Op.reduce, Reduce(ReduceKind.max, (0, 2)), [T(2, 3, 4)], Cost(24, 96, 12)),
    (Op.reduce, Reduce(ReduceKind.prod, (0,)), [T(6, dtype="f64")], Cost(6, 48, 8)),
    # scatter: the index and the values read (and, combining, the target rows they meet: one
    # flop each); the output, the target's copy, written once
    (Op.scatter, Scatter(0, "add"), [T(10, 4), T(3, dtype="i64"), T(3, 4)],
     Cost(12, 24 + 2 * 48, 160)),
    (Op.scatter, Scatter(0, "replace"), [T(10, 4), T(3, dtype="i64"), T(3, 4)],
     Cost(0, 24 + 48, 160)),
    # sort: ceil(log2 n) comparisons per element; the i64 permutation written
    (Op.sort, Sort(0, False), [T(8)], Cost(24, 32, 64)),
    (Op.sort, Sort(1, True), [T(2, 5, dtype="i32")], Cost(30, 40, 80)),
    # fft: 5 n log2 n per transform; c64 is 8 bytes an element (2 transforms of 4096; 3 real
    # signals of 8 to 5 frequencies each)
    (Op.fft, Fft(1, False, 4096), [T(2, 4096, dtype="c64")],
     Cost(2 * 5 * 4096 * 12, 2 * 4096 * 8, 2 * 4096 * 8)),
    (Op.fft, Fft(1, False, 8, kind=FftKind.r2c), [T(3, 8)], Cost(3 * 5 * 8 * 3, 96, 120)),
    # scan: one combine per element, linear in the axis
    (Op.scan, Scan(1, "add"), [T(2, 5)], Cost(10, 40, 40)),
    (Op.scan, Scan(0, "max", True), [T(4, dtype="i64")], Cost(4, 32, 32)),
    # movement: no flops; the input read, the output written
    (Op.permute, Permute((1, 0)), [T(2, 3)], Cost(0, 24, 24)),
    (Op.group, Group(0, 2), [T(2, 3)], Cost(0, 24, 24)),
    (Op.ungroup, Ungroup(0, (2, 3)), [T(6)], Cost(0, 24, 24)),
    (Op.squeeze, Squeeze((0,)), [T(1, 3)], Cost(0, 12, 12)),
    (Op.unsqueeze, Unsqueeze((0,)), [T(3)], Cost(0, 12, 12)),
    (Op.slice, Slice((0,), (2,), (6,), (2,)), [T(10)], Cost(0, 40, 8)),
    (Op.pad, Pad(((1, 2),)), [T(3)], Cost(0, 12, 24)),
    (Op.select, Select(0, 1), [T(4, 3)], Cost(0, 48, 12)),
    (Op.repeat, Repeat((0,), (4,)), [T(1, 3)], Cost(0, 12, 48)),
    (Op.unfold, Unfold(0, 3), [T(10)], Cost(0, 40, 96)),
    # fold overlap-adds: one flop per input element
    (Op.fold, Fold(0, 1, 1, 6), [T(4, 3)], Cost(12, 48, 24)),
]


def test_hand_table_covers_every_primitive():
    # a size data decides is symbolic in every cost: tests/deinops/test_runtime_sizes.py
    # checks those
    fresh = {op for op in tdag.PRIMITIVES if tdag.record(op).has(tdag.deinops.Trait.FRESH_SIZE)}
    assert {op for op, *_ in HAND} == set(tdag.PRIMITIVES) - fresh


@pytest.mark.parametrize("op,spec,ins,expected", HAND,
                         ids=[f"{op.value}-{i}" for i, (op, *_) in enumerate(HAND)])
def test_primitive_cost_by_hand(op, spec, ins, expected):
    got = node_cost(op, spec, *ins)
    assert isinstance(got, Cost)
    assert (got.flops, got.bytes_read, got.bytes_written) == \
        (expected.flops, expected.bytes_read, expected.bytes_written)
    assert all(isinstance(v, int) for v in (got.flops, got.bytes_read, got.bytes_written))


def test_cost_adds():
    assert Cost(1, 2, 3) + Cost(10, 20, 30) == Cost(11, 22, 33)


# -- whole graphs -----------------------------------------------------------------------------

def graph_cost(prog: tdag.Program) -> Cost:
    graph = prog.graph
    env = graph.types()
    total = Cost()
    for node in graph.nodes:
        total = total + REGISTRY[node.op].cost(node.spec, [env[n] for n in node.inputs],
                                               node.type)
    return total


def flop_counter(sa, sb) -> int:
    with FlopCounterMode(display=False) as counter:
        torch.matmul(torch.randn(sa), torch.randn(sb))
    return counter.get_total_flops()


MATMULS = [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)), ((7, 5), (5, 11)),
           ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)), ((5, 1, 2, 3), (4, 3, 2)), ((1, 1), (1, 1)),
           ((0, 3), (3, 2))]


def _matmul_flops(sa, sb) -> int:
    a, b = torch.empty(sa), torch.empty(sb)
    out = torch.matmul(a, b)
    k = sa[-1]
    return 2 * out.numel() * k


@pytest.mark.parametrize("sa,sb", MATMULS, ids=[f"{a}x{b}" for a, b in MATMULS])
def test_matmul_costs_2mkn(sa, sb):
    prog = tdag.trace(C.matmul, tdag.TensorSpec(sa), tdag.TensorSpec(sb))
    cost = graph_cost(prog)
    assert cost.flops == _matmul_flops(sa, sb)
    if len(sa) >= 2 and len(sb) >= 2:  # FlopCounterMode counts mm and bmm (not dot or mv)
        assert cost.flops == flop_counter(sa, sb)
    # only the multiply and the reduce-sum do arithmetic, mkn each
    flops = {n.op: REGISTRY[n.op].cost(n.spec, [prog.graph.types()[i] for i in n.inputs],
                                       n.type).flops for n in prog.graph.nodes}
    assert set(op for op, f in flops.items() if f) <= {Op.multiply, Op.reduce}


def test_matmul_bytes():
    """[2,3]x[3,4] f32: unsqueeze, repeat, multiply and reduce, each read and written once."""
    prog = tdag.trace(C.matmul, tdag.TensorSpec((2, 3)), tdag.TensorSpec((3, 4)))
    ops = [n.op for n in prog.graph.nodes]
    assert sorted(ops, key=str) == sorted([Op.unsqueeze, Op.unsqueeze, Op.repeat, Op.repeat,
                                           Op.multiply, Op.reduce], key=str)
    a, b, big, out = 24, 48, 2 * 3 * 4 * 4, 2 * 4 * 4
    read = a + b + a + b + 2 * big + big  # unsqueezes, repeats (small in), multiply, reduce
    written = a + b + 2 * big + big + out
    cost = graph_cost(prog)
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (2 * 2 * 3 * 4, read, written)


def test_elementwise_chain_bytes():
    prog = tdag.trace(lambda x, y: C.exp(x) * y, tdag.TensorSpec((8, 4)), tdag.TensorSpec((8, 4)))
    cost = graph_cost(prog)
    nbytes = 8 * 4 * 4
    assert (cost.flops, cost.bytes_read, cost.bytes_written) == (64, 3 * nbytes, 2 * nbytes)


def test_embedding_reads_only_picked_rows():
    table = torch.randn(50000, 64)
    prog = tdag.trace(lambda idx: C.gather(tdag.ops.param("emb", table), idx, 0),
                      tdag.TensorSpec((4, 7), "int64"))
    (node,) = [n for n in prog.graph.nodes if n.op is Op.gather]
    env = prog.graph.types()
    cost = REGISTRY[Op.gather].cost(node.spec, [env[n] for n in node.inputs], node.type)
    assert cost.bytes_read == 4 * 7 * 8 + 4 * 7 * 64 * 4  # index + 28 rows, not 50000
    assert cost.bytes_written == 4 * 7 * 64 * 4


# -- symbolic costs ---------------------------------------------------------------------------

B = symbol("b")


def test_symbolic_matmul_cost():
    prog = tdag.trace(C.matmul, tdag.TensorSpec(("b", 5, 3)), tdag.TensorSpec((3, 4)))
    cost = graph_cost(prog)
    assert isinstance(cost.flops, sympy.Expr) and cost.flops.free_symbols == {B}
    assert sympy.simplify(cost.flops - 2 * B * 5 * 3 * 4) == 0
    for b in (1, 2, 9):
        concrete = graph_cost(tdag.trace(C.matmul, tdag.TensorSpec((b, 5, 3)),
                                         tdag.TensorSpec((3, 4))))
        for field in ("flops", "bytes_read", "bytes_written"):
            value = getattr(cost, field).subs(B, b)
            assert value == getattr(concrete, field), (field, b)
        assert concrete.flops == flop_counter((b, 5, 3), (3, 4))


def test_symbolic_primitive_costs():
    x = T("b", 3)
    assert node_cost(Op.exp, NoSpec(), x) == Cost(as_dim(3 * B), as_dim(12 * B), as_dim(12 * B))
    assert node_cost(Op.reduce, Reduce(ReduceKind.sum, (0,)), x) == \
        Cost(as_dim(3 * B), as_dim(12 * B), 12)
    assert node_cost(Op.repeat, Repeat((1,), (B,)), T(2, 1)) == Cost(0, 8, as_dim(8 * B))
    assert node_cost(Op.iota, Iota(B + 1), ) == Cost(0, 0, as_dim(8 * B + 8))
    gathered = node_cost(Op.gather, Gather(0), T(100, 4), T("b", dtype="i64"))
    assert gathered == Cost(0, as_dim(8 * B + 16 * B), as_dim(16 * B))
    unfolded = node_cost(Op.unfold, Unfold(0, 3), T("b"))
    assert sympy.expand(unfolded.bytes_written - 12 * (B - 2)) == 0
    assert unfolded.bytes_written.subs(B, 10) == 4 * 8 * 3


def _at(type_: TensorType, b: int) -> TensorType:
    return type_.with_shape(as_dim(sympy.sympify(d).subs(B, b)) for d in type_.shape)


def test_symbolic_program_cost_evaluates():
    """mean(exp(x)) over a symbolic batch: the symbolic total, once b is bound, equals the
    sum of the node costs computed on concrete types (and the static trace's total, up to the
    nodes that count a symbolic axis length at run time)."""
    prog = tdag.trace(lambda x: C.mean(C.exp(x), 0), tdag.TensorSpec(("b", 6)))
    cost = graph_cost(prog)
    assert isinstance(cost.flops, sympy.Expr) and cost.flops.free_symbols == {B}
    env = prog.graph.types()
    for b in (1, 4, 13):
        concrete = Cost()
        for node in prog.graph.nodes:
            ins = [_at(env[n], b) for n in node.inputs]
            concrete = concrete + REGISTRY[node.op].cost(node.spec, ins, _at(node.type, b))
        for field in ("flops", "bytes_read", "bytes_written"):
            assert as_dim(sympy.sympify(getattr(cost, field)).subs(B, b)) == \
                getattr(concrete, field), (field, b)
        # exp (6b) + reduce-sum (6b) + divide (6) are the arithmetic; counting b costs b more
        assert cost.flops.subs(B, b) == 6 * b + 6 * b + 6 + b
