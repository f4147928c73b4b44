"""The cost of a training step: the matmul flops of tdag.cost(tdag.grad(prog)) equal
torch.utils.flop_counter.FlopCounterMode's count of ``loss.backward()`` (forward included) on
the same model, and ``saved_bytes`` counts the forward values the backward reads.

torch's count corrects its grouped-convolution weight gradient (counted ``groups`` times
over; see benchmarks/training_flops.py, which prints the table for every model).
"""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag import ops

pytest.importorskip("transformers")
from support.grad_models import MODELS, Loss, gpt2_cross_entropy  # noqa: E402
from training_flops import tdag_figures, torch_flops  # noqa: E402


class DepthwiseConv(torch.nn.Module):
    """A depthwise conv, whose input gradient is an overlap-add (fold) of products."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(4, 8, 1)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        return self.depthwise(self.stem(x)).pow(2).mean()


def _models():
    def wrap(name):
        model, args, reduce = MODELS[name]()
        return Loss(model, reduce), args
    return {"llama": lambda: wrap("llama"),
            "unet-block": lambda: wrap("unet-block"),
            "depthwise-conv": lambda: (DepthwiseConv(), (torch.randn(2, 4, 8, 8),))}


@pytest.mark.parametrize("name", list(_models()))
def test_matmul_flops_equal_flop_counter(name):
    torch.manual_seed(0)
    wrapped, args = _models()[name]()
    wrapped.eval()
    ours = tdag_figures(wrapped, args)
    forward, total = torch_flops(wrapped, args)
    assert (ours["forward"], ours["total"]) == (forward, total), name
    assert ours["forward"] + ours["backward"] == ours["total"]


def test_gpt2_forward_phase_is_the_forward_program():
    """The gradient program's forward counts what the plain forward does: the attention
    kernel is not formed where the backward reads the probabilities (it would compute the
    scores a second time: 21,020,672 flops against torch's 20,889,600)."""
    torch.manual_seed(0)
    wrapped, args = gpt2_cross_entropy()
    prog = tdag.from_torch(wrapped.eval(), args)
    report = tdag.cost(tdag.grad(prog))
    assert report.per_phase["forward"].matmul_flops == tdag.cost(prog).matmul_flops == 6_963_200
    assert torch_flops(wrapped, args) == (6_963_200, report.matmul_flops)


def test_saved_bytes_by_hand():
    """sum(tanh(x @ w)): the backward reads tanh's output (its derivative 1 - y*y); x and w
    are inputs, already in memory; the matmul's output is read by nothing backward."""
    prog = tdag.trace(lambda x, w: ops.sum(ops.tanh(ops.matmul(x, w))), tdag.TensorSpec((4, 8)),
                      tdag.TensorSpec((8, 16)))
    report = tdag.cost(tdag.grad(prog, wrt=[v.name for v in prog.inputs]))
    assert report.saved_bytes == 4 * 16 * 4
    assert report.per_phase["forward"].saved_bytes == 4 * 16 * 4
    assert report.per_phase["backward"].saved_bytes == 0
    assert "saved for backward" in report.table(by="phase")
    assert report.to_dict(by="phase")["total"]["saved_bytes"] == 256
    assert tdag.cost(prog).saved_bytes == 0


def test_saved_bytes_through_a_view():
    """A backward read through a reshape keeps the tensor the forward computed, once."""
    def f(x):
        y = ops.exp(x)
        return ops.sum(ops.reshape(y, (8, 4)) * ops.reshape(y, (4, 8)).reshape((8, 4)))
    prog = tdag.trace(f, tdag.TensorSpec((4, 8)))
    report = tdag.cost(tdag.grad(prog, wrt=[prog.inputs[0].name]), lowered=False)
    assert report.saved_bytes == 4 * 8 * 4


def test_a_loop_program_counts_its_forward_recompute_and_what_it_keeps():
    """An LSTM tagger (a Loop over the cell): the forward phase holds one LSTM pass and the
    head, each reverse trip recomputes its trip once (the ``recompute`` phase; the rerun of
    the forward trip that nothing reads is dropped), the backward is twice the forward, and
    the values kept between the passes are the stacked hidden and cell states and the values
    the forward steps hand the backward steps, not a copy of the input sequence per trip."""
    from support.grad_models import Tagger
    torch.manual_seed(0)
    batch, steps, inputs, hidden, tags = 2, 8, 8, 16, 5
    prog = tdag.from_torch(Tagger(), (torch.randint(0, 20, (batch, steps)),
                                      torch.randint(0, tags, (batch, steps))))
    report = tdag.cost(tdag.grad(prog))
    lstm = steps * 2 * batch * 4 * hidden * (inputs + hidden)
    head = 2 * batch * steps * hidden * tags
    phases = {ph: fig.matmul_flops for ph, fig in report.per_phase.items()}
    assert phases == {"forward": lstm + head, "recompute": lstm + head,
                      "backward": 2 * (lstm + head)}
    f32 = 4
    stacks = 2 * steps * batch * hidden * f32           # h and c before every trip
    handed = (batch * steps * hidden                     # the LSTM's output sequence
              + 2 * batch * steps * inputs               # the embedded sequence, twice named
              + 2 * batch * hidden) * f32 + f32          # the last h and c; the loss
    assert report.saved_bytes == stacks + handed < stacks + steps * batch * steps * inputs * f32
