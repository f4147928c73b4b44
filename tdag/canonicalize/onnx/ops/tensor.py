"""The ONNX op table, tensor ops: element gathers and scatters, top-k, arg-extremes, scans,
one-hots, space/depth moves, bit arithmetic and small activations. Entries follow
onnx/ops/table.py's convention ``(ctx, *inputs) -> value(s)``; each is a composition of tdag ops:

- gathers and scatters reuse the ATen table's forms (ops/writes.py ``take_along``,
  ``write``: a write is a read of flat positions, then a one-hot select);
- sorting is the pairwise-rank form of ops/sorting.py (exact, O(n^2) per row);
- bit ops on integers are exact integer arithmetic: a shift is a multiply or a floor-divide
  by 2**s, NOT is -x - 1, AND / OR / XOR sum their bits (floor-divide and remainder by 2).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tdag import ops
from tdag.ops import linalg
from tdag.ops import sorting
from tdag.ops import writes
from tdag.deinops.bitcast import bitcast
from tdag.canonicalize.onnx.ops.table import _cumsum_symbolic, _norm, register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static, product
from tdag.ir.types import DType


def _wrapped(index, x, axis):
    """i64 indices with negatives counted from the end of ``x``'s ``axis``."""
    return writes.wrap(ops.cast(index, DType.i64), x, axis)


def _flip(x, axis):
    n = x.shape[axis]
    if not is_static(n):
        raise UnsupportedOpError(f"a reversal along the symbolic axis {n}")
    return ops.gather(x, x.builder.const(torch.arange(n - 1, -1, -1)), axis)


# -- gathers and scatters -------------------------------------------------------------------------

@register("GatherElements")
def _gather_elements(ctx, x, index):
    x = ctx.tensor(x)
    axis = _norm(ctx.attr("axis", 0), x.ndim)
    return writes.take_along(x, axis, _wrapped(ctx.tensor(index), x, axis))


_REDUCTION = {"none": "replace", "add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _reduction(ctx) -> str:
    return _REDUCTION[ctx.choice("reduction", "none", _REDUCTION)]


@register("ScatterElements", "Scatter")
def _scatter_elements(ctx, x, index, updates):
    x = ctx.tensor(x)
    axis = _norm(ctx.attr("axis", 0), x.ndim)
    positions = writes.take_along(writes.positions_of(x), axis,
                                _wrapped(ctx.tensor(index), x, axis))
    return writes.write(x, positions, ctx.tensor(updates), _reduction(ctx))


def _gather_nd(x, index, batch: int):
    """``x[b..., index[b..., :]]``: the first ``batch`` axes and the k indexed axes merged
    into one, gathered at the linear position."""
    k = index.shape[-1]
    if not is_static(k) or k > x.ndim - batch:
        raise InvalidModelError(f"GatherND: indices of depth {k} for {x.type}")
    index = ops.cast(index, DType.i64)
    linear = None
    for j in range(k):
        axis = batch + j
        part = _wrapped(ops.select(index, index.ndim - 1, j), x, axis)
        linear = part if linear is None else ops.add(
            ops.mul(linear, ops.size_tensor(x, (axis,), DType.i64)), part)
    if linear is None:
        linear = ops.zeros(tuple(index.shape[:-1]), DType.i64, like=x)
    if batch:
        rows = ops.reshape(ops.iota(product(x.shape[:batch]), "i64", x.builder),
                           tuple(x.shape[:batch]) + (1,) * (linear.ndim - batch))
        linear = ops.add(ops.mul(rows, ops.size_tensor(x, tuple(range(batch, batch + k)),
                                                         DType.i64)), linear)
    merged = ops.flatten(x, 0, batch + k - 1) if batch + k > 0 else ops.unsqueeze(x, 0)
    out = ops.gather(merged, linear, 0, wrap=False)
    return out


@register("GatherND")
def _gather_nd_entry(ctx, x, index):
    x = ctx.tensor(x)
    return _gather_nd(x, ctx.tensor(index), ctx.attr("batch_dims", 0))


@register("ScatterND")
def _scatter_nd(ctx, x, index, updates):
    x = ctx.tensor(x)
    positions = _gather_nd(writes.positions_of(x), ctx.tensor(index), 0)
    return writes.write(x, positions, ctx.tensor(updates), _reduction(ctx))


@register("TensorScatter")
def _tensor_scatter(ctx, cache, update, write_indices=None):
    """A KV-cache write: cache position p along ``axis`` of batch entry b takes update[s]
    for s = p - write_indices[b] (mod the cache length in circular mode) where 0 <= s <
    the update's length, else keeps its value: one gather of the update, no scatter."""
    cache, update = ctx.tensor(cache), ctx.tensor(update)
    axis = _norm(ctx.attr("axis", -2), cache.ndim)
    if axis == 0:
        raise InvalidModelError("TensorScatter: axis 0 is the batch axis")
    length, steps = cache.shape[axis], update.shape[axis]
    start = ops.zeros((cache.shape[0],), DType.i64, like=cache) if write_indices is None \
        else ops.cast(ctx.tensor(write_indices), DType.i64)
    shape = [1] * cache.ndim
    shape[0] = -1
    start = ops.reshape(start, tuple(shape))
    shape[0], shape[axis] = 1, -1
    offset = ops.sub(ops.reshape(ops.iota(length, "i64", ctx.builder), tuple(shape)), start)
    if ctx.choice("mode", "linear", ("linear", "circular")) == "circular":
        offset = ops.remainder(offset, ops.size_tensor(cache, (axis,), DType.i64))
    inside = ops.logical_and(ops.ge(offset, 0), ops.lt(offset, ops.size_tensor(
        update, (axis,), DType.i64)))
    index = ops.clamp(offset, 0, ops.sub(ops.size_tensor(update, (axis,), DType.i64), 1)) \
        if not (is_static(steps) and steps == 0) else offset
    sizes = list(cache.shape)
    index = ops.broadcast_to(index, tuple(sizes))
    written = writes.take_along(update, axis, index)
    return ops.where(ops.broadcast_to(inside, tuple(sizes)), written, cache)


@register("TfIdfVectorizer")
def _tfidf_vectorizer(ctx, x):
    """Counts of the pool's integer n-grams in each row, as the ONNX reference: an n-gram of
    n >= 2 tokens is counted at every skip distance d (1 to max_skip_count + 1: tokens d
    apart), a unigram once; then TF (the counts), IDF (the weight where counted) or TFIDF
    (weight times count). Each (n-gram, d) is an AND of n shifted comparisons, summed.
    A weight belongs to its pool n-gram as the spec and onnxruntime read it (the reference
    indexes the weights by output position: the same where ngram_indexes is 0, 1, ...)."""
    if ctx.attr("pool_strings"):
        raise UnsupportedOpError("TfIdfVectorizer over strings (tdag has no string type)")
    x = ctx.tensor(x)
    rows = ops.cast(ops.unsqueeze(x, 0) if x.ndim == 1 else x, DType.i64)
    length = rows.shape[1]
    if not is_static(length):
        raise UnsupportedOpError(f"TfIdfVectorizer over a symbolic row length {length}")
    pool, starts = list(ctx.attr("pool_int64s") or []), list(ctx.attr("ngram_counts"))
    indexes, weights = list(ctx.attr("ngram_indexes")), list(ctx.attr("weights") or [])
    lowest, highest = ctx.attr("min_gram_length"), ctx.attr("max_gram_length")
    skips = ctx.attr("max_skip_count")
    grams = []  # every pool n-gram in pool order: its tokens
    for n, begin in enumerate(starts, 1):
        end = starts[n] if n < len(starts) else len(pool)
        grams += [pool[i:i + n] for i in range(begin, end, n)]
    size = max(indexes) + 1
    counts = [None] * size
    for gram, out in zip(grams, indexes):
        n = len(gram)
        if not lowest <= n <= highest:
            continue
        for distance in range(1, (skips + 2) if n > 1 else 2):
            span = distance * (n - 1)
            if span >= length:
                break
            hit = None
            for k, token in enumerate(gram):
                shifted = ops.slice(rows, 1, k * distance, length - span + k * distance)
                eq = ops.eq(shifted, int(token))
                hit = eq if hit is None else ops.logical_and(hit, eq)
            found = ops.sum(ops.cast(hit, DType.f32), 1)
            counts[out] = found if counts[out] is None else ops.add(counts[out], found)
    zero = ops.zeros((rows.shape[0],), DType.f32, like=rows)
    freq = ops.stack([c if c is not None else zero for c in counts], 1)
    mode = ctx.choice("mode", "TF", ("TF", "IDF", "TFIDF"))
    if weights:  # one per pool n-gram (the spec, onnxruntime), placed at its output
        per_output = [1.0] * size
        for out, weight in zip(indexes, weights):
            per_output[out] = float(weight)
        w = rows.builder.const(per_output, DType.f32)
    else:
        w = 1.0
    if mode == "IDF":
        freq = ops.where(ops.gt(freq, 0.0), ops.mul(ops.full((1, size), 1.0, DType.f32,
                                                             like=rows), w), 0.0)
    elif mode == "TFIDF" and weights:
        freq = ops.mul(freq, w)
    return ops.squeeze(freq, 0) if x.ndim == 1 else freq


@register("OptionalHasElement")
def _optional_has_element(ctx, x=None):
    """tdag values are tensors, never an empty optional: present exactly where the input is
    given."""
    return ops.full((), x is not None, DType.bool)


@register("OptionalGetElement")
def _optional_get_element(ctx, x):
    return ctx.tensor(x)


@register("Det")
def _det(ctx, x):
    return linalg.det(ctx.tensor(x))


# -- order: top-k, arg-extremes, hardmax --------------------------------------------------------

@register("TopK")
def _topk(ctx, x, k=None):
    x = ctx.tensor(x)
    axis = _norm(ctx.attr("axis", -1), x.ndim)
    largest = ctx.flag("largest", 1)
    if ctx.opset < 10:
        count = ctx.attr("k")
    else:
        known = ctx.known(k)
        count = int(known.dims()[0]) if known is not None and is_static(known.dims()[0]) \
            else None
    if count is not None:
        values, index = sorting.sorted_along(x, axis, largest, count)
        return values, index
    values, index = sorting.sorted_along(x, axis, largest, x.shape[axis])  # all, then the first k
    first = ops.arange_of(ops.reshape(ops.cast(ctx.tensor(k), DType.i64), ()))
    return (ops.gather(values, first, axis, wrap=False),
            ops.gather(index, first, axis, wrap=False))


def _arg(extreme):
    def convert(ctx, x):
        x = ctx.tensor(x)
        axis = _norm(ctx.attr("axis", 0), x.ndim)
        keep = ctx.flag("keepdims", 1)
        if not ctx.flag("select_last_index", 0):
            return (ops.argmax if extreme is ops.amax else ops.argmin)(x, axis, keep)
        hit = ops.eq(x, extreme(x, axis, True))
        if x.dtype.is_float:
            hit = ops.logical_or(hit, ops.isnan(x))
        shape = [1] * x.ndim
        shape[axis] = x.shape[axis]
        positions = ops.reshape(ops.iota(x.shape[axis], "i64", x.builder), tuple(shape))
        return ops.amax(ops.where(hit, positions, -1), axis, keep)
    return convert


register("ArgMax")(_arg(ops.amax))
register("ArgMin")(_arg(ops.amin))


@register("Hardmax")
def _hardmax(ctx, x):
    x = ctx.tensor(x)
    if ctx.opset >= 13:
        axis = _norm(ctx.attr("axis", -1), x.ndim)
        return _one_hot_max(x, axis)
    axis = _norm(ctx.attr("axis", 1), x.ndim)  # viewed as 2-D at axis
    flat = ops.reshape(x, product(x.shape[:axis]), product(x.shape[axis:]))
    return ops.reshape(_one_hot_max(flat, 1), *x.shape)


def _one_hot_max(x, axis):
    first = ops.argmax(x, axis, True)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    positions = ops.reshape(ops.iota(x.shape[axis], "i64", x.builder), tuple(shape))
    return ops.cast(ops.eq(positions, first), x.dtype)


# -- scans --------------------------------------------------------------------------------------

def _scan(ctx, x, axis, kind: str):
    """Inclusive/exclusive, forward/reverse prefix sums or products along ``axis``: each
    output reduces a window of the (identity-padded) input (pad + unfold + reduce)."""
    x = ctx.tensor(x)
    axis = _norm(int(ctx.scalar(axis, "axis")), x.ndim)
    n = x.shape[axis]
    reverse, exclusive = ctx.flag("reverse", 0), ctx.flag("exclusive", 0)
    if not is_static(n):
        if kind != "sum":
            raise UnsupportedOpError(f"{ctx.node.op_type} along the symbolic axis {n}")
        total = _cumsum_symbolic(x, axis)  # a product with the mask j <= i
        if reverse:  # suffix sums: the whole sum less the prefix before each
            total = ops.add(ops.sub(ops.sum(x, (axis,), True), total), x)
        return ops.cast(ops.sub(total, x) if exclusive else total, x.dtype)
    if n == 0:
        return x
    y = _flip(x, axis) if reverse else x
    identity = 1 if kind == "prod" else 0
    widths = [(0, 0)] * x.ndim
    widths[axis] = (n - 1 + exclusive, 0)
    padded = ops.pad(y, widths, identity)
    if exclusive:
        padded = ops.slice(padded, axis, 0, 2 * n - 1)
    out = ops.reduce(ops.unfold(padded, axis, n), kind, (x.ndim,))
    out = ops.cast(out, x.dtype)
    return _flip(out, axis) if reverse else out


@register("CumSum")
def _cumsum(ctx, x, axis):
    return _scan(ctx, x, axis, "sum")


@register("CumProd")
def _cumprod(ctx, x, axis):
    return _scan(ctx, x, axis, "prod")


# -- masks and one-hots -------------------------------------------------------------------------

@register("Trilu")
def _trilu(ctx, x, k=None):
    """Keep the elements on and above (upper) or below the k-th diagonal; k may be a run-time
    scalar (compared as a tensor)."""
    x = ctx.tensor(x)
    known = ctx.known(k) if k is not None else None
    if k is None:
        offset = 0
    elif known is not None and known.static:
        offset = int(np.asarray(known.values).reshape(-1)[0])
    else:
        offset = ops.reshape(ops.cast(ctx.tensor(k), DType.i64), ())
    rows = ops.unsqueeze(ops.iota(x.shape[-2]), 1)
    cols = ops.unsqueeze(ops.iota(x.shape[-1]), 0)
    diag = ops.sub(cols, rows)  # column minus row: k-th diagonal where it equals k
    keep = ops.ge(diag, offset) if ctx.flag("upper", 1) else ops.le(diag, offset)
    return ops.where(keep, x, ops.zeros((), x.dtype, like=x))


@register("OneHot")
def _one_hot(ctx, index, depth, values):
    """``values[1]`` where the position along the new ``axis`` equals the index (negative
    counts from depth), ``values[0]`` elsewhere; a run-time depth is a fresh size."""
    index, values = ctx.tensor(index), ctx.tensor(values)
    axis = _norm(ctx.attr("axis", -1), index.ndim + 1)
    known = ctx.known(depth)
    if known is not None and known.static:
        n = int(float(np.asarray(known.values).reshape(-1)[0]))
        positions, depth_t = ops.iota(n, "i64", index.builder), n
    else:
        depth_t = ops.cast(ops.reshape(ctx.tensor(depth), ()), DType.i64)
        positions = ops.arange_of(depth_t)
    index = ops.cast(index, DType.i64) if not index.dtype.is_float else \
        ops.cast(ops.trunc(index), DType.i64)
    index = ops.where(ops.lt(index, 0), ops.add(index, depth_t), index)
    shape = [1] * (index.ndim + 1)
    shape[axis] = positions.shape[0]
    hit = ops.eq(ops.unsqueeze(index, axis), ops.reshape(positions, tuple(shape)))
    off, on = ops.select(values, 0, 0), ops.select(values, 0, 1)
    return ops.where(hit, on, off)


@register("EyeLike")
def _eye_like(ctx, x):
    x = ctx.tensor(x)
    dtype = ctx.dtype(ctx.attr("dtype")) if ctx.attr("dtype") is not None else x.dtype
    rows = ops.unsqueeze(ops.iota(x.shape[0]), 1)
    cols = ops.unsqueeze(ops.iota(x.shape[1]), 0)
    return ops.cast(ops.eq(ops.sub(cols, rows), ctx.attr("k", 0)), dtype)


# -- space and depth ----------------------------------------------------------------------------

@register("DepthToSpace")
def _depth_to_space(ctx, x):
    x = ctx.tensor(x)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "CRD":
        y = ops.reshape(x, n, c // (b * b), b, b, h, w)
        y = ops.permute(y, 0, 1, 4, 2, 5, 3)
    else:
        y = ops.reshape(x, n, b, b, c // (b * b), h, w)
        y = ops.permute(y, 0, 3, 4, 1, 5, 2)
    return ops.reshape(y, n, c // (b * b), h * b, w * b)


@register("SpaceToDepth")
def _space_to_depth(ctx, x):
    x = ctx.tensor(x)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    y = ops.reshape(x, n, c, h // b, b, w // b, b)
    crd = ctx.attr("mode", "DCR") == "CRD"
    y = ops.permute(y, *((0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4)))
    return ops.reshape(y, n, c * b * b, h // b, w // b)


# -- small activations ---------------------------------------------------------------------------

@register("Celu")
def _celu(ctx, x):
    x = ctx.tensor(x)
    alpha = ctx.attr("alpha", 1.0)
    neg = ops.mul(ops.sub(ops.exp(ops.div(ops.minimum(x, 0.0), alpha)), 1.0), alpha)
    return ops.add(ops.maximum(x, 0.0), neg)


@register("Shrink")
def _shrink(ctx, x):
    x = ctx.tensor(x)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    zero = ops.zeros((), x.dtype, like=x)
    below = ops.cast(ops.add(x, bias), x.dtype)
    above = ops.cast(ops.sub(x, bias), x.dtype)
    return ops.where(ops.lt(x, -lambd), below, ops.where(ops.gt(x, lambd), above, zero))


@register("ThresholdedRelu")
def _thresholded_relu(ctx, x):
    x = ctx.tensor(x)
    return ops.where(ops.gt(x, ctx.attr("alpha", 1.0)), x, ops.zeros((), x.dtype, like=x))


@register("Swish")
def _swish(ctx, x):
    x = ctx.tensor(x)
    return ops.mul(x, ops.sigmoid(ops.mul(x, ctx.attr("alpha", 1.0))))


@register("Softsign")
def _softsign(ctx, x):
    x = ctx.tensor(x)
    return ops.div(x, ops.add(ops.abs(x), 1.0))


@register("IsInf")
def _is_inf(ctx, x):
    x = ctx.tensor(x)
    pos, neg = ctx.flag("detect_positive", 1), ctx.flag("detect_negative", 1)
    hits = [ops.eq(x, v) for v, on in ((math.inf, pos), (-math.inf, neg)) if on]
    if not hits:
        return ops.full(tuple(x.shape), False, DType.bool, like=x)
    return hits[0] if len(hits) == 1 else ops.logical_or(*hits)


# -- bit arithmetic on integers -----------------------------------------------------------------

def _bits(dtype: DType) -> int:
    if dtype.is_float or dtype is DType.bool:
        raise UnsupportedOpError(f"bit operations on {dtype.value}")
    return dtype.itemsize * 8


@register("BitShift")
def _bit_shift(ctx, x, shift):
    """x * 2**s (wrapping, as the integer type does) or floor(x / 2**s) (an arithmetic right
    shift); a shift below 0 or past the width gives the full-width result, 0 (or -1 for a
    negative x shifted right), as the spec's cases say."""
    x, shift = ctx.tensor(x), ctx.tensor(shift)
    bits, dtype = _bits(x.dtype), x.dtype
    x = ops.cast(x, DType.i64)  # narrower types: computed wide, wrapped by the cast back
    direction = ctx.choice("direction", "", ("LEFT", "RIGHT"))
    wide = ops.cast(shift, DType.i64)
    outside = ops.logical_or(ops.lt(wide, 0), ops.ge(wide, bits))
    safe = ops.clamp(wide, 0, min(bits - 1, 62))  # 2**62 is the largest i64 power
    factor = ops.pow(ops.full((), 2, DType.i64, like=x), safe)
    zero = ops.zeros((), DType.i64, like=x)
    if direction == "LEFT":
        out = ops.mul(x, factor)
        if bits == 64:  # 2**63 wraps to -2**63, the same product modulo 2**64
            out = ops.where(ops.eq(wide, 63), ops.mul(x, -(2 ** 63)), out)
        return ops.cast(ops.where(outside, zero, out), dtype)
    fill = ops.where(ops.lt(x, 0), ops.full((), -1, DType.i64, like=x), zero)
    out = ops.floor_divide(x, factor)
    if bits == 64:
        out = ops.where(ops.eq(wide, 63), fill, out)
    if dtype is DType.u64:  # a logical shift: the top bit (int64's sign) shifts in as 0
        fill, out = zero, _logical_right_u64(x, wide, safe, factor)
    return ops.cast(ops.where(outside, fill, out), dtype)


def _logical_right_u64(x, shift, safe, factor):
    """uint64 x (as int64 bits) >> s: x = 2**63 + r where the top bit is set, so the result
    is r >> s plus the top bit moved down, 2**(63 - s); s = 0 keeps x."""
    low = ops.sub(x, -(2 ** 63))  # r: wraps into [0, 2**63)
    top = ops.pow(ops.full((), 2, DType.i64, like=x), ops.sub(63, ops.maximum(safe, 1)))
    moved = ops.add(ops.floor_divide(low, factor), top)
    out = ops.where(ops.lt(x, 0), moved, ops.floor_divide(x, factor))
    out = ops.where(ops.eq(shift, 63), ops.cast(ops.lt(x, 0), DType.i64), out)
    return ops.where(ops.eq(shift, 0), x, out)


@register("BitwiseNot")
def _bitwise_not(ctx, x):
    x = ctx.tensor(x)
    if x.dtype is DType.bool:
        return ops.logical_not(x)
    _bits(x.dtype)
    if x.dtype is DType.u8:  # 255 - x, in a signed type (onnxruntime has no uint8 Neg)
        return ops.cast(ops.sub(255, ops.cast(x, DType.i16)), DType.u8)
    return ops.sub(ops.neg(x), 1)


def _bitwise(combine):
    """Bit k of an integer is floor(x / 2**k) mod 2 (two's complement too); the result sums
    combine(bit_a, bit_b) * 2**k, the top bit of a signed type weighing -2**(n-1)."""
    def convert(ctx, a, b):
        a, b = ctx.tensor(a), ctx.tensor(b)
        if a.dtype is DType.bool:
            return {"and": ops.logical_and, "or": ops.logical_or, "xor": ops.ne}[combine](a, b)
        n = _bits(a.dtype)
        # uint64's top bit weighs 2**63, which int64 holds as -2**63: the same modulo 2**64,
        # where the cast back to uint64 takes the sum
        signed = not a.dtype.is_unsigned or a.dtype is DType.u64
        wide = DType.i64
        a64, b64 = ops.cast(a, wide), ops.cast(b, wide)
        total = None
        for k in range(n):
            step = 2 ** k if k < 63 else None
            bit_a = ops.remainder(ops.floor_divide(a64, step), 2) if step else \
                ops.cast(ops.lt(a64, 0), wide)
            bit_b = ops.remainder(ops.floor_divide(b64, step), 2) if step else \
                ops.cast(ops.lt(b64, 0), wide)
            if combine == "and":
                bit = ops.mul(bit_a, bit_b)
            elif combine == "or":
                bit = ops.maximum(bit_a, bit_b)
            else:
                bit = ops.remainder(ops.add(bit_a, bit_b), 2)
            weight = -(2 ** (n - 1)) if signed and k == n - 1 else 2 ** k
            term = ops.mul(bit, weight)
            total = term if total is None else ops.add(total, term)
        return ops.cast(total, a.dtype)
    return convert


register("BitwiseAnd")(_bitwise("and"))
register("BitwiseOr")(_bitwise("or"))
register("BitwiseXor")(_bitwise("xor"))


@register("BitCast")
def _bit_cast(ctx, x):
    x, dtype = ctx.tensor(x), ctx.dtype(ctx.attr("to"))
    if x.dtype.itemsize != dtype.itemsize:
        raise InvalidModelError(f"BitCast from {x.dtype.value} to {dtype.value}: the widths "
                                "differ")
    return bitcast(x, dtype)


# -- sequences of a run-time length -------------------------------------------------------------

def _window(ctx, size, terms):
    """A window of ``size`` points: sum_k a_k cos(2 pi k n / N), N = size (periodic) or
    size - 1 (symmetric)."""
    known = ctx.known(size)
    if known is not None and known.static:
        count = int(np.asarray(known.values).reshape(-1)[0])
        positions = ops.cast(ops.iota(count, "i64", ctx.builder), DType.f32)
        length = float(count)
    else:
        size_t = ops.cast(ops.reshape(ctx.tensor(size), ()), DType.i64)
        positions = ops.cast(ops.arange_of(size_t), DType.f32)
        length = ops.cast(size_t, DType.f32)
    period = length if ctx.flag("periodic", 1) else ops.sub(length, 1.0) \
        if not isinstance(length, float) else length - 1.0
    out = None
    for k, a in enumerate(terms):
        term = ops.full(tuple(positions.shape), a, DType.f32, like=positions) if k == 0 else \
            ops.mul(ops.cos(ops.div(ops.mul(positions, 2.0 * math.pi * k), period)), a)
        out = term if out is None else ops.add(out, term)
    dtype = ctx.attr("output_datatype", 1)
    return ops.cast(out, ctx.dtype(dtype))


@register("HannWindow")
def _hann(ctx, size):
    return _window(ctx, size, (0.5, -0.5))


@register("HammingWindow")
def _hamming(ctx, size):
    return _window(ctx, size, (25.0 / 46.0, -(1.0 - 25.0 / 46.0)))


@register("BlackmanWindow")
def _blackman(ctx, size):
    return _window(ctx, size, (0.42, -0.5, 0.08))



# -- crops, reversals, pooled norms -------------------------------------------------------------

@register("CenterCropPad")
def _center_crop_pad(ctx, x, shape):
    """Crop (the centre, the extra cell at the end) or zero-pad (likewise) each axis to the
    target size."""
    x = ctx.tensor(x)
    sizes = [int(s) for s in ctx.ints(shape, "shape")]
    axes = ctx.attr("axes") or list(range(x.ndim))
    if len(axes) != len(sizes):
        raise InvalidModelError(f"CenterCropPad: {len(sizes)} sizes for axes {list(axes)}")
    for axis, size in zip(axes, sizes):
        axis = _norm(axis, x.ndim)
        dim = x.shape[axis]
        if not is_static(dim):
            raise UnsupportedOpError(f"CenterCropPad of the symbolic axis {dim}")
        if size < dim:
            start = (dim - size) // 2
            x = ops.slice(x, axis, start, start + size)
        elif size > dim:
            before = (size - dim) // 2
            widths = [(0, 0)] * x.ndim
            widths[axis] = (before, size - dim - before)
            x = ops.pad(x, widths, 0)
    return x


@register("ReverseSequence")
def _reverse_sequence(ctx, x, lengths):
    """Reverse the first lengths[b] steps of each batch entry along the time axis: a gather
    along time at index len - 1 - t (t < len), t elsewhere."""
    x = ctx.tensor(x)
    time, batch = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    lengths = ops.cast(ctx.tensor(lengths), DType.i64)
    steps = ops.iota(x.shape[time], "i64", x.builder)
    shape_t, shape_b = [1] * x.ndim, [1] * x.ndim
    shape_t[time], shape_b[batch] = x.shape[time], x.shape[batch]
    t = ops.reshape(steps, tuple(shape_t))
    n = ops.reshape(lengths, tuple(shape_b))
    index = ops.where(ops.lt(t, n), ops.sub(ops.sub(n, 1), t), t)
    return writes.take_along(x, time, ops.broadcast_to(index, tuple(x.shape)))


@register("MeanVarianceNormalization")
def _mvn(ctx, x):
    x = ctx.tensor(x)
    axes = tuple(_norm(a, x.ndim) for a in (ctx.attr("axes") or [0, 2, 3]))
    mean = ops.mean(x, axes, True)
    spread = ops.sqrt(ops.sub(ops.mean(ops.mul(x, x), axes, True), ops.mul(mean, mean)))
    return ops.div(ops.sub(x, mean), ops.add(spread, 1e-9))


@register("LpPool")
def _lp_pool(ctx, x):
    """(sum over each window of |x|**p) ** (1/p), pads counting as zeros: window sums of
    |x|**p (dilations and pads past half the kernel included)."""
    from tdag.canonicalize.onnx.ops.nn import _kernel, _pool_windows, _window  # noqa: PLC0415
    x = ctx.tensor(x)
    kernel = _kernel(ctx, x)
    strides, dilations, begins, ends = _window(ctx, x, kernel)
    p = ctx.attr("p", 2)
    powered = ops.pow(ops.abs(x), float(p))
    sums = _pool_windows(powered, "sum", kernel, strides, dilations, begins, ends,
                         ctx.flag("ceil_mode", 0), 0.0)
    return ops.pow(sums, 1.0 / p)
