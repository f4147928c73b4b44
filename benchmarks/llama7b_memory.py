"""The memory a Llama-2-7B-shaped model needs, from liveness, on the meta device (no weights
allocated): inference at sequence 2048, a decode step against a 4,096-token static cache
(prefill beside it), and an AdamW training step split by kind (weights, gradients,
optimizer state, activations kept for the backward pass), with the peak of each phase
(forward, backward, optimizer). Each figure is ``tdag.memory`` of the program
``tdag.to_torch`` would run; each stage of each capture (torch.export, tdag.from_torch) and
of each analysis (train_step, lowering, the memory replay) is timed apart, in wall and CPU
seconds.

Two captures make the three programs: the training step's (``WithLoss``, whose logits are the
inference program: ``tdag.extract`` takes them out, the nodes the export of ``model(ids)``
alone gives, with the same figures; ``--inference-export`` exports it apart to check) and
the cache step's (non-strict, through ``CacheStep``; ``--strict`` as transformers exports
it, all layers). torch.export's time grows with the depth, so each export is of a one-layer
probe, its layer repeated 32 times by ``tdag.from_torch_stacked`` and the repeat checked
against a two-layer probe's export (each step a stage of its own): the program that the
export of all layers gives (``--full-export`` captures so; ``--check`` captures both ways
and compares the programs and every figure, to the byte). torch.export records no source
lines unless ``--source-lines``: they cost a third of an export, and no figure reads them
(module scopes are kept).

    python benchmarks/llama7b_memory.py                 # 32 layers, bf16
    python benchmarks/llama7b_memory.py --layers 4 --check
    python benchmarks/llama7b_memory.py --layers 2 --seq 256 --cache 512
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass, replace

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tdag  # noqa: E402
from tdag.reify.torch.module import lowered as lower  # noqa: E402  (to_torch's lowering)
from tdag.canonicalize.torch.stacked import Probe  # noqa: E402  (from_torch_stacked's steps)
from tdag.refine.memory import memory_of  # noqa: E402
from tdag.reify.torch.codegen import liveness  # noqa: E402
from llama7b_cost import LLAMA2_7B  # noqa: E402

GiB = 2 ** 30


class WithLoss(torch.nn.Module):
    """The causal LM's next-token cross-entropy, a scalar every parameter reaches, written as
    the mean negative log-softmax at the labels."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        logp = self.model(ids).logits.float().log_softmax(-1)
        return -logp.gather(-1, labels.unsqueeze(-1)).mean()


class CacheStep(torch.nn.Module):
    """transformers' static-cache step (``TorchExportableModuleWithStaticCache``) whose cache
    layers read the module's own buffers on every call. Non-strict export swaps a module's
    buffers for fake tensors while it traces; cache layers still holding the real tensors
    would be lifted as constants, not buffers the step writes. In eager the assignments
    change nothing."""

    def __init__(self, model: LlamaForCausalLM, cache: int):
        super().__init__()
        self.step = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1,
                                                          max_cache_len=cache).model

    def forward(self, input_ids, cache_position):
        for i, layer in enumerate(self.step.static_cache.layers):
            layer.keys = self.step.get_buffer(f"key_cache_{i}")
            layer.values = self.step.get_buffer(f"value_cache_{i}")
            layer.cumulative_length = self.step.get_buffer(f"cumulative_length_{i}")
        return self.step(input_ids=input_ids, cache_position=cache_position)


class Stages:
    """Wall and CPU seconds per named stage: the machine is shared, and CPU time is what
    the work costs when other processes hold the cores."""

    def __init__(self):
        self.times: dict[str, tuple[float, float]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        wall, cpu = time.perf_counter(), time.process_time()
        yield
        self.times[name] = (time.perf_counter() - wall, time.process_time() - cpu)

    def total(self, prefix: str = "") -> tuple[float, float]:
        parts = [t for name, t in self.times.items() if name.startswith(prefix)]
        return sum(w for w, _ in parts), sum(c for _, c in parts)


def meta_llama(layers: int, cache: int, dtype: torch.dtype) -> LlamaForCausalLM:
    config = LlamaConfig(**{**LLAMA2_7B, "num_hidden_layers": layers}, use_cache=False,
                         max_position_embeddings=cache, attn_implementation="sdpa")
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(dtype).eval()


@dataclass(frozen=True)
class Capture:
    """How the programs are captured (the module docstring says why)."""

    strict: bool = False            # the step as transformers exports it (all layers)
    inference_export: bool = False  # the inference program by an export of its own
    source_lines: bool = False      # torch.export records each node's source line
    full_export: bool = False       # export all layers, not a one-layer probe stacked


def programs(layers: int, seq: int, cache: int, dtype: torch.dtype, stages: Stages,
             how: Capture = Capture()) -> dict:
    """The inference, cache-step and training-step programs of one meta-device model, each
    capture timed: stacked from a one-layer probe and checked against a two-layer one (the
    three steps of ``tdag.from_torch_stacked``), or with ``how.full_export`` exported whole
    (``tdag.from_torch``)."""
    model = meta_llama(layers, cache, dtype)
    probe = None if how.full_export else lambda k: meta_llama(k, cache, dtype)
    with _source_lines(how.source_lines):
        return _programs(model, probe, seq, cache, stages, how)


def _programs(model, probe, seq: int, cache: int, stages: Stages, how: Capture) -> dict:
    ids = torch.zeros(1, seq, dtype=torch.long, device="meta")
    probe_loss = None if probe is None else lambda k: WithLoss(probe(k))
    progs = {"train": _capture(stages, "train", WithLoss(model), probe_loss,
                               (ids, torch.zeros_like(ids)), layers="model.model.layers")}
    if how.inference_export:
        progs["inference"] = _capture(stages, "inference", model, probe, (ids,))
    else:
        with stages("capture inference: extract"):
            progs["inference"] = logits_program(progs["train"], model.config.vocab_size)
    _static_cache(model)
    length = torch.export.Dim("seq", min=1, max=cache - 1)
    inputs = {"input_ids": torch.zeros(1, 4, dtype=torch.long, device="meta"),
              "cache_position": torch.arange(4, device="meta")}
    shapes = {"input_ids": {1: length}, "cache_position": {0: length}}
    if how.strict:
        with stages("capture step: export (strict)"):
            wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1,
                                                            max_cache_len=cache)
            ep = wrapper.export(**inputs, dynamic_shapes=shapes)
        with stages("capture step: from_torch"):
            progs["step"] = tdag.from_torch(ep)
    else:
        probe_step = None if probe is None else \
            lambda k: CacheStep(_static_cache(probe(k)), cache)
        progs["step"] = _capture(stages, "step", CacheStep(model, cache), probe_step, (),
                                 inputs, shapes, layers="step.model.model.layers")
    return progs


def _static_cache(model: LlamaForCausalLM) -> LlamaForCausalLM:
    model.config.use_cache = model.generation_config.use_cache = True
    model.generation_config.cache_implementation = "static"
    return model


def _capture(stages: Stages, name: str, full, probe, args, kwargs=None, shapes=None,
             layers: str = "model.layers") -> tdag.Program:
    """One program, non-strict: without a probe exported whole; else the steps of
    ``tdag.from_torch_stacked`` timed apart: the one-layer probe exported and converted, its
    layer stacked to the full model's depth, the stack checked against the two-layer probe's
    export."""
    if probe is None:
        with stages(f"capture {name}: export + from_torch (all layers)"):
            return tdag.from_torch(full, args, kwargs, dynamic_shapes=shapes)
    capture = Probe(probe, layers, args, kwargs, dynamic_shapes=shapes)
    with stages(f"capture {name}: 1-layer probe (export + convert)"):
        one = capture.record(full)
    with stages(f"capture {name}: stack ({len(full.get_submodule(layers))} layers)"):
        prog = one.stacked(full)
    with stages(f"capture {name}: check (2-layer probe)"):
        capture.check(one)
    return prog


def logits_program(train: tdag.Program, vocab: int) -> tdag.Program:
    """The program computing the logits from the token ids inside the training capture:
    the last node of ``lm_head`` (``WithLoss`` reads ``model(ids).logits``)."""
    head = [n for n in train.graph.nodes if n.origin.scope == "model.lm_head"]
    if not head or head[-1].type.shape[-1] != vocab:
        raise tdag.TdagError("no lm_head node giving the logits in the training capture")
    return tdag.extract(train, inputs=["ids"], outputs=[head[-1].name])


@contextlib.contextmanager
def _source_lines(keep: bool):
    saved = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = not keep
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = saved


def reports(progs: dict, seq: int, stages: Stages) -> dict:
    """``tdag.memory`` of each, each step timed: the step program at the whole prompt
    (prefill) and at one new token (lowered once: the two differ only in the size), the
    training step with AdamW."""
    (length,) = {d.name for v in progs["step"].main.inputs for d in v.type.shape
                 if not isinstance(d, int)}
    out = {}
    with stages("analysis inference: lower"):
        inference = lower(progs["inference"])
    with stages("analysis inference: memory"):
        out["inference"] = memory_of(inference, liveness)
    with stages("analysis step: lower"):
        step = lower(progs["step"])
    with stages("analysis step: memory (prefill)"):
        out["prefill"] = memory_of(step, liveness, **{length: seq})
    with stages("analysis step: memory (decode)"):
        out["decode step"] = memory_of(step, liveness, **{length: 1})
    with stages("analysis train: train_step"):
        train = tdag.train_step(progs["train"], tdag.optim.AdamW())
    with stages("analysis train: lower"):
        train = lower(train)
    with stages("analysis train: memory"):
        out["train step"] = memory_of(train, liveness)
    return out


def figures(name: str, report) -> str:
    """One program's figures, as printed."""
    lines = [f"{name:<12} peak {report.peak / GiB:8.2f} GiB  after {report.peak_at} "
             f"({report.peak_phase})"]
    lines += [f"    {kind:<12} {value / GiB:8.2f} GiB" for kind, value in report.by_kind.items()]
    if len(report.phases) > 1:
        for phase, part in report.phases.items():
            kinds = ", ".join(f"{k} {v / GiB:.2f}" for k, v in part.by_kind.items())
            lines.append(f"    peak in {phase:<10} {part.peak / GiB:8.2f} GiB  ({kinds})")
    return "\n".join(lines)


def show_times(stages: Stages) -> None:
    print(f"\n{'stage':<50} {'wall s':>7} {'cpu s':>7}")
    for name, (wall, cpu) in stages.times.items():
        print(f"{name:<50} {wall:7.2f} {cpu:7.2f}")
    for part in ("capture", "analysis", ""):
        wall, cpu = stages.total(part)
        print(f"{(part or 'total') + ' (sum)':<50} {wall:7.2f} {cpu:7.2f}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--cache", type=int, default=4096, help="static cache tokens")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--strict", action="store_true",
                        help="export the step strict, as transformers' export does")
    parser.add_argument("--inference-export", action="store_true",
                        help="export the inference program apart (not from the training one)")
    parser.add_argument("--source-lines", action="store_true",
                        help="let torch.export record each node's source line")
    parser.add_argument("--full-export", action="store_true",
                        help="export all layers, not a one-layer probe stacked")
    parser.add_argument("--check", action="store_true",
                        help="capture both ways; the programs and figures must be equal")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    dtype = getattr(torch, args.dtype)
    how = Capture(args.strict, args.inference_export, args.source_lines, args.full_export)
    runs = [how, replace(how, full_export=not how.full_export)] if args.check else [how]
    outcomes = []
    for one in runs:
        stages = Stages()
        progs = programs(args.layers, args.seq, args.cache, dtype, stages, one)
        outcomes.append((one, stages, progs, reports(progs, args.seq, stages)))
    print(f"Llama-2-7B shapes, {args.layers} layers, {args.dtype}, meta device; sequence "
          f"{args.seq}, static cache {args.cache}; capture: torch.export + tdag.from_torch "
          "(one layer stacked unless --full-export), analysis: lowering (and train_step) + "
          "tdag.memory\n")
    for name, report in outcomes[0][3].items():
        print(figures(name, report))
    for one, stages, _, _ in outcomes:
        print(f"\n{'full export' if one.full_export else 'stacked'}:", end="")
        show_times(stages)
    if args.check:
        sys.exit(0 if check(outcomes) else 1)


def check(outcomes) -> bool:
    """The two captures' programs equal and every figure identical, to the byte."""
    (_, _, progs_a, reports_a), (_, _, progs_b, reports_b) = outcomes
    same = True
    print()
    for name in progs_a:
        equal = progs_a[name] == progs_b[name]
        print(f"check {name:<10} programs equal: {equal} ({progs_a[name].num_nodes} nodes)")
        same &= equal
    for name in reports_a:
        # every figure in bytes: the peak, its split, the live set and the whole timeline
        equal = reports_a[name].to_json() == reports_b[name].to_json()
        print(f"check {name:<10} memory reports identical (JSON, bytes): {equal}")
        same &= equal
    return same


if __name__ == "__main__":
    main()
