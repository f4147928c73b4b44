"""tdag.grad on real architectures: the gradient of every parameter equals torch.autograd's
(float32, 1e-4 relative to the largest gradient), through tdag.run and to_torch.

The models (transformers' small configs with random weights, eager attention, and a UNet
block), each wrapped so that its forward returns a scalar loss: tests/support/grad_models.py.
"""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag.refine.grad.reverse import BACKWARD

pytest.importorskip("transformers")
from support.grad_models import MODELS, Loss, Tagger, onnx_outputs  # noqa: E402

RELATIVE = 1e-4


@pytest.mark.parametrize("name", list(MODELS))
def test_gradient_equals_autograd(name):
    torch.manual_seed(0)
    model, args, reduce = MODELS[name]()
    wrapped = Loss(model, reduce).eval()
    prog = tdag.from_torch(wrapped, args)
    g = tdag.grad(prog)
    wrapped.zero_grad()
    wrapped(*args).backward()
    params = dict(wrapped.named_parameters())
    assert list(g.wrt) == [n for n in params if params[n].requires_grad], name
    scale = max(p.grad.abs().max().item() for p in params.values() if p.grad is not None)
    for outs in (tdag.run(g, *args), tdag.to_torch(g)(*args)):
        for n, got in zip(g.wrt, outs[1:]):
            want = params[n].grad if params[n].grad is not None else torch.zeros_like(got)
            err = (got - want).abs().max().item()
            assert err <= RELATIVE * scale, f"{name}: {n} off by {err:.2e} (scale {scale:.2e})"


def test_tied_weights_sum_their_uses():
    """GPT-2's embedding is its output projection: one gradient, the sum of both uses, named
    as torch names the parameter (its first name)."""
    torch.manual_seed(0)
    model, args, reduce = MODELS["gpt2"]()
    prog = tdag.from_torch(Loss(model, reduce).eval(), args)
    g = tdag.grad(prog)
    assert "model.transformer.wte.weight" in g.wrt
    assert "model.lm_head.weight" not in g.wrt


def test_backward_nodes_are_marked():
    prog = tdag.trace(lambda x: tdag.ops.sum(tdag.ops.exp(x)), tdag.TensorSpec((4,)))
    g = tdag.grad(prog, wrt=[prog.inputs[0].name])
    marks = [n.origin.op.startswith(BACKWARD) for n in g.graph.nodes]
    assert any(marks) and not all(marks)



class StackedGRU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.GRU(4, 6, num_layers=2, bidirectional=True, batch_first=True)
        self.out = torch.nn.Linear(12, 1)

    def forward(self, x):
        return self.out(self.rnn(x)[0]).pow(2).mean()


class Branching(torch.nn.Module):
    """torch.cond between a layer and a parameter-free branch: an If controller."""

    def __init__(self, sign: float):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
        torch.nn.init.constant_(self.a.bias, 5.0 * sign)

    def forward(self, x):
        h = self.a(x)
        y = torch.cond(h.sum() > 0, lambda h: torch.tanh(self.b(h)), lambda h: torch.sin(h), (h,))
        return self.c(y).pow(2).mean()


CONTROLLED = {
    "lstm-tagger": lambda: (Tagger(), (torch.randint(0, 20, (2, 6)), torch.randint(0, 5, (2, 6)))),
    "gru-2-layers-bidirectional": lambda: (StackedGRU(), (torch.randn(2, 5, 4),)),
    "cond-then": lambda: (Branching(1.0), (torch.rand(3, 4),)),
    "cond-else": lambda: (Branching(-1.0), (torch.rand(3, 4),)),
}


@pytest.mark.parametrize("name", list(CONTROLLED))
def test_gradient_through_loops_and_branches(name):
    """A Loop runs its body's reverse from the last trip back; an If the chosen branch's."""
    torch.manual_seed(0)
    model, args = CONTROLLED[name]()
    model.eval()
    prog = tdag.from_torch(model, args)
    assert any(not isinstance(s, tdag.Call) for s in prog.main.steps), name
    g = tdag.grad(prog)
    tdag.verify(g)
    model(*args).backward()
    params = dict(model.named_parameters())
    scale = max(p.grad.abs().max().item() for p in params.values() if p.grad is not None)
    onnx_outs = onnx_outputs(g, args)
    for outs in (tdag.run(g, *args), tdag.to_torch(g)(*args), onnx_outs):
        for n, got in zip(g.wrt, outs[1:]):
            want = params[n].grad if params[n].grad is not None else torch.zeros_like(got)
            err = (torch.as_tensor(got) - want).abs().max().item()
            assert err <= RELATIVE * scale, f"{name}: {n} off by {err:.2e}"



def _while_file(limit: float, weight):
    """An ONNX Loop with a condition: h = tanh(h @ W) while sum(h^2) < limit (at most 10
    trips); the loss is sum(h^2) of the last h."""
    import numpy as np
    from onnx import TensorProto as T
    from onnx import helper as H
    from onnx import numpy_helper as nh

    value = H.make_tensor_value_info
    body = H.make_graph([
        H.make_node("MatMul", ["h", "W"], ["m"]), H.make_node("Tanh", ["m"], ["h2"]),
        H.make_node("Mul", ["h2", "h2"], ["sq"]),
        H.make_node("ReduceSum", ["sq"], ["s"], keepdims=0),
        H.make_node("Less", ["s", "limit"], ["c_out"])], "body",
        [value("i", T.INT64, []), value("c_in", T.BOOL, []), value("h", T.FLOAT, [2, 4])],
        [value("c_out", T.BOOL, []), value("h2", T.FLOAT, [2, 4])],
        [nh.from_array(np.array(limit, np.float32), "limit")])
    graph = H.make_graph([
        H.make_node("Loop", ["M", "go", "x"], ["last"], body=body),
        H.make_node("Mul", ["last", "last"], ["q"]),
        H.make_node("ReduceSum", ["q"], ["loss"], keepdims=0)], "g",
        [value("x", T.FLOAT, [2, 4])], [value("loss", T.FLOAT, [])],
        [nh.from_array(weight.numpy(), "W"), nh.from_array(np.array(10, np.int64), "M"),
         nh.from_array(np.array(True), "go")])
    return H.make_model(graph, opset_imports=[H.make_opsetid("", 17)])


@pytest.mark.parametrize("limit", [6.0, 7.5])
def test_gradient_through_a_while_loop(limit):
    """The reverse runs as many trips as the forward took (the length of its stacks)."""
    torch.manual_seed(0)
    weight, x = torch.randn(4, 4) * 1.5, torch.randn(2, 4)
    g = tdag.grad(tdag.from_onnx(_while_file(limit, weight)), wrt=["W", "x"])
    tdag.verify(g)
    w, h = weight.clone().requires_grad_(), x.clone().requires_grad_()
    state, trips = h, 0
    while trips < 10:
        state, trips = torch.tanh(state @ w), trips + 1
        if not bool((state * state).sum() < limit):
            break
    (state * state).sum().backward()
    onnx_outs = onnx_outputs(g, (x,))
    for outs in (tdag.run(g, x), tdag.to_torch(g)(x), onnx_outs):
        for got, want in zip(outs[1:], (w.grad, h.grad)):
            torch.testing.assert_close(torch.as_tensor(got), want, rtol=1e-4, atol=1e-5)
