"""The einsum plan (tdag/lower/kernels/einsum_plan.py) orders a product's operands so that it
needs no permute where one order does: a weight gradient ``dy^T x`` comes out contiguous,
and the optimizer's elementwise update of it runs at full speed. The product still equals
torch.einsum through to_torch and onnxruntime."""
from __future__ import annotations

import onnxruntime as ort
import pytest
import torch

import tdag
from tdag import ops
from tdag.lower.kernels.einsum_plan import plan_einsum

# (equation, operand shapes): a weight gradient in either operand order, a transposed linear
CASES = [("kc,kd->dc", ((6, 3), (6, 4))), ("kd,kc->dc", ((6, 4), (6, 3))),
         ("bkc,bkd->bdc", ((2, 6, 3), (2, 6, 4))), ("mk,nk->mn", ((3, 5), (4, 5)))]


@pytest.mark.parametrize("equation,shapes", CASES)
def test_plan_needs_no_permute_and_equals_einsum(equation, shapes):
    plan = plan_einsum(equation)
    assert plan.kind != "einsum" and plan.out_perm is None
    args = [torch.randn(s) for s in shapes]
    prog = tdag.trace(lambda a, b: ops.einsum(equation, a, b),
                      *(tdag.TensorSpec(s, "float32") for s in shapes))
    want = torch.einsum(equation, *args)
    torch.testing.assert_close(tdag.to_torch(prog)(*args), want)
    sess = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString())
    feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    torch.testing.assert_close(torch.from_numpy(sess.run(None, feed)[0]), want)
