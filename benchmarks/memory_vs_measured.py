"""tdag.memory's predicted peak against torch's measured one, on the reified module.

    measured   MemTracker's peak "Total": every storage live while the module runs
               (parameters, buffers, inputs, activations; CPU), and torch.profiler's
               (profile_memory=True) peak of the allocations made during the call, plus the
               storages that existed before it
    predicted  tdag.memory(prog).peak; ratio = predicted / MemTracker

Beside them, the usual estimates from the parameter count N (fp32): accelerate's (weights
4N; training 4x that, its Adam rule of thumb), DeepSpeed's params + grads + AdamW moments
(16N, no activations), and Korthikanti et al.'s activations 34sbh + 5as^2b per transformer
layer (bytes at 16-bit, so the fp32 figure is doubled) where it applies.

    cd /tmp && python /work/main/benchmarks/memory_vs_measured.py
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import tdag  # noqa: E402
from support.grad_models import MODELS, Loss, Tagger  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

NAMES = ("gpt2", "llama", "bert", "vit", "resnet", "convnext", "tagger", "unet-block")


def build(name: str):
    """(wrapped model, args, transformer config or None) for one model at batch 2."""
    torch.manual_seed(0)
    if name == "tagger":
        return Tagger(), (torch.randint(0, 20, (2, 6)), torch.randint(0, 5, (2, 6))), None
    model, args, reduce = MODELS[name]()
    return Loss(model, reduce).eval(), args, getattr(model, "config", None)


def tracker_peak(module, args) -> int:
    tracker = MemTracker()
    tracker.track_external(module, *args)
    with tracker, torch.no_grad():
        module(*args)
    return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def profiler_peak(module, args) -> int:
    """The running sum of the profiler's allocation events, on top of what already lives."""
    before = sum(t.untyped_storage().nbytes() for t in list(module.state_dict().values()) +
                 list(args))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof, torch.no_grad():
        module(*args)
    events = sorted((e for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]"), key=lambda e: e.start_ns())
    live = top = 0
    for e in events:
        live += e.nbytes()
        top = max(top, live)
    return before + top


def korthikanti(config, args) -> int | None:
    """34sbh + 5as^2b bytes per layer (16-bit), doubled for fp32; transformers only."""
    if config is None or not hasattr(config, "num_attention_heads") or args[0].dim() != 2:
        return None
    b, s = args[0].shape
    h, a = config.hidden_size, config.num_attention_heads
    return 2 * config.num_hidden_layers * (34 * s * b * h + 5 * a * s * s * b)


def rows(name: str):
    model, args, config = build(name)
    n = sum(p.numel() for p in model.parameters())
    for batch in (2, 4):
        batch_args = tuple(torch.cat([a] * (batch // 2)) for a in args)
        prog = tdag.from_torch(model, batch_args)
        for mode in ("inference", "training"):
            p = prog if mode == "inference" else tdag.train_step(prog, tdag.optim.AdamW())
            predicted = tdag.memory(p).peak
            try:
                module = tdag.to_torch(p)
                measured = tracker_peak(module, batch_args)
                profiled = profiler_peak(tdag.to_torch(p), batch_args)
            except Exception as e:  # noqa: BLE001  (report the row, keep the table going)
                yield (name, batch, mode, predicted, None, None, f"to_torch fails: {e}"[:60], n,
                       None)
                continue
            kort = korthikanti(config, batch_args) if mode == "training" else None
            yield name, batch, mode, predicted, measured, profiled, "", n, kort


def main() -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    head = (f"{'model':<11}{'b':>3} {'mode':<10}{'predicted':>11}{'MemTracker':>11}{'ratio':>7}"
            f"{'profiler':>10}{'accel.':>9}{'DeepSpeed':>10}{'Korth.':>9}")
    print(head + "\n" + "-" * len(head))
    for name in sys.argv[1:] or NAMES:
        for model, b, mode, pred, meas, prof, note, n, kort in rows(name):
            accel = 4 * n if mode == "inference" else 16 * n
            deep = "-" if mode == "inference" else f"{16 * n}"
            if meas is None:
                print(f"{model:<11}{b:>3} {mode:<10}{pred:>11}  {note}")
                continue
            print(f"{model:<11}{b:>3} {mode:<10}{pred:>11}{meas:>11}{pred / meas:>7.3f}"
                  f"{prof:>10}{accel:>9}{deep:>10}{kort if kort else '-':>9}")


if __name__ == "__main__":
    main()
