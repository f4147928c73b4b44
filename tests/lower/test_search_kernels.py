"""searchsorted (torch's binary search, unrolled by ``tdag.ops.sorting.binary_search``) and
logcumsumexp lowered to one framework call each, and bincount with weights.

Every result is checked against torch eager: searchsorted exactly (NaN on either side and
unsorted boundaries included: the composition takes torch's path step by step), on tdag.run
(the composition), to_torch (the kernel), onnxruntime (the composition written in ONNX) and
JAX; logcumsumexp to float tolerance (NaN and infinities where torch puts them).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdag
import tdag.lower
from tdag import ops
from tdag.errors import TdagError
from tdag.ir.op import Op
from tdag.reify import to_onnx, to_torch

from support.guards import assert_close, run_onnx
from support.torch_models import Fn

NAN = float("nan")


def _lowered_ops(prog):
    return {n.op for n in tdag.lower.lower(prog).graph.nodes}


def _on_jax(prog, args):
    jax = pytest.importorskip("jax")
    with jax.enable_x64(True):
        got = tdag.to_jax(prog)(*(a.numpy() for a in args))
        got = got if isinstance(got, (tuple, list)) else (got,)
        return tuple(torch.from_numpy(jax.device_get(g).copy()) for g in got)


def _everywhere(fn, args, exact: bool = True):
    """``fn`` captured, run by tdag.run, to_torch, onnxruntime and JAX, each against eager."""
    prog = tdag.from_torch(Fn(fn), args)
    want = fn(*args)
    check = (lambda g, what: assert_close(g, want, what)) if not exact else \
        (lambda g, what: _equal(g, want, what))
    check(tdag.run(prog, *args), "run")
    check(to_torch(prog)(*args), "torch")
    check(run_onnx(to_onnx(prog), *args), "onnx")
    check(_on_jax(prog, args), "jax")
    return prog


def _equal(got, want, what):
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, want):
        assert torch.equal(torch.as_tensor(g).to(w.dtype), w), f"{what}: {g} != {w}"


def _boundaries(m: int, seed: int, sort: bool = True, nan: bool = True) -> torch.Tensor:
    """Few distinct values (duplicates), NaN at random places (after sorting, so that the
    search meets them mid-row), infinities."""
    gen = torch.Generator().manual_seed(seed)
    b = torch.randint(-3, 4, (m,), generator=gen).float()
    b = b.sort().values if sort else b
    if nan and m:
        b[torch.rand(m, generator=gen) < 0.25] = NAN
    if m > 2:
        b[0], b[-1] = -float("inf"), float("inf")
    return b


def _values(shape, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    v = torch.randint(-4, 5, shape, generator=gen).float()
    v.view(-1)[torch.rand(v.numel(), generator=gen) < 0.2] = NAN
    return v


# -- searchsorted -------------------------------------------------------------------------------

@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("m", [1, 2, 7, 16])
def test_searchsorted_is_torchs_search_with_nan_everywhere(m, right):
    b, v = _boundaries(m, m), _values((3, 5), m)
    prog = _everywhere(lambda b, v: torch.searchsorted(b, v, right=right), (b, v))
    assert Op.searchsorted in _lowered_ops(prog) and Op.gather not in _lowered_ops(prog)


def test_searchsorted_batched_boundaries_and_a_sorter():
    b = torch.stack([_boundaries(9, s) for s in range(4)]).reshape(2, 2, 9)
    v = _values((2, 2, 6), 1)
    _everywhere(lambda b, v: torch.searchsorted(b, v, side="right"), (b, v))
    unsorted = torch.stack([_boundaries(9, s, sort=False) for s in range(3)])
    sorter = torch.argsort(unsorted, -1)
    _everywhere(lambda b, v, s: torch.searchsorted(b, v, sorter=s),
                (unsorted, _values((3, 4), 2), sorter))


def test_bucketize_and_int_boundaries():
    b, v = torch.tensor([-2, 0, 0, 3, 9]), torch.randint(-4, 11, (4, 6))
    _everywhere(lambda v, b: torch.bucketize(v, b, out_int32=True, right=True), (v, b))
    _everywhere(lambda b, v: torch.searchsorted(b, v), (b, v))


def test_searchsorted_of_no_boundaries_is_zero():
    _everywhere(lambda b, v: torch.searchsorted(b, v), (torch.zeros(0), _values((5,), 0)))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([-1.0, 0.0, 0.5, 2.0, NAN]), min_size=1, max_size=12),
       st.lists(st.sampled_from([-2.0, 0.0, 0.5, 1.0, 3.0, NAN]), min_size=1, max_size=6),
       st.booleans())
def test_searchsorted_runs_torchs_path(b, v, right):
    b, v = torch.tensor(b), torch.tensor(v)
    prog = tdag.trace(lambda b, v: ops.searchsorted(b, v, right), tdag.TensorSpec(b.shape),
                      tdag.TensorSpec(v.shape))
    _equal(tdag.run(prog, b, v), torch.searchsorted(b, v, right=right), "run")


def test_a_symbolic_number_of_boundaries_is_a_merge_that_refuses_nan():
    prog = tdag.trace(lambda b, v: ops.searchsorted(b, v), tdag.TensorSpec(("m",)),
                      tdag.TensorSpec((6,)))
    assert Op.sort in {n.op for n in prog.graph.nodes}
    b, v = torch.tensor([-1.0, 0.0, 0.0, 2.0]), _values((6,), 3)
    _equal(tdag.run(prog, b, v), torch.searchsorted(b, v), "run")
    with pytest.raises((TdagError, RuntimeError)):
        tdag.run(prog, torch.tensor([0.0, NAN]), v)


def test_searchsorted_costs_a_binary_search():
    prog = tdag.trace(lambda b, v: ops.searchsorted(b, v), tdag.TensorSpec((1000,)),
                      tdag.TensorSpec((500,)))
    assert tdag.cost(prog).flops == 500 * 10  # 1000 is 10 bits: the loop's most trips


# -- logcumsumexp -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logcumsumexp_is_one_call_with_torchs_nan_and_infinities(dtype):
    x = torch.randn(4, 11, dtype=dtype) * 3
    x[0, 3], x[1, 0], x[1, 5], x[2, 2], x[3, :] = NAN, -float("inf"), float("inf"), \
        -float("inf"), -float("inf")
    prog = _everywhere(lambda x: (torch.logcumsumexp(x, 1), torch.logcumsumexp(x, 0)), (x,),
                       exact=False)
    lowered = _lowered_ops(prog)
    assert Op.logcumsumexp in lowered and Op.scan not in lowered and Op.exp not in lowered
    assert tdag.cost(prog).flops == 2 * 6 * x.numel()  # torch's log-add-exp per element


def test_logcumsumexp_from_the_end():
    x = torch.randn(3, 8)
    prog = tdag.trace(lambda x: ops.logcumsumexp(x, 1, reverse=True), tdag.TensorSpec((3, 8)))
    want = torch.logcumsumexp(x.flip(1), 1).flip(1)
    assert_close(to_torch(prog)(x), want, "torch")
    assert_close(run_onnx(to_onnx(prog), x), want, "onnx")
    assert_close(_on_jax(prog, (x,)), want, "jax")


# -- bincount -----------------------------------------------------------------------------------

@pytest.mark.parametrize("minlength", [0, 50])
def test_bincount_with_weights(minlength):
    x, w = torch.randint(0, 30, (200,)), torch.randn(200, dtype=torch.float64)
    _everywhere(lambda x, w: torch.bincount(x, w, minlength=minlength), (x, w), exact=False)
