"""In-place ATen ops converted as they are, without torch's functionalization re-tracing the
graph: a buffer written in place (``index_copy_`` into a cache, ``add_`` through an alias
that converts nothing, ``copy_``) becomes state of the Program, read and written back as a
functionalized buffer mutation is; writes through partial views are still left to
functionalization, and an input written in place is still refused. Each case runs a few
calls through tdag.run, carrying the state, against the eager module (exact: the writes move
values, the arithmetic is the same).
"""
from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import tdag
from tdag.canonicalize import from_torch
from tdag.canonicalize.torch.capture import capture
from tdag.canonicalize.torch.export import convertible


class Cache(torch.nn.Module):
    """A static cache and its fill count, written in place as transformers' StaticCache
    writes them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("keys", torch.zeros(2, 8, 3))
        self.register_buffer("length", torch.zeros((), dtype=torch.long))

    def forward(self, x, position):
        self.length.copy_(position[0])
        count = self.length.to(torch.long)  # an alias: it converts nothing
        count.add_(x.shape[1])
        self.keys.index_copy_(1, position, x)
        return self.keys.sum(1) * self.length


class PartialWrite(torch.nn.Module):
    """Writes through views of part of a buffer: torch writes the buffer itself."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.zeros(3, 4))

    def forward(self, x):
        row = self.table[1]
        self.table[:, 0].add_(x[0])
        row.mul_(2).add_(x)
        return self.table * 1


class SplitWrite(torch.nn.Module):
    def forward(self, x):
        y = x * 1
        first, _ = y.split(2)
        first.add_(1)  # one piece of y
        z = x.to(torch.float64)  # a conversion: a new tensor, x is not written
        z.add_(1)
        return y, z


def run_calls(module, calls):
    """Eager and tdag outputs of each call, tdag's state carried from one to the next; the
    buffers tdag wrote against the module's at the end."""
    prog = from_torch(module, calls[0])
    state = None
    for args in calls:
        got, state = tdag.run(prog, *args, state=state, return_state=True)
        want = module(*args)
        for g, w in zip(torch.utils._pytree.tree_leaves(got),
                        torch.utils._pytree.tree_leaves(want)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    buffers = dict(module.named_buffers())
    for name, value in (state or {}).items():
        torch.testing.assert_close(value, buffers[name], rtol=0, atol=0)
    return prog


def test_a_cache_written_in_place_is_state_without_functionalization():
    module = Cache()
    x = torch.randn(2, 2, 3, generator=torch.Generator().manual_seed(0))
    calls = [(x, torch.tensor([0, 1])), (x * 2, torch.tensor([2, 5])),
             (x - 1, torch.tensor([7, 3]))]
    ep = capture(module, calls[0])
    known = convertible(ep)
    assert all(known(n) for n in ep.graph.nodes if n.op == "call_function")
    prog = run_calls(module, calls)
    assert set(prog.state) == {"keys", "length"}
    assert set(prog.state) <= set(prog.main.steps[0].outputs)


def test_writes_through_partial_views_are_functionalized():
    module = PartialWrite()
    calls = [(torch.randn(4, generator=torch.Generator().manual_seed(i)),) for i in range(3)]
    ep = capture(module, calls[0])
    assert not all(convertible(ep)(n) for n in ep.graph.nodes if n.op == "call_function")
    prog = run_calls(module, calls)
    assert set(prog.state) == {"table"}


def test_writes_into_a_piece_of_a_fresh_tensor_and_into_a_conversion():
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    prog = run_calls(SplitWrite(), [(x,)])
    assert not prog.state


class Scan(torch.nn.Module):
    """A Python-loop scan writing each step into a column of a fresh tensor (``out[:, t] =
    h``, a copy_ into a select view: RWKV's and RecurrentGemma's CPU scans), and copies into
    a row and a slice of another."""

    def forward(self, x):
        out, state = torch.zeros_like(x), torch.zeros_like(x[:, 0])
        for t in range(x.shape[1]):
            state = 0.5 * state + x[:, t]
            out[:, t] = state
        other = torch.zeros_like(x)
        other[1] = x[0]
        other[:, 1:3] = x[:, :2] * 2
        return out, other


def test_copies_into_views_of_a_fresh_tensor_are_functionalized():
    x = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    prog = run_calls(Scan(), [(x,)])
    assert not prog.state


def test_an_input_written_in_place_is_refused():
    class WritesInput(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    with pytest.raises(tdag.UnsupportedOpError, match="user_input_mutation"):
        from_torch(WritesInput(), (torch.randn(3),))


class _Written(TorchDispatchMode):
    """The elements every ATen call writes (its outputs' sizes; an in-place copy_ into a
    view writes the view's)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.count += sum(t.numel() for t in torch.utils._pytree.tree_leaves(out)
                          if isinstance(t, torch.Tensor))
        return out


def _elements_written(module, x) -> int:
    with torch.no_grad(), _Written() as written:
        module(x)
    return written.count


def test_a_scans_writes_go_in_place_in_the_torch_module_and_onnxruntime():
    """Each ``out[:, t] = h`` is a write_slice: the torch module copies the step's values
    alone into ``out``, so T steps write O(T x width) elements as eager does (a
    concatenation of out's runs per step would write O(T^2 x width)), with gradients on too;
    the ONNX file is a ScatterElements per step, which onnxruntime writes into the dead
    target's buffer."""
    module, written = Scan(), {}
    for steps in (24, 48):
        x = torch.randn(2, steps, 8, generator=torch.Generator().manual_seed(steps))
        prog = from_torch(module, (x,))
        reified = tdag.to_torch(prog)
        written[steps] = _elements_written(reified, x), _elements_written(module, x)
        with torch.no_grad():
            for got, want in zip(reified(x), module(x)):
                torch.testing.assert_close(got, want, rtol=0, atol=0)
    (short, _), (long, long_eager) = written[24], written[48]
    assert long / short < 2.2 and long < 1.5 * long_eager, written  # linear, as eager

    # with autograd recording, the chain of writes still goes in place (CopySlices)
    leaf = x.clone().requires_grad_()
    weights = torch.randn(2, 48, 8), torch.randn(2, 48, 8)
    sum(o.mul(w).sum() for o, w in zip(reified(leaf), weights)).backward()
    eager = x.clone().requires_grad_()
    sum(o.mul(w).sum() for o, w in zip(module(eager), weights)).backward()
    torch.testing.assert_close(leaf.grad, eager.grad, rtol=1e-6, atol=1e-6)

    onnx_model = tdag.to_onnx(prog)
    kinds = [n.op_type for n in onnx_model.graph.node]
    # (one Concat: the first two steps' values, written as one run into the first pad)
    assert kinds.count("ScatterElements") >= 48 and kinds.count("Concat") <= 1
    import onnxruntime  # noqa: PLC0415
    session = onnxruntime.InferenceSession(onnx_model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    for g, w in zip(got, module(x)):
        torch.testing.assert_close(torch.from_numpy(g), w, rtol=0, atol=0)
