"""Tokens per second of generation: tdag's generation Program (``tdag.decode_loop`` over a
transformers static-cache export), reified to torch and to one ONNX model on onnxruntime,
against ``model.generate(do_sample=False)`` with a static cache: same model, same prompt,
same number of new tokens, in one process.

The sides are timed interleaved (the order alternates every round) and each side's median
is taken. A ratio above 1 means tdag's generation is faster than ``generate``. Every side's
tokens are checked equal to ``generate``'s before anything is timed. Target: >= 1.0.

    python benchmarks/generate_speed.py
    python benchmarks/generate_speed.py --models llama --new 32 --rounds 5
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers.integrations.executorch import (  # noqa: E402
    TorchExportableModuleForDecoderOnlyLM,
)

import tdag  # noqa: E402

VOCAB = 512


def gpt2():
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=4, n_head=4, n_embd=128, vocab_size=VOCAB, n_positions=256,
        initializer_range=0.3))


def llama():
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        initializer_range=0.3))


MODELS = {"gpt2": gpt2, "llama": llama}


def prepare(make, prompt_len: int, new: int):
    torch.manual_seed(0)
    model = make().eval()
    model.generation_config.cache_implementation = "static"
    cache = prompt_len + new
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=cache)
    # a dynamic length: the prompt is prefilled in one call, as generate does
    seq = torch.export.Dim("seq", min=1, max=cache - 1)
    ep = wrapper.export(input_ids=torch.zeros(1, 4, dtype=torch.long),
                        cache_position=torch.arange(4),
                        dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    gen = tdag.decode_loop(tdag.from_torch(ep), new)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(tdag.to_onnx(gen).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    module = tdag.to_torch(gen)
    prompt = torch.randint(0, VOCAB, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    feed_name = session.get_inputs()[0].name

    def reference():
        return model.generate(prompt, attention_mask=torch.ones_like(prompt),
                              max_new_tokens=new, do_sample=False, pad_token_id=0)

    sides = {
        "generate": reference,
        "tdag torch": lambda: module(prompt),
        "tdag onnx": lambda: torch.from_numpy(np.asarray(
            session.run(None, {feed_name: prompt.numpy()})[0])),
    }
    return sides


def timed(fn) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        fn()
    return time.perf_counter() - start


def measure(sides: dict, rounds: int) -> dict:
    with torch.no_grad():
        expected = sides["generate"]()
        for name, fn in sides.items():
            got = fn()
            if not torch.equal(got, expected):
                raise SystemExit(f"{name}: tokens differ from generate's:\n{got}\n{expected}")
    times = {name: [] for name in sides}
    names = list(sides)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            times[name].append(timed(sides[name]))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    print(f"{args.prompt}-token prompt, {args.new} new tokens, batch 1, 1 thread; "
          "tokens/s (median of interleaved rounds)")
    print(f"{'model':<8}{'generate':>12}{'tdag torch':>12}{'x':>7}{'tdag onnx':>12}{'x':>7}")
    ratios = {"tdag torch": [], "tdag onnx": []}
    for name in args.models.split(","):
        medians = measure(prepare(MODELS[name], args.prompt, args.new), args.rounds)
        rate = {k: args.new / v for k, v in medians.items()}
        for k in ratios:
            ratios[k].append(rate[k] / rate["generate"])
        print(f"{name:<8}{rate['generate']:>12.1f}{rate['tdag torch']:>12.1f}"
              f"{rate['tdag torch'] / rate['generate']:>7.2f}{rate['tdag onnx']:>12.1f}"
              f"{rate['tdag onnx'] / rate['generate']:>7.2f}")
    geo = {k: statistics.geometric_mean(v) for k, v in ratios.items()}
    print(f"geo-mean speed vs generate: tdag torch {geo['tdag torch']:.2f}x, "
          f"tdag onnx {geo['tdag onnx']:.2f}x")


if __name__ == "__main__":
    main()
