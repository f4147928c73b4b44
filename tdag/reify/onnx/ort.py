"""onnxruntime's fused kernels, written where ``to_onnx(..., runtime="onnxruntime")`` finds a
lowered kernel that one of them computes:

    attention(heads(slices of x @ Wqkv + b), finite mask) -> com.microsoft Attention
    attention(heads(x @ Wq + bq, x @ Wk + bk, x @ Wv + bv)) -> Attention (weights packed)
    reshape(permute(that attention))                      -> its [B, S, N*H] output as is
    rms_norm(x)                                            -> SimplifiedLayerNormalization
    gelu(x)                                                -> com.microsoft Gelu (tanh: FastGelu)
    linalg_inv(a), f32 or f64                              -> com.microsoft Inverse (any n)
    layer_norm(word[ids] + position[iota] + segment[seg])  -> EmbedLayerNormalization
    either, its weights or tables dequantized 8-bit constants -> QAttention (x's dequantized
      u8 integers in), QEmbedLayerNormalization (quantize_dynamic's kernels)
    where(key < length[b], 0, c) as attention's mask       -> Attention's mask_index [B]

``heads(t)`` is ``permute(reshape(t, [B, S, N, H]), (0, 2, 1, 3))``, how every exporter
splits a [B, S, N*H] projection into heads. These are the kernels onnxruntime's transformers
optimizer writes; its session optimiser does not find them in standard ONNX, so a file
re-emitted for onnxruntime runs as fast as the optimised original. A kernel that does not
match keeps its standard emission. The Skip norms that optimizer writes for a norm of a
residual sum are left out: their CPU kernels are slower than the Sum and norm they replace
(``_simplified_norm``).

onnxruntime's Attention softmaxes a row whose every key is masked to a uniform average, where
tdag's attention (torch's safe softmax) gives zeros: only a mask that is finite everywhere (the
exporters' ``finfo.min``), or none, goes to it. A key-padding mask goes to it as lengths (an
ONNX Attention's mask_index, imported) with its finite ``c`` as ``mask_filter_value``: a row of
length 0 is then the same softmax of scores shifted by ``c`` in both. No raw [B, S] mask is
written: onnxruntime reads it as ``m > 0`` where an exporter's ``(1 - m) * c`` differs for a
value other than 0 and 1. EmbedLayerNormalization takes int32 ids only where the program
widens int32 ones (a narrowing cast could bring an index into range) and refuses a negative
id where the program wraps it: an error, not another answer. ``SimplifiedLayerNormalization``
is in the default domain, as onnxruntime registers it.
"""
from __future__ import annotations

import math

import torch

from tdag.deinops.elementwise import CompareKind
from tdag.deinops.reduce import ReduceKind
from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.symbols import dims_equal, is_static
from tdag.ir.types import DType
from tdag.lower.kernels.einsum_plan import parse_equation
from tdag.lower.match import scalar
from tdag.reify.onnx.shortcuts import unwrapped_index

DOMAIN = "com.microsoft"


def fused(node, ins: list, g, cx) -> str | None:
    """The ONNX value of ``node`` computed by one of onnxruntime's fused kernels, or None
    where none fits (then the node's standard emission applies)."""
    for rule in _RULES:
        out = rule(node, ins, g, cx)
        if out is not None:
            return out
    return None


# -- attention --------------------------------------------------------------------------------

def _attention(node, ins, g, cx):
    if node.op is not Op.attention:
        return None
    heads = [_heads(cx.ctx, name) for name in node.inputs[:3]]
    if None in heads or node.type.dtype is not DType.f32:
        return None
    masked = _mask_inputs(node, ins, g, cx)
    if masked is None:
        return None
    sizes = {(n, h) for _, n, h in heads}
    if len(sizes) != 1 or not all(is_static(d) for d in next(iter(sizes))):
        return None
    (count, size), = sizes
    packed = _packed(cx, g, [src for src, _, _ in heads])
    if packed is None:
        return None
    mask, attrs = masked
    attrs.update(num_heads=int(count), scale=float(node.spec.scale),
                 unidirectional=int(node.spec.causal))
    packed, whole = packed
    quantized = _quantized(cx, g, whole) if whole is not None and len(mask) < 2 else None
    if quantized is not None:
        out = g.node("QAttention", quantized[:5] + (mask or [""]) + quantized[5:],
                     domain=DOMAIN, **attrs)
    else:
        out = g.node("Attention", list(packed) + mask, domain=DOMAIN, **attrs)
    # [B, S, N*H] -> tdag's [B, N, S, H]; a reader's permute back reads the [B, S, N, H]
    split = g.node("Reshape", [out, g.const([0, 0, int(count), int(size)])])
    cx.views[node.name, (0, 2, 1, 3)] = split
    cx.views[node.name, "merged"] = out
    return g.node("Transpose", [split], perm=[0, 2, 1, 3])


def _merged_heads(node, ins, g, cx):
    """reshape(permute(attention, (0, 2, 1, 3)), [B, S, N*H]): Attention's own output."""
    if node.op is not Op.reshape:
        return None
    permute = cx.ctx.made(node.inputs[0], Op.permute)
    if permute is None or permute.spec.perm != (0, 2, 1, 3) or node.type.rank != 3:
        return None
    return cx.views.get((permute.inputs[0], "merged"))


def _heads(ctx, name: str):
    """(t, N, H) where ``name`` is t[B, S, N*H] split into heads as [B, N, S, H]."""
    permute = ctx.made(name, Op.permute)
    if permute is None or permute.spec.perm != (0, 2, 1, 3):
        return None
    reshape = ctx.made(permute.inputs[0], Op.reshape)
    if reshape is None:
        return None
    src, split = ctx.type(reshape.inputs[0]).shape, reshape.type.shape
    if len(src) != 3 or not all(dims_equal(a, b) for a, b in zip(src[:2], split[:2])) or \
            not dims_equal(src[2], split[2] * split[3]):
        return None
    return reshape.inputs[0], split[2], split[3]


def _projection(ctx, name: str):
    """(the einsum node computing ``name`` = x[B, S, C] @ W (+ bias), whether W is [D, C]
    as nn.Linear holds it rather than [C, D]), else None."""
    node = ctx.made(name, Op.einsum)
    if node is None:
        return None
    (la, lb), out = parse_equation(node.spec.equation)
    if len(la) != 3 or len(lb) != 2 or la[2] not in lb or out != la[:2] + lb.replace(la[2], ""):
        return None
    if len(node.inputs) == 3 and ctx.type(node.inputs[2]).rank != 1:
        return None
    return node, lb[1] == la[2]


def _packed(cx, g, sources: list) -> tuple | None:
    """((x, W[C, 3D], bias) for com.microsoft Attention, the projection einsum or None),
    when q, k, v are the thirds of one projection (that einsum), or three projections of one
    x by weights tdag holds (packed here)."""
    ctx = cx.ctx
    slices = [ctx.made(s, Op.slice) for s in sources]
    if all(slices) and len({s.inputs[0] for s in slices}) == 1:
        whole, transposed = _projection(ctx, slices[0].inputs[0]) or (None, True)
        width = ctx.type(sources[0]).shape[2]
        if whole is None or transposed or not is_static(width):
            return None
        last = ctx.type(whole.name).rank - 1
        expected = [((last,), (i * width,), ((i + 1) * width,), (1,)) for i in range(3)]
        if [(s.spec.axes, s.spec.starts, s.spec.stops, s.spec.steps) for s in slices] != \
                expected or ctx.type(whole.name).shape[last] != 3 * width:
            return None
        # no bias (a zero one folded away): Attention's optional bias left empty
        bias = cx.env[whole.inputs[2]] if len(whole.inputs) == 3 else ""
        return tuple(cx.env[n] for n in whole.inputs[:2]) + (bias,), whole
    found = [_projection(ctx, s) for s in sources]
    if None in found or len({p.inputs[0] for p, _ in found}) != 1:
        return None
    projections = [p for p, _ in found]
    weights = [ctx.weight(p.inputs[1]) for p in projections]
    if any(w is None or w.value is None for w in weights):
        return None
    values = [w.value.T if transposed else w.value for w, (_, transposed) in zip(weights, found)]
    width = values[0].shape[1]
    biases = [ctx.weight(p.inputs[2]) if len(p.inputs) == 3 else None for p in projections]
    if any(len(p.inputs) == 3 and (b is None or b.value is None)
           for p, b in zip(projections, biases)):
        return None
    packed = g.initializer("qkv_weight", torch.cat(values, 1).contiguous())
    bias = torch.cat([b.value if b is not None else torch.zeros(width, dtype=torch.float32)
                      for b in biases])
    return (cx.env[projections[0].inputs[0]], packed, g.initializer("qkv_bias", bias)), None


def _quantized(cx, g, whole) -> list | None:
    """QAttention's inputs but the mask (x, W, bias, x's scale, W's, x's zero point, W's)
    where the projection ``whole`` is dequantized u8 x (one scale) by a dequantized 8-bit
    constant W[C, 3D] (one scale or one per column), as quantize_dynamic writes it: the
    integer product onnxruntime's QAttention computes, scaled, instead of a float one."""
    ctx = cx.ctx
    x, w = (ctx.made(n, Op.dequantize) for n in whole.inputs[:2])
    if x is None or w is None or ctx.type(x.inputs[0]).dtype is not DType.u8 or \
            x.spec.axis is not None or w.spec.axis not in (None, 1) or \
            ctx.type(w.inputs[0]).dtype not in (DType.i8, DType.u8) or \
            ctx.weight(w.inputs[0]) is None:
        return None
    bias = cx.env[whole.inputs[2]] if len(whole.inputs) == 3 else \
        g.filled(ctx.type(whole.name).shape[-1:], 0.0, DType.f32)
    (xq, xs, xz), (wq, ws, wz) = ([cx.env[n] for n in dq.inputs] + [""] * (3 - len(dq.inputs))
                                  for dq in (x, w))
    return [xq, wq, bias, xs, ws, xz, wz]


def _mask_inputs(node, ins, g, cx) -> tuple[list, dict] | None:
    """Attention's inputs after the bias, and its attributes, for ``node``'s mask: none; a
    key-padding length per row (mask_index, the filter value as ``mask_filter_value``); or an
    additive attention_bias finite everywhere. None for another mask."""
    if len(node.inputs) < 4:
        return [], {}
    padding = _padding(node, g, cx)
    if padding is not None:
        index, fill = padding
        return [index], {"mask_filter_value": fill}
    if not _finite_mask(cx.ctx, node):
        return None
    return ["", "", _attention_bias(node, ins[3], g, cx)], {}


def _attention_bias(node, mask: str, g, cx) -> str:
    """The additive mask as Attention's attention_bias [B or 1, N or 1, L, S]."""
    rank = cx.type(node.inputs[3]).rank
    shape = (1,) * (4 - rank) + tuple(cx.type(node.inputs[3]).shape)
    scores = node.type.shape[2], cx.type(node.inputs[1]).shape[2]
    if not all(dims_equal(a, b) for a, b in zip(shape[2:], scores)):
        return g.node("Expand", [mask, g.shape(shape[:2] + scores, False)])
    return mask if rank == 4 else g.node("Reshape", [mask, g.shape(shape)])


def _finite_mask(ctx, node) -> bool:
    """Whether ``node`` has no mask or an additive one that is finite everywhere."""
    if len(node.inputs) < 4:
        return True
    return ctx.type(node.inputs[3]).dtype is node.type.dtype and _finite(ctx, node.inputs[3])


def _finite(ctx, name: str) -> bool:
    node = ctx.producer(name)
    if node is None:
        weight = ctx.weight(name)
        return weight is not None and weight.value is not None and \
            bool(torch.isfinite(weight.value).all())
    if node.op is Op.where:
        return all(_finite(ctx, n) for n in node.inputs[1:])
    if has(node.op, Trait.KEEPS_VALUES):
        return _finite(ctx, node.inputs[0])
    return False


# -- embeddings and key padding (BERT's prologue) --------------------------------------------

def _embed_norm(node, ins, g, cx):
    """layer_norm(word[ids] + position[iota(S)] + segment[segment_ids]) over [B, S, D]:
    EmbedLayerNormalization. Its second output, the count of ones of each row of a [B, S]
    int32 mask, stands for the program's count of that mask (``_padding`` reads it)."""
    if node.op is not Op.layer_norm or node.spec.count != 1 or node.type.rank != 3 or \
            node.type.dtype is not DType.f32:
        return None
    ctx = cx.ctx
    terms = _addends(ctx, node.inputs[0], top=True)
    if len(terms) != 3:
        return None
    gathers = [_table_lookup(ctx, t, node.type.shape) for t in terms]
    if None in gathers:
        return None
    positions = [i for i, (_, index) in enumerate(gathers) if ctx.type(index).rank == 1]
    if len(positions) != 1:
        return None
    position = gathers.pop(positions[0])
    ids = [_int32(ctx, index) for _, index in gathers]
    if None in ids or not _is_iota(ctx, position[1], node.type.shape[1]):
        return None
    counted = _counted_mask(ctx, ctx.type(ids[0]).shape)
    (word, _), (segment, _) = gathers
    tables = [word, position[0], segment]
    mask = [cx.env[counted[1]]] if counted else []
    if all(len(t) == 1 for t in tables):
        width = node.type.shape[-1:]
        gamma = ins[1] if len(ins) > 1 else g.filled(width, 1.0, DType.f32)
        beta = ins[2] if len(ins) > 2 else g.filled(width, 0.0, DType.f32)
        inputs = [cx.env[ids[0]], cx.env[ids[1]]] + [cx.env[t] for t, in tables] + \
            [gamma, beta] + mask
        kernel = "EmbedLayerNormalization"
    else:
        tables += [_quantized_table(ctx, n) for n in node.inputs[1:3]]
        if len(tables) != 5 or not all(t and len(t) == 3 for t in tables):
            return None
        inputs = [cx.env[ids[0]], cx.env[ids[1]]] + [cx.env[q] for q, _, _ in tables] + \
            (mask or [""]) + [cx.env[s] for _, s, _ in tables] + \
            [cx.env[z] if z else "" for _, _, z in tables]
        kernel = "QEmbedLayerNormalization"
    out, lengths = g.node(kernel, inputs, outputs=2, domain=DOMAIN,
                          epsilon=float(node.spec.eps))
    if counted:
        cx.views[counted[0], "lengths"] = lengths
    return out


def _addends(ctx, name: str, top: bool = False) -> list:
    """The terms of ``name`` = a + b + ..., the inner sums read by nothing else."""
    node = ctx.made(name, Op.add)
    if node is None or not ctx.single_use(name) or (not top and node.type.rank != 3):
        return [name]
    return [t for n in node.inputs for t in _addends(ctx, n)]


def _table_lookup(ctx, name: str, shape) -> tuple | None:
    """(table, index) where ``name`` is gather(table[V, D], index, axis=0), broadcast to
    ``shape`` (index [B, S], or [S] for a lookup shared by the batch), the index as given
    before the importer's wrap of negative ones (onnxruntime refuses those: an error). The
    table is (t,), or (t, scale, zero point or "") for rows of an 8-bit table dequantized
    (QEmbedLayerNormalization's tables)."""
    node = ctx.made(name, Op.expand)
    name = node.inputs[0] if node is not None else name
    dequantized = ctx.made(name, Op.dequantize)
    gather = ctx.made(dequantized.inputs[0] if dequantized else name, Op.gather)
    if gather is None or gather.spec.axis != 0 or ctx.type(gather.inputs[0]).rank != 2 or \
            not dims_equal(ctx.type(gather.inputs[0]).shape[1], shape[-1]):
        return None
    index = unwrapped_index(ctx, gather) or gather.inputs[1]
    wanted = shape[:2] if gather.type.rank == 3 else shape[1:2]
    got = ctx.type(index).shape
    if len(got) != len(wanted) or not all(dims_equal(a, b) for a, b in zip(got, wanted)):
        return None
    if dequantized is None:
        return (gather.inputs[0],), index
    table = _quantized_table(ctx, dequantized.name, gather.inputs[0])
    return (table, index) if table is not None else None


def _quantized_table(ctx, name: str, source: str | None = None) -> tuple | None:
    """(q, scale, zero point or "") where ``name`` dequantizes ``source`` (by default its
    own input), a constant 8-bit tensor, with one scale."""
    node = ctx.made(name, Op.dequantize)
    if node is None or node.spec.axis is not None:
        return None
    q = source or node.inputs[0]
    if ctx.type(q).dtype not in (DType.i8, DType.u8) or ctx.weight(q) is None:
        return None
    return q, node.inputs[1], node.inputs[2] if len(node.inputs) == 3 else ""


def _int32(ctx, name: str) -> str | None:
    """The int32 tensor ``name`` widens (the kernels read int32 ids), else None: a cast of
    int64 to int32 could turn an index out of range into one in range."""
    while ctx.type(name).dtype is not DType.i32:
        node = ctx.made(name, Op.cast)
        if node is None or not _widens(ctx, node):
            return None
        name = node.inputs[0]
    return name


def _widens(ctx, cast) -> bool:
    source = ctx.type(cast.inputs[0]).dtype
    return source.is_integer and cast.type.dtype.is_integer and \
        source.itemsize <= cast.type.dtype.itemsize and \
        source.is_unsigned <= cast.type.dtype.is_unsigned or source is DType.bool


def _is_iota(ctx, name: str, length) -> bool:
    node = ctx.made(name, Op.iota)
    return node is not None and dims_equal(node.spec.length, length)


def _ones(ctx, name: str) -> str | None:
    """m where ``name`` is the number of ones in each row of the int32 mask m [B, S]
    (``reduce[sum](m == 1, axes=(1,))``, as EmbedLayerNormalization counts)."""
    node = ctx.made(name, Op.reduce)
    if node is None or node.spec.kind is not ReduceKind.sum or node.spec.axes != (1,) or \
            ctx.type(node.inputs[0]).rank != 2:
        return None
    source = node.inputs[0]
    while ctx.made(source, Op.cast) is not None and _widens(ctx, ctx.producer(source)):
        source = ctx.producer(source).inputs[0]
    test = ctx.made(source, Op.compare)
    if test is None or test.spec.kind is not CompareKind.eq or scalar(ctx, test.inputs[1]) != 1:
        return None
    return _int32(ctx, test.inputs[0])


def _counted_mask(ctx, shape) -> tuple | None:
    """(the count node, its mask) for a count of ones of an int32 [B, S] mask of ``shape``."""
    for node in ctx.graph.nodes:
        mask = _ones(ctx, node.name) if node.op is Op.reduce else None
        if mask is not None and all(dims_equal(a, b)
                                    for a, b in zip(ctx.type(mask).shape, shape)):
            return node.name, mask
    return None


def _padding(node, g, cx) -> tuple | None:
    """(mask_index, c) where ``node``'s mask is where(key < length[b], 0, c) over [B, 1, 1, S]
    (an ONNX Attention's mask_index, imported), S the keys and queries, c finite: the lengths
    as int32, the count of an EmbedLayerNormalization where one computes them."""
    ctx = cx.ctx
    batch, keys = node.type.shape[0], node.type.shape[2]
    choice = ctx.made(_rows(ctx, node.inputs[3], batch, keys) or "", Op.where)
    if choice is None or scalar(ctx, choice.inputs[1]) != 0 or \
            not dims_equal(ctx.type(node.inputs[1]).shape[2], keys):
        return None
    fill = scalar(ctx, choice.inputs[2])
    test = ctx.made(_rows(ctx, choice.inputs[0], batch, keys) or "", Op.compare)
    if fill is None or not math.isfinite(fill) or test is None or \
            test.spec.kind is not CompareKind.lt or test.type.rank != 2:
        return None
    position = ctx.made(test.inputs[0], Op.expand)
    if not _is_iota(ctx, position.inputs[0] if position else test.inputs[0], keys):
        return None
    lengths = _lengths(ctx, test.inputs[1], batch)
    if lengths is None:
        return None
    counted = cx.views.get((lengths, "lengths"))
    if counted is not None:
        return counted, fill
    return (cx.env[lengths] if ctx.type(lengths).dtype is DType.i32 else
            g.cast(cx.env[lengths], DType.i32)), fill


def _rows(ctx, name: str, batch, keys) -> str | None:
    """The [B, 1..., S] tensor that ``name`` is (or broadcasts over its middle axes), read
    through reshapes between such shapes (each keeps [b, ..., s] where it was), else None."""
    node = ctx.made(name, Op.expand)
    if node is not None and ctx.type(node.inputs[0]).rank == node.type.rank:
        name = node.inputs[0]
    if not _is_rows(ctx.type(name).shape, batch, keys):
        return None
    while (node := ctx.made(name, Op.reshape)) is not None and \
            _is_rows(ctx.type(node.inputs[0]).shape, batch, keys):
        name = node.inputs[0]
    return name


def _is_rows(shape, batch, keys) -> bool:
    return len(shape) >= 2 and dims_equal(shape[0], batch) and dims_equal(shape[-1], keys) \
        and all(is_static(d) and d == 1 for d in shape[1:-1])


def _lengths(ctx, name: str, batch) -> str | None:
    """The integer lengths [B] that ``name``, [B, S], holds as [B, 1] broadcast along its
    rows, through exact casts: a widening, or a narrowing of a count of mask ones (<= S)."""
    node = ctx.made(name, Op.expand)
    if node is not None and ctx.type(node.inputs[0]).rank == 2:
        name = node.inputs[0]
    shape = ctx.type(name).shape
    if len(shape) != 2 or shape[1] != 1 or not dims_equal(shape[0], batch) or \
            not ctx.type(name).dtype.is_integer:
        return None
    while True:
        node = ctx.producer(name)
        if node is not None and node.op is Op.reshape and ctx.type(node.inputs[0]).rank == 1:
            name = node.inputs[0]
        elif node is not None and node.op is Op.cast and \
                (_widens(ctx, node) or _ones(ctx, node.inputs[0]) is not None):
            name = node.inputs[0]
        else:
            return name if ctx.type(name).rank == 1 else None


# -- normalisation ----------------------------------------------------------------------------

def _simplified_norm(node, ins, g, cx):
    """rms_norm over the last axis: SimplifiedLayerNormalization. A norm of a residual sum
    is not written as a Skip kernel: on onnxruntime 1.32's CPU provider (one thread)
    SkipLayerNormalization takes 168 us where Sum + LayerNormalization take 30 on [128, 256]
    rows, SkipSimplifiedLayerNormalization 40 where Sum + SimplifiedLayerNormalization take
    20 (BERT's file with its four: 5.35 ms, without: 4.71)."""
    if node.op is not Op.rms_norm or node.spec.count != 1 or node.type.rank != 3 or \
            node.type.dtype is not DType.f32:
        return None
    gamma = ins[1] if len(ins) > 1 else g.filled(node.type.shape[-1:], 1.0, DType.f32)
    # as onnxruntime registers it: the default domain
    return g.node("SimplifiedLayerNormalization", [ins[0], gamma], axis=-1,
                  epsilon=float(node.spec.eps))


# -- activations ------------------------------------------------------------------------------

def _gelu(node, ins, g, cx):
    if node.op is not Op.gelu or node.type.dtype is not DType.f32:
        return None
    kernel = "Gelu" if node.spec.approximate == "none" else "FastGelu"
    return g.node(kernel, ins, domain=DOMAIN)


def _inverse(node, ins, g, cx):
    """com.microsoft Inverse (Eigen's partial-pivot LU) at any n, where standard ONNX has
    only the unrolled composition, capped at n <= 64 and O(n) nodes deep."""
    if node.op is not Op.linalg_inv or node.type.dtype not in (DType.f32, DType.f64):
        return None
    inverse = g.node("Inverse", ins, domain=DOMAIN)
    return g.node("Add", [inverse, _singular_check(g, ins[0], inverse, node.type.dtype)])


def _singular_check(g, a: str, inverse: str, dtype: DType) -> str:
    """A scalar 0 that fails at run time where the inverse has a non-finite entry and the
    matrices had none: Eigen divides by an exactly zero pivot where getrf reports it and
    torch raises (as the composition does, through a ConstantOfShape of length -1)."""
    def any_nonfinite(x: str) -> str:
        bad = g.node("Or", [g.node("IsInf", [x]), g.node("IsNaN", [x])])
        return g.node("ReduceMax", [g.cast(bad, DType.i64)], keepdims=0)
    ok = g.node("GreaterOrEqual", [any_nonfinite(a), any_nonfinite(inverse)])
    length = g.node("Where", [ok, g.const([0]), g.const([-1])])
    zeros = g.node("ConstantOfShape", [length])  # float zeros, or the run fails
    return g.cast(g.node("ReduceSum", [zeros], keepdims=0), dtype)


# each rule answers None for a node it does not fuse (another op included)
_RULES = (_attention, _merged_heads, _embed_norm, _simplified_norm, _gelu, _inverse)
