"""The ONNX op table, onnxruntime's com.microsoft quantized ops: the integer products
(MatMulIntegerToFloat, DynamicQuantizeMatMul, QGemm, QAttention's projection), the QLinear*
elementwise, softmax, pooling and concat ops, and the block-quantized weights of LLM files
(MatMulNBits, GatherBlockQuantized), and QEmbedLayerNormalization. ``QUANT_OPS`` names
those mapped (contrib.CONTRIB_OPS admits them); com.microsoft's QuantizeLinear and
DequantizeLinear, which onnxruntime's quantizer writes, are the default domain's entries.

The integer arithmetic stays in the IR, through the default domain's entries (onnx/ops/
quant.py): products are MatMulInteger's exact i32 matmul, scaled afterwards; a QLinear op is
its float op between a DequantizeLinear and a QuantizeLinear (round half to even, saturate),
as onnxruntime's kernels define them (its lookup tables and fixed-point requantization can
round a value the other way: one quantization step). Packed 2/4-bit weights are unpacked by
integer division and remainder over the packed bytes, elementwise, before the matmul or
after the gather.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import OPS, norm_axis, register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType

QUANT_OPS = ("QuantizeLinear", "DequantizeLinear", "MatMulIntegerToFloat",
             "DynamicQuantizeMatMul", "QGemm", "QLinearAdd", "QLinearMul", "QLinearSigmoid",
             "QLinearLeakyRelu", "QLinearSoftmax", "QLinearGlobalAveragePool",
             "QLinearAveragePool", "QLinearConcat", "MatMulNBits", "GatherBlockQuantized",
             "QAttention", "QEmbedLayerNormalization")


# -- quantize / dequantize, per tensor -------------------------------------------------------------

def _dequantize(ctx, x, scale, zero_point=None):
    """(x - zero_point) * scale in the scale's type (the default domain's DequantizeLinear)."""
    return OPS["DequantizeLinear"](ctx, x, scale, zero_point)


def _quantize(ctx, y, scale, zero_point, like):
    """round(y / scale) + zero_point, saturated to the zero point's type (``like``'s type
    where the node omits it, zero point 0: these ops keep their input's type)."""
    if zero_point is None:
        zero_point = ops.zeros((), ctx.tensor(like).dtype, like=ctx.tensor(like))
    return OPS["QuantizeLinear"](ctx, y, scale, zero_point)


def _qlinear_unary(fn):
    """A QLinear op of one input: quantize(fn(dequantize(x)))."""
    def convert(ctx, x, x_scale, x_zero=None, y_scale=None, y_zero=None):
        return _quantize(ctx, fn(ctx, _dequantize(ctx, x, x_scale, x_zero)), y_scale, y_zero, x)
    return convert


register("QLinearSigmoid")(_qlinear_unary(lambda ctx, x: ops.sigmoid(x)))
register("QLinearLeakyRelu")(_qlinear_unary(
    lambda ctx, x: ops.leaky_relu(x, ctx.attr("alpha", 0.01))))


def _qlinear_binary(fn):
    def convert(ctx, a, a_scale, a_zero, b, b_scale, b_zero, y_scale, y_zero=None):
        y = fn(_dequantize(ctx, a, a_scale, a_zero), _dequantize(ctx, b, b_scale, b_zero))
        return _quantize(ctx, y, y_scale, y_zero, a)
    return convert


register("QLinearAdd")(_qlinear_binary(ops.add))
register("QLinearMul")(_qlinear_binary(ops.mul))


@register("QLinearSoftmax")
def _qlinear_softmax(ctx, x, x_scale, x_zero, y_scale, y_zero):
    """Softmax over ``axis`` (opset >= 13, the ``opset`` attribute names the Softmax it
    stands for) or over every axis from ``axis`` on (older opsets: the 2-D coercion)."""
    xf = _dequantize(ctx, x, x_scale, x_zero)
    axis = norm_axis(ctx.attr("axis", -1), xf.ndim)
    if ctx.attr("opset", 13) >= 13:
        y = ops.softmax(xf, axis)
    else:
        y = ops.reshape(ops.softmax(ops.flatten(xf, axis), -1), xf.shape)
    return _quantize(ctx, y, y_scale, y_zero, x)


def _channels_first(ctx, x):
    """x as N C D1..Dn where ``channels_last`` stores it N D1..Dn C."""
    return ops.movedim(x, -1, 1) if ctx.flag("channels_last", 0) else x


def _channels_back(ctx, y):
    return ops.movedim(y, 1, -1) if ctx.flag("channels_last", 0) else y


@register("QLinearGlobalAveragePool")
def _qlinear_global_average_pool(ctx, x, x_scale, x_zero, y_scale, y_zero):
    xf = _channels_first(ctx, _dequantize(ctx, x, x_scale, x_zero))
    y = ops.mean(xf, tuple(range(2, xf.ndim)), True)
    return _quantize(ctx, _channels_back(ctx, y), y_scale, y_zero, x)


@register("QLinearAveragePool")
def _qlinear_average_pool(ctx, x, x_scale, x_zero=None, y_scale=None, y_zero=None):
    """The default domain's AveragePool, with its attributes, on the dequantized input: a
    padded cell is 0.0, the zero point."""
    xf = _channels_first(ctx, _dequantize(ctx, x, x_scale, x_zero))
    y = OPS["AveragePool"](ctx, xf)
    return _quantize(ctx, _channels_back(ctx, y), y_scale, y_zero, x)


@register("QLinearConcat")
def _qlinear_concat(ctx, y_scale, y_zero, *inputs):
    """Each (tensor, scale, zero point) triple requantized to Y's scale, then concatenated."""
    if not inputs or len(inputs) % 3:
        raise InvalidModelError(f"QLinearConcat: inputs come in (tensor, scale, zero point) "
                                f"triples, got {len(inputs)} inputs after Y's")
    parts = [_quantize(ctx, _dequantize(ctx, x, s, z), y_scale, y_zero, x)
             for x, s, z in zip(inputs[::3], inputs[1::3], inputs[2::3])]
    return ops.concat(parts, norm_axis(ctx.attr("axis"), parts[0].ndim))


# -- integer products ------------------------------------------------------------------------------

def _scaled(acc, a_scale, b_scale):
    """An i32 accumulator times a_scale * b_scale, in the scales' type."""
    scale = ops.mul(a_scale, b_scale)
    return ops.mul(ops.cast(acc, scale.dtype), scale)


def _with_bias(ctx, y, bias):
    return y if bias is None else ops.add(y, ctx.tensor(bias))


@register("MatMulIntegerToFloat")
def _matmul_integer_to_float(ctx, a, b, a_scale, b_scale, a_zero=None, b_zero=None, bias=None):
    """MatMulInteger's exact product, scaled by a_scale * b_scale (b's per column)."""
    acc = OPS["MatMulInteger"](ctx, a, b, a_zero, b_zero)
    return _with_bias(ctx, _scaled(acc, ctx.tensor(a_scale), ctx.tensor(b_scale)), bias)


@register("DynamicQuantizeMatMul")
def _dynamic_quantize_matmul(ctx, a, b, b_scale, b_zero=None, bias=None):
    """A quantized to uint8 at run time (DynamicQuantizeLinear), then MatMulIntegerToFloat."""
    qa, a_scale, a_zero = OPS["DynamicQuantizeLinear"](ctx, a)
    return _matmul_integer_to_float(ctx, qa, b, a_scale, b_scale, a_zero, b_zero, bias)


def _transposed(ctx, x, attr):
    x = ctx.tensor(x)
    return ops.permute(x, 1, 0) if ctx.flag(attr, 0) else x


@register("QGemm")
def _qgemm(ctx, a, a_scale, a_zero, b, b_scale, b_zero, c=None, y_scale=None, y_zero=None):
    """(A' B' + C) * alpha * a_scale * b_scale, C an i32 bias added to the exact product; float
    where y_scale is absent, else quantized with y_scale and y_zero_point."""
    a, b = _transposed(ctx, a, "transA"), _transposed(ctx, b, "transB")
    acc = OPS["MatMulInteger"](ctx, a, b, a_zero, b_zero)
    if c is not None:
        acc = ops.add(acc, ops.cast(ctx.tensor(c), DType.i32))
    alpha = ctx.attr("alpha", 1.0)
    y = _scaled(acc, ctx.tensor(a_scale), ctx.tensor(b_scale))
    y = y if alpha == 1.0 else ops.mul(y, alpha)
    return y if y_scale is None else _quantize(ctx, y, y_scale, y_zero, a)


@register("QAttention")
def _qattention(ctx, x, weight, bias, x_scale, w_scale, mask_index=None, x_zero=None,
                w_zero=None, past=None):
    """com.microsoft Attention (contrib_attention.py: the same attributes, mask and past) over
    the dequantized input and weight (the weight's scale and zero point per column): the
    projection is a DequantizeLinear pair around a float matmul, the form lowering reads back
    as an integer matmul."""
    xf = _dequantize(ctx, x, x_scale, x_zero)
    wf = _dequantize(ctx, weight, w_scale, w_zero)
    return OPS["com.microsoft:Attention"](ctx, xf, wf, bias, mask_index, past)


@register("QEmbedLayerNormalization")
def _qembed_layer_norm(ctx, input_ids, segment_ids, word, position, segment, gamma, beta, mask,
                       word_scale, position_scale, segment_scale, gamma_scale, beta_scale,
                       word_zero, position_zero, segment_zero, gamma_zero, beta_zero):
    """EmbedLayerNormalization (contrib_attention.py) over 8-bit tables, each with one scale
    and zero point: the rows are gathered quantized, then dequantized (the work is the
    output's size, not the table's); outputs the norm and the mask index."""
    def rows(table, scale, zero, ids):
        return _dequantize(ctx, ops.gather(ctx.tensor(table), ids, 0), scale, zero)
    ids = ops.cast(ctx.tensor(input_ids), DType.i64)
    positions = ops.iota(ids.shape[1])
    total = ops.add(rows(word, word_scale, word_zero, ids),
                    rows(position, position_scale, position_zero, positions))
    if segment_ids is not None and segment is not None:
        segments = ops.cast(ctx.tensor(segment_ids), DType.i64)
        total = ops.add(total, rows(segment, segment_scale, segment_zero, segments))
    y = ops.layer_norm(total, [total.shape[2]], _dequantize(ctx, gamma, gamma_scale, gamma_zero),
                       _dequantize(ctx, beta, beta_scale, beta_zero), ctx.attr("epsilon", 1e-12))
    if mask is None:
        mask_index = ops.zeros((ids.shape[0],), DType.i32, like=total)
    else:
        ones = ops.cast(ops.eq(ops.cast(ctx.tensor(mask), DType.i64), 1), DType.i32)
        mask_index = ops.cast(ops.sum(ones, 1), DType.i32)
    return (y, mask_index)[:max(ctx.num_outputs, 1)]


# -- block-quantized weights -----------------------------------------------------------------------

def _unpacked(packed, bits: int, axis: int):
    """The ``bits``-wide values packed low bits first in each byte, along ``axis`` (8 // bits
    per byte, in the packed axis' order), as i32: elementwise division and remainder."""
    packed = ops.cast(packed, DType.i32)
    if bits == 8:
        return packed
    per_byte, base = 8 // bits, 2 ** bits
    parts = [ops.remainder(ops.floor_divide(packed, base ** i) if i else packed, base)
             for i in range(per_byte)]
    axis = norm_axis(axis, packed.ndim)
    return ops.flatten(ops.stack(parts, axis + 1), axis, axis + 1)


def _bits(ctx, allowed=(2, 4, 8)) -> int:
    bits = ctx.attr("bits", 4)
    if bits not in allowed:
        raise UnsupportedOpError(f"{ctx.node.op_type}: bits={bits} (tdag maps "
                                 f"{', '.join(map(str, allowed))})")
    return bits


def _nbits_weight(ctx, b, scales, zero_points, bits: int):
    """MatMulNBits' weight dequantized, N x K: B (N, k_blocks, blob) unpacked to
    (N, k_blocks, block_size), less the zero points (packed uint8 like B, or of the scales'
    type; 2**(bits-1) when absent), times the scales, one per (row, block)."""
    k, n, block = ctx.attr("K"), ctx.attr("N"), ctx.attr("block_size")
    if not all(isinstance(v, int) and v > 0 for v in (k, n, block)):
        raise InvalidModelError(f"MatMulNBits: K, N and block_size must be positive, got "
                                f"K={k}, N={n}, block_size={block}")
    blocks = -(-k // block)
    q = ops.reshape(_unpacked(ctx.tensor(b), bits, -1), (n, blocks, block))
    scale = ops.reshape(ctx.tensor(scales), (n, blocks, 1))
    if zero_points is None:
        zero = ops.full((), 2 ** (bits - 1), DType.i32, like=q)
    elif ctx.tensor(zero_points).dtype is DType.u8:  # packed per row: the last byte padded
        zero = ops.reshape(ctx.tensor(zero_points), (n, -1))
        zero = ops.slice(_unpacked(zero, bits, -1), 1, 0, blocks)
        zero = ops.unsqueeze(zero, -1)
    else:
        zero = ops.reshape(ctx.tensor(zero_points), (n, blocks, 1))
    centred = ops.sub(ops.cast(q, zero.dtype) if zero.dtype.is_float else q, zero)
    w = ops.mul(ops.cast(centred, scale.dtype), scale)
    return ops.slice(ops.reshape(w, (n, blocks * block)), 1, 0, k)


@register("MatMulNBits")
def _matmul_nbits(ctx, a, b, scales, zero_points=None, g_idx=None, bias=None):
    """A @ W^T (+ bias), W the N x K weight quantized in blocks of ``block_size`` along K.
    ``accuracy_level`` lets onnxruntime quantize A too; tdag computes the float product it
    approximates. The deprecated ``g_idx`` (a block per column, GPTQ's act order) is refused."""
    if g_idx is not None:
        raise UnsupportedOpError("MatMulNBits: g_idx (act-order block indices)")
    if ctx.attr("weight_prepacked", 0):
        raise UnsupportedOpError("MatMulNBits: weight_prepacked (a CUDA-specific layout)")
    w = _nbits_weight(ctx, b, scales, zero_points, _bits(ctx))
    a = ctx.tensor(a)
    y = ops.matmul(a, ops.permute(ops.cast(w, a.dtype), 1, 0))
    return _with_bias(ctx, y, bias)


@register("GatherBlockQuantized")
def _gather_block_quantized(ctx, data, indices, scales, zero_points=None):
    """Rows of ``data`` at ``indices`` along ``gather_axis``, gathered packed (with their
    scales and zero points), then dequantized in blocks of ``block_size`` along
    ``quantize_axis``: the work is the output's size, not the table's. An index out of range
    gives a row of zeros, as onnxruntime's kernel does."""
    data, idx, scale = ctx.tensor(data), ctx.tensor(indices), ctx.tensor(scales)
    gather_axis = norm_axis(ctx.attr("gather_axis", 0), data.ndim)
    quantize_axis = norm_axis(ctx.attr("quantize_axis", 1), data.ndim)
    if quantize_axis == gather_axis:
        raise UnsupportedOpError("GatherBlockQuantized: quantize_axis equal to gather_axis")
    if data.dtype is DType.u8:
        bits = _bits(ctx)
        if bits < 8 and quantize_axis != data.ndim - 1:
            raise UnsupportedOpError("GatherBlockQuantized: packed data quantized along an "
                                     "axis other than the last")
    elif data.dtype is DType.i8 or data.dtype.is_float8 and zero_points is None:
        bits = 0  # float8, or int4/uint4 read one a byte (onnx/load.py WIDENED): zero point 0
    else:
        raise UnsupportedOpError(f"GatherBlockQuantized: data of {data.dtype.value}"
                                 f"{' with zero points' if data.dtype.is_float8 else ''}")
    rows = data.shape[gather_axis]
    idx = ops.cast(idx, DType.i64)
    idx = ops.where(ops.lt(idx, 0), ops.add(idx, rows), idx)
    inside = ops.logical_and(ops.ge(idx, 0), ops.lt(idx, rows))
    safe = ops.where(inside, idx, ops.zeros((), DType.i64, like=idx))

    def take(t):  # a scale of size 1 on the gathered axis is one for every row
        if t.shape[gather_axis] == 1 and rows != 1:
            return ops.reshape(t, tuple(t.shape[:gather_axis]) + (1,) * idx.ndim +
                               tuple(t.shape[gather_axis + 1:]))
        return ops.gather(t, safe, gather_axis, wrap=False)

    out_axis = quantize_axis + (idx.ndim - 1 if quantize_axis > gather_axis else 0)
    q = take(data)
    if bits:
        q = _unpacked(q, bits, -1)
        zero = ops.full((), 2 ** (bits - 1), DType.i32, like=q) if zero_points is None else \
            _unpacked(take(ctx.tensor(zero_points)), bits, -1)
        q = ops.sub(q, _blocks(ctx, zero, q, out_axis))
    elif zero_points is not None:
        q = ops.sub(ops.cast(q, DType.i32),
                    _blocks(ctx, ops.cast(take(ctx.tensor(zero_points)), DType.i32), q, out_axis))
    y = ops.mul(ops.cast(q, scale.dtype), _blocks(ctx, take(scale), q, out_axis))
    mask = ops.reshape(inside, (1,) * gather_axis + tuple(idx.shape) +
                       (1,) * (data.ndim - 1 - gather_axis))
    return ops.where(mask, y, ops.zeros((), y.dtype, like=y))


def _blocks(ctx, value, x, axis: int):
    """A per-block value (a scale or zero point) repeated over its block along ``axis``."""
    if value.ndim == 0:
        return value
    block = ctx.attr("block_size", 128)
    if block == 0:  # one block: the whole axis
        return value
    value = ops.repeat_interleave(value, block, axis)
    return ops.slice(value, axis, 0, x.shape[axis])
