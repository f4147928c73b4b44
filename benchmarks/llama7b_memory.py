"""The memory a Llama-2-7B-shaped model needs, from liveness, on the meta device (no weights
allocated): inference at sequence 2048, a decode step against a 4,096-token static cache
(prefill beside it), and an AdamW training step split by kind (weights, gradients,
optimizer state, activations kept for the backward pass), with the peak of each phase
(forward, backward, optimizer). Each figure is ``tdag.memory`` of the program
``tdag.to_torch`` would run; each capture (torch.export) and each analysis is timed apart.

    python benchmarks/llama7b_memory.py                 # 32 layers, bf16
    python benchmarks/llama7b_memory.py --layers 2 --seq 256 --cache 512
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tdag  # noqa: E402
from tdag.lower.pipeline import lower  # noqa: E402
from tdag.refine.memory import memory_of  # noqa: E402
from tdag.reify.torch.codegen import liveness  # noqa: E402
from llama7b_cost import LLAMA2_7B  # noqa: E402

GiB = 2 ** 30


class WithLoss(torch.nn.Module):
    """The causal LM's next-token cross-entropy, a scalar every parameter reaches, written as
    the mean negative log-softmax at the labels: ``F.cross_entropy`` exports as
    ``aten.cross_entropy_loss``, which tdag's ATen table lacks, and decomposing it re-traces
    the whole exported program (~80 s of the 32-layer capture)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        logp = self.model(ids).logits.float().log_softmax(-1)
        return -logp.gather(-1, labels.unsqueeze(-1)).mean()


def meta_llama(layers: int, cache: int, dtype: torch.dtype) -> LlamaForCausalLM:
    config = LlamaConfig(**{**LLAMA2_7B, "num_hidden_layers": layers}, use_cache=False,
                         max_position_embeddings=cache, attn_implementation="sdpa")
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(dtype).eval()


def programs(layers: int, seq: int, cache: int, dtype: torch.dtype) -> tuple[dict, dict]:
    """The inference, cache-step and training-step programs of one meta-device model, and
    the seconds each capture took."""
    model = meta_llama(layers, cache, dtype)
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    progs, seconds = {}, {}
    start = time.perf_counter()
    progs["inference"] = tdag.from_torch(model, (ids,))
    seconds["inference"] = time.perf_counter() - start
    start = time.perf_counter()
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=cache)
    length = torch.export.Dim("seq", min=1, max=cache - 1)
    progs["step"] = tdag.from_torch(wrapper.export(
        input_ids=torch.zeros(1, 4, dtype=torch.long, device="meta"),
        cache_position=torch.arange(4, device="meta"),
        dynamic_shapes={"input_ids": {1: length}, "cache_position": {0: length}}))
    seconds["step"] = time.perf_counter() - start
    start = time.perf_counter()
    model.config.use_cache = False
    progs["train"] = tdag.from_torch(WithLoss(model), (ids, ids))
    seconds["train"] = time.perf_counter() - start
    return progs, seconds


def reports(progs: dict, seq: int) -> dict:
    """``tdag.memory`` of each, timed: the step program at the whole prompt (prefill) and at
    one new token (lowered once: the two differ only in the size), the training step with
    AdamW (``train_step`` included in its time)."""
    (length,) = {d.name for v in progs["step"].main.inputs for d in v.type.shape
                 if not isinstance(d, int)}
    out = {}
    start = time.perf_counter()
    out["inference"] = tdag.memory(progs["inference"]), time.perf_counter() - start
    start = time.perf_counter()
    step = lower(progs["step"])
    out["prefill"] = memory_of(step, liveness, **{length: seq}), time.perf_counter() - start
    start = time.perf_counter()
    out["decode step"] = memory_of(step, liveness, **{length: 1}), time.perf_counter() - start
    start = time.perf_counter()
    train = tdag.train_step(progs["train"], tdag.optim.AdamW())
    out["train step"] = tdag.memory(train), time.perf_counter() - start
    return out


def show(name: str, report, seconds: float, captured: float) -> None:
    print(f"{name:<12} peak {report.peak / GiB:8.2f} GiB  after {report.peak_at} "
          f"({report.peak_phase}); capture {captured:.1f} s, analysis {seconds:.1f} s")
    for kind, value in report.by_kind.items():
        print(f"    {kind:<12} {value / GiB:8.2f} GiB")
    if len(report.phases) > 1:
        for phase, part in report.phases.items():
            kinds = ", ".join(f"{k} {v / GiB:.2f}" for k, v in part.by_kind.items())
            print(f"    peak in {phase:<10} {part.peak / GiB:8.2f} GiB  ({kinds})")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--cache", type=int, default=4096, help="static cache tokens")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    progs, captured = programs(args.layers, args.seq, args.cache, getattr(torch, args.dtype))
    results = reports(progs, args.seq)
    print(f"Llama-2-7B shapes, {args.layers} layers, {args.dtype}, meta device; sequence "
          f"{args.seq}, static cache {args.cache}; capture: torch.export + tdag.from_torch, "
          f"analysis: lowering (and train_step) + tdag.memory\n")
    source = {"inference": "inference", "prefill": "step", "decode step": "step",
              "train step": "train"}
    for name, (report, seconds) in results.items():
        show(name, report, seconds, captured[source[name]])
    total = sum(captured.values()) + sum(s for _, s in results.values())
    print(f"\ntotal {total:.1f} s (the step program is captured once for prefill and decode)")


if __name__ == "__main__":
    main()
