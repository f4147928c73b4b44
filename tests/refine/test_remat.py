"""tdag.remat: a training step within 60% of its peak, measured by torch's MemTracker on the
reified module, with the original's loss and gradients (AdamW's first moments, 0.1 x the
gradient, 1e-5 relative); the copies survive lowering and run late; a budget below the
smallest reachable peak raises MemoryBudgetError naming it; a plan replays its trials'
memory and lowers the program it found once."""
from __future__ import annotations

import pytest
import torch
import transformers as T

import tdag
from tdag import ops
from tdag.ir.types import REMAT
from tdag.lower.pipeline import lower
from tdag.refine.memory import memory_of
from tdag.refine.memory.remat import Target
from tdag.refine.memory.remat import remat as plan
from tdag.reify.torch.codegen import liveness
from support.grad_models import SMALL, Loss, UNetBlock
from support.mem_tracker import measured_peak


def _gpt2():
    model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100,
                                           n_positions=32, **SMALL))
    return Loss(model, lambda o: o.logits.logsumexp(-1).mean()), (torch.randint(0, 100, (8, 32)),)


def _unet():
    return Loss(UNetBlock(), lambda y: y.pow(2).mean()), (torch.randn(8, 8, 16, 16),)


def _same(want: list, got: list) -> None:
    """Equal within 1e-5 of the largest value (a near-zero gradient is compared at the
    scale of the others, as the gradient tests compare)."""
    scale = max(float(w.abs().max()) for w in want)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-5 * scale)


@pytest.mark.parametrize("build", [_gpt2, _unet], ids=["gpt2", "unet-block"])
def test_a_step_fits_60_percent_of_its_peak(build):
    torch.manual_seed(0)
    model, args = build()
    step = tdag.train_step(tdag.from_torch(model.eval(), args), tdag.optim.AdamW())
    peak = tdag.memory(step).peak
    budget = int(0.6 * peak)
    assert budget > sum(w.type.nbytes for w in step.state.values())  # activations dominate
    smaller = tdag.remat(step, budget)
    report = smaller.report
    assert tdag.memory(smaller).peak == report.peak <= budget < report.peak_before == peak
    assert measured_peak(tdag.to_torch(smaller), args) <= budget
    assert report.added_flops == tdag.cost(smaller).per_phase["recompute"].flops > 0
    before, after = tdag.to_torch(step), tdag.to_torch(smaller)
    _same([before(*args)], [after(*args)])
    moments = dict(after.named_buffers())
    names = [n for n, _ in before.named_buffers() if ".exp_avg." in n]  # 0.1 x the gradient
    _same([before.get_buffer(n) for n in names], [moments[n] for n in names])


def _mlp_grad():
    """The gradient program of four tanh layers: each layer's output is kept for its
    backward, or recomputed from the layer before."""
    torch.manual_seed(0)
    weights = [torch.randn(64, 64) / 8 for _ in range(4)]

    def fn(x):
        for i, w in enumerate(weights):
            x = ops.tanh(x @ ops.param(f"w{i}", w))
        return ops.sum(x)
    return tdag.grad(tdag.trace(fn, tdag.TensorSpec((512, 64))))


def test_gradients_equal_and_copies_run_late():
    g = _mlp_grad()
    smaller = tdag.remat(g, int(0.8 * tdag.memory(g).peak))
    x = torch.randn(512, 64)
    _same(list(tdag.to_torch(g)(x)), list(tdag.to_torch(smaller)(x)))
    nodes = lower(smaller).graph.nodes  # what to_torch runs: lowering keeps the copies
    copies = [i for i, n in enumerate(nodes) if n.origin.op.startswith(REMAT)]
    assert len(copies) == sum(n.origin.op.startswith(REMAT) for n in smaller.graph.nodes) > 0
    first_backward = min(i for i, n in enumerate(nodes) if n.origin.phase == "backward")
    assert min(copies) > first_backward
    assert smaller.report.recomputed and all(r.startswith(f"{next(iter(g.graphs))}:")
                                             for r in smaller.report.recomputed)


def test_a_plan_replays_its_trials_and_lowers_once():
    """Each trial replays the memory of the lowered program with its copies, not lowered
    again; the plan found is lowered once, and is the one that judging every trial lowered
    finds (the values, the peak, the flops)."""
    g = lower(_mlp_grad())
    budget = int(0.8 * memory_of(g, liveness).peak)
    lowered = []

    def counting(prog):
        lowered.append(prog)
        return lower(prog)
    fast = plan(g, budget, Target(counting, lambda p: memory_of(p, liveness).peak), {})
    assert len(lowered) == 1
    slow = plan(g, budget, Target(lower, lambda p: memory_of(lower(p), liveness).peak), {})
    assert fast.report == slow.report and fast.report.peak <= budget


def test_a_budget_below_the_smallest_peak_names_it():
    g = _mlp_grad()
    with pytest.raises(tdag.MemoryBudgetError, match="smallest peak reachable") as info:
        tdag.remat(g, 1)
    smallest = info.value.smallest
    assert str(smallest) in str(info.value)
    assert tdag.memory(tdag.remat(g, smallest)).peak == smallest


def test_a_budget_the_program_fits_changes_nothing():
    g = _mlp_grad()
    peak = tdag.memory(g).peak
    same = tdag.remat(g, peak)
    assert same.report.added_flops == 0 and same.report.recomputed == ()
    assert tdag.memory(same).peak == peak


def test_free_sizes_must_be_bound():
    prog = tdag.trace(lambda x: ops.sum(ops.tanh(x)), tdag.TensorSpec(("b", 8)))
    with pytest.raises(tdag.ShapeError, match="bind the sizes b"):
        tdag.remat(tdag.grad(prog, wrt=[prog.inputs[0].name]), 1000)
