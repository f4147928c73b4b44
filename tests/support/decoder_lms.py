"""Decoder-only LMs of transformers with a static KV cache (small configs, random weights,
nothing downloaded), exported as one step Program each: the generation tests
(tests/canonicalize/torch/test_generate.py) and the JAX back end's (tests/reify/test_to_jax.py).
"""
from __future__ import annotations

import warnings

import torch
import transformers
from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

import tdag


CACHE = 32      # the static cache: prompt + new tokens must fit


NEW = 10        # new tokens per generation (the issue asks for 8 or more)


def gpt2():
    """A two-layer GPT-2 LM head model."""
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, vocab_size=97, n_positions=64, initializer_range=0.3,
        bos_token_id=0, eos_token_id=1))


def llama():
    """A two-layer Llama causal LM (grouped-query attention)."""
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.3, bos_token_id=0, eos_token_id=1))


class Exported:
    """A model, its transformers export wrapper and the step Program tdag makes of it."""

    def __init__(self, make, batch: int, whole_prompt: bool):
        torch.manual_seed(0)
        self.model = make().eval()
        self.model.generation_config.cache_implementation = "static"  # what export wants
        self.batch = batch
        self.wrapper = TorchExportableModuleForDecoderOnlyLM(self.model, batch_size=batch,
                                                             max_cache_len=CACHE)
        # one token a call, or a dynamic length: then the prefill is one call
        n = 4 if whole_prompt else 1
        seq = torch.export.Dim("seq", min=1, max=CACHE - 1)
        shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}} if whole_prompt else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = self.wrapper.export(input_ids=torch.zeros(batch, n, dtype=torch.long),
                                     cache_position=torch.arange(n), dynamic_shapes=shapes)
        self.step = tdag.from_torch(ep)
        self.whole_prompt = whole_prompt

    def generate(self, prompt: torch.Tensor, eos: int | None = None) -> torch.Tensor:
        config = dict(max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                      pad_token_id=eos if eos is not None else 0)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                       **config)


def random_prompt(lm: Exported, length: int = 5) -> torch.Tensor:
    """A seeded prompt of token ids in [2, 97): no bos (0) or eos (1)."""
    return torch.randint(2, 97, (lm.batch, length), generator=torch.Generator().manual_seed(1))
