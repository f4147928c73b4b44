"""``tdag.remat`` on AdamW training steps: a budget of 60% of the step's peak, the peak the
new program reaches (predicted by tdag.memory, measured by torch's MemTracker on the reified
module), the flops it adds, and its gradients against the original step's.

    budget     60% of the predicted peak; where that is below what no recomputation frees
               ("fixed": the weights, the optimizer's moments and the batch, or the optimizer
               update's own peak, which holds the old and the new state), the fixed part
               plus 60% of the rest, marked "*"
    before     tdag.memory(step).peak;  after: tdag.memory(tdag.remat(step, budget)).peak
    measured   MemTracker's peak while the remat module runs one step (CPU)
    +flops     the flops the recomputation adds, as a share of the step's
    grad err   the largest difference of the loss, and of the first moments AdamW writes
               (0.1 x the gradient) relative to the largest, remat step against the original

The models: the small configs of tests/support/grad_models.py at a larger batch (gpt2,
resnet, unet-block) and the builders of benchmarks/train_step_speed.py (names ``speed:*``).

    cd /tmp && python /work/main/benchmarks/remat.py
    cd /tmp && python /work/main/benchmarks/remat.py --models gpt2,speed:vit
    cd /tmp && python /work/main/benchmarks/remat.py --models speed:gpt2,speed:bert --repeat 8
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests")]

import tdag  # noqa: E402
import train_step_speed  # noqa: E402
from support.grad_models import MODELS, Loss  # noqa: E402
from support.mem_tracker import measured_peak  # noqa: E402
from tdag.lower.pipeline import lower  # noqa: E402

SHARE = 0.6
SMALL = ("gpt2", "resnet", "unet-block")
BATCH = {"gpt2": (8, 32), "resnet": (8, 3, 32, 32), "unet-block": (8, 8, 16, 16)}


def build(name: str, repeat: int = 1):
    """(wrapped model, args) at the sizes this benchmark runs (a builder's batch of
    benchmarks/train_step_speed.py ``repeat`` times over)."""
    torch.manual_seed(0)
    if name.startswith("speed:"):
        model, args, reduce = train_step_speed.MODELS[name.removeprefix("speed:")](1.0)
        return Loss(model, reduce).eval(), tuple(torch.cat([a] * repeat) for a in args)
    model, args, reduce = MODELS[name]()
    shape = BATCH[name]
    args = (torch.randint(0, 100, shape),) if args[0].dtype == torch.int64 else \
        (torch.randn(shape),)
    return Loss(model, reduce).eval(), args


def budget_of(step: tdag.Program, report, args) -> tuple[int, bool]:
    """(budget, whether it is 60% of the budgetable part rather than of the whole peak)."""
    fixed = fixed_part(step, report, args)
    if SHARE * report.peak >= fixed:
        return int(SHARE * report.peak), False
    return int(fixed + SHARE * (report.peak - fixed)), True


def fixed_part(step: tdag.Program, report, args) -> int:
    """What no recomputation frees: the state (weights, optimizer moments) and the batch,
    or the optimizer update's own peak, where the step holds the old and the new state."""
    phases = {f"{g}:{n.name}": n.origin.phase for g, graph in lower(step).graphs.items()
              for n in graph.nodes}
    update = [v for label, v in report.timeline() if phases.get(label) == "optimizer"]
    state = sum(w.type.nbytes for w in step.state.values()) + \
        sum(a.untyped_storage().nbytes() for a in args)
    return max([state] + update)


def gradient_error(step, smaller, args) -> float:
    """The largest difference of the loss, and of the first moments relative to the largest
    moment (a near-zero gradient compared at the scale of the others)."""
    before, after = tdag.to_torch(step), tdag.to_torch(smaller)
    want, got = before(*args), after(*args)
    loss = float((want - got).abs() / want.abs().clamp_min(1e-30))
    mine = dict(after.named_buffers())
    pairs = [(b, mine[n]) for n, b in before.named_buffers() if ".exp_avg." in n]
    scale = max(float(a.abs().max()) for a, _ in pairs)
    return max([loss] + [float((a - b).abs().max()) / scale for a, b in pairs])


def row(name: str, repeat: int) -> dict:
    model, args = build(name, repeat)
    step = tdag.train_step(tdag.from_torch(model, args), tdag.optim.AdamW())
    report = tdag.memory(step)
    peak = report.peak
    budget, partial = budget_of(step, report, args)
    start = time.perf_counter()
    try:
        smaller = tdag.remat(step, budget)
    except tdag.MemoryBudgetError as e:
        return {"model": name, "before": peak, "budget": budget, "partial": partial,
                "note": f"no plan: smallest {e.smallest}"}
    seconds = time.perf_counter() - start
    flops = tdag.cost(step).total.flops
    return {"model": name, "before": peak, "budget": budget, "partial": partial,
            "after": tdag.memory(smaller).peak,
            "measured": measured_peak(tdag.to_torch(smaller), args),
            "added": smaller.report.added_flops, "share": smaller.report.added_flops / flops,
            "values": len(smaller.report.recomputed), "error": gradient_error(step, smaller, args),
            "seconds": seconds}


def line(r: dict) -> str:
    head = f"{r['model']:<18}{r['before']:>11}{r['budget']:>11}{'*' if r['partial'] else ' '}"
    if "note" in r:
        return head + "  " + r["note"]
    fits = "yes" if r["measured"] <= r["budget"] else "NO"
    return head + (f"{r['after']:>11}{r['measured']:>11} {fits:<5}{r['added']:>13,}"
                   f"{r['share']:>8.1%}{r['values']:>7}{r['error']:>10.1e}{r['seconds']:>7.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    names = list(SMALL) + [f"speed:{n}" for n in train_step_speed.MODELS]
    parser.add_argument("--models", default=",".join(names), help="comma-separated names")
    parser.add_argument("--repeat", type=int, default=1,
                        help="the speed:* builders' batch this many times over")
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    head = (f"{'model':<18}{'before':>11}{'budget':>11} {'after':>11}{'measured':>11} "
            f"{'fits':<5}{'+flops':>13}{'share':>8}{'values':>7}{'grad err':>10}{'plan s':>7}")
    args = parser.parse_args()
    print(head + "\n" + "-" * len(head))
    for name in args.models.split(","):
        print(line(row(name, args.repeat)), flush=True)
    print("* 60% of the whole peak is below what no recomputation frees (the state and the "
          "batch, or the optimizer update's peak): the budget is that plus 60% of the rest")


if __name__ == "__main__":
    main()
