"""The scatter primitive beyond its differential cases (support/primitive_cases.py): the
mirror law with gather, NaN through max/min, its cost (linear), strip_batch, the text form,
and the front ends' writes (ATen, ONNX) against torch and onnxruntime."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import tdag
from tdag import ops
from tdag.canonicalize import from_torch

from support.guards import run_onnx
from support.torch_models import Fn


def _program(target, index, values, axis, combine):
    return tdag.trace(lambda z, i, v: ops.scatter(z, i, v, axis, combine),
                      tdag.TensorSpec(tuple(target.shape), "float32"),
                      tdag.TensorSpec(tuple(index.shape), "int64"),
                      tdag.TensorSpec(tuple(values.shape), "float32"))


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2), st.data())
def test_gather_of_scatter_reads_back_the_values(n, axis, data):
    """``gather(scatter(z, i, v), i) == v`` for distinct positions i, every combine's
    replace; and scatter-add into zeros of distinct positions is the same write."""
    shape = [2, 3, 4]
    shape[axis] = n
    m = data.draw(st.integers(0, n))
    index = torch.randperm(n)[:m]
    z = torch.randn(shape)
    v = torch.randn(*shape[:axis], m, *shape[axis + 1:])
    out = tdag.run(_program(z, index, v, axis, "replace"), z, index, v)
    torch.testing.assert_close(out.index_select(axis, index), v)
    added = tdag.run(_program(z, index, v, axis, "add"), torch.zeros(shape), index, v)
    torch.testing.assert_close(added, torch.zeros(shape).index_copy(axis, index, v))


@pytest.mark.parametrize("combine,reduce", [("max", "amax"), ("min", "amin")])
def test_nan_propagates_through_max_and_min(combine, reduce):
    z = torch.tensor([1.0, float("nan"), 3.0, 0.0])
    index, v = torch.tensor([0, 0, 2, 3]), torch.tensor([float("nan"), 5.0, 1.0, -1.0])
    prog = _program(z, index, v, 0, combine)
    want = z.scatter_reduce(0, index, v, reduce)
    torch.testing.assert_close(tdag.run(prog, z, index, v), want, equal_nan=True)
    torch.testing.assert_close(tdag.to_torch(prog)(z, index, v), want, equal_nan=True)


def test_cost_is_linear_in_what_it_touches():
    """200,000 rows of 32 written into 20,000: the flops are the values, not values x rows."""
    z, index, v = torch.zeros(20000, 32), torch.zeros(200000, dtype=torch.long), \
        torch.zeros(200000, 32)
    report = tdag.cost(_program(z, index, v, 0, "add"))
    assert report.flops == v.numel()
    assert report.bytes_read <= 3 * (v.numel() * 4 + index.numel() * 8)


def test_text_form_round_trips():
    z, index, v = torch.zeros(4, 3), torch.zeros(2, dtype=torch.long), torch.zeros(4, 2)
    prog = _program(z, index, v, 1, "mul")
    assert tdag.parse(str(prog)) == prog


def test_strip_batch_writes_each_sample_its_own_rows():
    """A KV cache [b, heads, positions, dim] written at one position per step."""
    cache, k = torch.randn(3, 2, 8, 4), torch.randn(3, 2, 1, 4)
    prog = tdag.trace(lambda c, v: ops.scatter(c, c.builder.const(torch.tensor([5])), v, 2),
                      tdag.TensorSpec(("b", 2, 8, 4)), tdag.TensorSpec(("b", 2, 1, 4)))
    single = tdag.strip_batch(prog)
    for s in range(3):
        torch.testing.assert_close(tdag.run(single, cache[s], k[s]), tdag.run(prog, cache, k)[s])


# -- the ATen writes, against eager ----------------------------------------------------------

def _check(fn, *args, onnx_too=False):
    module = Fn(fn).eval()
    want = torch.utils._pytree.tree_leaves(module(*args))
    prog = from_torch(module, args)
    outs = [tdag.run(prog, *args), tdag.to_torch(prog)(*args)]
    if onnx_too:
        outs.append(run_onnx(tdag.to_onnx(prog), *args))
    for got in outs:
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)


def _elementwise(x, i, src):
    """torch.scatter's per-element index: every form, with duplicates in i."""
    outs = [x.scatter(1, i, src), x.scatter(1, i, 2.5), x.scatter_add(1, i, src)]
    for reduce in ("sum", "prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            outs.append(x.scatter_reduce(1, i, src, reduce, include_self=include_self))
    return tuple(outs)


def _rows(x, i, src):
    """index_add / index_copy / index_fill / index_reduce along one axis, and the broadcast
    index of a graph network (``dst.expand_as(msg)``), which writes whole rows."""
    expanded = i[:, None].expand(-1, x.shape[1])
    outs = [x.index_add(0, i, src, alpha=2.0), x.index_copy(0, i, src),
            x.index_fill(1, i[:2] % 3, -1.0), x.scatter_add(0, expanded, src),
            x.scatter_reduce(0, expanded, src, "amax")]
    for reduce in ("prod", "mean", "amax", "amin"):
        for include_self in (True, False):
            outs.append(x.index_reduce(0, i, src, reduce, include_self=include_self))
    return tuple(outs)


def _puts(x, i, j, mask, v):
    """index_put: one axis, adjacent and apart axes, accumulate, negatives, a bool mask."""
    a, b, c, d, e = x.clone(), x.clone(), x.clone(), x.clone(), x.clone()
    a[:, i] = v
    b[i, j] += 1.0
    c[i, :, j] = 3.0
    d[:, -1] = 0.0
    e[mask] = 7.0
    return a, b, c, d, e


def test_elementwise_scatters():
    torch.manual_seed(0)
    x, i, src = torch.randn(3, 5), torch.randint(0, 5, (3, 4)), torch.randn(3, 6)
    _check(_elementwise, x, i, src)


def test_row_writes():
    torch.manual_seed(0)
    x, i, src = torch.randn(6, 3), torch.tensor([4, 0, 4, 2, 5, 0, 4]), torch.randn(7, 3)
    _check(_rows, x, i, src, onnx_too=True)


def test_index_put():
    torch.manual_seed(0)
    x = torch.randn(4, 5, 3)
    i, j = torch.tensor([3, 0, 3, -1]), torch.tensor([1, 2, 1, 0])
    _check(_puts, x, i, j, torch.rand(4, 5, 3) > 0.5, torch.randn(4, 4, 3))


def test_counts():
    """bincount (weights, minlength; a length data decides) and histc."""
    torch.manual_seed(0)
    x, w = torch.randint(0, 7, (40,)), torch.rand(40)
    _check(lambda a, b: (torch.bincount(a), torch.bincount(a, b, minlength=12)), x, w)
    _check(lambda a: torch.histc(a, bins=6, min=-1.0, max=1.0), torch.randn(50))


# -- the ONNX writes, against onnxruntime --------------------------------------------------

def _onnx_case(op, data, index, updates, **attrs):
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "i", "u"], ["y"], **attrs)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(data.shape)),
         helper.make_tensor_value_info("i", TensorProto.INT64, list(index.shape)),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, list(updates.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(data.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    return model


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_onnx_scatters_with_reduction(reduction):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((4, 5, 3)).astype(np.float32))
    cases = [("ScatterElements", torch.from_numpy(rng.integers(-5, 5, (2, 4, 3))),
              torch.randn(2, 4, 3), {"axis": 1}),
             ("ScatterND", torch.tensor([[[1, 2]], [[3, 0]], [[1, 2]]]), torch.randn(3, 1, 3), {})]
    for op, index, updates, attrs in cases:
        model = _onnx_case(op, x, index, updates, reduction=reduction, **attrs)
        want = run_onnx(model, x, index, updates)
        torch.testing.assert_close(tdag.run(tdag.from_onnx(model), x, index, updates), want)


def _top_p(logits):
    """transformers' TopPLogitsWarper (top_p 0.9): the mask is sent back to vocabulary
    order by a scatter at the sort's permutation."""
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)
    remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - 0.9
    remove[..., -1:] = 0
    remove = remove.scatter(1, sorted_indices, remove)
    return logits.masked_fill(remove, -float("inf"))


def test_a_scatter_at_a_sorts_permutation_is_not_wrapped():
    """A sort's permutation holds no negative index: the write goes without the wrap's
    compare, add and where (top-p's hot path), and still matches torch and onnxruntime."""
    x = torch.randn(3, 50)
    x[1, :10] = 0.5  # ties
    prog = from_torch(Fn(_top_p), (x,))
    assert not any(n.op is tdag.Op.compare and n.spec.kind.value == "lt"
                   for n in prog.graph.nodes)
    want = _top_p(x)
    for got in (tdag.run(prog, x), tdag.to_torch(prog)(x), run_onnx(tdag.to_onnx(prog), x)):
        torch.testing.assert_close(got, want)
