"""Mixture-of-experts models: transformers' Mixtral and Qwen2-MoE (small configs, random
weights) in each experts implementation, through from_torch, run, to_torch, to_onnx and
to_jax; and the cost of the experts the tokens run (top-k of n), not of every expert.

``grouped_mm`` (the default) runs the custom op ``transformers::grouped_mm_fallback`` in
float32 under torch.export (``torch._grouped_mm`` in bf16); ``eager`` loops over the experts
a batch hits, which torch.export cannot trace, so capture runs it as ``grouped_mm``;
``batched_mm`` gathers each routed row's expert weights.
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers

from support.guards import run_onnx
from support.hf_encoders import LastHidden
from support.torch_models import Fn

import tdag
from tdag import ops

TOKENS, TOP_K, EXPERTS, HIDDEN = 14, 2, 4, 32   # 2 x 7 ids
EXPERT_HIDDEN = {"mixtral": 64, "qwen2_moe": 16}  # each expert's intermediate size


def _config(kind: str, impl: str):
    common = dict(hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=TOP_K, vocab_size=100,
                  max_position_embeddings=64, use_cache=False)
    if kind == "mixtral":
        config = transformers.MixtralConfig(intermediate_size=64, num_local_experts=EXPERTS,
                                            **common)
    else:
        config = transformers.Qwen2MoeConfig(intermediate_size=64, moe_intermediate_size=16,
                                             shared_expert_intermediate_size=32,
                                             num_experts=EXPERTS, **common)
    config._experts_implementation = impl
    return config


@functools.lru_cache(maxsize=None)
def _captured(kind: str, impl: str):
    """(model, ids, eager logits, Program), built once per kind and implementation."""
    torch.manual_seed(0)
    make = transformers.MixtralForCausalLM if kind == "mixtral" else \
        transformers.Qwen2MoeForCausalLM
    model = make(_config(kind, impl)).eval()
    ids = torch.randint(0, 100, (2, TOKENS // 2))
    with torch.no_grad():
        logits = model(ids).logits
    return model, ids, logits, tdag.from_torch(model, (ids,))


# Qwen2-MoE's experts dispatch as Mixtral's do: its other implementations are a slow sweep
SLOW = pytest.mark.slow


@pytest.mark.parametrize("kind, impl", [
    ("mixtral", "grouped_mm"), ("mixtral", "eager"), ("mixtral", "batched_mm"),
    ("qwen2_moe", "grouped_mm"), pytest.param("qwen2_moe", "eager", marks=SLOW),
    pytest.param("qwen2_moe", "batched_mm", marks=SLOW)])
def test_capture_matches_eager(kind, impl):
    model, ids, logits, prog = _captured(kind, impl)
    torch.testing.assert_close(tdag.run(prog, ids), logits, rtol=0, atol=1e-5)
    assert model.config._experts_implementation == impl  # capture leaves the model as it was


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_backends(kind):
    _, ids, logits, prog = _captured(kind, "grouped_mm")
    torch.testing.assert_close(tdag.to_torch(prog)(ids), logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(run_onnx(tdag.to_onnx(prog), ids), logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_lowers_to_grouped_mm(kind):
    """Each layer's up-and-gate and down projections are grouped_mm kernels: no expert
    matrix is gathered per routed row (a 3-d gather)."""
    low = tdag.lower.lower(_captured(kind, "grouped_mm")[3])
    assert [n.op for n in low.graph.nodes].count(tdag.Op.grouped_mm) == 2 * 2  # 2 layers
    assert not [n for n in low.graph.nodes if n.op is tdag.Op.gather and n.type.rank == 3
                and n.origin.scope.endswith("experts")]


@pytest.mark.parametrize("kind", ["mixtral", pytest.param("qwen2_moe", marks=SLOW)])
def test_to_jax(kind):
    pytest.importorskip("jax")
    _, ids, logits, prog = _captured(kind, "grouped_mm")
    got = np.asarray(tdag.to_jax(prog)(ids.numpy()))
    np.testing.assert_allclose(got, logits.numpy(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("kind, impl", [
    ("mixtral", "grouped_mm"), ("mixtral", "batched_mm"), ("qwen2_moe", "grouped_mm"),
    pytest.param("qwen2_moe", "batched_mm", marks=SLOW)])
def test_cost_counts_routed_experts(kind, impl):
    """The experts' matmul flops are those of the TOP_K experts each token runs: TOP_K /
    EXPERTS of the dense count (every token through every expert's up-and-gate and down
    projections); the router's own matmul is its own scope."""
    report = tdag.cost(_captured(kind, impl)[3])
    mlp = "model.layers.0.mlp"
    inner = EXPERT_HIDDEN[kind]
    dense = 2 * TOKENS * EXPERTS * (HIDDEN * 2 * inner + inner * HIDDEN)
    routed = report.per_scope[f"{mlp}.experts"].matmul_flops
    assert routed == dense * TOP_K // EXPERTS == {"mixtral": 344064, "qwen2_moe": 86016}[kind]
    assert report.per_scope[f"{mlp}.gate"].matmul_flops == 2 * TOKENS * HIDDEN * EXPERTS


def _fallback(x, weight, offsets):
    return torch.ops.transformers.grouped_mm_fallback(x, weight, offsets)


@pytest.mark.parametrize("offsets", [[2, 2, 6], [0, 3, 5], [6, 6, 6], [0, 0, 0], [1, 4, 4]])
def test_grouped_matmul_matches_fallback(offsets):
    """Empty groups, one group holding every row, and rows past the last offset (zero)."""
    torch.manual_seed(0)
    x, weight = torch.randn(6, 4), torch.randn(3, 4, 5)
    offs = torch.tensor(offsets, dtype=torch.int32)
    prog = tdag.trace(ops.grouped_matmul, tdag.TensorSpec((6, 4)), tdag.TensorSpec((3, 4, 5)),
                      tdag.TensorSpec((3,), "int32"))
    torch.testing.assert_close(tdag.run(prog, x, weight, offs), _fallback(x, weight, offs))
    assert tdag.cost(prog).matmul_flops == 2 * 6 * 4 * 5  # each row by its own expert only


def test_aten_grouped_mm_bf16():
    """torch's own grouped matmul (bf16: the only dtype torch.export traces it in)."""
    torch.manual_seed(0)
    x, weight = torch.randn(10, 16).bfloat16(), torch.randn(3, 16, 8).bfloat16()
    offs = torch.tensor([4, 4, 10], dtype=torch.int32)
    module = Fn(lambda a, w, o: F.grouped_mm(a, w, offs=o)).eval()
    prog = tdag.from_torch(module, (x, weight, offs))
    want = torch.cat([x[:4] @ weight[0], x[4:] @ weight[2]]).float()
    torch.testing.assert_close(tdag.run(prog, x, weight, offs).float(), want,
                               rtol=2e-2, atol=2e-2)


def test_aten_grouped_mm_refuses_other_forms():
    module = Fn(lambda a, w: F.grouped_mm(a, w)).eval()
    x, weight = torch.randn(2, 8, 16).bfloat16(), torch.randn(2, 16, 8).bfloat16()
    with pytest.raises(tdag.errors.UnsupportedOpError, match="only the routed form"):
        tdag.from_torch(module, (x, weight))


def test_dbrx_experts_capture_as_grouped_matmuls():
    """DBRX's experts loop over the experts a batch hits with no implementation switch:
    capture runs them grouped over its own w1, v1 and w2, so one trace serves any routing
    (ids routed otherwise than the example's), and the module keeps its own forward."""
    torch.manual_seed(0)
    config = transformers.DbrxConfig(
        d_model=HIDDEN, n_heads=4, n_layers=2, max_seq_len=64, vocab_size=100,
        attn_config=dict(kv_n_heads=2, rope_theta=10000, clip_qkv=8.0),
        ffn_config=dict(ffn_hidden_size=48, moe_num_experts=EXPERTS, moe_top_k=TOP_K),
        use_cache=False)
    model = transformers.DbrxForCausalLM(config).eval()
    ids = torch.randint(0, 100, (2, TOKENS // 2))
    prog = tdag.from_torch(model, (ids,))
    experts = model.transformer.blocks[0].ffn.experts
    assert "forward" not in vars(experts)
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes].count(tdag.Op.grouped_mm) == 3 * 2  # 2 layers
    module = tdag.to_torch(prog)
    for seed in range(3):
        other = torch.randint(0, 100, (2, TOKENS // 2),
                              generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = model(other).logits
        torch.testing.assert_close(tdag.run(prog, other), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(module(other), want, rtol=0, atol=1e-5)
    torch.testing.assert_close(run_onnx(tdag.to_onnx(prog), ids), model(ids).logits.detach(),
                               rtol=0, atol=1e-4)


def test_switch_experts_capture_with_the_rows_each_expert_takes():
    """Switch Transformers' experts are separate modules looping over the experts hit, and
    its router moves its classifier to its dtype on every call: capture loops over every
    expert on the rows routed to it (a size data decides), so one trace serves any routing,
    tokens past an expert's capacity included; the cost is in those sizes."""
    torch.manual_seed(0)
    config = transformers.SwitchTransformersConfig(
        vocab_size=100, d_model=HIDDEN, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
        num_experts=EXPERTS, expert_capacity=3, num_sparse_encoder_layers=1,
        num_sparse_decoder_layers=1)
    model = LastHidden(transformers.SwitchTransformersEncoderModel(config)).eval()
    ids, mask = torch.randint(0, 100, (2, TOKENS // 2)), torch.ones(2, TOKENS // 2)
    prog = tdag.from_torch(model, (ids, mask))
    sparse = next(m for m in model.modules() if type(m).__name__ == "SwitchTransformersSparseMLP")
    assert "forward" not in vars(sparse.experts) and "to" not in vars(sparse.router.classifier)
    module = tdag.to_torch(prog)
    for seed in range(3):
        other = torch.randint(0, 100, (2, TOKENS // 2),
                              generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = model(other, mask)
        torch.testing.assert_close(tdag.run(prog, other, mask), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(module(other, mask), want, rtol=0, atol=1e-5)
    with torch.no_grad():
        want = model(ids, mask)
    torch.testing.assert_close(run_onnx(tdag.to_onnx(prog), ids, mask), want, rtol=0,
                               atol=1e-4)
    experts = tdag.cost(prog).flops.free_symbols
    assert len(experts) == EXPERTS  # one sparse layer: a row count per expert
    assert tdag.memory(prog).peak.free_symbols <= experts
