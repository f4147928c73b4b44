"""The per-layer cost of a Llama-2-7B-shaped model at sequence 2048, built on the meta device
(no weights allocated), beside torch's FlopCounterMode on the same exported program.

transformers' LlamaConfig with Llama-2-7B's shapes (hidden 4096, 32 layers, 32 heads,
intermediate 11008, vocab 32000), bf16, captured by ``tdag.from_torch`` from
``torch.export`` at batch 1. Prints the per-layer table (``--depth``), the dense and the
causal (useful) attention flops, tdag's matmul flops against FlopCounterMode's total, and a
roofline estimate on ``--device`` (a datasheet preset).

    python benchmarks/llama7b_cost.py                       # depth 3, H100 SXM
    python benchmarks/llama7b_cost.py --depth 4 --seq 4096 --device a100-80gb-sxm
"""
from __future__ import annotations

import argparse
import time

import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import LlamaConfig, LlamaForCausalLM

import tdag
from tdag.refine.cost import roofline

LLAMA2_7B = dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=32, intermediate_size=11008, vocab_size=32000)


def meta_llama(layers: int, dtype: torch.dtype) -> torch.nn.Module:
    config = LlamaConfig(**{**LLAMA2_7B, "num_hidden_layers": layers}, use_cache=False,
                         attn_implementation="sdpa")
    with torch.device("meta"):
        return LlamaForCausalLM(config).to(dtype).eval()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--device", default="h100-sxm", choices=list(roofline.DEVICES))
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = parser.parse_args(argv)

    model = meta_llama(args.layers, getattr(torch, args.dtype))
    ids = torch.zeros(1, args.seq, dtype=torch.long, device="meta")
    start = time.perf_counter()
    exported = torch.export.export(model, (ids,))
    prog = tdag.from_torch(exported)
    captured = time.perf_counter() - start
    with FlopCounterMode(display=False) as counter:  # the same graph, run on meta
        exported.module()(ids)
    start = time.perf_counter()
    report = tdag.cost(prog)
    costed = time.perf_counter() - start

    device = roofline.DEVICES[args.device]
    print(f"Llama-2-7B shapes, {args.layers} layers, sequence {args.seq}, {args.dtype}, meta "
          f"device: capture {captured:.1f} s, cost (lowering included) {costed:.1f} s\n")
    print(report.table(depth=args.depth, device=device))
    attention = report.per_op.get("attention")
    flop_counter = counter.get_total_flops()
    print()
    print(f"{'matmul flops, tdag (dense)':<40} {report.matmul_flops:>22,}")
    print(f"{'FlopCounterMode total':<40} {flop_counter:>22,}   "
          f"ratio {report.matmul_flops / flop_counter:.6f}")
    if attention is not None:
        print(f"{'attention score+value flops, dense':<40} {attention.matmul_flops:>22,}")
        print(f"{'attention score+value flops, causal':<40} "
              f"{attention.useful_matmul_flops:>22,}   "
              f"({attention.useful_matmul_flops / attention.matmul_flops:.4f} of dense)")
    print(f"{'matmul flops, causal kernels (useful)':<40} {report.useful_matmul_flops:>22,}")
    print(f"{'all flops, dense / useful':<40} {report.flops:>22,} / {report.useful_flops:,}")
    print(f"{'bytes (lowered) / unfused':<40} {report.bytes:>22,} / {report.unfused_bytes:,}")


if __name__ == "__main__":
    main()
