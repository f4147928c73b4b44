"""The ONNX op table, onnxruntime's com.microsoft GroupQueryAttention (what onnxruntime-genai's
model builder writes for every decoder layer): causal attention of ``num_heads`` query heads
over ``kv_num_heads`` key/value heads, with its KV cache placed per row as the CPU kernel
places it (onnxruntime/contrib_ops/cpu/bert/gqa_attention_base.h), an optional rotary
embedding, a local window and a softcap. Listed in contrib_attention.ATTENTION_OPS."""
from __future__ import annotations

import math

from tdag import ops
from tdag.canonicalize.onnx.ops.attention import rotate_pairs
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

_INF = float("inf")


def _as_value(dim):
    """A size as an operand: the int, or an i64 scalar tensor of a symbolic size."""
    return dim if is_static(dim) else ops.dim_tensor(dim)


def _size_tensor(dim, like):
    """A size as an i64 scalar tensor."""
    return ops.add(ops.zeros((), DType.i64, like=like), _as_value(dim))


def _past_lengths(ctx, seqlens_k, total, seq):
    """Per row, where this step's keys go: 0 on the first prompt (seq > 1 and seq equal to
    total_sequence_length), else seqlens_k + 1 - seq (seqlens_k is the last valid position)."""
    if seqlens_k is None or total is None:
        raise InvalidModelError("GroupQueryAttention: seqlens_k and total_sequence_length are "
                                "required")
    seqlens = ops.cast(ctx.tensor(seqlens_k), DType.i64)
    total = ops.reshape(ops.cast(ctx.tensor(total), DType.i64), ())
    steps = ops.sub(ops.add(seqlens, 1), _as_value(seq))
    length = _size_tensor(seq, seqlens)
    first = ops.logical_and(ops.eq(length, total), ops.gt(length, 1))
    return ops.where(first, ops.zeros((), DType.i64, like=seqlens), steps)


def _place(past, new, past_len):
    """present (batch, kv_heads, P + S, size): row b holds the first past_len[b] positions of
    the past, then this step's S, then zeros, as the kernel writes its present buffer."""
    keys, stored = past.shape[2], ops.concat([past, new], 2)
    total = stored.shape[2]
    cols = ops.reshape(ops.iota(total), (1, -1))
    start = ops.unsqueeze(past_len, 1)
    index = ops.where(ops.lt(cols, start), cols, ops.add(ops.sub(cols, start), _as_value(keys)))
    index = ops.minimum(index, ops.sub(_size_tensor(total, index), 1))
    rows = ops.mul(ops.reshape(ops.iota(stored.shape[0]), (-1, 1)), _as_value(total))
    flat = ops.group(ops.permute(stored, 0, 2, 1, 3), 0, 2)           # (batch * T, heads, size)
    placed = ops.gather(flat, ops.add(rows, index), 0)                 # (batch, T, heads, size)
    valid = ops.reshape(ops.lt(cols, ops.add(start, _as_value(new.shape[2]))), (-1, total, 1, 1))
    placed = ops.where(valid, placed, ops.zeros((), placed.dtype, like=placed))
    return ops.permute(placed, 0, 2, 1, 3)


def _keep(ctx, rows, keys):
    """(batch, 1, seq, keys) bool: key j is visible to query i (at position rows[b, i]) when
    j <= rows[b, i] and, with local_window_size w > 0, j > rows[b, i] - w (the w last
    positions, the query's own included)."""
    cols = ops.reshape(ops.iota(keys), (1, 1, -1))
    at = ops.unsqueeze(rows, 2)
    keep = ops.le(cols, at)
    window = ctx.attr("local_window_size", -1)
    if window > 0:
        keep = ops.logical_and(keep, ops.gt(cols, ops.sub(at, window)))
    return ops.unsqueeze(keep, 1)


def _rotary(ctx, q, k, rows, cos, sin, position_ids):
    """q and k (batch, seq, heads, size) rotated at position_ids, or at each row's positions."""
    if cos is None or sin is None:
        raise InvalidModelError("GroupQueryAttention: do_rotary needs cos_cache and sin_cache")
    ids = rows if position_ids is None else ops.cast(ctx.tensor(position_ids), DType.i64)
    cos, sin = (ops.unsqueeze(ops.gather(ctx.tensor(c), ids, 0), 2) for c in (cos, sin))
    dim = 2 * cos.shape[-1]
    interleaved = ctx.flag("rotary_interleaved", 0)
    return (rotate_pairs(q, cos, sin, dim, interleaved),
            rotate_pairs(k, cos, sin, dim, interleaved))


def _split_packed(query, heads, kv_heads):
    """(q, k, v) of a packed (batch, seq, (heads + 2 kv_heads) size) query."""
    hidden = query.shape[2]
    if not is_static(hidden) or hidden % (heads + 2 * kv_heads):
        raise InvalidModelError(f"GroupQueryAttention: packed QKV of {hidden} features over "
                                f"{heads} + 2 x {kv_heads} heads")
    size = hidden // (heads + 2 * kv_heads)
    return ops.split(query, [heads * size, kv_heads * size, kv_heads * size], 2)


@register("GroupQueryAttention")
def _group_query_attention(ctx, query, key=None, value=None, past_key=None, past_value=None,
                           seqlens_k=None, total_sequence_length=None, cos_cache=None,
                           sin_cache=None, position_ids=None, attention_bias=None,
                           head_sink=None):
    """Outputs the attention (batch, seq, heads * size), present_key and present_value
    (batch, kv_heads, P + seq, size): the present holds P + seq positions, as onnxruntime
    allocates it when the file passes total_sequence_length = P + seq (a past that shares
    its buffer with the present is not mapped)."""
    for name, default in (("smooth_softmax", 0), ("qk_output", 0)):
        if ctx.attr(name, default) != default:
            raise UnsupportedOpError(f"GroupQueryAttention: attribute {name}="
                                     f"{ctx.attr(name)!r} (tdag maps {default} only)")
    for name, given in (("attention_bias", attention_bias), ("head_sink", head_sink)):
        if given is not None:
            raise UnsupportedOpError(f"GroupQueryAttention: input {name} is not mapped")
    heads, kv_heads = ctx.attr("num_heads"), ctx.attr("kv_num_heads")
    query = ctx.tensor(query)
    if key is None:
        q, k, v = _split_packed(query, heads, kv_heads)
    else:
        q, k, v = query, ctx.tensor(key), ctx.tensor(value)
    q, k, v = (ops.ungroup(t, 2, (n, -1)) for t, n in ((q, heads), (k, kv_heads),
                                                       (v, kv_heads)))
    seq = q.shape[1]
    past_len = _past_lengths(ctx, seqlens_k, total_sequence_length, seq)
    rows = ops.add(ops.unsqueeze(past_len, 1), ops.reshape(ops.iota(seq), (1, -1)))
    if ctx.flag("do_rotary", 0):
        q, k = _rotary(ctx, q, k, rows, cos_cache, sin_cache, position_ids)
    q, k, v = (ops.permute(t, 0, 2, 1, 3) for t in (q, k, v))
    if (past_key is None) != (past_value is None):
        raise InvalidModelError("GroupQueryAttention: past_key and past_value go together")
    if past_key is not None:
        k = _place(ctx.tensor(past_key), k, past_len)
        v = _place(ctx.tensor(past_value), v, past_len)
    y = _attend(ctx, q, k, v, _keep(ctx, rows, k.shape[2]))
    return (ops.group(ops.permute(y, 0, 2, 1, 3), 2, 2), k, v)[:max(ctx.num_outputs, 1)]


def _attend(ctx, q, k, v, keep):
    """softmax(softcap(q k^T * scale)) v over the visible keys, each kv head serving
    heads / kv_heads consecutive query heads."""
    size = q.shape[3]
    scale = ctx.attr("scale", 0.0) or 1.0 / math.sqrt(size)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = ops.repeat_interleave(k, group, 1), ops.repeat_interleave(v, group, 1)
    scores = ops.mul(ops.matmul(q, ops.permute(k, 0, 1, 3, 2)), scale)
    softcap = ctx.attr("softcap", 0.0)
    if softcap > 0:
        scores = ops.mul(ops.tanh(ops.div(scores, softcap)), softcap)
    scores = ops.where(keep, scores, ops.full((), -_INF, scores.dtype, like=scores))
    return ops.matmul(ops.safe_softmax(scores, -1), v)
