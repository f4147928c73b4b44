"""ONNX ops the standard defines as functions of other ONNX ops (their schema carries the body,
often built for the node's attributes and input types): tdag imports such a node by expanding
that body and importing each body node in its place, so the op is whatever composition of
tdag primitives its body's ops map to.

Only ops whose bodies hold plain ops are listed (a body with Scan or If, as LinearAttention's,
would need the importer's controllers). A body node's names are prefixed so that they cannot
meet the model's; the body's formal inputs and outputs are the node's own names.
"""
from __future__ import annotations

import onnx
import torch
from onnx import helper

from tdag.canonicalize.onnx_ops import register
from tdag.canonicalize.onnx_values import Known
from tdag.errors import UnsupportedOpError

FUNCTION_OPS = ("CausalConvWithState", "SwiGLU")


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
        importer._node(_renamed(inner, names, prefix, given), index)
    return [importer.read(prefix + name) for name in body.output[:len(node.output)]]


for _op in FUNCTION_OPS:
    register(_op)(_expand)
