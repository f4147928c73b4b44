"""onnxruntime's com.microsoft attention ops (onnx/ops/contrib_attention.py, contrib_gqa.py):
each a single node on random inputs against onnxruntime's CPU kernels (rtol 1e-4), through
tdag.run and through tdag.to_onnx (standard ONNX) on onnxruntime; then a tiny BERT that
onnxruntime's transformers optimizer fuses into EmbedLayerNormalization and Attention."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import tdag
from tdag.errors import UnsupportedOpError

from support.guards import reproduces, run_onnx

RNG = np.random.default_rng(20)
MS = "com.microsoft"
_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.int64): TensorProto.INT64}


def _r(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _model(op, inputs, outputs=1, int_outputs=(), **attrs):
    """One com.microsoft node over graph inputs ``inputs`` (name, array); None skips one;
    the outputs float32 but those ``int_outputs`` name (int32)."""
    names = [name if value is not None else "" for name, value in inputs]
    while names and not names[-1]:
        names.pop()
    node = helper.make_node(op, names, [f"y{i}" for i in range(outputs)], domain=MS,
                            name=f"{op.lower()}_0", **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, _TYPES[v.dtype], v.shape)
         for n, v in inputs if v is not None],
        [helper.make_tensor_value_info(
            f"y{i}", TensorProto.INT32 if i in int_outputs else TensorProto.FLOAT, None)
         for i in range(outputs)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model, [v for _, v in inputs if v is not None]


def _check(model, args, rtol=1e-4):
    """tdag.run and tdag.to_onnx (on onnxruntime) give onnxruntime's outputs."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {i.name: a for i, a in zip(session.get_inputs(), args)})
    reproduces(model, args, expected, lambda g, e, what: np.testing.assert_allclose(
        np.asarray(g), e, rtol=rtol, atol=rtol, err_msg=what))


def _lengths_mask(lengths, total):
    return (np.arange(total)[None, :] < np.array(lengths)[:, None]).astype(np.int32)


# -- Attention -------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask,attrs,past", [
    ("none", {}, False),
    ("raw", {}, False),
    ("raw", dict(unidirectional=1, mask_filter_value=-1e4), False),
    ("lengths", dict(scale=0.3), False),
    ("ends_starts", {}, False),
    ("raw3d", {}, False),
    ("none", dict(unidirectional=1), True),
    ("raw", dict(unidirectional=1), True),
    ("none", dict(qkv_hidden_sizes=[16, 16, 8]), False)])
def test_attention(mask, attrs, past):
    batch, seq, hidden, heads, past_len = 2, 5, 16, 2, 3 if past else 0
    total = seq + past_len
    sizes = attrs.get("qkv_hidden_sizes", [hidden] * 3)
    masks = {"none": None, "raw": _lengths_mask([total, total - 2], total),
             "lengths": np.array([seq, 3], np.int32),
             "ends_starts": np.array([seq, 4, 0, 1], np.int32),
             "raw3d": (RNG.random((batch, seq, total)) > 0.3).astype(np.int32)}
    inputs = [("x", _r(batch, seq, hidden)), ("w", _r(hidden, sum(sizes))),
              ("b", _r(sum(sizes))), ("mask", masks[mask]),
              ("past", _r(2, batch, heads, past_len, hidden // heads) if past else None)]
    _check(*_model("Attention", inputs, 2 if past else 1, num_heads=heads, **attrs))


def test_attention_bias_input():
    batch, seq, hidden, heads = 2, 4, 8, 2
    inputs = [("x", _r(batch, seq, hidden)), ("w", _r(hidden, 3 * hidden)), ("b", None),
              ("mask", None), ("past", None), ("attention_bias", _r(1, heads, seq, seq))]
    _check(*_model("Attention", inputs, num_heads=heads))


def test_attention_refuses_rotary():
    model, _ = _model("Attention", [("x", _r(1, 4, 8)), ("w", _r(8, 24))], num_heads=2,
                      do_rotary=1)
    with pytest.raises(UnsupportedOpError, match=r"Attention \(node 'attention_0', domain "
                                                 r"com.microsoft\): Attention: attribute "
                                                 r"do_rotary=1"):
        tdag.from_onnx(model)


# -- MultiHeadAttention ----------------------------------------------------------------------------

@pytest.mark.parametrize("layout,bias,mask,attrs,past", [
    ("separate", False, None, {}, False),
    ("separate", True, "raw", {}, False),
    ("separate", True, "lengths", dict(scale=0.2), False),
    ("separate", True, None, dict(unidirectional=1), True),
    ("separate", False, "raw", dict(mask_filter_value=-500.0), True),
    ("cache", False, None, {}, False)])
def test_multi_head_attention(layout, bias, mask, attrs, past):
    batch, seq, kv, heads, size = 2, 4, 4, 2, 4
    hidden, past_len = heads * size, 3 if past else 0
    total = kv + past_len
    query, key, value = _r(batch, seq, hidden), _r(batch, kv, hidden), _r(batch, kv, hidden)
    if layout == "cache":
        key, value = _r(batch, heads, kv, size), _r(batch, heads, kv, size)
    masks = {None: None, "raw": _lengths_mask([total, total - 1], total),
             "lengths": np.array([total, 2], np.int32)}
    inputs = [("q", query), ("k", key), ("v", value), ("bias", _r(3 * hidden) if bias else None),
              ("mask", masks[mask]), ("attention_bias", None),
              ("past_key", _r(batch, heads, past_len, size) if past else None),
              ("past_value", _r(batch, heads, past_len, size) if past else None)]
    _check(*_model("MultiHeadAttention", inputs, 3 if past else 1, num_heads=heads, **attrs))


@pytest.mark.parametrize("query,key", [((2, 4, 2, 3, 4), None), ((2, 4, 8), (2, 4, 2, 2, 4))])
def test_multi_head_attention_refuses_packed(query, key):
    """Packed QKV and packed KV: onnxruntime's CPU kernel refuses them, so tdag has no
    oracle to check them against and refuses them too."""
    model, _ = _model("MultiHeadAttention", [("q", _r(*query)),
                                             ("k", _r(*key) if key else None)], num_heads=2)
    with pytest.raises(UnsupportedOpError, match="MultiHeadAttention: packed"):
        tdag.from_onnx(model)


def test_multi_head_cross_attention_with_bias():
    batch, seq, kv, heads, size = 2, 3, 6, 2, 4
    inputs = [("q", _r(batch, seq, heads * size)), ("k", _r(batch, kv, heads * size)),
              ("v", _r(batch, kv, heads * size)), ("bias", _r(3 * heads * size)),
              ("mask", None), ("attention_bias", _r(batch, heads, seq, kv))]
    _check(*_model("MultiHeadAttention", inputs, num_heads=heads))


# -- EmbedLayerNormalization -----------------------------------------------------------------------

@pytest.mark.parametrize("segments,mask,position_ids,outputs", [
    (True, True, False, 2), (False, False, False, 2), (True, True, True, 3),
    (False, True, False, 3)])
def test_embed_layer_norm(segments, mask, position_ids, outputs):
    batch, seq, hidden, vocab = 2, 5, 8, 11
    inputs = [("ids", RNG.integers(0, vocab, (batch, seq)).astype(np.int32)),
              ("segment_ids", RNG.integers(0, 2, (batch, seq)).astype(np.int32)
               if segments else None),
              ("word", _r(vocab, hidden)), ("position", _r(7, hidden)),
              ("segment", _r(2, hidden) if segments else None),
              ("gamma", _r(hidden)), ("beta", _r(hidden)),
              ("mask", _lengths_mask([5, 3], seq) if mask else None),
              ("position_ids", RNG.integers(0, 7, (batch, seq)).astype(np.int32)
               if position_ids else None)]
    _check(*_model("EmbedLayerNormalization", inputs, outputs, int_outputs=(1,), epsilon=1e-5))


# -- RotaryEmbedding -------------------------------------------------------------------------------

@pytest.mark.parametrize("rank,interleaved,offset,dim", [
    (3, 0, False, 0), (3, 1, True, 0), (4, 0, True, 0), (4, 1, False, 0), (3, 0, False, 4)])
def test_rotary_embedding(rank, interleaved, offset, dim):
    batch, seq, heads, size = 2, 5, 2, 8
    rot = dim or size
    x = _r(batch, seq, heads * size) if rank == 3 else _r(batch, heads, seq, size)
    ids = np.array([2], np.int64) if offset else \
        RNG.integers(0, 10, (batch, seq)).astype(np.int64)
    inputs = [("x", x), ("ids", ids), ("cos", _r(12, rot // 2)), ("sin", _r(12, rot // 2))]
    attrs = dict(interleaved=interleaved, num_heads=heads)
    if dim:
        attrs["rotary_embedding_dim"] = dim
    _check(*_model("RotaryEmbedding", inputs, **attrs))


# -- GroupQueryAttention ---------------------------------------------------------------------------

@pytest.mark.parametrize("batch,past_len,seq,attrs,packed", [
    (2, 0, 5, {}, False),
    (2, 0, 5, dict(local_window_size=2, softcap=2.0), True),
    (2, 4, 1, {}, False),
    (1, 4, 2, dict(scale=0.3, local_window_size=3), False),
    (2, 0, 5, dict(do_rotary=1), False),
    (2, 4, 1, dict(do_rotary=1, rotary_interleaved=1), True)])
def test_group_query_attention(batch, past_len, seq, attrs, packed):
    """(onnxruntime's CPU kernel takes a batch of one where a step of several tokens follows
    a past, and head sizes that are multiples of 16 with rotary)."""
    heads, kv_heads, size = 4, 2, 16
    total = past_len + seq
    q, k, v = _r(batch, seq, heads * size), _r(batch, seq, kv_heads * size), \
        _r(batch, seq, kv_heads * size)
    if packed:
        q, k, v = np.concatenate([q, k, v], 2), None, None
    rotary = attrs.get("do_rotary")
    inputs = [("q", q), ("k", k), ("v", v),
              ("past_key", _r(batch, kv_heads, past_len, size)),
              ("past_value", _r(batch, kv_heads, past_len, size)),
              ("seqlens_k", np.full((batch,), total - 1, np.int32)),
              ("total", np.array(total, np.int32)),
              ("cos", _r(16, size // 2) if rotary else None),
              ("sin", _r(16, size // 2) if rotary else None)]
    _check(*_model("GroupQueryAttention", inputs, 3, num_heads=heads, kv_num_heads=kv_heads,
                   **attrs))


def test_group_query_attention_rows_of_different_lengths():
    """Row 1's cache holds 2 of its 4 past positions: its new keys go at position 2."""
    batch, heads, kv_heads, size, past_len = 2, 2, 1, 8, 4
    inputs = [("q", _r(batch, 1, heads * size)), ("k", _r(batch, 1, kv_heads * size)),
              ("v", _r(batch, 1, kv_heads * size)),
              ("past_key", _r(batch, kv_heads, past_len, size)),
              ("past_value", _r(batch, kv_heads, past_len, size)),
              ("seqlens_k", np.array([4, 2], np.int32)), ("total", np.array(5, np.int32))]
    _check(*_model("GroupQueryAttention", inputs, 3, num_heads=heads, kv_num_heads=kv_heads))


# -- a real file: onnxruntime's transformers optimizer on a tiny BERT ------------------------------

def test_optimised_tiny_bert_attention(tmp_path):
    """A one-layer BERT (eager attention) exported by torch.onnx (legacy, opset 17, dynamic
    batch and sequence) and optimised by onnxruntime's transformers optimizer, which fuses
    EmbedLayerNormalization and Attention (with its raw 0/1 mask): tdag.run and to_onnx on the
    optimised file match onnxruntime on the original file, a padded batch of two."""
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model

    torch.manual_seed(20)
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=64,
                                     max_position_embeddings=16, attn_implementation="eager")
    bert = transformers.BertModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask, segments):
            return self.bert(input_ids=ids, attention_mask=mask,
                             token_type_ids=segments).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    ids = torch.randint(0, 64, (2, 8))
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    segments = torch.tensor([[0] * 4 + [1] * 4] * 2)
    torch.onnx.export(Hidden(), (ids, mask, segments), tmp_path / "bert.onnx", dynamo=False,
                      input_names=names, opset_version=17,
                      dynamic_axes={n: {0: "batch", 1: "seq"} for n in names})
    optimised = optimize_model(str(tmp_path / "bert.onnx"), model_type="bert", num_heads=2,
                               hidden_size=32)
    assert {n.op_type for n in optimised.model.graph.node if n.domain == MS} >= {
        "EmbedLayerNormalization", "Attention"}
    optimised.save_model_to_file(str(tmp_path / "opt.onnx"))
    feeds = dict(zip(names, (ids.numpy(), mask.numpy(), segments.numpy())))
    session = ort.InferenceSession(str(tmp_path / "bert.onnx"),
                                   providers=["CPUExecutionProvider"])
    expected = session.run(None, feeds)[0]
    prog = tdag.from_onnx(str(tmp_path / "opt.onnx"))
    for what, got in (("tdag.run", tdag.run(prog, ids, mask, segments)),
                      ("to_onnx", run_onnx(tdag.to_onnx(prog), ids, mask, segments))):
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4,
                                   err_msg=what)
