"""Hand-built Programs with controllers (Call, If, Loop) and a state dict, run by
``tdag.run`` against plain Python and checked by ``tdag.verify``."""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag import Block, Call, If, Loop, Program, TensorSpec, Value
from tdag import ops as C
from tdag.errors import InvalidModelError
from tdag.ir.symbols import as_dim, symbol

from support.control_programs import (I64, accumulator_program, affine_loop, doubling_loop, graph,
                                      if_program, row_sum_loop, value)

F32 = "float32"


def run_checked(prog, *args, **kw):
    tdag.verify(prog)
    return tdag.run(prog, *args, **kw)


# -- If ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [1, 4])
def test_if_else_on_bool_scalar(batch):
    prog = if_program()
    assert [str(t) for t in tdag.ir.interpreter.output_types(prog)] == ["f32[b,3]"]
    pos = torch.rand(batch, 3) + 0.1
    torch.testing.assert_close(run_checked(prog, pos), pos * 2.0, rtol=0, atol=0)
    neg = -pos
    torch.testing.assert_close(run_checked(prog, neg), neg - 1.0, rtol=0, atol=0)


def test_if_condition_from_an_input():
    """The condition may be a program input (a bool scalar)."""
    spec = TensorSpec((2,))
    graphs = {"inc": graph(lambda x: x + 1.0, spec), "dec": graph(lambda x: x - 1.0, spec)}
    x, flag = value("x", 2), value("flag", dtype="bool")
    prog = Program(graphs, Block((flag, x), (If("flag", ("x",),
                                                 Block((x,), (Call("inc", ("x",), ("a",)),),
                                                       ("a",)),
                                                 Block((x,), (Call("dec", ("x",), ("a",)),),
                                                       ("a",)),
                                                 ("y",)),), ("y",)))
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(run_checked(prog, torch.tensor(True), t), t + 1)
    assert torch.equal(run_checked(prog, torch.tensor(False), t), t - 1)


# -- counted loops ----------------------------------------------------------------------------


def test_fixed_count_loop():
    prog = affine_loop(5)
    x = torch.randn(3, 4)
    expected = x.clone()
    for _ in range(5):
        expected = expected * 0.5 + 1.0
    torch.testing.assert_close(run_checked(prog, x), expected, rtol=0, atol=0)


def test_zero_count_loop_returns_its_inputs():
    x = torch.randn(2, 4)
    assert torch.equal(run_checked(affine_loop(0), x), x)


@pytest.mark.parametrize("n", [1, 2, 7])
def test_symbolic_count_loop_with_scan(n):
    prog = row_sum_loop()
    types = tdag.ir.interpreter.output_types(prog)
    assert [str(t) for t in types] == ["f32[3]", "f32[n,3]"]
    x = torch.randint(-5, 6, (n, 3)).float()  # integer values: the sums are exact
    total, partial = run_checked(prog, x)
    assert torch.equal(total, x.sum(0))
    assert torch.equal(partial, torch.cumsum(x, 0))


def test_loop_iteration_number_is_an_i64_scalar():
    body_graph = graph(lambda i, acc: acc + C.cast(i, "i64"), TensorSpec((), "int64"),
                       TensorSpec((), "int64"))
    i, acc = Value("i", I64), Value("acc", I64)
    main = Block((acc,), (Loop(("acc",), Block((i, acc), (Call("body", ("i", "acc"), ("a",)),),
                                               ("a", "i")), ("s", "steps"), count=4,
                               scanned=1),), ("s", "steps"))
    prog = Program({"body": body_graph}, main)
    s, steps = run_checked(prog, torch.tensor(10))
    assert s.item() == 10 + 0 + 1 + 2 + 3
    assert torch.equal(steps, torch.arange(4))


# -- while loops ------------------------------------------------------------------------------


def python_doubling(x, limit=None):
    sums, i = [], 0
    while x.sum() < 100.0 and (limit is None or i < limit):
        x = x * 2.0
        sums.append(x.sum())
        i += 1
    return x, sums


@pytest.mark.parametrize("start", [[1.0, 2.0], [30.0, 40.0], [200.0, 0.0]])
def test_while_loop_with_condition_output(start):
    prog = doubling_loop()
    # trips_y is named after the first output
    assert [str(t) for t in tdag.ir.interpreter.output_types(prog)] == [
        "f32[2]", "f32[trips_y]"]
    x = torch.tensor(start)
    expected, sums = python_doubling(x)
    y, got_sums = run_checked(prog, x)
    assert torch.equal(y, expected)
    # zero iterations: an empty stack of the body's f32[] sums
    assert torch.equal(got_sums, torch.stack(sums) if sums else torch.empty(0))


def test_while_loop_with_count_stops_at_the_first_limit():
    prog = doubling_loop(count=3)
    x = torch.tensor([0.5, 0.25])
    expected, sums = python_doubling(x, limit=3)
    y, got_sums = run_checked(prog, x)
    assert len(sums) == 3 and torch.equal(y, expected) and torch.equal(got_sums, torch.stack(sums))
    # the count bounds the trips; how many run is known at run time: a symbol of its own
    assert [str(t) for t in tdag.ir.interpreter.output_types(prog)] == ["f32[2]", "f32[trips_y]"]


# -- state ------------------------------------------------------------------------------------


def test_state_entry_updated_by_a_step():
    prog = accumulator_program()
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    y, state = run_checked(prog, x, return_state=True)
    assert torch.equal(y, x)
    assert state["total"].item() == 10.0
    y, state = run_checked(prog, x * 2, state=state, return_state=True)  # carried on
    assert state["total"].item() == 30.0
    assert prog.state["total"].value.item() == 0.0  # the program itself is unchanged
    assert run_checked(prog, x).shape == x.shape  # without return_state: the outputs only


def test_state_updated_inside_a_loop():
    prog = accumulator_program(steps=5)
    x = torch.tensor([[1.0, 2.0]])
    _, state = run_checked(prog, x, return_state=True)
    assert state["total"].item() == 15.0


def test_state_write_of_the_wrong_type_is_rejected():
    prog = accumulator_program()
    row = graph(lambda total, x: (C.sum(x, 0) + total, x), TensorSpec(()), TensorSpec(("b", 2)),
                names=["total", "x"])  # writes an f32[2] into the f32[] state
    bad = prog.replace(graphs={"acc": row})
    with pytest.raises(InvalidModelError, match="state %total"):
        tdag.verify(bad)


# -- the verifier on controllers --------------------------------------------------------------

def test_verify_rejects_bad_controllers():
    prog = if_program()
    x = value("x", "b", 3)
    # a condition that is not a bool scalar
    main = Block((x,), (If("x", ("x",), prog.main.steps[1].then_branch,
                           prog.main.steps[1].else_branch, ("out",)),), ("out",))
    with pytest.raises(InvalidModelError, match="bool scalar"):
        tdag.verify(prog.replace(main=main))
    # branches returning different types
    cast = graph(lambda x: C.cast(x, "f64"), TensorSpec(("b", 3)))
    then = Block((x,), (Call("cast", ("x",), ("y",)),), ("y",))
    main = Block((x,), (prog.main.steps[0], If("c", ("x",), then,
                                               prog.main.steps[1].else_branch, ("out",))),
                 ("out",))
    with pytest.raises(InvalidModelError, match="different types"):
        tdag.verify(Program({**prog.graphs, "cast": cast}, main))
    # a call with arguments of the wrong type
    main = Block((value("x", 5),), (Call("double", ("x",), ("y",)),), ("y",))
    with pytest.raises(InvalidModelError, match="call double"):
        tdag.verify(prog.replace(main=main))
    # an undefined name, an unknown graph
    with pytest.raises(InvalidModelError, match="%nope"):
        tdag.verify(prog.replace(main=Block((x,), (Call("double", ("nope",), ("y",)),), ("y",))))
    with pytest.raises(InvalidModelError, match="unknown TDAG"):
        tdag.verify(prog.replace(main=Block((x,), (Call("missing", ("x",), ("y",)),), ("y",))))


def test_verify_rejects_bad_loops():
    prog = affine_loop(5)
    loop = prog.main.steps[0]
    # the body changes a carried value's type
    grow = graph(lambda x: C.concat([x, x], 1), TensorSpec(("b", 4)))
    body = Block(loop.body.inputs, (Call("grow", ("x",), ("x1",)),), ("x1",))
    bad = Program({**prog.graphs, "grow": grow},
                  Block(prog.main.inputs, (Loop(("x",), body, ("y",), count=5),), ("y",)))
    with pytest.raises(InvalidModelError, match="carried"):
        tdag.verify(bad)
    # neither a count nor a condition
    bad = prog.replace(main=Block(prog.main.inputs, (Loop(("x",), loop.body, ("y",)),), ("y",)))
    with pytest.raises(InvalidModelError, match="count"):
        tdag.verify(bad)
    # a scan declared but not produced
    bad = prog.replace(main=Block(prog.main.inputs,
                                  (Loop(("x",), loop.body, ("y", "s"), count=5, scanned=1),),
                                  ("y",)))
    with pytest.raises(InvalidModelError, match="scanned"):
        tdag.verify(bad)
    # the body's first input must be the i64 iteration number
    body = Block((value("x", "b", 4),), loop.body.steps, loop.body.outputs)
    bad = prog.replace(main=Block(prog.main.inputs, (Loop(("x",), body, ("y",), count=5),),
                                  ("y",)))
    with pytest.raises(InvalidModelError, match="loop body"):
        tdag.verify(bad)


def test_loop_count_may_be_a_symbolic_expression():
    prog = affine_loop(as_dim(symbol("b") + 1))
    x = torch.randn(3, 4)
    expected = x.clone()
    for _ in range(4):
        expected = expected * 0.5 + 1.0
    torch.testing.assert_close(run_checked(prog, x), expected, rtol=0, atol=0)


def test_state_written_in_a_loop_is_seen_after_it():
    """A later step of the enclosing block reads the state the loop body wrote."""
    prog = accumulator_program(steps=5)
    read = graph(lambda total: total * 1.0, TensorSpec(()), names=["total"])
    main = Block(prog.main.inputs, prog.main.steps + (Call("read", ("total",), ("t",)),),
                 ("out", "t"))
    prog = Program({**prog.graphs, "read": read}, main, prog.state)
    out, t = run_checked(prog, torch.tensor([[1.0, 2.0]]))
    assert t.item() == 15.0
