"""One mixture-of-experts block of transformers at a real size, against tdag's reified forms.

    mixtral     MixtralSparseMoeBlock: hidden 1024, 8 experts of 2048, top-2
    qwen2_moe   Qwen2MoeSparseMoeBlock: hidden 1024, 60 experts of 256, top-4, a shared
                expert of 1024 (Qwen1.5-MoE's expert count and top-k, narrower)

Random weights, 512 tokens ([1, 512, hidden]), one thread. The block is captured with
``tdag.from_torch`` in transformers' default experts implementation (``grouped_mm``) and
reified with ``tdag.to_torch`` (lowered: the ``grouped_mm`` kernel), checked against eager,
then timed, interleaved medians, against the same block in transformers' ``eager`` experts
implementation (its per-expert loop) and in its default one:

    eager ms / default ms   transformers' eager loop and its default (grouped_mm)
    tdag ms, torch x        the reified module, over the faster of the two
    ort ms, ort x           ``tdag.to_onnx`` on onnxruntime (one thread), over the same
                            (torch.onnx.export does not export the block: its custom op)
    jax ms, jax x           ``tdag.to_jax``, jitted (XLA on one thread), over the same
    gflops                  ``tdag.cost`` matmul flops: the top-k experts each token runs

    cd /tmp && python /work/main/benchmarks/moe.py                 # both blocks
    cd /tmp && python /work/main/benchmarks/moe.py --cases mixtral --rounds 5 --tokens 128
"""
from __future__ import annotations

import argparse
import os
import sys

# XLA's CPU client reads its thread count when jax is first imported
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                      "intra_op_parallelism_threads=1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import tdag  # noqa: E402
from real_sizes import interleaved, session  # noqa: E402

HIDDEN = 1024


def _mixtral(impl: str) -> torch.nn.Module:
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    config = transformers.MixtralConfig(hidden_size=HIDDEN, intermediate_size=2048,
                                        num_local_experts=8, num_experts_per_tok=2)
    config._experts_implementation = impl
    return MixtralSparseMoeBlock(config)


def _qwen2_moe(impl: str) -> torch.nn.Module:
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
    config = transformers.Qwen2MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=256,
                                         shared_expert_intermediate_size=1024,
                                         num_experts=60, num_experts_per_tok=4)
    config._experts_implementation = impl
    return Qwen2MoeSparseMoeBlock(config)


CASES = {"mixtral": _mixtral, "qwen2_moe": _qwen2_moe}


def _block(name: str, impl: str) -> torch.nn.Module:
    """The block with weights drawn at N(0, 0.02) (the configs' initializer range), the
    same for every implementation."""
    torch.manual_seed(0)
    block = CASES[name](impl).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.02)
    return block


def _jax_ms(prog, x: torch.Tensor, want: torch.Tensor, rounds: int) -> float | None:
    try:
        import jax
    except ImportError:
        return None
    fn = jax.jit(tdag.to_jax(prog))
    arg = jax.numpy.asarray(x.numpy())
    np.testing.assert_allclose(np.asarray(fn(arg)), want.numpy(), rtol=0, atol=1e-4)
    return interleaved(lambda: fn(arg).block_until_ready(),
                       lambda: fn(arg).block_until_ready(), rounds)[0] * 1e3


def measure(name: str, tokens: int, rounds: int) -> dict:
    eager, default = _block(name, "eager"), _block(name, "grouped_mm")
    x = torch.randn(1, tokens, HIDDEN)
    prog = tdag.from_torch(default, (x,))
    reified = tdag.to_torch(prog)
    assert "grouped_mm" in {n.op.value for n in tdag.lower.lower(prog).graph.nodes}
    ort = session(tdag.to_onnx(prog).SerializeToString())
    feed = {ort.get_inputs()[0].name: x.numpy()}
    with torch.no_grad():
        want = eager(x)
        for got in (default(x), reified(x), torch.from_numpy(ort.run(None, feed)[0])):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
        eager_s, default_s = interleaved(lambda: eager(x), lambda: default(x), rounds)
        base = eager if eager_s < default_s else default
        base_s, tdag_s = interleaved(lambda: base(x), lambda: reified(x), rounds)
        _, ort_s = interleaved(lambda: base(x), lambda: ort.run(None, feed), rounds)
    jax_ms = _jax_ms(prog, x, want, rounds)
    return {"case": name, "eager_ms": eager_s * 1e3, "default_ms": default_s * 1e3,
            "tdag_ms": tdag_s * 1e3, "torch_ratio": tdag_s / base_s, "ort_ms": ort_s * 1e3,
            "ort_ratio": ort_s / base_s, "jax_ms": jax_ms,
            "jax_ratio": None if jax_ms is None else jax_ms / (base_s * 1e3),
            "gflops": float(tdag.cost(prog).matmul_flops) / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    torch.set_num_threads(1)
    keys = ("case", "eager_ms", "default_ms", "tdag_ms", "torch_ratio", "ort_ms", "ort_ratio",
            "jax_ms", "jax_ratio", "gflops")
    print("".join(f"{k:>12}" for k in keys))
    for name in args.cases.split(","):
        row = measure(name, args.tokens, args.rounds)
        print("".join(f"{'-' if row[k] is None else row[k]:>12}" if isinstance(row[k], str)
                      or row[k] is None else f"{row[k]:>12.2f}" for k in keys), flush=True)


if __name__ == "__main__":
    main()
