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
