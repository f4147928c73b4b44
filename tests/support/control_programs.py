"""Hand-built Programs with controllers, shared by the interpreter's tests
(tests/ir/test_program.py) and the back ends' (tests/reify/): an If on the sign of a sum, a
counted loop, a loop over rows with a scan, a while loop that doubles, and a buffer that each
call adds to (optionally inside a loop). ``graph`` and ``value`` are the builders' shorthands.
"""
from __future__ import annotations

import torch

import tdag
from tdag import Block, Call, If, Loop, Program, TensorKind, TensorSpec, TensorType, Value, Weight
from tdag import ops as C
from tdag.ir.symbols import symbol


I64 = TensorType((), "i64")


def graph(fn, *specs, names=None):
    return tdag.trace(fn, *specs, names=names).graph


def value(name, *shape, dtype="f32"):
    return Value(name, TensorType(shape, dtype))


def if_program(shape=("b", 3)) -> Program:
    spec = TensorSpec(shape)
    graphs = {
        "is_positive": graph(lambda x: C.sum(x) > 0.0, spec),
        "double": graph(lambda x: x * 2.0, spec),
        "shift": graph(lambda x: x - 1.0, spec),
    }
    x = value("x", *shape)
    then = Block((x,), (Call("double", ("x",), ("y",)),), ("y",))
    other = Block((x,), (Call("shift", ("x",), ("z",)),), ("z",))
    main = Block((x,), (Call("is_positive", ("x",), ("c",)),
                        If("c", ("x",), then, other, ("out",))), ("out",))
    return Program(graphs, main)


def affine_loop(count) -> Program:
    """``count`` steps of x = x*0.5 + 1."""
    step = graph(lambda x: x * 0.5 + 1.0, TensorSpec(("b", 4)))
    x = value("x", "b", 4)
    body = Block((Value("i", I64), x), (Call("step", ("x",), ("x1",)),), ("x1",))
    main = Block((x,), (Loop(("x",), body, ("y",), count=count),), ("y",))
    return Program({"step": step}, main)


def row_sum_loop() -> Program:
    """Loop over the n rows of x (count = the symbol n): carry a running sum, scan it."""
    body_graph = graph(lambda i, acc, x: (acc + C.gather(x, i, 0), x),
                       TensorSpec((), "int64"), TensorSpec((3,)), TensorSpec(("n", 3)))
    init = graph(lambda x: C.zeros((3,), like=x), TensorSpec(("n", 3)))
    i, acc, x = Value("i", I64), value("acc", 3), value("x", "n", 3)
    body = Block((i, acc, x), (Call("body", ("i", "acc", "x"), ("acc1", "x1")),),
                 ("acc1", "x1", "acc1"))  # carried (acc, x), then scanned acc
    main = Block((x,), (Call("init", ("x",), ("zero",)),
                        Loop(("zero", "x"), body, ("total", "same", "partial"),
                             count=symbol("n"), scanned=1)),
                 ("total", "partial"))
    return Program({"body": body_graph, "init": init}, main)


def doubling_loop(count=None) -> Program:
    """while sum(x) < 100: x = 2*x (and scan the sums)."""
    spec = TensorSpec((2,))
    graphs = {
        "check": graph(lambda x: C.sum(x) < 100.0, spec),
        "step": graph(lambda x: (C.sum(x * 2.0) < 100.0, x * 2.0, C.sum(x * 2.0)), spec),
    }
    i, x = Value("i", I64), value("x", 2)
    body = Block((i, x), (Call("step", ("x",), ("go", "x2", "s")),), ("go", "x2", "s"))
    main = Block((x,), (Call("check", ("x",), ("go0",)),
                        Loop(("x",), body, ("y", "sums"), count=count, cond="go0", scanned=1)),
                 ("y", "sums"))
    return Program(graphs, main)


def accumulator_program(steps=None) -> Program:
    """A buffer ``total`` that each call adds sum(x) to; optionally inside a counted loop."""
    acc = graph(lambda total, x: (total + C.sum(x), x * 1.0), TensorSpec(()), TensorSpec(("b", 2)),
                names=["total", "x"])
    state = {"total": Weight(TensorKind.buffer, TensorType((), "f32"), torch.tensor(0.0))}
    x = value("x", "b", 2)
    call = Call("acc", ("total", "x"), ("total", "y"))
    if steps is None:
        main = Block((x,), (call,), ("y",))
    else:
        body = Block((Value("i", I64), x), (call,), ("y",))
        main = Block((x,), (Loop(("x",), body, ("out",), count=steps),), ("out",))
    return Program({"acc": acc}, main, state)
