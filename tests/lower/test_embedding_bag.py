"""embedding_bag: the composition the torch front end writes (``tdag.ops.embedding_bag``) and
the kernel lowering makes of it, against torch eager.

Every captured ``nn.EmbeddingBag`` / ``F.embedding_bag`` must lower to the one
``embedding_bag`` kernel (no scatter left), and the composition (``tdag.run`` of the captured
program), the reified torch module, the ONNX model on onnxruntime and the JAX function must
each give eager's bags: sums, means and maxima, empty bags (0), padding entries left out,
per-sample weights, a last offset that closes the last bag, i32 indices, and a symbolic
number of indices and bags. Float tolerances: the composition adds a bag's rows in another
order than torch's kernel.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tdag
import tdag.lower
from tdag import ops
from tdag.ir.op import Op
from tdag.lower.kernels.writes import EmbeddingBag
from tdag.reify import to_onnx, to_torch

from support.guards import assert_close, run_onnx
from support.torch_models import Fn

ROWS, DIM = 12, 5
OFFSETS = torch.tensor([0, 0, 4, 4, 9, 13])  # bags 0, 2 and the last are empty (13 indices)


def _indices(n: int = 13, seed: int = 0, dtype=torch.int64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, ROWS, (n,), generator=gen).to(dtype)


def _backends(fn, args, jax: bool = True, kernel: bool = True):
    """Capture ``fn``; check it lowers to the kernel alone (where ``kernel``) and that the
    composition and every back end give eager's result."""
    prog = tdag.from_torch(Fn(fn), args)
    lowered = {n.op for n in tdag.lower.lower(prog).graph.nodes}
    assert (Op.embedding_bag in lowered and Op.scatter not in lowered) == kernel, lowered
    want = fn(*args)
    assert_close(tdag.run(prog, *args), want, "the composition")
    module = to_torch(prog)
    assert ("torch.nn.functional.embedding_bag(" in module.code) == kernel
    assert_close(module(*args), want, "torch")
    assert_close(run_onnx(to_onnx(prog), *args), want, "onnx")
    if jax:
        _on_jax(prog, args, want)


def _on_jax(prog, args, want):
    jax = pytest.importorskip("jax")
    got = tdag.to_jax(prog)(*(a.numpy() for a in args))
    assert_close(torch.from_numpy(jax.device_get(got).copy()), want, "jax")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 3])
def test_a_captured_embedding_bag_module_lowers_to_the_kernel(mode, padding_idx):
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(ROWS, DIM, mode=mode, padding_idx=padding_idx).eval()
    index = _indices()
    index[4:9] = 3  # a bag of padding only: empty once its entries are left out
    _backends(lambda i, o: bag(i, o), (index, OFFSETS), jax=padding_idx is None)


@pytest.mark.parametrize("mode", ["sum", "max"])
def test_include_last_offset_and_per_sample_weights(mode):
    torch.manual_seed(1)
    weight, index, weights = torch.randn(ROWS, DIM), _indices(seed=1), torch.rand(13)
    closed = torch.tensor([0, 3, 3, 10, 13])  # four bags, the last offset closes the last
    if mode == "sum":
        fn = lambda w, i, o, p: F.embedding_bag(  # noqa: E731
            i, w, o, mode="sum", per_sample_weights=p, include_last_offset=True)
        _backends(fn, (weight, index, closed, weights))
    else:
        fn = lambda w, i, o: F.embedding_bag(  # noqa: E731
            i, w, o, mode=mode, include_last_offset=True, padding_idx=2)
        _backends(fn, (weight, index, closed))


def test_i32_indices():
    torch.manual_seed(2)
    _backends(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"),
              (torch.randn(ROWS, DIM), _indices(dtype=torch.int32), OFFSETS.int()), jax=False)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_a_2d_input_lowers_to_the_kernel(mode):
    """A 2-D input's offsets are torch's arange(0, b * n, n): lowering folds them and the bag
    numbers into constants; the rule matches the composition with those offsets folded
    the same way and gives the kernel iota(b * n)[::n]."""
    torch.manual_seed(3)
    _backends(lambda w, i: F.embedding_bag(i, w, mode=mode),
              (torch.randn(ROWS, DIM), _indices(12).reshape(3, 4)))


def test_a_2d_input_with_padding_and_per_sample_weights():
    torch.manual_seed(4)
    index = _indices(12).reshape(4, 3)
    index[1] = 3  # a bag of padding only
    _backends(lambda w, i: F.embedding_bag(i, w, mode="mean", padding_idx=3),
              (torch.randn(ROWS, DIM), index), jax=False)
    _backends(lambda w, i, p: F.embedding_bag(i, w, per_sample_weights=p, mode="sum"),
              (torch.randn(ROWS, DIM), index, torch.rand(4, 3)))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_symbolic_numbers_of_indices_and_bags(mode):
    """Traced with n indices and b offsets symbolic; run at two sizes."""
    weight = torch.randn(ROWS, DIM)
    prog = tdag.trace(lambda w, i, o: ops.embedding_bag(w, i, o, mode),
                      tdag.TensorSpec((ROWS, DIM)), tdag.TensorSpec(("n",), "int64"),
                      tdag.TensorSpec(("b",), "int64"))
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes] == [Op.embedding_bag]
    assert low.graph.nodes[0].spec == EmbeddingBag(mode)
    module, model = to_torch(prog), to_onnx(prog)
    for n, offsets in ((13, OFFSETS), (40, torch.tensor([0, 17, 17, 30]))):
        index = _indices(n, seed=n)
        want = F.embedding_bag(index, weight, offsets, mode=mode)
        assert_close(tdag.run(prog, weight, index, offsets), want, "the composition")
        assert_close(module(weight, index, offsets), want, "torch")
        assert_close(run_onnx(model, weight, index, offsets), want, "onnx")


def test_a_near_miss_stays_the_composition():
    """Bags summed without the composition's range mask (a position before the first
    offset would write bag -1) are not the kernel: the matcher leaves them as they are."""
    def fn(w, i, o):
        n = i.shape[0]
        bag = ops.sub(ops.cumsum(ops.slice(ops.scatter(
            ops.zeros((n + 1,), "int64", like=i), o, 1, 0, "add"), 0, 0, n), 0), 1)
        rows = ops.gather(w, i, 0, wrap=False)
        return ops.slice(ops.scatter(ops.zeros((5, DIM), like=w), bag, rows, 0, "add"), 0, 0, 4)
    prog = tdag.trace(fn, tdag.TensorSpec((ROWS, DIM)), tdag.TensorSpec((13,), "int64"),
                      tdag.TensorSpec((4,), "int64"))
    assert Op.embedding_bag not in {n.op for n in tdag.lower.lower(prog).graph.nodes}
    index = _indices()
    assert_close(to_torch(prog)(torch.ones(ROWS, DIM), index, OFFSETS[:4]),
                 F.embedding_bag(index, torch.ones(ROWS, DIM), OFFSETS[:4], mode="sum"),
                 "near miss")


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_cost_is_the_kernels_count(mode):
    """One combine per gathered element (a divide per output element for a mean), as
    torch's kernel does: not the composition's passes."""
    n, bags = 13, len(OFFSETS)
    prog = tdag.trace(lambda w, i, o: ops.embedding_bag(w, i, o, mode),
                      tdag.TensorSpec((ROWS, DIM)), tdag.TensorSpec((n,), "int64"),
                      tdag.TensorSpec((bags,), "int64"))
    assert tdag.cost(prog).flops == n * DIM + (bags * DIM if mode == "mean" else 0)
