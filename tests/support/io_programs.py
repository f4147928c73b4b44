"""Programs shared by test_printer.py and test_serialize.py: traced core ops with symbolic
dims, weights of every common dtype, and a hand-built program with If / Loop / state."""
from __future__ import annotations

import torch

import tdag
from tdag import Block, Call, If, Loop, Program, TensorSpec, Value, Weight, ops
from tdag.ops.builder import active_builder
from tdag.ir.symbols import symbol
from tdag.ir.types import DType, Origin, TensorKind, TensorType

F32_4 = TensorType((4,), DType.f32)
I64 = TensorType((), DType.i64)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def tiny_program() -> Program:
    """The golden-text program: a param, a scalar const, one node with provenance."""
    def fn(x):
        w = ops.param("w", torch.ones(3))
        with active_builder().scope(Origin("aten.mul", "layer.0", "model.py:7")):
            y = x * w
        return ops.sum(y * 0.5, axis=1)
    return tdag.trace(fn, TensorSpec(("b", 3)))


def core_program() -> Program:
    """matmul, reshape, concat, where, gather, cumsum, pad, slice, arange, unfold/fold,
    casts and compares over symbolic dims ``b`` and ``s``."""
    def fn(x, y):
        w = ops.param("enc.w", _rand(3, 4))
        bias = ops.buffer("enc.b", _rand(4, seed=1))
        h = ops.reshape(ops.matmul(x, w) + bias, (-1, 2, 2))         # [b,2,2]
        c = ops.concat([h, h * 0.5], axis=1)                          # [b,4,2]
        masked = ops.where(c < 0.25, c, float("-inf"))
        rows = ops.gather(w, ops.arange(0, 2, like=x))                # [2,4]
        windows = ops.unfold(ops.pad(ops.cumsum(rows, 1), [(1, 0), (0, 2)]), 1, 3, 2)
        folded = ops.fold(windows, 1, 7, 2)                           # [3,7]
        tail = ops.slice(masked, 1, 1, None)                          # [b,3,2]
        counts = ops.sum(ops.cast(ops.gt(y, 3), "i64"), axis=2)      # [b,s]
        positions = ops.arange(0, y.shape[1], like=y)                 # iota(length=s)
        return masked, folded, tail, ops.cast(y, "f16"), y // 2, counts, positions
    return tdag.trace(fn, TensorSpec(("b", 3)), TensorSpec(("b", "s", 8), "int64"))


def core_inputs():
    return _rand(2, 3, seed=2), torch.randint(0, 7, (2, 5, 8),
                                              generator=torch.Generator().manual_seed(3))


def dtype_program() -> Program:
    """Weights in f32, f16, bf16, i64 and bool; small consts inline, bigger ones stored."""
    def fn(x):
        w16 = ops.param("w16", _rand(2, 3, seed=4).half())
        wbf = ops.param("wbf", _rand(2, 3, seed=5).bfloat16())
        big = ops.param("big", _rand(64, 3, seed=6))
        idx = ops.buffer("idx", torch.tensor([2, 0, 1]))
        mask = ops.const(torch.tensor([[True, False, True], [False, True, True]]))
        wide = ops.param("wide_mask", torch.arange(40).reshape(5, 8) % 3 == 0)
        special = ops.const(torch.tensor([-0.0, float("inf"), -float("inf"), 1e-30, 0.1]))
        a = x * ops.cast(w16, "f32") + ops.cast(wbf, "f32")
        a = ops.where(mask, a, 0.0)
        picked = ops.gather(a, idx, axis=1)
        proj = ops.matmul(big, ops.transpose(picked, 0, 1))           # [64,2]
        return (a, picked, proj, w16 * w16, wbf * wbf,
                ops.sum(ops.cast(wide, "i64")), special * 2.0)
    return tdag.trace(fn, TensorSpec((2, 3)))


def _graph(fn, *specs):
    return tdag.trace(fn, *specs).graph


def control_program() -> Program:
    """call / if / counted loop with a scan / while loop / symbolic count / state write."""
    graphs = {
        "positive": _graph(lambda a: ops.sum(a) > 0.0, TensorSpec((4,))),
        "double": _graph(lambda a: a * 2.0, TensorSpec((4,))),
        "negate": _graph(lambda a: -a, TensorSpec((4,))),
        "step": _graph(lambda i, h: (h + 1.0, h * ops.cast(i, "f32")),
                       TensorSpec((), "int64"), TensorSpec((4,))),
        "decay": _graph(lambda i, h: (ops.sum(h) > 1.0, h * 0.5),
                        TensorSpec((), "int64"), TensorSpec((4,))),
        "update": _graph(lambda kv, h: kv + h, TensorSpec((2, 4)), TensorSpec((4,))),
    }

    def branch(graph):
        return Block((Value("a", F32_4),), (Call(graph, ("a",), ("r",)),), ("r",))

    def body(graph):
        params = (Value("i", I64), Value("h", F32_4))
        return Block(params, (Call(graph, ("i", "h"), ("o1", "o2")),), ("o1", "o2"))

    n_type = TensorType((symbol("n"),), DType.f32)
    main = Block((Value("x", F32_4), Value("z", n_type)), (
        Call("positive", ("x",), ("c",)),
        If("c", ("x",), branch("double"), branch("negate"), ("y",)),
        Loop(("y",), body("step"), ("h", "ys"), count=3, scanned=1),
        Call("positive", ("h",), ("go",)),
        Loop(("h",), body("decay"), ("h2",), count=10, cond="go"),
        Loop(("x",), body("step"), ("hn", "zs"), count=symbol("n"), scanned=1),
        Call("update", ("kv", "h2"), ("kv",)),
    ), ("h2", "ys", "zs", "kv"))
    state = {"kv": Weight(TensorKind.buffer, TensorType((2, 4), DType.f32), _rand(2, 4, seed=7))}
    return Program(graphs, main, state)


def control_inputs():
    return torch.tensor([1.0, -2.0, 3.0, 0.5]), torch.zeros(5)
