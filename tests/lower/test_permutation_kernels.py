"""A sort's permutation read and written row by row: ``take_along`` (torch.gather, ONNX
GatherElements) and ``put_along`` (torch.scatter, ONNX ScatterElements) in place of the flat
gather and the deduplicating flat scatter, as transformers' top-p filter uses them.

Each program is captured from torch, checked to lower to the kernels (no flat gather or
scatter left), and run through torch, onnxruntime and JAX against eager: exactly, as the
results are selections and masks of the input (the softmax and cumsum are the same calls).
"""
from __future__ import annotations

import pytest
import torch

import tdag
import tdag.lower
from tdag.ir.op import Op
from tdag.reify import to_onnx, to_torch

from support.guards import assert_close, run_onnx
from support.torch_models import Fn


def _top_p(logits, stable=False):
    """transformers' TopPLogitsWarper (top_p 0.9)."""
    sorted_logits, sorted_indices = torch.sort(logits, descending=False, stable=stable)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= 1 - 0.9
    remove[..., -1:] = 0
    remove = remove.scatter(-1, sorted_indices, remove)
    return logits.masked_fill(remove, -float("inf"))


def _sent_back(x):
    """Sorted values, scaled and ranked, written back in place as floats and integers."""
    values, order = torch.sort(x, dim=-1, descending=True, stable=True)
    ranks = torch.arange(x.shape[-1]).expand_as(order)
    return (torch.zeros_like(x).scatter(-1, order, values * 2),
            torch.zeros_like(order).scatter(-1, order, ranks))


def _checked(fn, *args):
    """The lowered program's kernels, after checking torch and onnxruntime against eager."""
    prog = tdag.from_torch(Fn(fn), args)
    kinds = {n.op for n in tdag.lower.lower(prog).graph.nodes}
    want = fn(*args)
    assert_close(to_torch(prog)(*args), want, "torch")
    assert_close(run_onnx(to_onnx(prog), *args), want, "onnx")
    return kinds


@pytest.mark.parametrize("shape", [(3, 50), (1, 64), (2, 3, 40)])
def test_top_p_reads_and_writes_the_sort_row_by_row(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    kinds = _checked(_top_p, x)
    assert {Op.take_along, Op.put_along} <= kinds
    assert not kinds & {Op.gather, Op.scatter}


def test_top_p_with_ties_follows_the_stable_sort():
    x = torch.randint(-3, 4, (4, 30), generator=torch.Generator().manual_seed(1)).float()
    assert {Op.take_along, Op.put_along} <= _checked(lambda t: _top_p(t, True), x)


def test_sorted_values_sent_back_as_floats_and_integers():
    x = torch.randint(-5, 6, (3, 17), generator=torch.Generator().manual_seed(2)).float()
    x[0, 3] = float("nan")
    kinds = _checked(_sent_back, x)
    assert Op.put_along in kinds and Op.scatter not in kinds


def test_top_p_on_jax():
    jax = pytest.importorskip("jax")
    x = torch.randn(2, 40, generator=torch.Generator().manual_seed(3))
    got = tdag.to_jax(tdag.from_torch(Fn(_top_p), (x,)))(x.numpy())
    assert_close(torch.from_numpy(jax.device_get(got).copy()), _top_p(x), "jax")


def test_a_scatter_by_another_index_stays_a_scatter():
    """Only a sort's permutation is known to write each position once."""
    x = torch.randn(3, 8)
    index = torch.randint(0, 8, (3, 8))
    kinds = _checked(lambda t, i: t.scatter(1, i.argsort(1), t), x, index)
    assert Op.put_along in kinds
    kinds = _checked(lambda t, i: t.scatter(1, i, t), x, torch.zeros(3, 8, dtype=torch.long))
    assert Op.put_along not in kinds and Op.scatter in kinds
