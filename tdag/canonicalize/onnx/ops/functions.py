"""ONNX ops the standard defines as functions of other ONNX ops (their schema carries the body,
often built for the node's attributes and input types): tdag imports such a node by expanding
that body and importing each body node in its place, so the op is whatever composition of
tdag primitives its body's ops map to: CausalConvWithState, SwiGLU and (of the
ai.onnx.preview domain) FlexAttention.

Only ops whose bodies hold plain ops are expanded (a body with Scan or If would need the
importer's controllers): LinearAttention, whose body scans the tokens, is written out here
as its recurrence instead. A body node's names are prefixed so that they cannot meet the
model's; the body's formal inputs and outputs are the node's own names.
"""
from __future__ import annotations

import onnx
import torch
from onnx import helper

from tdag import ops
from tdag.canonicalize.onnx.ops.table import register
from tdag.canonicalize.onnx.values import Known
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

FUNCTION_OPS = ("CausalConvWithState", "SwiGLU", "FlexAttention")
PREVIEW_OPS = ("FlexAttention",)  # of the ai.onnx.preview domain (the rest are ai.onnx's)


def _type_proto(value) -> bytes:
    """The ONNX type of an input value (empty for an omitted one), as the schema's function
    builder reads it."""
    if value is None:
        return onnx.TypeProto().SerializeToString()
    dtype, shape = (value.dtype, value.shape)
    try:
        elem = helper.np_dtype_to_tensor_dtype(torch.empty(0, dtype=dtype.torch).numpy().dtype)
    except TypeError:
        raise UnsupportedOpError(f"a function body for an input of {dtype}") from None
    dims = [d if isinstance(d, int) else str(d) for d in shape]
    return helper.make_tensor_type_proto(elem, dims).SerializeToString()


def _body(ctx, inputs) -> onnx.FunctionProto:
    node = ctx.node
    schema = onnx.defs.get_schema(node.op_type, ctx.opset, node.domain)
    if schema.has_context_dependent_function:
        raw = schema.get_context_dependent_function(node.SerializeToString(),
                                                    [_type_proto(v) for v in inputs])
    elif schema.has_function:
        raw = schema.get_function_with_opset_version(
            max(v for v in schema.function_opset_versions if v <= ctx.opset))
    else:
        raise UnsupportedOpError(f"{node.op_type}: its schema defines no function body")
    body = onnx.FunctionProto()
    body.ParseFromString(raw)
    return body


def _resolved(attribute, given: dict):
    """A body attribute; one that refers to the node's (ref_attr_name) takes its value, and
    is dropped (the op's default) where the node does not set it."""
    if not attribute.ref_attr_name:
        return attribute
    if attribute.ref_attr_name not in given:
        return None
    value = onnx.AttributeProto()
    value.CopyFrom(given[attribute.ref_attr_name])
    value.name = attribute.name
    return value


def _renamed(inner: onnx.NodeProto, names: dict, prefix: str, given: dict) -> onnx.NodeProto:
    def rename(name):
        return names.get(name, prefix + name if name else "")

    out = onnx.NodeProto()
    out.CopyFrom(inner)
    del out.input[:], out.output[:], out.attribute[:]
    out.input.extend(rename(n) for n in inner.input)
    out.output.extend(rename(n) for n in inner.output)
    out.attribute.extend(a for a in (_resolved(a, given) for a in inner.attribute)
                         if a is not None)
    out.name = prefix + (inner.name or inner.op_type)
    return out


def _expand(ctx, *inputs):
    node, importer = ctx.node, ctx.importer
    body = _body(ctx, [None if v is None else v if not isinstance(v, Known) else
                       ctx.tensor(v) for v in inputs])
    prefix = importer.builder.fresh(f"{node.op_type}_body") + "/"
    names = {formal: actual for formal, actual in zip(body.input, node.input)}
    names.update({formal: prefix + formal for formal in body.input[len(node.input):]})
    given = {a.name: a for a in node.attribute}
    for index, inner in enumerate(body.node):
        importer.convert_node(_renamed(inner, names, prefix, given), index)
    return [importer.read(prefix + name) for name in body.output[:len(node.output)]]


for _op in FUNCTION_OPS:
    register(_op)(_expand)


# -- LinearAttention: its body runs a Scan, so its recurrence is written out here --------------

def _heads(x, count: int):
    """(B, T, H * D) -> (B, T, H, D)."""
    return ops.reshape(x, (x.shape[0], x.shape[1], count, -1))


@register("LinearAttention")
def _linear_attention(ctx, query, key, value, past_state=None, decay=None, beta=None):
    """The recurrent state S (B, H_kv, d_k, d_v) updated token by token (unrolled over the
    static sequence length), in float32 as the ONNX function body:

        gated:  S = exp(g_t) * S                      (per key dimension or per head)
        delta:  S = S + k_t (x) beta_t (v_t - S^T k_t)   else   S = S + k_t (x) v_t
        o_t = scale * q_t^T S   (query heads share a kv head's state in groups)
    """
    rule = ctx.choice("update_rule", "gated_delta", ("linear", "gated", "delta", "gated_delta"))
    q_heads, kv_heads = ctx.attr("q_num_heads", 0), ctx.attr("kv_num_heads", 0)
    if q_heads < 1 or kv_heads < 1 or q_heads % kv_heads:
        raise InvalidModelError(f"LinearAttention: q_num_heads {q_heads} must be a positive "
                                f"multiple of kv_num_heads {kv_heads}")
    query = ctx.tensor(query)
    steps = query.shape[1]
    if not is_static(steps):
        raise UnsupportedOpError(f"LinearAttention over a symbolic sequence length {steps}")
    q, k, v = (ops.cast(_heads(ctx.tensor(t), h), DType.f32)
               for t, h in ((query, q_heads), (key, kv_heads), (value, kv_heads)))
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if (gated and decay is None) or (delta and beta is None):
        raise InvalidModelError(f"LinearAttention: update_rule {rule!r} needs "
                                f"{'decay' if gated and decay is None else 'beta'}")
    g = ops.exp(ops.cast(_heads(ctx.tensor(decay), kv_heads), DType.f32)) if gated else None
    b = ops.cast(ops.reshape(ctx.tensor(beta), (q.shape[0], steps, -1, 1)), DType.f32) \
        if delta else None
    key_dim = k.shape[-1]
    scale = ctx.attr("scale", 0.0) or 1.0 / float(key_dim) ** 0.5
    state = ops.cast(ctx.tensor(past_state), DType.f32) if past_state is not None else \
        ops.zeros((q.shape[0], kv_heads, key_dim, v.shape[-1]), DType.f32, like=q)
    outputs = []
    for t in range(steps):
        k_t, v_t = ops.select(k, 1, t), ops.select(v, 1, t)  # (B, H_kv, d)
        if gated:
            state = ops.mul(state, ops.unsqueeze(ops.select(g, 1, t), -1))
        if delta:
            retrieved = ops.sum(ops.mul(state, ops.unsqueeze(k_t, -1)), 2)  # S^T k
            v_t = ops.mul(ops.select(b, 1, t), ops.sub(v_t, retrieved))
        state = ops.add(state, ops.mul(ops.unsqueeze(k_t, -1), ops.unsqueeze(v_t, -2)))
        shared = ops.repeat_interleave(state, q_heads // kv_heads, 1) \
            if q_heads != kv_heads else state
        read = ops.sum(ops.mul(ops.unsqueeze(ops.select(q, 1, t), -1), shared), 2)
        outputs.append(ops.mul(read, scale))  # (B, H_q, d_v)
    out = ops.reshape(ops.stack(outputs, 1), (q.shape[0], steps, -1))
    return ops.cast(out, query.dtype), ops.cast(state, query.dtype)
