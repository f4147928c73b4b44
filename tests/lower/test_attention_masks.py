"""A constant attention mask that hides no key leaves the kernel; any other mask stays.

transformers' ViT builds ``where(all-true, 0, -max)`` and BERT adds a constant of zeros when
no padding is given; eager passes no mask. Each case captures a torch function, lowers it,
checks the attention kernel's operands, and compares run, to_torch and to_onnx with eager.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tdag
import tdag.lower
from tdag.ir.op import Op
from support.targets import capture, on_targets

B, H, L, E = 2, 2, 48, 8  # masks of B * L * L > 4096 elements: too big to fold
LOW = torch.finfo(torch.float32).min


def _where_true(q, k, v):
    """ViT's: every position kept, made an additive mask by a where."""
    keep = torch.ones(B, 1, L, 1, dtype=torch.bool).expand(B, 1, L, L)
    mask = torch.where(keep, torch.tensor(0.0), torch.tensor(LOW))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _zeros_added(q, k, v):
    """BERT's eager attention: the scores plus a constant of zeros, then softmax."""
    scores = q @ k.transpose(-1, -2) * E ** -0.5 + torch.zeros(B, 1, L, L)
    return torch.softmax(scores, -1) @ v


def _all_true(q, k, v):
    return F.scaled_dot_product_attention(q, k, v,
                                          attn_mask=torch.ones(L, L, dtype=torch.bool))


def _constant_hides_one(q, k, v):
    """A constant that hides the last key from every query: it stays."""
    mask = torch.zeros(B, 1, L, L)
    mask[..., -1] = LOW
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _input_mask(q, k, v, m):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=m)


CASES = {  # name -> (fn, extra inputs, whether the kernel keeps a mask)
    "where-all-true": (_where_true, (), False),
    "zeros-added": (_zeros_added, (), False),
    "bool-all-true": (_all_true, (), False),
    "constant-hiding-a-key": (_constant_hides_one, (), True),
    "input-bool": (_input_mask, (torch.rand(B, 1, L, L) > 0.3,), True),
    "input-float": (_input_mask, (torch.randn(B, 1, L, L),), True),
}


@pytest.mark.parametrize("name", CASES)
def test_mask_that_hides_nothing_leaves_the_kernel(name):
    fn, extra, keeps = CASES[name]
    torch.manual_seed(0)
    args = tuple(torch.randn(B, H, L, E) for _ in range(3)) + extra
    low = tdag.lower.lower(capture(fn, args))
    tdag.verify(low)
    kernels = [n for n in low.graph.nodes if n.op is Op.attention]
    assert len(kernels) == 1
    assert (len(kernels[0].inputs) == 4) is keeps
    with torch.no_grad():
        want = fn(*args)
    for target, (got,) in on_targets(low, args, ("run", "torch", "onnx")).items():
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item(),
                                   msg=lambda m, t=target: f"{name} on {t}: {m}")
