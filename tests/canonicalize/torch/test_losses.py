"""from_torch on ``F.cross_entropy`` (``aten.cross_entropy_loss``) and ``F.nll_loss``
(``aten.nll_loss_nd``), mapped whole: class-index targets with class weights,
``ignore_index`` and label smoothing under each reduction, class-probability targets, one
sample (no batch axis) and spatial inputs. Each case runs through torch.export,
tdag.from_torch and tdag.run on seeded random inputs and is compared with eager
(rtol 1e-5, atol 1e-6; NaN where eager gives NaN).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tdag
from tdag.canonicalize import from_torch

from support.torch_models import Fn

REDUCTIONS = ["mean", "sum", "none"]


def check(fn, *args):
    module = Fn(fn).eval()
    prog = from_torch(module, args)
    ops = {n.origin.op for n in prog.graph.nodes}
    assert ops & {"aten.cross_entropy_loss", "aten.nll_loss_nd"}  # mapped, not decomposed
    want, got = module(*args), tdag.run(prog, *args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


def _logits(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)) * 3


def _targets(classes, *shape, ignored=2):
    t = torch.randint(0, classes, shape, generator=torch.Generator().manual_seed(1))
    t.view(-1)[::3] = ignored  # every third target is the ignored class
    return t


CROSS_ENTROPY = {
    "plain": {},
    "ignore_index": {"ignore_index": 2},
    "weight": {"weight": True},
    "weight_ignore": {"weight": True, "ignore_index": 2},
    "smoothing": {"label_smoothing": 0.2},
    "smoothing_weight_ignore": {"label_smoothing": 0.15, "weight": True, "ignore_index": 2},
}


def _cross_entropy(options: dict, reduction: str):
    options = dict(options)
    if options.pop("weight", False):
        return lambda x, t, w: F.cross_entropy(x, t, w, reduction=reduction, **options)
    return lambda x, t, w: F.cross_entropy(x, t, reduction=reduction, **options) + 0 * w.sum()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", CROSS_ENTROPY)
def test_cross_entropy_with_class_targets(name, reduction):
    check(_cross_entropy(CROSS_ENTROPY[name], reduction), _logits(6, 5), _targets(5, 6),
          torch.rand(5) + 0.5)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_cross_entropy_over_spatial_positions(reduction):
    fn = _cross_entropy({"weight": True, "ignore_index": 2, "label_smoothing": 0.1}, reduction)
    check(fn, _logits(2, 4, 3, 5), _targets(4, 2, 3, 5), torch.rand(4) + 0.5)


@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.3}])
def test_cross_entropy_of_one_sample(options):
    check(lambda x, t: F.cross_entropy(x, t, **options), _logits(7), torch.tensor(4))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("options", [{}, {"weight": True, "label_smoothing": 0.2}],
                         ids=["plain", "weight_smoothing"])
def test_cross_entropy_with_class_probabilities(options, reduction):
    probabilities = _logits(6, 5, 2).softmax(1)
    check(_cross_entropy(options, reduction), _logits(6, 5, 2), probabilities,
          torch.rand(5) + 0.5)


def test_cross_entropy_of_all_ignored_targets_is_nan():
    check(lambda x, t: F.cross_entropy(x, t, ignore_index=1), _logits(3, 4),
          torch.ones(3, dtype=torch.long))


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss(reduction):
    check(lambda x, t, w: F.nll_loss(x.log_softmax(1), t, w, ignore_index=2,
                                     reduction=reduction),
          _logits(6, 5, 3), _targets(5, 6, 3), torch.rand(5) + 0.5)


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x, t):
        return F.cross_entropy(self.fc(x), t, ignore_index=2, label_smoothing=0.1)


def test_cross_entropy_differentiates():
    """tdag.grad of the mapped loss: the loss and the parameters' gradients match
    autograd's."""
    torch.manual_seed(0)
    model, x, t = Classifier(), _logits(6, 4), _targets(5, 6)
    grad = tdag.grad(from_torch(model, (x, t)))
    got = tdag.run(grad, x, t)
    loss = model(x, t)
    loss.backward()
    torch.testing.assert_close(got[0], loss.detach(), rtol=1e-5, atol=1e-6)
    params = dict(model.named_parameters())
    for name, value in zip(grad.wrt, got[1:]):
        torch.testing.assert_close(value, params[name].grad, rtol=1e-5, atol=1e-6)
