"""The cost of a training step: tdag.cost(tdag.grad(prog)) against torch's own count.

For each model of tests/support/grad_models.py (and GPT-2 under a cross-entropy loss), the
matmul flops of the gradient program's forward and backward phases (``table(by="phase")``)
beside ``torch.utils.flop_counter.FlopCounterMode`` over ``loss.backward()`` (forward
included), and the activations kept for the backward pass: tdag's ``saved_bytes`` beside the
unique storages torch's ``saved_tensors_hooks`` see saved (parameters and inputs left out).

torch's count is taken with one correction: its ``convolution_backward`` formula counts a
grouped convolution's weight gradient ``groups`` times over (the per-group channel product is
lost when the shapes are transposed; pytorch/pytorch#183405), so the weight gradient's share
is divided by ``groups``; the raw count is printed too. Run::

    python benchmarks/training_flops.py [model ...]
"""
from __future__ import annotations

import os
import sys
import warnings

import torch
from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop

import tdag

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))

_raw_conv_backward = conv_backward_flop.__wrapped__  # the formula on shapes


def _conv_backward_per_group(grad_out, x, w, bias, stride, padding, dilation, transposed,
                             output_padding, groups, output_mask, out_shape, **kwargs) -> int:
    """torch's convolution_backward flops with the weight gradient's counted once per group."""
    def part(mask):
        return _raw_conv_backward(grad_out, x, w, bias, stride, padding, dilation, transposed,
                                  output_padding, groups, mask, out_shape, **kwargs)
    return part([output_mask[0], False, False]) + \
        part([False, output_mask[1], False]) // groups


def torch_flops(wrapped, args, per_group: bool = True) -> tuple[int, int]:
    """(forward, forward + backward) matmul flops by FlopCounterMode; ``per_group`` corrects
    grouped convolutions' weight gradients (see the module docstring)."""
    fix = {torch.ops.aten.convolution_backward: _conv_backward_per_group} if per_group else {}
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=fix) as forward:
        wrapped(*args)
    with FlopCounterMode(display=False, custom_mapping=fix) as step:
        wrapped(*args).backward()
    return forward.get_total_flops(), step.get_total_flops()


def torch_saved_bytes(wrapped, args) -> int:
    """Bytes of the unique storages autograd saves for the backward pass, less the parameters'
    and the inputs' (already in memory)."""
    kept = {t.untyped_storage().data_ptr() for t in (*wrapped.parameters(), *args)}
    storages: dict = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in kept:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        wrapped(*args)
    return sum(storages.values())


def tdag_figures(wrapped, args) -> dict:
    """Matmul flops per phase and saved bytes of tdag.cost(tdag.grad(prog))."""
    report = tdag.cost(tdag.grad(tdag.from_torch(wrapped, args)))
    phases = {k: f.matmul_flops for k, f in report.per_phase.items()}
    return {"forward": phases.get("forward", 0), "backward": phases.get("backward", 0),
            "total": report.matmul_flops, "saved": report.saved_bytes}


def models() -> dict:
    """name -> a maker of (loss module, args)."""
    from support.grad_models import MODELS, Loss, gpt2_cross_entropy

    def wrap(make):
        model, args, reduce = make()
        return Loss(model, reduce), args
    out = {"gpt2-cross-entropy": gpt2_cross_entropy}
    out.update({name: (lambda make=make: wrap(make)) for name, make in MODELS.items()})
    return out


def main(names: list[str]) -> None:
    warnings.filterwarnings("ignore")
    makers = models()
    head = (f"{'model':<19}{'tdag fwd':>11}{'tdag bwd':>11}{'bwd/fwd':>8}{'torch fwd':>11}"
            f"{'torch f+b':>11}{'(raw)':>11}{'diff':>8}{'saved tdag':>12}{'saved torch':>12}")
    print(head + "\n" + "-" * len(head))
    ratios = {}
    for name in names or list(makers):
        torch.manual_seed(0)
        wrapped, args = makers[name]()
        wrapped.eval()
        ours = tdag_figures(wrapped, args)
        forward, total = torch_flops(wrapped, args)
        raw = torch_flops(wrapped, args, per_group=False)[1]
        ratios[name] = ours["backward"] / ours["forward"]
        print(f"{name:<19}{ours['forward']:>11,}{ours['backward']:>11,}{ratios[name]:>8.3f}"
              f"{forward:>11,}{total:>11,}{raw:>11,}{ours['total'] - total:>8,}"
              f"{ours['saved']:>12,}{torch_saved_bytes(wrapped, args):>12,}", flush=True)
    print("\nbackward/forward matmul flops: " +
          ", ".join(f"{n} {r:.2f}" for n, r in ratios.items()) +
          ".\nBelow 2 where the first layer's input needs no gradient (token ids, an image): "
          "its input gradient is not computed, by torch either. A nonzero diff: a layer the "
          "loss does not read (BERT's and ViT's pooler), which torch runs and tdag drops.")


if __name__ == "__main__":
    main(sys.argv[1:])
