"""tdag.memory on a Llama with Llama-2-7B's layer shapes (two layers), built on the meta
device: nothing is allocated, and the split by kind is the closed form of the weights."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tdag

transformers = pytest.importorskip("transformers")

SHAPES = dict(hidden_size=4096, num_hidden_layers=2, num_attention_heads=32,
              num_key_value_heads=32, intermediate_size=11008, vocab_size=32000)


class WithLoss(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, labels):
        logits = self.model(ids).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


@pytest.fixture(scope="module")
def meta_llama():
    config = transformers.LlamaConfig(**SHAPES, use_cache=False, attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    return model, 2 * sum(p.numel() for p in model.parameters())


def test_inference_peak_is_the_weights_and_the_widest_activations(meta_llama):
    model, weight_bytes = meta_llama
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    report = tdag.memory(tdag.from_torch(model, (ids,)))
    assert weight_bytes <= report.by_kind["weights"] < weight_bytes + 2 ** 16  # + rotary consts
    logits = 16 * 32000 * 2
    assert logits <= report.peak - report.by_kind["weights"] < 8 * logits


@pytest.mark.slow
def test_training_step_by_kind(meta_llama):
    model, weight_bytes = meta_llama
    ids = torch.zeros(1, 16, dtype=torch.long, device="meta")
    step = tdag.train_step(tdag.from_torch(WithLoss(model), (ids, ids)), tdag.optim.AdamW())
    report = tdag.memory(step)
    assert weight_bytes <= report.by_kind["weights"] < weight_bytes + 2 ** 16
    assert report.by_kind["optimizer"] >= 2 * weight_bytes  # both moments, at least
    assert sum(report.by_kind.values()) == report.peak
