"""from_torch on single ATen ops that need more than a one-line entry: sorting and order
statistics, embedding bags, 3-d grid sampling, antialiased resizing, cropped replicate
padding, histogramdd and the chunked linear cross-entropy. Each case runs a small function
through torch.export, tdag.from_torch and tdag.run, and compares with eager (rtol 1e-4).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tdag
from tdag.canonicalize import from_torch

from support.guards import run_onnx
from support.torch_models import Fn


def check(fn, *args):
    module = Fn(fn).eval()
    with torch.no_grad():
        want = module(*args)
    got = tdag.run(from_torch(module, args), *args)
    want = torch.utils._pytree.tree_leaves(want)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5, equal_nan=True)


def _ties_and_nans():
    x = torch.randn(4, 7)
    x[0, 2] = x[0, 5] = x[0, 6]  # ties keep their order (stable)
    x[1, 1] = x[1, 4] = float("nan")  # NaN sorts last, first when descending
    x[2, :] = float("nan")
    return x


SORTING = {
    "sort": lambda x: torch.sort(x, dim=1),
    "sort_desc_dim0": lambda x: torch.sort(x, dim=0, descending=True),
    "argsort_stable": lambda x: torch.argsort(x, dim=-1, stable=True),
    # among equal values (an all-NaN row) topk and nanmedian may pick any position
    "topk": lambda x: torch.topk(x[[0, 1, 3]], 3, dim=1),
    "topk_smallest": lambda x: torch.topk(x, 2, dim=0, largest=False),
    # kthvalue (quickselect) picks any position among equal values: rows without ties
    "kthvalue": lambda x: torch.kthvalue(torch.cat([x[1:2], x[3:]]), 3, dim=1, keepdim=True),
    "median_dim": lambda x: torch.median(x, dim=1),
    "nanmedian_dim": lambda x: torch.nanmedian(x[[0, 1, 3]], dim=1),
    "median_all": lambda x: torch.median(x[3]),
    "quantile": lambda x: torch.quantile(x[3:], torch.tensor([0.1, 0.5, 0.9]), dim=1),
    "msort": lambda x: torch.msort(x),
}


@pytest.mark.parametrize("name", sorted(SORTING))
def test_sorting(name):
    torch.manual_seed(0)
    check(SORTING[name], _ties_and_nans())


def test_mode_prefers_smallest_and_reports_last_position():
    x = torch.tensor([[3.0, 1.0, 3.0, 1.0, 2.0], [5.0, 5.0, 4.0, 4.0, 4.0]])
    check(lambda t: torch.mode(t, dim=1), x)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag(mode, padding_idx):
    torch.manual_seed(0)
    weight = torch.randn(10, 4)
    index = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    offsets = torch.tensor([0, 3, 3, 6])  # bag 1 is empty
    check(lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=padding_idx),
          weight, index, offsets)


def test_embedding_bag_weights_last_offset_and_2d():
    torch.manual_seed(0)
    weight, index = torch.randn(10, 4), torch.tensor([1, 2, 4, 5, 4, 3, 2, 9])
    per_sample = torch.rand(8)
    check(lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p,
                                             include_last_offset=True),
          weight, index, torch.tensor([0, 2, 5, 7]), per_sample)
    check(lambda w, i: F.embedding_bag(i, w, mode="mean"), weight, index.reshape(2, 4))


def test_an_embedding_is_one_lookup_refusing_a_negative_index_as_torch_does():
    """F.embedding takes no negative index (torch raises), so the program wraps none: one
    gather, no compare, add and select over the indices; the reified module raises too."""
    table = torch.nn.Embedding(10, 4)
    index = torch.tensor([[1, 2, 9], [0, 3, 3]])
    prog = from_torch(table, (index,))
    assert [n.op.name for n in prog.graph.nodes] == ["gather"], prog
    module = tdag.to_torch(prog)
    torch.testing.assert_close(module(index), table(index))
    for fn in (table, module):
        with pytest.raises(IndexError):
            fn(torch.tensor([[1, -1, 2], [0, 0, 0]]))


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_3d(mode, padding_mode, align_corners):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4, 5, 6)
    grid = torch.rand(2, 3, 2, 4, 3) * 2.6 - 1.3  # some points fall outside [-1, 1]
    check(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding_mode,
                                     align_corners=align_corners), x, grid)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size", [(3, 7), (17, 9), (1, 40)])
@pytest.mark.parametrize("align_corners", [False, True])
def test_antialiased_interpolate(mode, size, align_corners):
    torch.manual_seed(0)
    check(lambda x: F.interpolate(x, size=size, mode=mode, antialias=True,
                                  align_corners=align_corners), torch.randn(2, 3, 10, 20))


def test_antialiased_interpolate_scale_factor():
    check(lambda x: F.interpolate(x, scale_factor=0.3, mode="bilinear", antialias=True),
          torch.randn(1, 2, 11, 13))


@pytest.mark.parametrize("pad", [(-4, 5, 0, 0), (2, -3, -1, 2), (-1, -1, 1, 0)])
def test_replicate_pad_with_crop(pad):
    check(lambda x: F.pad(x, pad, mode="replicate"), torch.randn(2, 3, 4, 4))


def test_histogramdd():
    torch.manual_seed(0)
    x, w = torch.randn(30, 2), torch.rand(30)
    check(lambda t: torch.histogramdd(t, bins=[3, 4]), x)
    check(lambda t, u: torch.histogramdd(t, bins=[2, 3], range=[-1.0, 1.0, -2.0, 0.5],
                                         weight=u, density=True), x, w)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_linear_cross_entropy(reduction):
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 5), torch.randn(7, 5), torch.randn(7)
    target, class_weight = torch.tensor([0, 3, 6, 2, 2, 1]), torch.rand(7)
    options = torch.nn.LinearCrossEntropyOptions(batch_chunk_size=2)
    check(lambda i, lw, t, lb, cw: F.linear_cross_entropy(
        i, lw, t, linear_bias=lb, weight=cw, reduction=reduction, ignore_index=2,
        options=options), x, w, target, b, class_weight)


# -- writes along one axis (a KV cache update): compared along that axis only -------------------

def _put(x, pos, v):
    x = x.clone()
    x[:, :, pos] = v
    return x


def _put_last(x, pos, v):
    x = x.clone()
    x[..., pos] = v
    return x


WRITES_ALONG_ONE_AXIS = {
    "kv-cache": (_put, lambda: (torch.randn(1, 2, 8, 4), torch.tensor([3]),
                                torch.randn(1, 2, 1, 4))),
    "several": (_put, lambda: (torch.randn(2, 3, 8, 4), torch.tensor([0, 5, 2]),
                               torch.randn(2, 3, 3, 4))),
    "negative": (_put, lambda: (torch.randn(1, 2, 8, 4), torch.tensor([-1, -8]),
                                torch.randn(1, 2, 2, 4))),
    "duplicates-last-wins": (_put, lambda: (torch.randn(1, 1, 5, 2), torch.tensor([1, 1, 4]),
                                            torch.randn(1, 1, 3, 2))),
    "broadcast-value": (_put_last, lambda: (torch.randn(3, 6), torch.tensor([2, 4]),
                                            torch.tensor(7.0))),
    "index_copy": (lambda x, pos, v: x.index_copy(2, pos, v),
                   lambda: (torch.randn(1, 2, 8, 4), torch.tensor([6, 1]),
                            torch.randn(1, 2, 2, 4))),
    # torch takes a 0-d tensor as one row along dim 0 (OpInfo's first samples)
    "index_copy 0-d": (lambda x, pos, v: x.index_copy(0, pos, v),
                       lambda: (torch.tensor(1.5), torch.tensor([0]), torch.tensor(-2.0))),
    "index_add 0-d": (lambda x, pos, v: x.index_add(-1, pos, v, alpha=3),
                      lambda: (torch.tensor(1.5), torch.tensor([0]), torch.tensor(-2.0))),
    "index_fill 0-d": (lambda x, pos: x.index_fill(0, pos, 4.0),
                       lambda: (torch.tensor(1.5), torch.tensor(0))),
    "index_reduce 0-d": (lambda x, pos, v: x.index_reduce(0, pos, v, "amax"),
                         lambda: (torch.tensor(1.5), torch.tensor([0]), torch.tensor(2.0))),
}


@pytest.mark.parametrize("name", WRITES_ALONG_ONE_AXIS)
def test_write_along_one_axis(name):
    fn, args = WRITES_ALONG_ONE_AXIS[name]
    check(fn, *args())


def test_kv_cache_write_costs_the_cache_not_its_square():
    """A one-token write into a cache of n positions: O(n) work, not O(n * numel)."""
    cache, pos, v = torch.randn(1, 2, 512, 16), torch.tensor([3]), torch.randn(1, 2, 1, 16)
    prog = from_torch(Fn(_put).eval(), (cache, pos, v))
    assert tdag.cost(prog).flops < 10 * cache.numel()


@pytest.mark.parametrize("fn", [
    lambda x: torch.diff(x),
    lambda x: torch.diff(x, n=2, dim=0, prepend=x[:1], append=x[-2:]),
    lambda x: torch.diff(x > 0, dim=1),
    lambda x: torch.diff(x.long(), n=3),
], ids=["first", "second_joined", "bool", "third_i64"])
def test_diff(fn):
    check(fn, torch.randn(5, 6) * 4)


def test_batch_norm_of_batch_statistics_without_running_ones():
    """F.batch_norm(training=True) with no running statistics updates nothing: a pure
    normalisation, as BiT's weight-standardised convolution calls it in an eval-mode model;
    a batch norm that would update its running statistics is refused, naming module.eval()."""
    weight = torch.randn(8, 3, 3, 3)

    def standardised_conv(x):
        w = F.batch_norm(weight.reshape(1, 8, -1), None, None, training=True,
                         eps=1e-8).reshape_as(weight)
        return F.conv2d(x, w)
    check(standardised_conv, torch.randn(2, 3, 9, 9))
    scale, shift = torch.rand(3) + 0.5, torch.randn(3)
    check(lambda x: F.batch_norm(x, None, None, scale, shift, training=True),
          torch.randn(4, 3, 5))
    training = torch.nn.BatchNorm2d(3).train()
    with pytest.raises(tdag.UnsupportedOpError, match=r"running statistics.*module\.eval\(\)"):
        from_torch(training, (torch.randn(2, 3, 4, 4),))


def test_where_of_a_condition_alone_is_its_positions():
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    check(lambda x: torch.where(x > 0), x)
    check(lambda x: torch.where(x[0] > 0), x)


@pytest.mark.parametrize("fn", [torch.maximum, torch.minimum])
def test_maximum_and_minimum_of_two_tensors_are_one_call_propagating_nan(fn):
    """The composition (compare, nan test, or, select) lowers back to torch's one call and
    ONNX's Max / Min, nan from either side propagating as in torch."""
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    a[0, 0, 0] = b[0, 1, 1] = b[1, 2, 3] = a[1, 2, 3] = float("nan")
    prog = from_torch(Fn(lambda x, y: fn(x, y) * 2).eval(), (a, b))
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes if n.op in (tdag.Op.maximum, tdag.Op.minimum,
                                                           tdag.Op.where)] == \
        [getattr(tdag.Op, fn.__name__)]
    want = fn(a, b) * 2
    torch.testing.assert_close(tdag.to_torch(prog)(a, b), want, equal_nan=True)
    onnx_model = tdag.to_onnx(prog)
    assert {"Max", "Min"} & {n.op_type for n in onnx_model.graph.node}
    torch.testing.assert_close(run_onnx(onnx_model, a, b), want, equal_nan=True)
