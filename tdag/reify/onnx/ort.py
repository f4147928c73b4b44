"""onnxruntime's fused kernels, written where ``to_onnx(..., runtime="onnxruntime")`` finds a
lowered kernel that one of them computes:

    attention(heads(slices of x @ Wqkv + b), finite mask) -> com.microsoft Attention
    attention(heads(x @ Wq + bq, x @ Wk + bk, x @ Wv + bv)) -> Attention (weights packed)
    reshape(permute(that attention))                      -> its [B, S, N*H] output as is
    layer_norm(a + b [+ bias])                             -> com.microsoft SkipLayerNormalization
    rms_norm(a + b [+ bias])                               -> SkipSimplifiedLayerNormalization
    rms_norm(x)                                            -> SimplifiedLayerNormalization
    gelu(x)                                                -> com.microsoft Gelu (tanh: FastGelu)

``heads(t)`` is ``permute(reshape(t, [B, S, N, H]), (0, 2, 1, 3))``, how every exporter
splits a [B, S, N*H] projection into heads. These are the kernels onnxruntime's transformers
optimizer writes; its session optimiser does not find them in standard ONNX, so a file
re-emitted for onnxruntime runs as fast as the optimised original. A kernel that does not
match keeps its standard emission.

onnxruntime's Attention softmaxes a row whose every key is masked to a uniform average, where
tdag's attention (torch's safe softmax) gives zeros: only a mask that is finite everywhere (the
exporters' ``finfo.min``), or none, goes to it. ``SimplifiedLayerNormalization`` is in the
default domain, as onnxruntime registers it.
"""
from __future__ import annotations

import torch

from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.symbols import dims_equal, is_static
from tdag.ir.types import DType
from tdag.lower.kernels.einsum_plan import parse_equation

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
    if None in heads or not _finite_mask(cx.ctx, node) or node.type.dtype is not DType.f32:
        return None
    sizes = {(n, h) for _, n, h in heads}
    if len(sizes) != 1 or not all(is_static(d) for d in next(iter(sizes))):
        return None
    (count, size), = sizes
    packed = _packed(cx, g, [src for src, _, _ in heads])
    if packed is None:
        return None
    inputs = list(packed)
    if len(node.inputs) == 4:
        inputs += ["", "", _attention_bias(node, ins[3], g, cx)]
    out = g.node("Attention", inputs, domain=DOMAIN, num_heads=int(count),
                 scale=float(node.spec.scale), unidirectional=int(node.spec.causal))
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
    """(x, W[C, 3D], bias) for com.microsoft Attention, when q, k, v are the thirds of one
    projection, or three projections of one x by weights tdag holds (packed here)."""
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
        return tuple(cx.env[n] for n in whole.inputs[:2]) + \
            ((cx.env[whole.inputs[2]],) if len(whole.inputs) == 3 else ())
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
    return cx.env[projections[0].inputs[0]], packed, g.initializer("qkv_bias", bias)


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


# -- normalisation ----------------------------------------------------------------------------

def _skip_norm(node, ins, g, cx):
    """layer_norm / rms_norm over the last axis of a sum (a residual): the Skip kernel."""
    if node.op not in (Op.layer_norm, Op.rms_norm) or node.spec.count != 1 or \
            node.type.rank != 3 or node.type.dtype is not DType.f32:
        return None
    terms = _sum_terms(cx.ctx, node.inputs[0], node.type.shape)
    if terms is not None and not all(n in cx.env for n in terms if n):
        return None  # a broadcast term left to Add's own broadcasting: no tensor to pass
    gamma = ins[1] if len(ins) > 1 else g.filled(node.type.shape[-1:], 1.0, DType.f32)
    if terms is None:
        if node.op is Op.rms_norm:  # as onnxruntime registers it: the default domain
            return g.node("SimplifiedLayerNormalization", [ins[0], gamma], axis=-1,
                          epsilon=float(node.spec.eps))
        return None
    a, b, bias = (cx.env[n] if n else "" for n in terms)
    if node.op is Op.layer_norm:
        beta = ins[2] if len(ins) > 2 else ""
        return g.node("SkipLayerNormalization", [a, b, gamma, beta, bias], domain=DOMAIN,
                      epsilon=float(node.spec.eps))
    return g.node("SkipSimplifiedLayerNormalization", [a, b, gamma, bias], domain=DOMAIN,
                  epsilon=float(node.spec.eps))


def _sum_terms(ctx, name: str, shape) -> tuple | None:
    """(a, b, bias or "") where ``name`` = a + b (+ bias[D] broadcast), a and b of ``shape``,
    and no other node reads the sums (the kernel does not return them)."""
    total = ctx.made(name, Op.add)
    if total is None or not ctx.single_use(name):
        return None
    bias = ""
    for i, term in enumerate(total.inputs):
        vector = _vector(ctx, term, shape)
        inner = ctx.made(total.inputs[1 - i], Op.add)
        if vector is not None and inner is not None and ctx.single_use(inner.name):
            total, bias = inner, vector
            break
    a, b = total.inputs
    full = all(len(ctx.type(n).shape) == len(shape) and
               all(dims_equal(x, y) for x, y in zip(ctx.type(n).shape, shape)) for n in (a, b))
    return (a, b, bias) if full else None


def _vector(ctx, name: str, shape) -> str | None:
    """The [D] tensor that ``name`` broadcasts to ``shape`` (D its last axis), else None."""
    node = ctx.made(name, Op.expand)
    source = node.inputs[0] if node is not None else name
    t = ctx.type(source)
    return source if t.rank == 1 and dims_equal(t.shape[0], shape[-1]) else None


# -- activations ------------------------------------------------------------------------------

def _gelu(node, ins, g, cx):
    if node.op is not Op.gelu or node.type.dtype is not DType.f32:
        return None
    kernel = "Gelu" if node.spec.approximate == "none" else "FastGelu"
    return g.node(kernel, ins, domain=DOMAIN)


# each rule answers None for a node it does not fuse (another op included)
_RULES = (_attention, _merged_heads, _skip_norm, _gelu)
