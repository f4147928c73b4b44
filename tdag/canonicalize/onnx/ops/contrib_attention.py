"""The ONNX op table, onnxruntime's com.microsoft attention ops: Attention (packed Q/K/V
weights), MultiHeadAttention, EmbedLayerNormalization, GroupQueryAttention and
RotaryEmbedding. Each is a composition of tdag ops written after onnxruntime's CPU kernels
(onnxruntime/contrib_ops/cpu/bert/) and checked against them; the scores are one
(queries x keys) matmul per head, as the kernels compute them. ``ATTENTION_OPS`` names those
mapped (contrib.CONTRIB_OPS admits them). Attention and RotaryEmbedding share their names
with default-domain ops of other signatures: they are registered as
``com.microsoft:Attention`` and ``com.microsoft:RotaryEmbedding`` (table.table_key)."""
from __future__ import annotations

import math

from tdag import ops
from tdag.canonicalize.onnx.ops.attention import rotate_pairs
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

ATTENTION_OPS: tuple[str, ...] = ("Attention", "MultiHeadAttention", "EmbedLayerNormalization",
                                  "GroupQueryAttention", "RotaryEmbedding")

_MASK_FILTER = -10000.0  # onnxruntime's default mask_filter_value
_INF = float("inf")


def _refuse(ctx, **defaults):
    """UnsupportedOpError for an attribute set away from the value tdag maps."""
    for name, default in defaults.items():
        value = ctx.attr(name, default)
        if value != default:
            raise UnsupportedOpError(f"{ctx.node.op_type}: attribute {name}={value!r} (tdag "
                                     f"maps {name}={default!r} only)")


def _refuse_inputs(ctx, **inputs):
    for name, value in inputs.items():
        if value is not None:
            raise UnsupportedOpError(f"{ctx.node.op_type}: input {name} is not mapped")


def _split_heads(x, heads: int):
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    return ops.permute(ops.ungroup(x, 2, (heads, -1)), 0, 2, 1, 3)


def _merge_heads(y):
    """(batch, heads, seq, size) -> (batch, seq, heads * size)."""
    return ops.group(ops.permute(y, 0, 2, 1, 3), 2, 2)


def _scale(ctx, head_size) -> float:
    """``scale``, where absent or 0 the kernels' 1/sqrt(head_size)."""
    scale = ctx.attr("scale", 0.0)
    if scale:
        return scale
    if not is_static(head_size):
        raise UnsupportedOpError(f"{ctx.node.op_type}: default scale of a symbolic head size")
    return 1.0 / math.sqrt(head_size)


def _same(a, b) -> bool:
    return a is b or is_static(a) and is_static(b) and a == b


# -- masks -----------------------------------------------------------------------------------------

def _padding_bias(ctx, mask, batch, keys, like):
    """The additive mask of ``mask_index`` / ``key_padding_mask`` in the forms onnxruntime's
    CPU kernels read (attention_helper.h PrepareMask): raw 0/1 (batch, total) or (batch,
    queries, total), key lengths (batch), or end then start positions (2 * batch); a masked key
    gets ``mask_filter_value`` added, not -inf. (batch, 1, queries or 1, total), or None."""
    if mask is None:
        return None
    mask = ctx.tensor(mask)
    filler = ctx.attr("mask_filter_value", _MASK_FILTER)
    cols = ops.reshape(ops.iota(keys), (1, -1))
    if mask.ndim == 2:
        keep = ops.unsqueeze(ops.gt(mask, 0), 1)
    elif mask.ndim == 3:
        keep = ops.gt(mask, 0)
    elif mask.ndim == 1 and _same(mask.shape[0], batch):
        keep = ops.unsqueeze(ops.lt(cols, ops.unsqueeze(ops.cast(mask, DType.i64), 1)), 1)
    elif mask.ndim == 1 and is_static(batch) and _same(mask.shape[0], 2 * batch):
        ends, starts = ops.split(ops.cast(mask, DType.i64), [batch, batch], 0)
        keep = ops.logical_and(ops.lt(cols, ops.unsqueeze(ends, 1)),
                               ops.ge(cols, ops.unsqueeze(starts, 1)))
        keep = ops.unsqueeze(keep, 1)
    else:
        raise UnsupportedOpError(f"{ctx.node.op_type}: mask of shape {list(mask.shape)} "
                                 f"(tdag maps (batch, total), (batch, seq, total), (batch) and "
                                 f"(2 * batch))")
    if not _same(keep.shape[-1], keys):
        raise UnsupportedOpError(f"{ctx.node.op_type}: mask of {keep.shape[-1]} keys for "
                                 f"{keys} keys")
    zero = ops.zeros((), like.dtype, like=like)
    return ops.unsqueeze(ops.where(keep, zero, ops.full((), filler, like.dtype, like=like)), 1)


def _causal(bias, queries, keys, past, like):
    """``bias`` where key j <= past + query i, -inf elsewhere (the kernels' unidirectional
    mask; the diagonal always stays, so no row is all -inf)."""
    rows = ops.reshape(ops.add(ops.iota(queries), past), (-1, 1))
    keep = ops.le(ops.reshape(ops.iota(keys), (1, -1)), rows)
    if bias is None:
        bias = ops.zeros((), like.dtype, like=like)
    return ops.where(keep, bias, ops.full((), -_INF, like.dtype, like=like))


def _add(a, b):
    return b if a is None else a if b is None else ops.add(a, b)


def _attend(q, k, v, scale, bias):
    """softmax(q k^T * scale + bias) v over (batch, heads, seq, size), kv heads repeated for
    the query heads they serve."""
    return ops.scaled_dot_product_attention(q, k, v, bias, scale=scale,
                                            enable_gqa=not _same(q.shape[1], k.shape[1]))


# -- Attention -------------------------------------------------------------------------------------

@register("com.microsoft:Attention")
def _attention(ctx, x, weights, bias=None, mask_index=None, past=None, attention_bias=None,
               past_sequence_length=None):
    """Self-attention from one packed Q/K/V projection (qkv_hidden_sizes where V's differs);
    outputs the attention and ``present`` (2, batch, heads, total, head_size): the past's keys
    and values, then this step's."""
    _refuse(ctx, do_rotary=0, past_present_share_buffer=0)
    _refuse_inputs(ctx, past_sequence_length=past_sequence_length)
    heads = ctx.attr("num_heads")
    x, weights = ctx.tensor(x), ctx.tensor(weights)
    sizes = list(ctx.attr("qkv_hidden_sizes") or [])
    if not sizes:
        if not is_static(weights.shape[1]) or weights.shape[1] % 3:
            raise InvalidModelError(f"Attention: weights of shape {list(weights.shape)} do "
                                    f"not split in three")
        sizes = [weights.shape[1] // 3] * 3
    qkv = ops.matmul(x, weights)
    if bias is not None:
        qkv = ops.add(qkv, ctx.tensor(bias))
    q, k, v = (_split_heads(t, heads) for t in ops.split(qkv, sizes, 2))
    past_len = 0
    if past is not None:
        past = ctx.tensor(past)
        past_len = past.shape[3]
        k = ops.concat([ops.select(past, 0, 0), k], 2)
        v = ops.concat([ops.select(past, 0, 1), v], 2)
    mask = _padding_bias(ctx, mask_index, x.shape[0], k.shape[2], q)
    if ctx.flag("unidirectional", 0):
        mask = _causal(mask, q.shape[2], k.shape[2], past_len, q)
    if attention_bias is not None:
        mask = _add(mask, ctx.tensor(attention_bias))
    y = _merge_heads(_attend(q, k, v, _scale(ctx, q.shape[3]), mask))
    if ctx.num_outputs < 2:
        return y
    if not _same(k.shape[3], v.shape[3]):
        raise UnsupportedOpError("Attention: output present with qkv_hidden_sizes that give "
                                 "K and V different head sizes")
    return y, ops.stack([k, v], 0)


# -- MultiHeadAttention ----------------------------------------------------------------------------

def _mha_qkv(ctx, query, key, value, bias, heads):
    """(q, k, v) as (batch, heads, seq, size) and whether k/v may take a past: query (batch,
    seq, hidden), key and value (batch, kv, hidden) with the bias added to each projection,
    or already (batch, heads, kv, size), a cross-attention cache the bias skips. Packed QKV
    and packed KV are refused, as onnxruntime's CPU kernel refuses them: no oracle checks
    them."""
    query = ctx.tensor(query)
    if query.ndim != 3 or key is None or value is None:
        raise UnsupportedOpError(f"MultiHeadAttention: packed QKV or KV (query of rank "
                                 f"{query.ndim}, {'no ' if value is None else ''}value) is "
                                 f"not mapped")
    hidden, key, value = query.shape[2], ctx.tensor(key), ctx.tensor(value)
    if bias is not None:
        bias = ctx.tensor(bias)
        parts = ops.split(bias, [hidden, hidden, bias.shape[0] - 2 * hidden], 0)
        query = ops.add(query, parts[0])
        if key.ndim == 3:
            key, value = ops.add(key, parts[1]), ops.add(value, parts[2])
    q = _split_heads(query, heads)
    if key.ndim == 4:
        return q, key, value, False
    return q, _split_heads(key, heads), _split_heads(value, heads), True


@register("MultiHeadAttention")
def _multi_head_attention(ctx, query, key=None, value=None, bias=None, key_padding_mask=None,
                          attention_bias=None, past_key=None, past_value=None,
                          past_sequence_length=None, cache_indirection=None):
    """Attention of projected Q/K/V in any of onnxruntime's layouts; outputs the attention,
    present_key and present_value (the past, then this step's keys and values)."""
    _refuse_inputs(ctx, past_sequence_length=past_sequence_length,
                   cache_indirection=cache_indirection)
    if ctx.num_outputs > 3:
        raise UnsupportedOpError("MultiHeadAttention: output qk is not mapped")
    heads = ctx.attr("num_heads")
    q, k, v, may_past = _mha_qkv(ctx, query, key, value, bias, heads)
    if (past_key is None) != (past_value is None):
        raise InvalidModelError("MultiHeadAttention: past_key and past_value go together")
    past_len = 0
    if past_key is not None:
        if not may_past:
            raise UnsupportedOpError("MultiHeadAttention: a past with a (batch, heads, kv, "
                                     "size) key")
        past_key = ctx.tensor(past_key)
        past_len = past_key.shape[2]
        k = ops.concat([past_key, k], 2)
        v = ops.concat([ctx.tensor(past_value), v], 2)
    mask = _padding_bias(ctx, key_padding_mask, q.shape[0], k.shape[2], q)
    if ctx.flag("unidirectional", 0):
        mask = _causal(mask, q.shape[2], k.shape[2], past_len, q)
    if attention_bias is not None:
        mask = _add(mask, ctx.tensor(attention_bias))
    y = _merge_heads(_attend(q, k, v, _scale(ctx, q.shape[3]), mask))
    return (y, k, v)[:max(ctx.num_outputs, 1)]


# -- EmbedLayerNormalization -----------------------------------------------------------------------

@register("EmbedLayerNormalization")
def _embed_layer_norm(ctx, input_ids, segment_ids, word, position, segment, gamma, beta,
                      mask=None, position_ids=None):
    """LayerNorm(word[ids] + position[position_ids or 0..seq-1] + segment[segment_ids]);
    outputs it, mask_index (int32, per row the count of mask entries equal to 1, zeros
    without a mask) and the embedding sum before the norm."""
    if ctx.attr("mask_index_type", 1) != 1:
        raise UnsupportedOpError(f"EmbedLayerNormalization: attribute mask_index_type="
                                 f"{ctx.attr('mask_index_type')!r} (tdag maps 1 only)")
    ids = ops.cast(ctx.tensor(input_ids), DType.i64)
    total = ops.gather(ctx.tensor(word), ids, 0)
    if position_ids is None:
        positions = ops.iota(ids.shape[1])
    else:
        positions = ops.cast(ctx.tensor(position_ids), DType.i64)
    total = ops.add(total, ops.gather(ctx.tensor(position), positions, 0))
    if segment_ids is not None and segment is not None:
        segments = ops.cast(ctx.tensor(segment_ids), DType.i64)
        total = ops.add(total, ops.gather(ctx.tensor(segment), segments, 0))
    y = ops.layer_norm(total, [total.shape[2]], ctx.tensor(gamma), ctx.tensor(beta),
                       ctx.attr("epsilon", 1e-12))
    if mask is None:
        mask_index = ops.zeros((ids.shape[0],), DType.i32, like=total)
    else:
        ones = ops.cast(ops.eq(ops.cast(ctx.tensor(mask), DType.i64), 1), DType.i32)
        mask_index = ops.cast(ops.sum(ones, 1), DType.i32)
    return (y, mask_index, total)[:max(ctx.num_outputs, 1)]


# -- RotaryEmbedding -------------------------------------------------------------------------------

def _positions(ids, seq):
    """(batch or 1, seq) positions: a (1) position_ids is the first position's offset."""
    ids = ops.cast(ids, DType.i64)
    if ids.ndim == 1:
        return ops.unsqueeze(ops.add(ops.iota(seq), ids), 0)
    return ids


@register("com.microsoft:RotaryEmbedding")
def _rotary_embedding(ctx, x, position_ids, cos, sin):
    """Rotary embedding of (batch, seq, hidden) or (batch, heads, seq, size) input, position_ids
    an offset (1) or (batch, seq), the caches (max_position, rotary_dim / 2)."""
    _refuse(ctx, is_packed_batching=0)
    x, cos, sin = ctx.tensor(x), ctx.tensor(cos), ctx.tensor(sin)
    dim = ctx.attr("rotary_embedding_dim", 0) or 2 * cos.shape[1]
    if x.ndim == 4:
        rows = ops.permute(x, 0, 2, 1, 3)
    elif x.ndim == 3:
        heads = ctx.attr("num_heads", 0)
        rows = ops.ungroup(x, 2, (heads, -1)) if heads else ops.ungroup(x, 2, (-1, dim))
    else:
        raise InvalidModelError(f"RotaryEmbedding: input of rank {x.ndim}")
    ids = _positions(ctx.tensor(position_ids), rows.shape[1])
    cos, sin = (ops.unsqueeze(ops.gather(c, ids, 0), 2) for c in (cos, sin))
    rotated = rotate_pairs(rows, cos, sin, dim, ctx.flag("interleaved", 0))
    if x.ndim == 3:
        return ops.group(rotated, 2, 2)
    return ops.permute(rotated, 0, 2, 1, 3)
