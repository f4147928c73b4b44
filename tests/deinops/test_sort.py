"""The ``sort`` primitive and the order statistics over it (tdag/ops/sorting.py).

The one-node cases (every dtype, ties, signed zeros, NaN, descending, empty and symbolic
axes) live in support/primitive_cases.py and run through the evaluator, torch code, ONNX
and JAX there. Here: properties of the permutation (hypothesis), the compositions against
torch eager through from_torch, to_torch and to_onnx (values exactly; indices exactly where
torch's are specified, else checked to point at the values), lowering to top-k and argmax,
and the cost (n log n, never n^2: a 200,000-element sort runs in well under a second).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdag
from tdag import ops
from tdag.ir.op import Op
from tdag.reify import to_onnx, to_torch

from support.guards import run_onnx
from support.torch_models import Fn

S = tdag.TensorSpec
_FLOATS = st.sampled_from([0.0, -0.0, 1.0, -1.0, 2.5, math.inf, -math.inf, math.nan])


def _outs(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _same(got, want, what):
    for g, w in zip(_outs(got), _outs(want)):
        g = g.to(w.dtype)
        assert g.shape == w.shape, f"{what}: shape {tuple(g.shape)} != {tuple(w.shape)}"
        assert torch.equal(g, w) or (w.is_floating_point() and torch.allclose(
            g, w, equal_nan=True, rtol=0, atol=0)), f"{what}: {g} != {w}"


# -- the permutation --------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(_FLOATS, min_size=0, max_size=12), st.booleans())
def test_the_permutation_is_a_stable_sort_with_nan_largest(values, descending):
    x = torch.tensor(values, dtype=torch.float32)
    prog = tdag.trace(lambda t: ops.argsort(t, 0, descending), S((len(values),), "float32"))
    perm = tdag.run(prog, x)
    assert sorted(perm.tolist()) == list(range(len(values)))  # a permutation
    key = [(math.inf if math.isnan(v) else v, math.isnan(v)) for v in values]
    for a, b in zip(perm.tolist(), perm.tolist()[1:]):
        ka, kb = key[a], key[b]
        if ka == kb:
            assert a < b, "ties keep their input order"
        else:
            assert (ka > kb) if descending else (ka < kb), (values, perm)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=10), st.booleans())
def test_the_permutation_matches_torchs_stable_sort_on_ints(values, descending):
    x = torch.tensor(values)
    prog = tdag.trace(lambda t: ops.argsort(t, 0, descending), S((len(values),), "int64"))
    want = torch.sort(x, descending=descending, stable=True).indices
    assert torch.equal(tdag.run(prog, x), want)
    assert torch.equal(to_torch(prog)(x), want)


# -- the order statistics against torch eager -------------------------------------------------

def _ties(*shape):
    x = torch.randint(0, 4, shape).float()
    x.view(-1)[3] = math.nan
    return x


_EXACT = {  # torch's indices are specified (a stable sort) or there is no index
    "sort-stable": (lambda x: torch.sort(x, dim=1, descending=True, stable=True), _ties(3, 9)),
    "sort-dim0": (lambda x: torch.sort(x, dim=0, stable=True), _ties(9, 3)),
    "argsort": (lambda x: torch.argsort(x, dim=1, stable=True), _ties(3, 9)),
    "msort": (lambda x: torch.msort(x), _ties(6, 2)),
    "median": (lambda x: torch.median(x), _ties(4, 5)),
    "nanmedian": (lambda x: torch.nanmedian(x), _ties(4, 5)),
    "quantile": (lambda x: torch.quantile(x, torch.tensor([0.1, 0.5, 0.9]), dim=1),
                 torch.randn(3, 11)),
    "unique": (lambda x: torch.unique(x, return_inverse=True, return_counts=True),
               torch.randint(0, 6, (4, 7))),
    "unique-float-nan": (lambda x: torch.unique(x), torch.tensor([2.0, math.nan, 1.0, 2.0])),
    "unique-dim": (lambda x: torch.unique(x, dim=0, return_inverse=True, return_counts=True),
                   torch.randint(0, 2, (7, 2))),
    "unique-consecutive": (lambda x: torch.unique_consecutive(
        x, return_inverse=True, return_counts=True), torch.tensor([1, 1, 3, 3, 3, 1, 2, 2])),
    "mode": (lambda x: torch.mode(x, 1), torch.randint(0, 3, (4, 9))),
    "searchsorted": (lambda b, v: torch.searchsorted(b, v),
                     torch.tensor([1.0, 2.0, 2.0, 5.0]), torch.tensor([[0.0, 2.0, 3.0, 9.0]])),
    "searchsorted-right": (lambda b, v: torch.searchsorted(b, v, right=True),
                           torch.tensor([1.0, 2.0, 2.0, 5.0]), torch.tensor([0.0, 2.0, 5.0])),
    "searchsorted-2d-sorter": (lambda b, v, s: torch.searchsorted(b, v, side="right", sorter=s),
                               torch.tensor([[3, 1, 2], [9, 7, 8]]), torch.tensor([[2, 0], [7, 9]]),
                               torch.tensor([[1, 2, 0], [1, 2, 0]])),
    "bucketize": (lambda v, b: torch.bucketize(v, b, out_int32=True),
                  torch.randn(3, 4), torch.tensor([-1.0, 0.0, 0.5])),
    "empty-sort": (lambda x: torch.sort(x, 1), torch.zeros(3, 0)),
}
_VALUES = {  # torch's indices are one of several valid answers on ties: check the values
    "topk": (lambda x: torch.topk(x, 3, 1), _ties(3, 9), 1),
    "topk-smallest": (lambda x: torch.topk(x, 2, 0, largest=False), _ties(9, 3), 0),
    "kthvalue": (lambda x: torch.kthvalue(x, 4, 1, keepdim=True), _ties(3, 9), 1),
    "median-dim": (lambda x: torch.median(x, 1, keepdim=True), _ties(3, 8), 1),
    "nanmedian-dim": (lambda x: torch.nanmedian(x, 1, keepdim=True), _ties(3, 8), 1),
    "sort-unstable": (lambda x: torch.sort(x, 1), _ties(3, 9), 1),
}


@pytest.mark.parametrize("name", list(_EXACT))
def test_order_statistics_match_torch(name):
    fn, *args = _EXACT[name]
    prog = tdag.from_torch(Fn(fn), tuple(args))
    want = fn(*args)
    _same(tdag.run(prog, *args), want, f"run {name}")
    _same(to_torch(prog)(*args), want, f"to_torch {name}")


@pytest.mark.parametrize("name", list(_VALUES))
def test_order_statistics_give_torchs_values_and_indices_to_them(name):
    fn, x, dim = _VALUES[name]
    prog = tdag.from_torch(Fn(fn), (x,))
    want_values = fn(x)[0]
    for got in (tdag.run(prog, x), to_torch(prog)(x)):
        values, index = got
        _same(values, want_values, name)
        _same(torch.gather(x, dim, index), want_values, f"{name}: the indices")


def test_onnx_sort_topk_and_argmax_order_nan_as_torch():
    x = _ties(4, 9)
    x[1, 5] = -math.nan
    fns = {"sort": lambda t: ops.sort(t, 1, True), "topk": lambda t: ops.topk(t, 3, 0, False),
           "argmax": lambda t: ops.argmax(t, 1), "argmin": lambda t: ops.argmin(t, 0)}
    for name, fn in fns.items():
        prog = tdag.trace(fn, S((4, 9), "float32"))
        _same(run_onnx(to_onnx(prog), x), tdag.run(prog, x), f"onnx {name}")
        if name.startswith("arg"):  # the composition's ReduceMax drops NaN on onnxruntime
            continue
        _same(run_onnx(to_onnx(prog, lower=False), x), tdag.run(prog, x), f"onnx {name}")


def test_unique_has_a_fresh_count_at_symbolic_sizes():
    prog = tdag.trace(lambda t: ops.unique(t, return_counts=True)[0:3:2], S(("n",), "int64"))
    for n in (0, 1, 13):
        x = torch.randint(0, 5, (n,))
        values, counts = tdag.run(prog, x)
        want = torch.unique(x, return_counts=True)
        _same(values, want[0], f"unique at {n}")
        _same(counts, want[1], f"counts at {n}")



_RUNS = {  # run starts from the key shifted by a pad: every operand n long, n = 0 included
    "unique": lambda t: ops.unique(t, return_inverse=True, return_counts=True),
    "unique-consecutive": lambda t: ops.unique_consecutive(t, return_inverse=True,
                                                            return_counts=True),
    "unique-dim": lambda t: _without_index(ops.unique_slices(t, 0)),
}


def _without_index(results):
    values, _, inverse, counts = results
    return values, inverse, counts


def _runs_want(name, x):
    if name == "unique":
        return torch.unique(x, return_inverse=True, return_counts=True)
    if name == "unique-consecutive":
        return torch.unique_consecutive(x, return_inverse=True, return_counts=True)
    values, inverse, counts = torch.unique(x, dim=0, return_inverse=True, return_counts=True)
    return values, inverse, counts


def _runs_inputs(dtype, n):
    """Empty, one, all equal, and duplicates (with NaNs for floats) at length n."""
    if dtype is torch.bool:
        return [torch.zeros(n, dtype=torch.bool), torch.rand(n) > 0.5]
    x = torch.randint(0, 4, (n,)).to(dtype)
    if dtype.is_floating_point and n > 2:
        x[::3] = math.nan
    return [torch.full((n,), 7).to(dtype), x]


@pytest.mark.parametrize("name", list(_RUNS))
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.bool])
def test_runs_match_torch_at_a_symbolic_length_that_is_0_at_run_time(name, dtype):
    torch.manual_seed(0)
    shape = ("n", 2) if name == "unique-dim" else ("n",)
    prog = tdag.trace(_RUNS[name], S(shape, str(dtype).removeprefix("torch.")))
    module, model = to_torch(prog), to_onnx(prog)
    for n in (0, 1, 2, 13):
        for x in _runs_inputs(dtype, n):
            if name == "unique-dim":
                if dtype.is_floating_point:
                    continue  # torch sorts NaN rows with a comparator that is no order
                x = torch.stack([x, x.flip(0)], 1)
            want = _runs_want(name, x)
            _same(tdag.run(prog, x), want, f"run {name} {dtype} at {n}: {x}")
            _same(module(x), want, f"to_torch {name} {dtype} at {n}")
            _same(run_onnx(model, x), want, f"onnx {name} {dtype} at {n}")


# -- lowering and cost ------------------------------------------------------------------------

@pytest.mark.parametrize("fn, kernel", [
    (lambda x: ops.topk(x, 5, -1)[0], Op.topk), (lambda x: ops.sort(x, 0)[0], Op.topk),
    (lambda x: ops.argmax(x, -1), Op.argmax), (lambda x: ops.argmin(x, 0), Op.argmin)],
    ids=["topk", "sort-values", "argmax", "argmin"])
def test_lowering_gives_one_framework_call(fn, kernel):
    prog = tdag.trace(fn, S((4, 50), "float32"))
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes if n.op not in (Op.reshape,)] == [kernel]
    x = _ties(4, 50)
    _same(to_torch(low, lower=False)(x), tdag.run(prog, x), f"lowered {kernel.value}")


def test_cost_is_n_log_n_and_a_large_sort_is_fast():
    n = 200_000
    prog = tdag.trace(lambda t: ops.sort(t, 0)[0], S((n,), "float32"))
    flops = int(tdag.cost(prog, lowered=False).flops)
    assert n * math.ceil(math.log2(n)) <= flops <= 2 * n * math.ceil(math.log2(n))
    x = torch.randn(n)
    got = tdag.run(prog, x)
    assert torch.equal(got, torch.sort(x).values)


def test_searchsorted_is_a_binary_search_not_a_comparison_of_every_pair():
    prog = tdag.trace(lambda b, v: ops.searchsorted(b, v), S((10_000,), "float32"),
                      S((100_000,), "float32"))
    biggest = max(int(np.prod([int(d) for d in n.type.shape])) for n in prog.graph.nodes)
    assert biggest <= 100_001
    assert sum(n.op is Op.gather for n in prog.graph.nodes) == 14  # a step per bit of 10,000
