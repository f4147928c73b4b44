"""simplify: every rule before and after on random inputs, the pass manager, real models."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdag
from tdag import ops
from tdag.deinops.elementwise import Cast, Divide, DivideMode
from tdag.deinops.extent import Pad, Repeat, Slice
from tdag.deinops.movement import Group, Permute, Squeeze, Ungroup, Unsqueeze
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.ir.op import Op
from tdag.ir.types import DType
from tdag.refine import PIPELINE, PassError, PassManager, simplify
from tdag.refine.constants import fold_constants
from tdag.refine.rules import rewrite
from tdag.refine.simplify import cse, dead_code, per_graph

from support.refine_programs import MODELS, close, from_torch, model, outputs


def emit(op, spec, *xs):
    """A primitive node as it is, with no shortcut for identities (ops.* skip some)."""
    return xs[0].builder.emit(op, spec, *xs)


def check(fn, shape, passes=PIPELINE, most: int = 0, ops_gone=(), dtype="float32"):
    """Trace, simplify, and compare on random inputs; at most ``most`` nodes may remain."""
    prog = tdag.trace(fn, tdag.TensorSpec(shape, dtype))
    tdag.verify(prog)
    simple = simplify(prog, passes, check=True)
    tdag.verify(simple)
    x = torch.randn(shape) if dtype == "float32" else torch.randint(-5, 5, shape)
    assert close(outputs(simple, x), outputs(prog, x), atol=0)
    assert simple.num_nodes <= most < prog.num_nodes or simple.num_nodes == most == 0
    assert simple.num_nodes < prog.num_nodes
    remaining = {n.op for n in simple.graph.nodes}
    assert not remaining & set(ops_gone), remaining
    return simple


# (name, fn, input shape, nodes left at most, ops that must be gone)
RULES = [
    ("permute_permute_identity",
     lambda x: emit(Op.permute, Permute((2, 0, 1)), emit(Op.permute, Permute((1, 2, 0)), x)),
     (2, 3, 4), 0, ()),
    ("permute_permute_compose",
     lambda x: emit(Op.permute, Permute((0, 2, 1)), emit(Op.permute, Permute((1, 2, 0)), x)),
     (2, 3, 4), 1, ()),
    ("identity_permute", lambda x: ops.exp(emit(Op.permute, Permute((0, 1)), x)), (2, 3), 1,
     (Op.permute,)),
    ("group_ungroup",
     lambda x: emit(Op.group, Group(1, 2), emit(Op.ungroup, Ungroup(1, (2, 3)), x)),
     (4, 6), 0, ()),
    ("ungroup_group",
     lambda x: emit(Op.ungroup, Ungroup(0, (2, -1)), emit(Op.group, Group(0, 2), x)),
     (2, 3, 5), 0, ()),
    ("squeeze_unsqueeze",
     lambda x: emit(Op.squeeze, Squeeze((0, 2)), emit(Op.unsqueeze, Unsqueeze((0, 2)), x)),
     (3, 4), 0, ()),
    ("squeeze_part_of_unsqueeze",
     lambda x: emit(Op.squeeze, Squeeze((2,)), emit(Op.unsqueeze, Unsqueeze((0, 2)), x)),
     (3, 4), 1, (Op.squeeze,)),
    ("unsqueeze_squeeze",
     lambda x: emit(Op.unsqueeze, Unsqueeze((1,)), emit(Op.squeeze, Squeeze((1,)), x)),
     (3, 1, 4), 0, ()),
    ("unsqueeze_unsqueeze",
     lambda x: ops.exp(emit(Op.unsqueeze, Unsqueeze((1, 3)),
                            emit(Op.unsqueeze, Unsqueeze((0,)), x))),
     (3, 4), 2, ()),
    ("squeeze_squeeze",
     lambda x: ops.exp(emit(Op.squeeze, Squeeze((1,)), emit(Op.squeeze, Squeeze((0,)), x))),
     (1, 3, 1, 4), 2, ()),
    ("slice_of_pad_recovers",
     lambda x: emit(Op.slice, Slice((0, 1), (2, 1), (5, 4), (1, 1)),
                    emit(Op.pad, Pad(((2, 1), (1, 1)), 7.0), x)),
     (3, 3), 0, ()),
    ("slice_inside_pad",
     lambda x: emit(Op.slice, Slice((0,), (3,), (6,), (2,)),
                    emit(Op.pad, Pad(((2, 1), (0, 0))), x)),
     (5, 3), 1, (Op.pad,)),
    ("identity_slice", lambda x: ops.exp(emit(Op.slice, Slice((0,), (0,), (3,), (1,)), x)), (3, 2),
     1, (Op.slice,)),
    ("identity_pad", lambda x: ops.exp(emit(Op.pad, Pad(((0, 0), (0, 0))), x)), (3, 2), 1,
     (Op.pad,)),
    ("identity_repeat", lambda x: ops.exp(emit(Op.repeat, Repeat((1,), (1,)), x)), (3, 1), 1,
     (Op.repeat,)),
    ("identity_group", lambda x: ops.exp(emit(Op.group, Group(0, 1), x)), (3, 2), 1, (Op.group,)),
    ("identity_ungroup", lambda x: ops.exp(emit(Op.ungroup, Ungroup(0, (-1,)), x)), (3, 2), 1,
     (Op.ungroup,)),
    ("identity_cast", lambda x: ops.exp(emit(Op.cast, Cast(DType.f32), x)), (3,), 1, (Op.cast,)),
    ("reduce_no_axes", lambda x: ops.exp(emit(Op.reduce, Reduce(ReduceKind.sum, ()), x)), (3,), 1,
     (Op.reduce,)),
    ("mul_one", lambda x: ops.exp(x * 1.0), (3, 4), 1, (Op.multiply,)),
    ("one_mul", lambda x: ops.exp(ops.ones((3, 4)) * x), (3, 4), 1, (Op.multiply,)),
    ("add_zero", lambda x: ops.exp(x + 0.0), (3, 4), 1, (Op.add,)),
    ("zero_add", lambda x: ops.exp(ops.zeros((3, 4)) + x), (3, 4), 1, (Op.add,)),
    ("div_one", lambda x: ops.exp(x / 1.0), (3, 4), 1, (Op.divide,)),
    ("pow_one", lambda x: ops.exp(ops.pow(x, 1.0)), (3, 4), 1, (Op.pow,)),
    ("neg_neg", lambda x: ops.exp(-(-x)), (3, 4), 1, (Op.neg,)),
    ("where_same", lambda x: ops.where(x > 0, ops.exp(x), ops.exp(x)), (3, 4), 1, (Op.where,)),
    ("cse", lambda x: ops.exp(x) * ops.exp(x) + ops.exp(x) * ops.exp(x), (3, 4), 3, ()),
    ("cse_commutative", lambda x: ops.exp(x) * ops.tanh(x) + ops.tanh(x) * ops.exp(x), (3,), 4, ()),
    ("dead_code", lambda x: (ops.tanh(ops.exp(x)), ops.sin(x))[0], (3,), 2, (Op.sin,)),
    ("fold_constants", lambda x: x + ops.exp(ops.const(torch.arange(4.0))) * 2.0, (4,), 1,
     (Op.exp, Op.multiply)),
    ("fold_iota", lambda x: x + ops.arange(4) * 3, (4,), 2, (Op.iota, Op.multiply)),
]


@pytest.mark.parametrize("name,fn,shape,most,gone", RULES, ids=[r[0] for r in RULES])
def test_rule_before_and_after(name, fn, shape, most, gone):
    check(fn, shape, most=most, ops_gone=gone)


def test_plus_zero_keeps_integers_exact():
    check(lambda x: ops.neg(x + 0), (5,), most=1, ops_gone=(Op.add,), dtype="int64")


def test_floor_division_by_one_is_kept_for_floats():
    prog = tdag.trace(lambda x: emit(Op.divide, Divide(DivideMode.floor), x,
                                     ops.broadcast_to(ops.const(1.0), (4,))),
                      tdag.TensorSpec((4,)))
    assert any(n.op is Op.divide for n in simplify(prog).graph.nodes)


def test_integer_remainder_by_one_stays_zero():
    """x % 1 is 0, not x (the x / 1 -> x rule once took it; Col2Im's stride-1 taps)."""
    prog = tdag.trace(lambda x: ops.remainder(x, 1), tdag.TensorSpec((3,), "int64"))
    x = torch.tensor([-3, 4, 5])
    assert torch.equal(tdag.run(simplify(prog), x), torch.zeros(3, dtype=torch.int64))


def test_constant_folding_leaves_big_results_alone():
    big = torch.randn(100, 100)
    prog = tdag.trace(lambda x: x + ops.exp(ops.const(big)), tdag.TensorSpec((100, 100)))
    simple = simplify(prog)
    assert any(n.op is Op.exp for n in simple.graph.nodes)
    assert sum(w.type.numel for w in simple.graph.weights.values()) == big.numel()
    folded, changed = fold_constants(prog.graph, limit=20000)
    assert changed and not any(n.op is Op.exp for n in folded.nodes)


def test_parameters_are_not_folded():
    w = torch.randn(4)
    prog = tdag.trace(lambda x: x + ops.exp(ops.param("w", w)), tdag.TensorSpec((4,)))
    assert any(n.op is Op.exp for n in simplify(prog).graph.nodes)


# -- algebra, by hypothesis ---------------------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(st.permutations(range(4)), st.permutations(range(4)))
def test_any_two_permutes_become_at_most_one(p, q):
    fn = lambda x: emit(Op.permute, Permute(tuple(q)), emit(Op.permute, Permute(tuple(p)), x))  # noqa
    prog = tdag.trace(fn, tdag.TensorSpec((2, 3, 4, 5)))
    simple = simplify(prog)
    x = torch.randn(2, 3, 4, 5)
    assert close(outputs(simple, x), outputs(prog, x), atol=0)
    assert simple.num_nodes == (0 if [p[i] for i in q] == [0, 1, 2, 3] else 1)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2), st.sampled_from([(2, 3), (3, 2), (6, 1), (1, 6), (2, -1)]))
def test_ungroup_then_group_is_identity(axis, sizes):
    shape = [2, 3, 4]
    shape.insert(axis, 6)
    fn = lambda x: emit(Op.group, Group(axis, 2), emit(Op.ungroup, Ungroup(axis, sizes), x))  # noqa
    prog = tdag.trace(fn, tdag.TensorSpec(tuple(shape)))
    assert simplify(prog).num_nodes == 0


# -- the pass manager ---------------------------------------------------------------------

def test_each_pass_says_whether_it_changed_the_program():
    prog = tdag.trace(lambda x: ops.exp(x) + ops.exp(x), tdag.TensorSpec((3,)))
    for name, run in PIPELINE:
        same, changed = run(prog)
        assert changed == (name == "cse") and (changed or same is prog), name
    once, changed = per_graph(cse)(prog)
    assert changed and per_graph(cse)(once)[1] is False
    dead = tdag.trace(lambda x: (ops.exp(x), ops.sin(x))[0], tdag.TensorSpec((3,)))
    assert dead_code(dead)[1] is True and dead_code(dead_code(dead)[0])[1] is False


def test_the_manager_runs_to_a_fixed_point():
    prog = tdag.trace(lambda x: -(-(-(-ops.exp(x) * 1.0))) + 0.0, tdag.TensorSpec((3,)))
    simple, changed = PassManager(PIPELINE)(prog)
    assert changed and simple.num_nodes == 1
    assert PassManager(PIPELINE)(simple) == (simple, False)


def test_a_failing_pass_is_named():
    def broken(prog):
        graph = prog.graph
        return prog.with_graph("main", graph.replace(outputs=("nowhere",))), True

    prog = tdag.trace(lambda x: ops.exp(x), tdag.TensorSpec((3,)))
    with pytest.raises(PassError, match="pass broken left a malformed program"):
        PassManager([("broken", broken)], check=True)(prog)

    def raising(prog):
        raise tdag.ShapeError("no luck")

    with pytest.raises(PassError, match="pass raising failed: no luck"):
        PassManager([("raising", raising)])(prog)
    with pytest.raises(PassError, match="no fixed point"):
        PassManager([("restless", lambda p: (p, True))], max_rounds=3)(prog)


def test_rules_are_data_with_their_algebra():
    import inspect

    from tdag.refine import rules
    source = inspect.getsource(rules)
    for rule in rules.RULES:
        line = next(l for l in source.splitlines() if "Rule(" in l and
                    f"{rule.fn.__name__})" in l)
        assert "->" in line.split("#", 1)[1], line


def test_a_single_sweep_collapses_a_chain():
    fn = lambda x: emit(Op.permute, Permute((1, 0)), emit(Op.permute, Permute((1, 0)),  # noqa
                                                          emit(Op.permute, Permute((1, 0)), x)))
    prog = tdag.trace(fn, tdag.TensorSpec((2, 3)))
    graph, changed = rewrite(prog.graph)
    assert changed and len([n for n in graph.nodes if n.name in graph.outputs]) == 1


# -- real models ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", MODELS)
def test_models_shrink_and_compute_the_same(name):
    module, args = model(name)
    prog = from_torch(name)
    simple = simplify(prog, check=True)
    tdag.verify(simple)
    assert simple.num_nodes < prog.num_nodes
    example = args(3)
    assert close(outputs(simple, *example), outputs(prog, *example), atol=1e-5)
    weights = lambda p: {k: w for g in p.graphs.values()  # noqa: E731  (loops: several TDAGs)
                         for k, w in g.weights.items()}
    assert set(weights(simple)) >= {k for k, w in weights(prog).items()
                                    if w.kind is not tdag.TensorKind.const}
