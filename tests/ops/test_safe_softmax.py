"""``ops.safe_softmax``, the one safe-softmax composition, and the front ends that call it.

torch's ``_safe_softmax`` (what attention runs) is softmax where a row that is entirely -inf
gives zeros instead of nan. ``scaled_dot_product_attention``, the ATen ``_safe_softmax``
entry and the ONNX ``Attention`` entry all call ``ops.safe_softmax``; each is checked on rows
that are fully masked, partly -inf, hold a nan or a +inf, against torch's kernel or the ONNX
reference implementation.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import tdag
from tdag import ops
from tdag.canonicalize.torch.aten.nn import safe_softmax as aten_safe_softmax

INF, NAN = float("inf"), float("nan")

ROWS = torch.tensor([
    [0.5, -1.0, 2.0, 0.0],       # plain
    [-INF, 1.0, -INF, 3.0],      # partly masked: -inf weighs 0
    [-INF, -INF, -INF, -INF],    # fully masked: zeros, not nan
    [NAN, 1.0, 0.0, -INF],       # a nan makes its row nan
    [INF, 1.0, 0.0, -INF],       # so does a +inf (inf - inf)
    [NAN, -INF, -INF, -INF],     # a nan among -inf: nan, as torch
])


def _run(fn, x: torch.Tensor) -> torch.Tensor:
    return tdag.run(tdag.trace(fn, tdag.TensorSpec(tuple(x.shape))), x)


@pytest.mark.parametrize("axis", [-1, 0])
def test_safe_softmax_is_torchs(axis):
    want = torch.ops.aten._safe_softmax(ROWS, axis)
    torch.testing.assert_close(_run(lambda x: ops.safe_softmax(x, axis), ROWS), want,
                               equal_nan=True)


def test_safe_softmax_agrees_with_softmax_off_the_fully_masked_rows():
    got = _run(lambda x: ops.safe_softmax(x, -1), ROWS)
    soft = torch.softmax(ROWS, -1)
    torch.testing.assert_close(got[[0, 1, 3, 4, 5]], soft[[0, 1, 3, 4, 5]], equal_nan=True)
    assert torch.equal(got[2], torch.zeros(4))


@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_the_aten_entry_calls_it(dim):
    x = ROWS.reshape(2, 3, 4)
    want = torch.ops.aten._safe_softmax(x, dim)
    torch.testing.assert_close(_run(lambda t: aten_safe_softmax(t, dim), x), want,
                               equal_nan=True)


def test_attention_calls_it():
    """A query whose every key is masked attends to nothing (zeros), as torch."""
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    mask = torch.rand(3, 5) > 0.4
    mask[1] = False
    fn = lambda q, k, v: ops.scaled_dot_product_attention(  # noqa: E731
        q, k, v, attn_mask=ops.const(mask))
    prog = tdag.trace(fn, *(tdag.TensorSpec(tuple(t.shape)) for t in (q, k, v)))
    got = tdag.run(prog, q, k, v)
    torch.testing.assert_close(got, torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask))
    assert got[:, 1].abs().max() == 0


def _onnx_attention(mask: np.ndarray) -> onnx.ModelProto:
    f32 = TensorProto.FLOAT
    node = helper.make_node("Attention", ["q", "k", "v", "mask"], ["y"])
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info("q", f32, [1, 2, 3, 4]),
         helper.make_tensor_value_info("k", f32, [1, 2, 5, 4]),
         helper.make_tensor_value_info("v", f32, [1, 2, 5, 6]),
         helper.make_tensor_value_info("mask", TensorProto.BOOL, list(mask.shape))],
        [helper.make_tensor_value_info("y", f32, [1, 2, 3, 6])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


@pytest.mark.parametrize("masked_row", [None, 1])
def test_the_onnx_attention_entry_calls_it(masked_row):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 2, 3, 4), np.float32), rng.standard_normal((1, 2, 5, 4),
                                                                             np.float32)
    v = rng.standard_normal((1, 2, 5, 6), np.float32)
    mask = rng.random((3, 5)) > 0.4
    mask[:, 0] = True
    if masked_row is not None:
        mask[masked_row] = False
    model = _onnx_attention(mask)
    feeds = dict(q=q, k=k, v=v, mask=mask)
    got = tdag.run(tdag.from_onnx(model), *(torch.from_numpy(a) for a in feeds.values()))
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    if masked_row is not None:
        assert np.abs(got.numpy()[:, :, masked_row]).max() == 0
