"""Gradient programs of transformers lower their softmax, GELU, layer norm and RMS norm input
gradients to softmax_backward, gelu_backward, layer_norm_backward and rms_norm_backward
(tdag/lower/backward.py), and still equal torch.autograd through to_torch and onnxruntime
(1e-4 relative to the largest gradient, float32)."""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag.ir.op import Op
from tdag.lower.pipeline import lower

pytest.importorskip("transformers")
from support.grad_models import assert_lowered_gradients  # noqa: E402

# one softmax and one GELU per layer, two layers (GPT-2's gelu_new a formula of its own:
# a pow, not the composition of ops.gelu); a layer norm before each block and at the end
# (GPT-2), or after the embeddings and each block (BERT): the embeddings' has no residual
KERNELS = {"gpt2": {Op.softmax_backward: 2, Op.gelu_backward: 2, Op.layer_norm_backward: 5},
           "bert": {Op.softmax_backward: 2, Op.gelu_backward: 2, Op.layer_norm_backward: 5},
           # an RMS norm before each block and at the end; none of them a layer norm's
           "llama": {Op.softmax_backward: 2, Op.rms_norm_backward: 5, Op.layer_norm_backward: 0},
           "t5-encoder": {Op.softmax_backward: 2, Op.rms_norm_backward: 5}}


@pytest.mark.parametrize("name", list(KERNELS))
def test_transformer_gradients_use_backward_kernels(name):
    assert_lowered_gradients(name, KERNELS[name])


class _ResidualNorm(torch.nn.Module):
    """A layer norm over two trailing axes on a residual stream: its input gradient sums
    the residual's contribution between the norm's own two terms."""

    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(6, 6)
        self.norm = torch.nn.LayerNorm((5, 6), eps=1e-3)

    def forward(self, x):
        h = self.inp(x)
        return (h + self.norm(h).tanh()).pow(2).mean()


def test_layer_norm_gradient_inside_a_residual_sum():
    torch.manual_seed(0)
    model, x = _ResidualNorm(), torch.randn(3, 5, 6)
    g = tdag.grad(tdag.from_torch(model, (x,)))
    norms = [n for n in lower(g).graph.nodes if n.op is Op.layer_norm_backward]
    assert [(n.spec.count, n.spec.eps) for n in norms] == [(2, 1e-3)]
    model(x).backward()
    for n, got in zip(g.wrt, tdag.to_torch(g)(x)[1:]):
        torch.testing.assert_close(got, dict(model.named_parameters())[n].grad,
                                   rtol=1e-4, atol=1e-6)


class _SumsOfPrefixes(torch.nn.Module):
    """An inference program of one float add per shape, ``count`` shapes."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count

    def forward(self, x):
        return torch.stack([(x[:n] + 1.0).sum() for n in range(4, 4 + self.count)])


def test_an_inference_program_builds_no_gradient_template_per_shape():
    """The gradient rules are tried at every float add. A program without their chains'
    ops (an inference program) refuses them from one template per pattern of sizes, not
    one per shape: DenseNet-121's 3,500 adds of a hundred shapes took 33 s to lower, then
    2.3 s. Twice the shapes build no more templates."""
    from tdag.lower import backward, match
    built = []
    for count in (20, 40):
        prog = tdag.from_torch(_SumsOfPrefixes(count), (torch.randn(64, 8),))
        for cached in (match.kernel_template, backward._template_kinds, backward._template_ops):
            cached.cache_clear()
        lower(prog)
        built.append(match.kernel_template.cache_info().misses)
        assert backward._template_kinds.cache_info().misses == 0
    assert built[0] == built[1]
