"""ONNX attention: Attention (scaled dot-product, with masks, a KV cache, grouped heads and
softcap) and RotaryEmbedding. Each is a composition of tdag ops written after the ONNX
reference implementation (onnx/reference/ops/op_attention.py), whose outputs the conformance
cases ship.
"""
from __future__ import annotations

import math

from tdag import ops
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

_INF = float("inf")


def _heads(x, count, what):
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    if count is None:
        raise InvalidModelError(f"Attention: 3-D inputs need {what}")
    hidden = x.shape[2]
    if is_static(hidden) and hidden % count:
        raise InvalidModelError(f"Attention: {what}={count} does not divide {hidden}")
    return ops.permute(ops.ungroup(x, 2, (count, -1)), 0, 2, 1, 3)


def _neg_inf_where_not(keep, like):
    """0 where ``keep``, -inf elsewhere, in like's dtype."""
    return ops.where(keep, ops.zeros((), like.dtype, like=like),
                     ops.full((), -_INF, like.dtype, like=like))


@register("Attention")
def _attention(ctx, q, k, v, mask=None, past_key=None, past_value=None, nonpad=None):
    """Scaled dot-product attention as onnx/reference/ops/op_attention.py computes it:
    Y, present_key, present_value and the qk_matmul_output the mode selects."""
    q, k, v = ctx.tensor(q), ctx.tensor(k), ctx.tensor(v)
    rank = q.ndim
    if not q.ndim == k.ndim == v.ndim or rank not in (3, 4):
        raise InvalidModelError("Attention: Q, K and V must all be 3-D or all 4-D")
    if rank == 3:
        q = _heads(q, ctx.attr("q_num_heads"), "q_num_heads")
        k = _heads(k, ctx.attr("kv_num_heads"), "kv_num_heads")
        v = _heads(v, ctx.attr("kv_num_heads"), "kv_num_heads")
    if (past_key is None) != (past_value is None):
        raise InvalidModelError("Attention: past_key and past_value go together")
    if past_key is not None:
        k = ops.concat([ctx.tensor(past_key), k], 2)
        v = ops.concat([ctx.tensor(past_value), v], 2)
    present_k, present_v = k, v
    nq, nk = q.shape[1], k.shape[1]
    if is_static(nq) and is_static(nk) and nq != nk:
        if nq % nk:
            raise InvalidModelError(f"Attention: {nq} query heads over {nk} key heads")
        k, v = ops.repeat_interleave(k, nq // nk, 1), ops.repeat_interleave(v, nq // nk, 1)
    scale = ctx.attr("scale")
    if scale is None:
        if not is_static(q.shape[3]):
            raise UnsupportedOpError("Attention: default scale of a symbolic head size")
        scale = 1.0 / math.sqrt(q.shape[3])
    root = math.sqrt(scale)
    scores = ops.matmul(ops.mul(q, root), ops.permute(ops.mul(k, root), 0, 1, 3, 2))
    softcap = ctx.attr("softcap", 0.0)
    if softcap and softcap > 0:
        scores = ops.mul(ops.tanh(ops.div(scores, softcap)), softcap)
    bias = _bias(ctx, q, k, scores, mask, past_key, nonpad)
    with_bias = ops.add(scores, bias) if bias is not None else scores
    mode = ctx.attr("qk_matmul_output_mode", 0)
    qk_out = with_bias if mode == 2 else scores
    precision = ctx.attr("softmax_precision")
    soft_in = ops.cast(with_bias, ctx.dtype(precision)) if precision else with_bias
    probs = ops.safe_softmax(soft_in, -1)  # a row of -inf gives zeros, not nan
    if bias is not None:  # a row the bias masks entirely gives zeros
        masked = ops.eq(ops.amax(bias, -1, True), -_INF)
        probs = ops.where(masked, ops.zeros((), probs.dtype, like=probs), probs)
    probs = ops.cast(probs, q.dtype)
    if mode == 3:
        qk_out = probs
    y = ops.matmul(probs, v)
    if rank == 3:
        y = ops.group(ops.permute(y, 0, 2, 1, 3), 2, 2)
    return (y, present_k, present_v, ops.cast(qk_out, q.dtype))[:ctx.num_outputs]


def _bias(ctx, q, k, scores, mask, past_key, nonpad):
    """The additive mask (0 or -inf, or the float mask given), broadcastable to the scores;
    None where nothing is masked."""
    nq, nkv = q.shape[2], k.shape[2]
    bias = None
    if mask is not None:
        mask = ctx.tensor(mask)
        width = mask.shape[-1]
        if not dims_static_equal(width, nkv):  # a short mask: the rest is masked
            fill = 0.0 if mask.dtype is DType.bool else -_INF
            mask = ops.pad(mask, [(0, 0)] * (mask.ndim - 1) + [(0, nkv - width)], fill)
        bias = _neg_inf_where_not(mask, scores) if mask.dtype is DType.bool else \
            ops.cast(mask, scores.dtype)
    rows = ops.unsqueeze(ops.iota(nq), 1)
    cols = ops.unsqueeze(ops.iota(nkv), 0)
    offset = None
    if nonpad is not None and past_key is None:
        offset = ops.reshape(ops.sub(ops.cast(ctx.tensor(nonpad), DType.i64), nq), (-1, 1, 1, 1))
    elif past_key is not None:
        offset = ctx.tensor(past_key).shape[2]
    if ctx.flag("is_causal", 0):
        keep = ops.le(cols, ops.add(rows, offset if offset is not None else 0))
        causal = _neg_inf_where_not(keep, scores)
        bias = causal if bias is None else ops.add(bias, causal)
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    if left >= 0 or right >= 0:
        diff = ops.sub(ops.add(rows, offset if offset is not None else 0), cols)
        keep = None
        if left >= 0:
            keep = ops.le(diff, left)
        if right >= 0:
            near = ops.le(ops.neg(diff), right)
            keep = near if keep is None else ops.logical_and(keep, near)
        window = _neg_inf_where_not(keep, scores)
        bias = window if bias is None else ops.add(bias, window)
    if nonpad is not None:
        lengths = ops.reshape(ops.cast(ctx.tensor(nonpad), DType.i64), (-1, 1, 1, 1))
        padding = _neg_inf_where_not(ops.lt(ops.reshape(ops.iota(nkv), (1, 1, 1, -1)),
                                            lengths), scores)
        bias = padding if bias is None else ops.add(bias, padding)
    return bias


def dims_static_equal(a, b) -> bool:
    return is_static(a) and is_static(b) and a == b or a is b


@register("RotaryEmbedding")
def _rotary(ctx, x, cos, sin, position_ids=None):
    """Rotate pairs of the first ``rotary_embedding_dim`` features by the cached angles
    (pairs are halves, or neighbours where ``interleaved``)."""
    x, cos, sin = ctx.tensor(x), ctx.tensor(cos), ctx.tensor(sin)
    shape, rank = x.shape, x.ndim
    if rank == 4:  # (batch, heads, seq, size) -> (batch, seq, heads, size)
        x = ops.permute(x, 0, 2, 1, 3)
    elif rank == 3:
        heads = ctx.attr("num_heads")
        if not heads:
            raise InvalidModelError("RotaryEmbedding: 3-D input needs num_heads")
        x = ops.ungroup(x, 2, (heads, -1))
    else:
        raise InvalidModelError(f"RotaryEmbedding: input of rank {rank}")
    size = x.shape[3]
    dim = ctx.attr("rotary_embedding_dim", 0) or size
    if position_ids is not None:
        ids = ops.cast(ctx.tensor(position_ids), DType.i64)
        cos, sin = ops.gather(cos, ids, 0), ops.gather(sin, ids, 0)
    rotated = rotate_pairs(x, ops.unsqueeze(cos, 2), ops.unsqueeze(sin, 2), dim,
                           ctx.flag("interleaved", 0))
    if rank == 3:
        return ops.reshape(rotated, *shape)
    return ops.permute(rotated, 0, 2, 1, 3)


def rotate_pairs(x, cos, sin, dim: int, interleaved: bool):
    """x (batch, seq, heads, size) with its first ``dim`` features rotated in pairs (halves,
    or neighbours where ``interleaved``) by cos/sin (broadcastable to (..., dim/2)); the
    rest pass through. onnxruntime's com.microsoft RotaryEmbedding and GroupQueryAttention
    rotate the same way."""
    size = x.shape[3]
    rotate = ops.slice(x, 3, 0, dim)
    if interleaved:
        pairs = ops.ungroup(rotate, 3, (-1, 2))
        x1, x2 = ops.select(pairs, 4, 0), ops.select(pairs, 4, 1)
    else:
        x1, x2 = ops.split(rotate, [dim // 2, dim - dim // 2], 3)
    real = ops.sub(ops.mul(cos, x1), ops.mul(sin, x2))
    imag = ops.add(ops.mul(sin, x1), ops.mul(cos, x2))
    if interleaved:
        rotated = ops.group(ops.stack([real, imag], 4), 3, 2)
    else:
        rotated = ops.concat([real, imag], 3)
    if not (is_static(size) and dim == size):
        rotated = ops.concat([rotated, ops.slice(x, 3, dim, size)], 3)
    return rotated
