"""Gradient programs of transformers lower their softmax and GELU input gradients to
softmax_backward and gelu_backward (tdag/lower/backward.py), and still equal torch.autograd
through to_torch and onnxruntime (1e-4 relative to the largest gradient, float32)."""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag.ir.op import Op
from tdag.lower.pipeline import lower

pytest.importorskip("transformers")
from support.grad_models import MODELS, Loss, onnx_outputs  # noqa: E402

RELATIVE = 1e-4



# one softmax and one GELU per layer, two layers; GPT-2's gelu_new is a formula of its own
# (a pow, not the composition of ops.gelu), whose derivative stays a chain
KERNELS = {"gpt2": {Op.softmax_backward: 2}, "bert": {Op.softmax_backward: 2,
                                                        Op.gelu_backward: 2}}


@pytest.mark.parametrize("name", list(KERNELS))
def test_transformer_gradients_use_backward_kernels(name):
    torch.manual_seed(0)
    model, args, reduce = MODELS[name]()
    wrapped = Loss(model, reduce).eval()
    g = tdag.grad(tdag.from_torch(wrapped, args))
    ops = [n.op for n in lower(g).graph.nodes]
    assert {op: ops.count(op) for op in KERNELS[name]} == KERNELS[name]
    wrapped(*args).backward()
    params = dict(wrapped.named_parameters())
    scale = max(p.grad.abs().max().item() for p in params.values() if p.grad is not None)
    for outs in (tdag.to_torch(g)(*args), onnx_outputs(g, args)):
        for n, got in zip(g.wrt, outs[1:]):
            want = params[n].grad if params[n].grad is not None else torch.zeros(got.shape)
            err = (torch.as_tensor(got) - want).abs().max().item()
            assert err <= RELATIVE * scale, f"{name}: {n} off by {err:.2e} (scale {scale:.2e})"
