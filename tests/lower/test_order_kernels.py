"""Lowering to the framework's own order kernels: cummax/cummin (values and indices from one
call), bincount (one call that sizes its own result), and top-k positions (torch.topk where
it has no ties to order, the packed key where it has).

Each lowered program is checked against torch eager (exactly: these are integer results or
selections of the input) and, for the kernels' ONNX emitters, against onnxruntime.
"""
from __future__ import annotations

import pytest
import torch

import tdag
import tdag.lower
from tdag.ir.op import Op
from tdag.lower.kernels import sorting as sorting_kernels
from tdag.lower.kernels.sorting import topk_positions
from tdag.reify import to_onnx, to_torch

from support.guards import assert_close, run_onnx
from support.torch_models import Fn


def _lowered(fn, *args):
    prog = tdag.from_torch(Fn(fn), args)
    return prog, {n.op for n in tdag.lower.lower(prog).graph.nodes}


def _ties(shape, dtype, seed=0) -> torch.Tensor:
    """Few distinct values (many ties); floats also get NaN, -0.0 and infinities."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, shape, generator=gen)
    if not dtype.is_floating_point:
        return x.to(dtype)
    x = x.to(dtype)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=gen)[:4]
    flat[picks] = torch.tensor([float("nan"), -0.0, float("inf"), float("-inf")], dtype=dtype)
    return x


# -- cummax / cummin ----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.int32])
@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cumulative_extremes_lower_to_one_framework_call(name, dtype):
    x = _ties((4, 13), dtype)
    fn = lambda t: (*getattr(torch, name)(t, 1), *getattr(torch, name)(t, 0))  # noqa: E731
    prog, ops_seen = _lowered(fn, x)
    assert Op.cum_extreme in ops_seen and Op.scan not in ops_seen
    module = to_torch(prog)
    assert module.code.count(f"torch.{name}(") == 2  # one call per axis for both outputs
    want = fn(x)
    assert_close(module(x), want, f"torch {name}")
    assert_close(run_onnx(to_onnx(prog), x), want, f"onnx {name}")


def _on_jax(fn, *args):
    """``fn`` captured from torch, reified for JAX and run on ``args`` (the function turns
    x64 on for its own run); checked against eager."""
    jax = pytest.importorskip("jax")
    prog = tdag.from_torch(Fn(fn), args)
    got = tdag.to_jax(prog)(*(a.numpy() for a in args))
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert Op.scan not in {n.op for n in tdag.lower.lower(prog).graph.nodes}
    assert_close(tuple(torch.from_numpy(jax.device_get(g).copy()) for g in got), fn(*args),
                 "jax")


def test_cumulative_extremes_on_jax():
    _on_jax(lambda t: tuple(torch.cummin(t, 1)), _ties((3, 9), torch.float32))


# -- bincount -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [500, 0])
@pytest.mark.parametrize("minlength", [0, 40])
def test_bincount_is_one_framework_call_everywhere(minlength, n):
    """torch.bincount's length (max + 1, at least minlength) and count: one call that finds
    the length as it counts (bincount_sized), through run, to_torch, onnxruntime and JAX."""
    x = torch.randint(0, 30, (n,))
    fn = lambda t: torch.bincount(t, minlength=minlength)  # noqa: E731
    prog, ops_seen = _lowered(fn, x)
    assert Op.bincount_sized in ops_seen and Op.scatter not in ops_seen
    module = to_torch(prog)
    body = module.code.split("def forward")[0]
    assert body.count("torch.") == 1 and "torch.bincount(" in body
    want = fn(x)
    lowered = tdag.lower.lower(prog)
    for got, what in ((tdag.run(lowered, x), "run"), (module(x), "torch"),
                      (run_onnx(to_onnx(prog), x), "onnx")):
        assert torch.equal(got, want), what
    _on_jax(fn, x)


def test_bincount_refuses_a_negative_value_everywhere():
    x = torch.tensor([3, 0, -1, 2])
    prog = tdag.from_torch(Fn(lambda t: torch.bincount(t, minlength=2)), (torch.arange(4),))
    with pytest.raises(tdag.TdagError, match="must be >= 0"):
        tdag.run(tdag.lower.lower(prog), x)
    with pytest.raises(RuntimeError, match="non-negative"):  # torch.bincount's own, as eager
        to_torch(prog)(x)
    with pytest.raises(Exception, match="ConstantOfShape"):  # -1 as a size, refused
        run_onnx(to_onnx(prog), x)
    with pytest.raises(tdag.TdagError, match="must be >= 0"):
        tdag.to_jax(prog)(x.numpy())


def test_bincount_on_jax():
    _on_jax(lambda z, i: (z.index_add(0, i, torch.ones_like(i)),),
            torch.randint(-5, 5, (7,)), torch.randint(0, 7, (40,)))


def test_a_weighted_bincount_keeps_the_scatter():
    x, w = torch.randint(0, 30, (500,)), torch.rand(500)
    prog, ops_seen = _lowered(lambda t, v: torch.bincount(t, v), x, w)
    assert Op.scatter in ops_seen and Op.bincount not in ops_seen
    assert_close(to_torch(prog)(x, w), torch.bincount(x, w), "weighted")


def test_a_count_added_to_a_target_keeps_the_target():
    fn = lambda z, i: z.index_add(0, i, torch.ones_like(i, dtype=torch.int32))  # noqa: E731
    z, i = torch.randint(-5, 5, (7,), dtype=torch.int32), torch.randint(0, 7, (40,))
    prog, ops_seen = _lowered(fn, z, i)
    assert Op.bincount in ops_seen
    assert torch.equal(to_torch(prog)(z, i), fn(z, i))
    assert torch.equal(run_onnx(to_onnx(prog), z, i), fn(z, i))


def test_an_i64_min_over_every_axis_is_written_min():
    """torch's amin of int64 is scalar code on CPU; ``x.min()`` is vectorized: the bincount
    range check reads 1M entries with it. Only that form changes (amax, partial reductions
    and other dtypes keep amin/amax, which agree with min/max on NaN but not on -0.0)."""
    x = torch.randint(-50, 50, (6, 7))
    fn = lambda t: (t.amin(), t.amin(1), t.amax(), t.float().amin())  # noqa: E731
    module = to_torch(tdag.from_torch(Fn(fn), (x,)))
    assert module.code.count(".min()") == 1 and module.code.count(".amin(") == 2
    for got, want in zip(module(x), fn(x)):
        assert torch.equal(got, want) and got.dtype == want.dtype


# -- top-k positions ----------------------------------------------------------------------------

def _stable_topk(x, k, dim, largest):
    return torch.sort(x, dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int32,
                                   torch.int8, torch.uint8, torch.bool])
@pytest.mark.parametrize("largest", [True, False])
def test_topk_positions_order_ties_as_the_stable_sort(dtype, largest):
    x = _ties((5, 17), dtype).abs() if dtype is torch.uint8 else _ties((5, 17), dtype)
    x = x > 0 if dtype is torch.bool else x
    for k in (0, 1, 5, 16, 17):
        for dim in (0, 1):
            k_dim = min(k, x.shape[dim])
            assert torch.equal(topk_positions(x, k_dim, dim, largest),
                               _stable_topk(x, k_dim, dim, largest)), (k_dim, dim)


def test_topk_positions_skip_the_packed_key_without_ties(monkeypatch):
    calls = []
    packed = sorting_kernels._packed_key
    monkeypatch.setattr(sorting_kernels, "_packed_key",
                        lambda *a: calls.append(1) or packed(*a))
    x = torch.randperm(1000).float().view(4, 250)
    assert torch.equal(topk_positions(x, 50, 1, True), _stable_topk(x, 50, 1, True))
    assert not calls
    x[2, 7] = x[2, 9] = x.max() + 1  # a tie at the top of one row
    assert torch.equal(topk_positions(x, 50, 1, True), _stable_topk(x, 50, 1, True))
    assert calls


def test_topk_with_positions_matches_eager_over_an_empty_axis():
    x = torch.randn(3, 0)
    assert topk_positions(x, 0, 1, True).shape == (3, 0)
