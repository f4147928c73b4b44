"""tdag.memory against torch's own count: MemTracker's peak of live storages (parameters,
buffers and inputs included) while the reified module runs, within 5%; and the report's parts."""
from __future__ import annotations

import json

import pytest
import torch

import tdag
from tdag import ops
from tdag.ir.symbols import symbol
from support.grad_models import MODELS, Loss
from support.mem_tracker import measured_peak


@pytest.mark.parametrize("name", ["gpt2", "bert", "resnet", "unet-block", "convnext"])
@pytest.mark.parametrize("training", [False, True])
def test_peak_matches_memtracker(name, training):
    torch.manual_seed(0)
    model, args, reduce = MODELS[name]()
    prog = tdag.from_torch(Loss(model, reduce).eval(), args)
    if training:
        prog = tdag.train_step(prog, tdag.optim.AdamW())
    predicted = tdag.memory(prog).peak
    assert abs(predicted / measured_peak(tdag.to_torch(prog), args) - 1) <= 0.05


def test_training_split():
    torch.manual_seed(0)
    model, args, reduce = MODELS["gpt2"]()
    step = tdag.train_step(tdag.from_torch(Loss(model, reduce).eval(), args), tdag.optim.AdamW())
    report = tdag.memory(step)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert params <= report.by_kind["weights"] < params + 1024  # and a few small consts
    assert report.by_kind["optimizer"] >= 2 * params  # the moments, at least
    assert sum(report.by_kind.values()) == report.peak
    assert report.timeline()[-1][1] <= report.peak == max(v for _, v in report.timeline())
    # the peak by phase: the run's peak is its phase's, and each phase's kinds add up
    assert set(report.phases) == {"forward", "backward", "optimizer"}
    assert report.phases[report.peak_phase].peak == report.peak
    assert report.peak == max(p.peak for p in report.phases.values())
    for phase in report.phases.values():
        assert sum(phase.by_kind.values()) == phase.peak
    assert "saved" in report.phases["forward"].by_kind  # kept for the backward


def _mlp():
    return tdag.trace(lambda x, w: ops.relu(x @ w), tdag.TensorSpec(("b", 256)),
                      tdag.TensorSpec((256, 256)))


def test_symbolic_peak_is_a_formula_in_the_sizes():
    report = tdag.memory(_mlp())
    assert str(report.peak) == "2048*b + 262144"  # x and the product (the relu written over it); w
    assert tdag.memory(_mlp(), b=8).peak == report.peak.subs(symbol("b"), 8) == 2048 * 8 + 262144


def test_a_peak_in_many_sizes_data_decides():
    """Eight sizes data decides (the rows each of eight experts takes): the peak compares
    the events at the grid's diagonal and each size alone at either end (19 points, where
    the whole grid's 3^8 made it minutes), and is still a Max of the candidates."""
    from tdag.refine.memory.report import _probes  # noqa: PLC0415

    def fn(x):
        picked = [ops.masked_select(x, ops.gt(x, k / 8)) for k in range(8)]
        return [ops.exp(p) for p in picked]

    prog = tdag.trace(fn, tdag.TensorSpec((64,)))
    assert len(list(_probes(8))) == 3 + 2 * 8 and len(list(_probes(4))) == 3 ** 4
    peak = tdag.memory(prog).peak
    assert len(peak.free_symbols) == 8  # in the counts, not a number made up for them
    x = torch.linspace(0, 1, 64)
    counts = {s: int((x > k / 8).sum()) for k, s in enumerate(sorted(
        peak.free_symbols, key=lambda s: int(str(s).lstrip("nz"))))}
    assert int(peak.subs(counts)) >= 64 * 4


def test_a_view_is_free_and_a_reshape_of_a_permute_copies():
    def fn(x):
        view = ops.rearrange(x, "a b -> (a b)")            # a view of x
        copy = ops.rearrange(x, "a b -> (b a)")            # permute then flatten: a copy
        return view * 2.0, copy * 2.0
    prog = tdag.trace(fn, tdag.TensorSpec((64, 32)))
    module = tdag.to_torch(prog)
    x = torch.randn(64, 32)
    report = tdag.memory(prog)
    assert report.peak == measured_peak(module, (x,))
    assert {live.name for live in report.live_at_peak} >= {"x"}


def test_report_forms():
    report = tdag.memory(_mlp(), b=4)
    data = json.loads(report.to_json())
    assert data["schema"] == "tdag.memory/1" and data["peak"] == report.peak
    assert "by kind at the peak" in report.table()
    assert len(data["timeline"]) == len(report.timeline())
