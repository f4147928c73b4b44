"""Stacked capture (``tdag.from_torch_stacked``): a one-layer probe's program, its layer
repeated and checked against a two-layer probe's, against ``tdag.from_torch`` of the full
model (small configs, random weights).

The stacked program must be the full export's, not merely compute the same: it is compared
with ``==`` (nodes, names, origins, weights, state, calls), then by its results (against
the full program's and eager, to 1e-6), its memory report (JSON, to the byte) and its flops.
"""
from __future__ import annotations

import copy
import re

import pytest
import torch
import transformers

from llama7b_memory import CacheStep, WithLoss

import tdag
from tdag.canonicalize.torch.stacked import Probe
from tdag.ir.types import TensorKind

RTOL, ATOL = 1e-6, 1e-6
LAYERS = 3


def _llama(layers: int, cache: bool = False, **extra) -> transformers.LlamaForCausalLM:
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      num_hidden_layers=layers, vocab_size=100,
                                      max_position_embeddings=64, use_cache=cache,
                                      attn_implementation="sdpa", **extra)
    model = transformers.LlamaForCausalLM(config).eval()
    if cache:
        model.generation_config.use_cache = True
        model.generation_config.cache_implementation = "static"
    return model


def _same(stacked: tdag.Program, full: tdag.Program) -> None:
    """One program: the same nodes, names and weights; the weights' values the full's."""
    assert stacked.num_nodes == full.num_nodes
    assert stacked == full
    ours, theirs = stacked.graph.weights, full.graph.weights
    assert list(ours) == list(theirs)
    for name, weight in ours.items():
        if weight.kind is not TensorKind.const and weight.value is not None:
            assert torch.equal(weight.value, theirs[name].value), name
    assert list(stacked.state) == list(full.state)


def _same_analysis(stacked: tdag.Program, full: tdag.Program, **sizes) -> None:
    assert tdag.memory(stacked, **sizes).to_json() == tdag.memory(full, **sizes).to_json()
    assert tdag.cost(stacked).flops == tdag.cost(full).flops


@pytest.fixture(scope="module")
def llamas():
    torch.manual_seed(0)
    return _llama(LAYERS), _llama, torch.randint(0, 100, (1, 8))


def test_forward_is_the_full_export(llamas):
    full, probe, ids = llamas
    stacked = tdag.from_torch_stacked(full, probe, (ids,))
    whole = tdag.from_torch(full, (ids,))
    _same(stacked, whole)
    assert "model.layers.2.mlp.down_proj.weight" in stacked.graph.weights
    with torch.no_grad():
        expected = full(ids).logits
    torch.testing.assert_close(tdag.run(stacked, ids), expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(tdag.run(stacked, ids), tdag.run(whole, ids), rtol=0, atol=0)
    _same_analysis(stacked, whole)


def test_training_loss_is_the_full_export(llamas):
    full, probe, ids = llamas
    labels = torch.randint(0, 100, (1, 8))
    stacked = tdag.from_torch_stacked(WithLoss(full), lambda k: WithLoss(probe(k)),
                                      (ids, labels), layers="model.model.layers")
    whole = tdag.from_torch(WithLoss(full), (ids, labels))
    _same(stacked, whole)
    with torch.no_grad():
        expected = WithLoss(full)(ids, labels)
    torch.testing.assert_close(tdag.run(stacked, ids, labels), expected, rtol=RTOL, atol=ATOL)
    step, whole_step = (tdag.train_step(p, tdag.optim.AdamW()) for p in (stacked, whole))
    assert step == whole_step
    assert tdag.memory(step).to_json() == tdag.memory(whole_step).to_json()


def _cache_step(model, cache: int = 32):
    length = torch.export.Dim("seq", min=1, max=cache - 1)
    device = next(model.parameters()).device
    inputs = {"input_ids": torch.randint(0, 100, (1, 4), device=device),
              "cache_position": torch.arange(4, device=device)}
    shapes = {"input_ids": {1: length}, "cache_position": {0: length}}
    return CacheStep(model, cache), inputs, shapes


def _cache_probe(layers: int, device: str = "cpu") -> CacheStep:
    with torch.device(device):
        model = _llama(layers, cache=True)
    return _cache_step(model)[0]


def test_static_cache_step_is_the_full_export():
    """The step writes each layer's cache (state ``step.key_cache_k`` ...), and before the
    model runs, resets every layer's ``cumulative_length``: a write outside the layers that
    the full export makes once per layer."""
    torch.manual_seed(0)
    full = _llama(LAYERS, cache=True)
    step, inputs, shapes = _cache_step(full)
    stacked = tdag.from_torch_stacked(step, _cache_probe, (), inputs, dynamic_shapes=shapes,
                                      layers="step.model.model.layers")
    whole = tdag.from_torch(step, (), inputs, dynamic_shapes=shapes)
    _same(stacked, whole)
    assert "step.cumulative_length_2" in stacked.state
    args = (inputs["input_ids"], inputs["cache_position"])
    got, state = tdag.run(stacked, *args, return_state=True)
    eager = _cache_step(full)[0]  # its own cache, zero as the program's state starts
    with torch.no_grad():
        expected = eager(**inputs)
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(state["step.value_cache_2"],
                               eager.get_buffer("step.value_cache_2"), rtol=RTOL, atol=ATOL)
    _same_analysis(stacked, whole, seq=4)


def test_static_cache_step_on_meta():
    """On the meta device torch.export keeps the cache writes in place (no op needs
    decomposing): the written state comes in the order of the first writes, the resets
    before the layers first."""
    with torch.device("meta"):
        full = _llama(LAYERS, cache=True)
    step, inputs, shapes = _cache_step(full)
    stacked = tdag.from_torch_stacked(step, lambda k: _cache_probe(k, "meta"), (), inputs,
                                      dynamic_shapes=shapes, layers="step.model.model.layers")
    _same(stacked, tdag.from_torch(step, (), inputs, dynamic_shapes=shapes))


def test_gpt2_is_the_full_export():
    torch.manual_seed(0)
    def gpt2(layers):
        config = transformers.GPT2Config(n_embd=32, n_layer=layers, n_head=4, vocab_size=100,
                                         n_positions=32, attn_implementation="sdpa",
                                         use_cache=False)
        return transformers.GPT2LMHeadModel(config).eval()
    full, probe, ids = gpt2(LAYERS), gpt2, torch.randint(0, 100, (2, 7))
    stacked = tdag.from_torch_stacked(full, probe, (ids,), layers="transformer.h")
    _same(stacked, tdag.from_torch(full, (ids,)))
    with torch.no_grad():
        expected = full(ids).logits
    torch.testing.assert_close(tdag.run(stacked, ids), expected, rtol=1e-5, atol=1e-5)


def _bert(layers):
    return transformers.BertModel(transformers.BertConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=layers,
        vocab_size=100, max_position_embeddings=32)).eval()


def _opt(layers):
    return transformers.OPTForCausalLM(transformers.OPTConfig(
        hidden_size=32, ffn_dim=64, num_attention_heads=4, num_hidden_layers=layers,
        vocab_size=100, word_embed_proj_dim=32, max_position_embeddings=32,
        use_cache=False)).eval()


def _vit(layers):
    return transformers.ViTModel(transformers.ViTConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=layers,
        image_size=16, patch_size=8)).eval()


@pytest.mark.parametrize("build, layers, make_input", [
    (_bert, "encoder.layer", lambda: torch.randint(0, 100, (2, 7))),
    (_opt, "model.decoder.layers", lambda: torch.randint(0, 100, (2, 7))),
    (_vit, "layers", lambda: torch.randn(2, 3, 16, 16)),
], ids=["bert", "opt", "vit"])
def test_other_families_are_the_full_export(build, layers, make_input):
    """An encoder (its padding mask built before the stack), a decoder with learned
    positions, a vision encoder (a conv patch embedding before it)."""
    torch.manual_seed(0)
    full, x = build(LAYERS), make_input()
    stacked = tdag.from_torch_stacked(full, build, (x,), layers=layers)
    _same(stacked, tdag.from_torch(full, (x,)))
    with torch.no_grad():
        expected = full(x)[0]
    got = tdag.run(stacked, x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_alternating_layer_types_are_refused():
    """Gemma-2 alternates sliding-window and full attention: its layers are not one layer."""
    def gemma2(layers):
        return transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
            head_dim=8, num_hidden_layers=layers, vocab_size=100, use_cache=False)).eval()
    with pytest.raises(tdag.InvalidModelError, match=r"layer_types\[1\]: 'full_attention'"):
        tdag.from_torch_stacked(gemma2(LAYERS), gemma2, (torch.randint(0, 100, (2, 7)),))


# -- refusals ------------------------------------------------------------------------------------

def test_a_layer_with_another_attribute_is_refused(llamas):
    full, probe, ids = llamas
    odd = copy.deepcopy(full)
    odd.model.layers[2].self_attn.scaling = 0.5
    with pytest.raises(tdag.InvalidModelError, match=r"model\.layers\.2\.self_attn\.scaling"):
        tdag.from_torch_stacked(odd, probe, (ids,))


def test_a_layer_with_another_weight_shape_is_refused(llamas):
    full, probe, ids = llamas
    odd = copy.deepcopy(full)
    odd.model.layers[1].mlp.up_proj = torch.nn.Linear(64, 96, bias=False)
    with pytest.raises(tdag.InvalidModelError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        tdag.from_torch_stacked(odd, probe, (ids,))


def test_per_layer_attention_types_are_refused():
    """Qwen2 with a sliding window on layer 1 only: the per-layer list of its config names
    the layer that differs."""
    def qwen(layers, types):
        config = transformers.Qwen2Config(hidden_size=32, intermediate_size=64,
                                          num_attention_heads=4, num_key_value_heads=2,
                                          num_hidden_layers=layers, vocab_size=100,
                                          use_sliding_window=True, sliding_window=4,
                                          max_window_layers=1, layer_types=types)
        return transformers.Qwen2ForCausalLM(config).eval()
    full = qwen(2, ["full_attention", "sliding_attention"])
    def probe(k):
        return qwen(k, ["full_attention"] * k)
    with pytest.raises(tdag.InvalidModelError, match=r"layer_types\[1\]: 'sliding_attention'"):
        tdag.from_torch_stacked(full, probe, (torch.randint(0, 100, (1, 8)),))


def test_a_wrong_layers_path_is_refused(llamas):
    full, probe, ids = llamas
    with pytest.raises(tdag.InvalidModelError, match="model.blocks"):
        tdag.from_torch_stacked(full, probe, (ids,), layers="model.blocks")
    with pytest.raises(tdag.InvalidModelError, match="not a ModuleList"):
        tdag.from_torch_stacked(full, probe, (ids,), layers="model.norm")
    with pytest.raises(tdag.InvalidModelError, match=r"probe\(1\) has 3 layers"):
        tdag.from_torch_stacked(full, lambda k: full, (ids,))
    with pytest.raises(tdag.InvalidModelError, match="a function k -> nn.Module"):
        tdag.from_torch_stacked(full, probe(1), (ids,))


class _Looped(torch.nn.Module):
    """Code of the loop's own after each layer: one layer cannot show it."""

    def __init__(self, depth: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(depth))
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.head(x)


def test_code_between_layers_is_refused():
    with pytest.raises(tdag.ConversionError, match="aten.relu @ the top level"):
        tdag.from_torch_stacked(_Looped(3), _Looped, (torch.randn(2, 4),), layers="layers")


class _After(_Looped):
    """Code after the loop in the forward that runs it: one pass, whatever the depth."""

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(torch.relu(x) * 2)


def test_code_after_the_loop_in_the_same_forward_is_stacked():
    x = torch.randn(2, 4)
    full = _After(3)
    stacked = tdag.from_torch_stacked(full, _After, (x,), layers="layers")
    assert stacked == tdag.from_torch(full, (x,))
    torch.testing.assert_close(tdag.run(stacked, x), full(x), rtol=1e-6, atol=1e-6)


class _Scaled(torch.nn.Module):
    """Each layer scales by a non-persistent buffer of its own (a rotary inv_freq's kind)."""

    class Layer(torch.nn.Module):
        def __init__(self, scale: float):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("scale", torch.full((4,), scale), persistent=False)

        def forward(self, x):
            return torch.tanh(self.linear(x)) * self.scale

    def __init__(self, depth: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(self.Layer(1.0 + k) for k in range(depth))
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_non_persistent_buffers_are_each_layers_consts():
    x, full = torch.randn(2, 4), _Scaled(3)
    stacked = tdag.from_torch_stacked(full, _Scaled, (x,), layers="layers")
    assert stacked == tdag.from_torch(full, (x,))
    weights = stacked.graph.weights
    for k in range(3):
        scale = weights[f"layers.{k}.scale"]
        assert scale.kind is TensorKind.const and torch.equal(scale.value, full.layers[k].scale)
    torch.testing.assert_close(tdag.run(stacked, x), full(x), rtol=1e-6, atol=1e-6)
    module = tdag.to_torch(stacked)
    module.load_state_dict(full.state_dict())   # strict: neither holds the scales
    assert set(module.state_dict()) == set(full.state_dict())


class _Aux(torch.nn.Module):
    """Each layer gives the rest of the model a second value (an auxiliary loss)."""

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            y = torch.tanh(self.linear(x))
            return y, (y * y).mean()

    def __init__(self, depth: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(self.Layer() for _ in range(depth))
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        aux = []
        for layer in self.layers:
            x, extra = layer(x)
            aux.append(extra)
        return self.head(x), torch.stack(aux).sum()


def test_a_layer_giving_two_values_is_refused():
    with pytest.raises(tdag.ConversionError, match="layers.0 gives 2 values"):
        tdag.from_torch_stacked(_Aux(3), _Aux, (torch.randn(2, 4),), layers="layers")


# -- refused by the two-layer check: what one layer cannot show ------------------------------------

class _Before(torch.nn.Module):
    """Code the loop runs before each layer, on its input: with one layer it looks like
    code before the loop."""

    def __init__(self, depth: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(depth))
        self.norm = torch.nn.LayerNorm(4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(self.norm(x))
        return self.head(x)


class _Reset(torch.nn.Module):
    """A value computed once and written into every layer's buffer (which the layer then
    updates): with one layer it looks like a write made per layer."""

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.register_buffer("seen", torch.zeros(4))

        def forward(self, x):
            y = self.linear(x) + self.seen
            self.seen.copy_(y.mean(0))
            return y

    def __init__(self, depth: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(self.Layer() for _ in range(depth))
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        start = x.mean(0)
        for layer in self.layers:
            layer.seen.copy_(start)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


class _Counted(_Before):
    """A constant that counts the layers: the probe's is 1."""

    def forward(self, x):
        x = x * len(self.layers)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


@pytest.mark.parametrize("model, first", [
    (_Before, r"two-layer export has %\w+ = \w+ \(aten.layer_norm @ norm\)"),
    (_Reset, r"the stack has %\w+ = \w+ \(aten.mean @ the top level\)"),
    (_Counted, r"constant %c0, read by .*aten.mul @ the top level.*1.0 in the stack, 2.0"),
], ids=["code-before-each-layer", "value-written-into-every-layer", "layer-count"])
def test_code_one_layer_cannot_show_is_refused(model, first):
    """Each is refused by the two-layer check, the first node where the programs part named;
    stacked unchecked, each is a program other than the full export (most of them ``==``
    tells apart; the count, its constant's value)."""
    x = torch.randn(2, 4)
    unchecked = Probe(model, "layers", (x,)).record(model(3)).stacked(model(3))
    full = tdag.from_torch(model(3), (x,))
    assert unchecked != full or not torch.equal(tdag.run(unchecked, x), tdag.run(full, x))
    with pytest.raises(tdag.ConversionError, match="stacked to two layers differs") as refusal:
        tdag.from_torch_stacked(model(3), model, (x,), layers="layers")
    assert re.search(first, str(refusal.value)), refusal.value
    assert "runs code per layer that a one-layer probe does not show" in str(refusal.value)
