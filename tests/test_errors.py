"""Bad input raises tdag's own errors, and the message names what failed: the node, the
operands and their types, the input, the weight."""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag import InvalidModelError, Node, ShapeError, TdagError, TensorSpec, TensorType
from tdag import ops as C
from tdag.ops.builder import Builder
from tdag.deinops.elementwise import Divide, DivideMode
from tdag.deinops.indexing import Iota
from tdag.deinops.extent import Repeat
from tdag.deinops.movement import Permute, Ungroup
from tdag.deinops.windows import Fold
from tdag.ir.record import NoSpec
from tdag.ir.op import Op
from tdag.ir.types import Origin, TensorKind


def f32(*shape):
    return TensorType(shape, "f32")


def builder_with(*types):
    b = Builder()
    return b, [b.input(f"x{i}", t) for i, t in enumerate(types)]


# -- trace time -------------------------------------------------------------------------------

def test_primitive_shape_error_names_node_and_operands():
    b, (x, y) = builder_with(f32(2, 3), f32(3, 2))
    with pytest.raises(ShapeError) as info:
        b.emit(Op.add, None, x, y, name="bad_add")
    message = str(info.value)
    assert "%bad_add" in message and info.value.node == "bad_add"
    assert "%x0: f32[2,3]" in message and "%x1: f32[3,2]" in message


def test_shape_error_carries_the_origin():
    b, (x,) = builder_with(f32(2, 3))
    with b.scope(Origin("aten.permute", "encoder.layer.3")):
        with pytest.raises(ShapeError, match=r"encoder\.layer\.3") as info:
            b.emit(Op.permute, Permute((0, 0)), x, name="p")
    assert "%p" in str(info.value) and "aten.permute" in str(info.value)


@pytest.mark.parametrize("fn,specs,words", [
    (lambda x, y: x + y, [(2, 3), (4,)], ["add", "%x: f32[2,3]", "%y: f32[4]"]),
    (lambda x, y: x - y, [(2, 3), (4,)], ["sub", "%x: f32[2,3]", "%y: f32[4]"]),
    (lambda x, y: C.matmul(x, y), [(2, 3), (4, 5)], ["matmul", "%x: f32[2,3]", "%y: f32[4,5]"]),
    (lambda x, y: C.concat([x, y], 0), [(2, 3), (2, 4)],
     ["concat", "%x: f32[2,3]", "%y: f32[2,4]"]),
    (lambda x, y: C.where(x > 0, x, y), [(2, 3), (3, 2)], ["where", "%y: f32[3,2]"]),
    (lambda x: C.reshape(x, (4,)), [(2, 3)], ["reshape", "%x: f32[2,3]"]),
    (lambda x: C.squeeze(x, 0), [(2, 3)], ["squeeze", "%x: f32[2,3]", "node %"]),
    (lambda x: x[5], [(2, 3)], ["select", "%x: f32[2,3]", "node %"]),
    (lambda x: C.permute(x, 0, 0), [(2, 3)], ["permute", "%x: f32[2,3]", "node %"]),
    (lambda x: C.exp(x) + C.ones((5,)), [(2, 3)], ["add", "f32[2,3]", "f32[5]"]),
])
def test_helper_shape_errors_name_operands(fn, specs, words):
    with pytest.raises(ShapeError) as info:
        tdag.trace(fn, *[TensorSpec(s) for s in specs])
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("op,spec,types", [
    (Op.add, NoSpec(), [f32(2), TensorType((2,), "f64")]),        # dtypes differ
    (Op.add, NoSpec(), [TensorType((2,), "bool")] * 2),          # bool arithmetic
    (Op.exp, NoSpec(), [TensorType((2,), "i64")]),               # float-only op
    (Op.divide, Divide(DivideMode.true), [TensorType((2,), "i64")] * 2),
    (Op.where, NoSpec(), [f32(2), f32(2), f32(2)]),              # the condition is not bool
    (Op.repeat, Repeat((0,), (-1,)), [f32(1, 3)]),               # a negative size
    (Op.repeat, Repeat((1,), (4,)), [f32(1, 3)]),                # not a size-1 axis
    (Op.ungroup, Ungroup(0, (-2, -3)), [f32(6)]),                # negative sizes
    (Op.ungroup, Ungroup(0, (4, -1)), [f32(6)]),                 # not divisible
    (Op.fold, Fold(0, 0, 1, 4), [f32(3, 2)]),                    # step 0
    (Op.iota, Iota(-2), []),                                     # a negative length
])
def test_bad_specs_and_operands_are_shape_errors(op, spec, types):
    b, xs = builder_with(*types)
    with pytest.raises(ShapeError, match="%bad"):
        b.emit(op, spec, *xs, name="bad")


def test_wrong_spec_type_and_arity_at_trace_time():
    b, (x, y) = builder_with(f32(2), f32(2))
    with pytest.raises(ShapeError, match="NoSpec"):
        b.emit(Op.add, Permute((0,)), x, y, name="s")
    with pytest.raises(ShapeError, match="expected 2 inputs"):
        b.emit(Op.add, None, x, name="a")


def test_bool_of_traced_tensor():
    def branchy(x):
        if x.sum() > 0:  # data-dependent Python control flow
            return x
        return -x
    with pytest.raises(TdagError, match="truth value"):
        tdag.trace(branchy, TensorSpec((3,)))
    with pytest.raises(TdagError, match="controller"):
        tdag.trace(lambda x: x if bool(x) else x, TensorSpec(()))


def test_operand_from_another_graph():
    b1, (x,) = builder_with(f32(2))
    b2, (y,) = builder_with(f32(2))
    with pytest.raises(TdagError, match="not a tensor of this graph"):
        b1.emit(Op.add, None, x, y, name="mixed")


def test_duplicate_names_at_trace_time():
    b, (x,) = builder_with(f32(2))
    b.emit(Op.neg, None, x, name="n")
    with pytest.raises(TdagError, match="defined twice"):
        b.emit(Op.neg, None, x, name="n")
    with pytest.raises(TdagError, match="defined twice"):
        b.input("x0", f32(2))


# -- hand-built TDAGs: the verifier -----------------------------------------------------------

def small_graph():
    """x -> a = neg(x) -> c = add(a, a)."""
    prog = tdag.trace(lambda x: C.neg(x) + C.neg(x), TensorSpec((2, 3)))
    graph = prog.graph
    x = graph.inputs[0]
    a = Node("a", Op.neg, (x.name,), NoSpec(), x.type)
    c = Node("c", Op.add, ("a", "a"), NoSpec(), x.type)
    return graph.replace(nodes=(a, c), outputs=("c",), weights={})


def test_hand_built_graph_verifies_and_runs():
    graph = small_graph()
    tdag.verify(graph)
    x = torch.randn(2, 3)
    assert torch.equal(tdag.run(graph, x), -x + -x)


def test_cycle():
    graph = small_graph()
    a, c = graph.nodes
    cyclic = graph.replace(nodes=(a.replace(inputs=("c",)), c))  # a reads c, c reads a
    with pytest.raises(InvalidModelError, match="cycle") as info:
        tdag.verify(cyclic)
    assert "%c" in str(info.value) and info.value.node == "a"
    with pytest.raises(InvalidModelError, match="topological order") as info:
        tdag.run(cyclic, torch.randn(2, 3))
    assert info.value.node == "a"
    reordered = graph.replace(nodes=(c, a))  # out of topological order
    with pytest.raises(InvalidModelError, match="order") as info:
        tdag.verify(reordered)
    assert info.value.node == "c"


def test_dangling_name():
    graph = small_graph()
    a, c = graph.nodes
    dangling = graph.replace(nodes=(a, c.replace(inputs=("a", "ghost"))))
    with pytest.raises(InvalidModelError, match="dangling") as info:
        tdag.verify(dangling)
    assert "%ghost" in str(info.value) and "%c" in str(info.value)
    with pytest.raises(InvalidModelError, match="ghost"):
        tdag.run(dangling, torch.randn(2, 3))
    with pytest.raises(InvalidModelError, match="output %nowhere"):
        tdag.verify(graph.replace(outputs=("nowhere",)))


def test_duplicate_names():
    graph = small_graph()
    a, c = graph.nodes
    with pytest.raises(InvalidModelError, match="defined twice") as info:
        tdag.verify(graph.replace(nodes=(a, c.replace(name="a"))))
    assert info.value.node == "a"
    x = graph.inputs[0].name
    with pytest.raises(InvalidModelError, match=f"%{x} is defined twice"):
        tdag.verify(graph.replace(nodes=(a, c.replace(name=x))))
    with pytest.raises(InvalidModelError, match="invalid name"):
        tdag.verify(graph.replace(nodes=(a, c.replace(name="not a name")), outputs=("a",)))


def test_stored_type_disagrees_with_shape_rule():
    graph = small_graph()
    a, c = graph.nodes
    for wrong in (f32(3, 2), TensorType((2, 3), "f64"), f32(2, 3, 1)):
        bad = graph.replace(nodes=(a, c.replace(type=wrong)))
        with pytest.raises(InvalidModelError, match="node says") as info:
            tdag.verify(bad)
        assert info.value.node == "c" and str(wrong) in str(info.value)


def test_bad_spec_type_and_wrong_arity_in_a_graph():
    graph = small_graph()
    a, c = graph.nodes
    with pytest.raises(InvalidModelError, match="NoSpec") as info:
        tdag.verify(graph.replace(nodes=(a, c.replace(spec=Permute((1, 0))))))
    assert info.value.node == "c"
    with pytest.raises(InvalidModelError, match="takes 2 inputs") as info:
        tdag.verify(graph.replace(nodes=(a, c.replace(inputs=("a",)))))
    assert info.value.node == "c"
    with pytest.raises(InvalidModelError, match="takes 1 inputs") as info:
        tdag.verify(graph.replace(nodes=(a.replace(inputs=(graph.inputs[0].name,) * 2), c)))
    assert info.value.node == "a"
    # a spec that fails the shape rule is reported for its node
    with pytest.raises(InvalidModelError, match="permutation") as info:
        tdag.verify(graph.replace(nodes=(a, Node("c", Op.permute, ("a",), Permute((0, 0)),
                                                 f32(2, 3)))))
    assert info.value.node == "c"


def test_weight_declared_type_disagrees_with_value():
    b, (x,) = builder_with(f32(3))
    w = b.weight("w", TensorKind.parameter, torch.zeros(3))
    graph = b.build([b.emit(Op.add, None, x, w)])
    bad = graph.replace(weights={"w": graph.weights["w"].__class__(
        TensorKind.parameter, f32(3), torch.zeros(4))})
    with pytest.raises(InvalidModelError, match="%w"):
        tdag.verify(bad)


def test_not_a_program():
    with pytest.raises(InvalidModelError, match="not a tdag Program"):
        tdag.verify("main")


# -- run time ---------------------------------------------------------------------------------

@pytest.fixture
def batch_prog():
    return tdag.trace(lambda x, y: x * y, TensorSpec(("b", 3)), TensorSpec(("b", 3)))


def test_wrong_input_shape_at_run_time(batch_prog):
    with pytest.raises(ShapeError, match=r"%x.*f32\[b,3\]"):
        tdag.run(batch_prog, torch.randn(2, 4), torch.randn(2, 3))
    with pytest.raises(ShapeError, match=r"%y"):
        tdag.run(batch_prog, torch.randn(2, 3), torch.randn(2, 3, 1))


def test_inconsistent_symbol_at_run_time(batch_prog):
    """x binds b = 2, so y with 5 rows is an error, not a silent rebinding."""
    with pytest.raises(ShapeError, match=r"%y.*b = 2"):
        tdag.run(batch_prog, torch.randn(2, 3), torch.randn(5, 3))


def test_wrong_input_dtype_and_count_at_run_time(batch_prog):
    with pytest.raises(ShapeError, match=r"%x.*f32\[b,3\].*f64"):
        tdag.run(batch_prog, torch.randn(2, 3).double(), torch.randn(2, 3))
    with pytest.raises(TdagError, match="expected 2 inputs, got 1"):
        tdag.run(batch_prog, torch.randn(2, 3))
    with pytest.raises(TdagError, match="torch.Tensor"):
        tdag.run(batch_prog, torch.randn(2, 3), [[1.0, 2.0, 3.0]] * 2)


def test_weight_without_value():
    b, (x,) = builder_with(f32(3))
    w = b.weight("w", TensorKind.parameter, None, f32(3))
    graph = b.build([b.emit(Op.add, None, x, w)])
    tdag.verify(graph)  # a shape-only program is well formed...
    with pytest.raises(TdagError, match="weight %w has no value"):
        tdag.run(graph, torch.randn(3))  # ...but cannot run
    meta = Builder()
    x = meta.input("x", f32(3))
    w = meta.weight("w", TensorKind.parameter, torch.empty(3, device="meta"))
    with pytest.raises(TdagError, match="weight %w has no value"):
        tdag.run(meta.build([meta.emit(Op.add, None, x, w)]), torch.randn(3))


def test_run_time_failures_name_the_node():
    prog = tdag.trace(lambda t, i: C.gather(t, i, 0), TensorSpec((4, 2)),
                      TensorSpec((3,), "int64"))
    node = prog.graph.nodes[-1].name
    with pytest.raises(TdagError, match="gather failed at run time") as info:
        tdag.run(prog, torch.randn(4, 2), torch.tensor([0, 9, 1]))
    assert info.value.node == node and f"%{node}" in str(info.value)
    div = tdag.trace(lambda a, b: C.floor_divide(a, b), TensorSpec((2,), "int64"),
                     TensorSpec((2,), "int64"))
    with pytest.raises(TdagError, match="divide failed at run time"):
        tdag.run(div, torch.tensor([1, 2]), torch.tensor([1, 0]))
