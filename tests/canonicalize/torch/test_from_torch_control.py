"""from_torch on control flow: ``torch.cond`` becomes an If controller and ``while_loop`` a
Loop controller; the Program runs, reifies to torch and to ONNX, and matches eager on every
path."""
from __future__ import annotations

import onnxruntime as ort
import torch
import torch.nn as nn
from torch._higher_order_ops import while_loop

import tdag
from tdag.ir.program import Call, If, Loop


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        y = x * 2
        z = torch.cond(y.sum() > 0, lambda v: self.a(v).relu(), lambda v: self.b(v) - 1, (y,))
        return z + x


class Looping(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        y = x + 1
        i, z = while_loop(lambda i, z: (i < 3) & (z.sum() < 100),
                          lambda i, z: (i + 1, self.a(z) + y), (torch.tensor(0), x))
        return z * 2, i


def _close(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = torch.as_tensor(g)
        assert g.shape == w.shape and torch.allclose(g.to(w.dtype), w, atol=1e-4), (g, w)


def _check_everywhere(model, prog, inputs):
    tdag.verify(prog)
    module = tdag.to_torch(prog)
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString())
    for x in inputs:
        want = model(x)
        _close(tdag.run(prog, x), want)
        _close(module(x), want)
        _close(session.run(None, {session.get_inputs()[0].name: x.numpy()}), want)


def test_cond_becomes_if():
    torch.manual_seed(0)
    model = Branchy().eval()
    prog = tdag.from_torch(model, (torch.randn(2, 4),))
    assert [type(s) for s in prog.main.steps] == [Call, If, Call]
    branch = prog.main.steps[1]
    weights = {g: set(prog.graphs[g].weights) for s in (branch.then_branch, branch.else_branch)
               for g in [c.graph for c in s.steps]}
    assert any({"a.weight", "a.bias"} <= w for w in weights.values())
    assert any({"b.weight", "b.bias"} <= w for w in weights.values())
    _check_everywhere(model, prog, [torch.ones(2, 4), -torch.ones(2, 4)])


def test_while_loop_becomes_loop():
    torch.manual_seed(0)
    model = Looping().eval()
    prog = tdag.from_torch(model, (torch.randn(2, 4),))
    assert any(isinstance(s, Loop) for s in prog.main.steps)
    # three iterations, and none (the condition fails at once)
    _check_everywhere(model, prog, [torch.randn(2, 4), 30 * torch.ones(2, 4)])


def test_programs_without_control_flow_stay_one_tdag():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU()).eval()
    prog = tdag.from_torch(model, (torch.randn(2, 4),))
    assert len(prog.graphs) == 1 and [type(s) for s in prog.main.steps] == [Call]


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x, flag):
        def inner(v):
            return torch.cond(v.mean() > 0, lambda u: self.a(u), lambda u: u * 3, (v,))
        return torch.cond(flag, inner, lambda v: v.clone(), (x,)) + 1


def test_nested_cond_with_a_dynamic_batch():
    torch.manual_seed(0)
    model = Nested().eval()
    prog = tdag.from_torch(model, (torch.randn(2, 4), torch.tensor(True)),
                           dynamic_shapes=({0: torch.export.Dim("b")}, None))
    assert str(prog.input_types[0]) == "f32[b,4]"
    tdag.verify(prog)
    module = tdag.to_torch(prog)
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString())
    names = [i.name for i in session.get_inputs()]
    for x in (torch.ones(3, 4), -torch.ones(2, 4)):
        for flag in (torch.tensor(True), torch.tensor(False)):
            want = model(x, flag)
            _close(tdag.run(prog, x, flag), want)
            _close(module(x, flag), want)
            _close(session.run(None, dict(zip(names, (x.numpy(), flag.numpy())))), want)


class SizeCond(nn.Module):
    """A branch on a symbolic size: the condition is a SymBool, computed at run time."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.shape[0] > 4, lambda v: self.a(v).relu(), lambda v: v - 1, (x,))


def test_cond_on_a_symbolic_size():
    torch.manual_seed(0)
    model = SizeCond().eval()
    prog = tdag.from_torch(model, (torch.randn(3, 4),),
                           dynamic_shapes=({0: torch.export.Dim("b")},))
    assert any(isinstance(s, If) for s in prog.main.steps)
    _check_everywhere(model, prog, [torch.randn(2, 4), torch.randn(4, 4), torch.randn(7, 4)])


class CountedByInts(nn.Module):
    """A while_loop carrying a Python int, bounded by a symbolic size."""

    def forward(self, x):
        i, y = while_loop(lambda i, y: i < x.shape[0], lambda i, y: (i + 1, y * 2 + 1), (0, x))
        return y, i


def test_while_loop_carrying_ints_and_symbolic_sizes():
    model = CountedByInts().eval()
    prog = tdag.from_torch(model, (torch.randn(3, 4),),
                           dynamic_shapes=({0: torch.export.Dim("b")},))
    assert any(isinstance(s, Loop) for s in prog.main.steps)
    module = tdag.to_torch(prog)
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString())
    for x in (torch.randn(2, 4), torch.randn(5, 4)):
        y, i = model(x)
        want = (y, torch.tensor(i))  # the loop's int is an i64 scalar tensor in tdag
        _close(tdag.run(prog, x), want)
        _close(module(x), want)
        _close(session.run(None, {session.get_inputs()[0].name: x.numpy()}), want)
