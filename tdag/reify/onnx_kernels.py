"""ONNX nodes for the kernels (registered into ``onnx_ops.CONVERT``).

Where ONNX has the op at the chosen opset it is used (Conv, LayerNormalization, Gelu at
opset 20, Softmax, BatchNormalization, MaxPool); otherwise the composition torch.onnx.export
emits (RMS norm, attention, group norm via InstanceNormalization).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tdag.ir.op import Op
from tdag.ir.symbols import is_static
from tdag.ir.types import DType
from tdag.deinops.kernels.sequence import lstm_parts
from tdag.deinops.kernels.einsum_plan import plan_einsum
from tdag.reify.onnx_graph import ONNX_DTYPE, GraphBuilder
from tdag.reify.onnx_ops import _last_two, converts
from tdag.reify.torch_ops import global_pool


def _t(g: GraphBuilder, x: str, rank: int) -> str:
    return g.node("Transpose", [x], perm=_last_two(rank))


@converts(Op.einsum)
def _einsum(node, ins, g, cx):
    bias = ins[2] if len(ins) == 3 else None
    plan = plan_einsum(node.spec.equation, cx.type(node.inputs[2]).rank if bias else None)
    if plan.kind == "einsum":
        out = g.node("Einsum", ins[:2], equation=node.spec.equation)
        return g.node("Add", [out, bias]) if bias else out
    (xi, yi) = (1, 0) if plan.swap else (0, 1)
    x, y = ins[xi], ins[yi]
    rx, ry = cx.type(node.inputs[xi]).rank, cx.type(node.inputs[yi]).rank
    if plan.transpose_a:
        x = _t(g, x, rx)
    inside = bias if plan.bias_inside else None
    if plan.kind == "linear" and rx == 2 and not plan.transpose_b:
        out = g.node("Gemm", [x, y] + ([inside] if inside else []), transB=1)  # as torch emits
    else:
        if plan.kind == "linear" and not plan.transpose_b or \
                plan.kind == "matmul" and plan.transpose_b:
            y = _t(g, y, ry)
        out = g.node("MatMul", [x, y])
        if inside:
            out = g.node("Add", [out, inside])
    if plan.out_perm is not None:
        out = g.node("Transpose", [out], perm=list(plan.out_perm))
    return g.node("Add", [out, bias]) if bias and not plan.bias_inside else out


def _conv_attrs(spec, kernel) -> dict:
    return dict(kernel_shape=[int(k) for k in kernel], strides=list(spec.stride),
                pads=list(spec.padding) * 2, dilations=list(spec.dilation), group=spec.groups)


@converts(Op.conv)
def _conv(node, ins, g, cx):
    kernel = cx.type(node.inputs[1]).shape[2:]
    return g.node("Conv", ins, **_conv_attrs(node.spec, kernel))


@converts(Op.conv_transpose)
def _conv_transpose(node, ins, g, cx):
    kernel = cx.type(node.inputs[1]).shape[2:]
    return g.node("ConvTranspose", ins, output_padding=list(node.spec.output_padding),
                  **_conv_attrs(node.spec, kernel))


@converts(Op.max_pool)
def _max_pool(node, ins, g, cx):
    s = node.spec
    if global_pool(node, cx.type(node.inputs[0]).shape):
        return g.node("GlobalMaxPool", ins)
    return g.node("MaxPool", ins, kernel_shape=list(s.kernel), strides=list(s.stride),
                  pads=list(s.padding) * 2, dilations=list(s.dilation))


@converts(Op.avg_pool)
def _avg_pool(node, ins, g, cx):
    s = node.spec
    if global_pool(node, cx.type(node.inputs[0]).shape):
        return g.node("GlobalAveragePool", ins)
    return g.node("AveragePool", ins, kernel_shape=list(s.kernel), strides=list(s.stride),
                  pads=list(s.padding) * 2, count_include_pad=1)


@converts(Op.resize)
def _resize(node, ins, g, cx):
    """Resize with torch's coordinates: floor-nearest on asymmetric coordinates, linear on
    pytorch_half_pixel or align_corners; sizes (or torch's explicit scales) as given."""
    s = node.spec
    if s.mode == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                     nearest_mode="floor")
    else:  # half_pixel is pytorch_half_pixel except for size-1 outputs, and runs faster
        half = "half_pixel" if all(n != 1 for n in s.sizes) else "pytorch_half_pixel"
        attrs = dict(mode="linear", coordinate_transformation_mode=(
            "align_corners" if s.align_corners else half))
    scales = s.scales if s.scales is not None else _exact_scales(cx.type(node.inputs[0]), s)
    if scales is not None:  # constant scales let onnxruntime use its fast upsampling
        scales = g.const([1.0, 1.0] + [float(v) for v in scales], DType.f32)
        return g.node("Resize", [ins[0], "", scales], **attrs)
    sizes = g.node("Concat", [g.node("Shape", ins, end=2), g.const(list(s.sizes))], axis=0)
    return g.node("Resize", [ins[0], "", "", sizes], **attrs)


def _exact_scales(x_type, spec) -> tuple | None:
    """out/in per axis when float32 reproduces every size exactly (then the scale and the
    size ratio give the same coordinates)."""
    scales = []
    for n, out in zip(x_type.shape[2:], spec.sizes):
        if not is_static(n) or not n:
            return None
        scale = float(np.float32(out / n))
        if math.floor(np.float32(scale) * np.float32(n)) != out or \
                float(np.float32(n) / np.float32(out)) != float(np.float32(1 / scale)):
            return None
        scales.append(scale)
    return tuple(scales)


@converts(Op.softmax)
def _softmax(node, ins, g, cx):
    return g.node("Softmax", ins, axis=node.spec.axis)


@converts(Op.log_softmax)
def _log_softmax(node, ins, g, cx):
    return g.node("LogSoftmax", ins, axis=node.spec.axis)


def _filled(g: GraphBuilder, like: str, shape, value: float, dtype: DType) -> str:
    """A tensor of ``value`` with ``shape`` (static: an initializer; else Expand)."""
    if all(is_static(d) for d in shape):
        return g.initializer("fill", torch.full(tuple(shape), value, dtype=dtype.torch))
    return g.node("Expand", [g.const(value, dtype), g.shape(shape, False)])


@converts(Op.layer_norm)
def _layer_norm(node, ins, g, cx):
    x_type = node.type
    tail = x_type.shape[x_type.rank - node.spec.count:]
    scale = ins[1] if len(ins) > 1 else _filled(g, ins[0], tail, 1.0, x_type.dtype)
    return g.node("LayerNormalization", [ins[0], scale] + ins[2:3], axis=-node.spec.count,
                  epsilon=node.spec.eps)


@converts(Op.rms_norm)
def _rms_norm(node, ins, g, cx):
    """x * 1/sqrt(mean(x^2) + eps) [* w], as torch.onnx.export writes it."""
    rank, dtype = node.type.rank, node.type.dtype
    axes = g.const(list(range(rank - node.spec.count, rank)))
    mean = g.node("ReduceMean", [g.node("Mul", [ins[0], ins[0]]), axes], keepdims=1)
    inv = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [mean, g.const(node.spec.eps,
                                                                                dtype)])])])
    out = g.node("Mul", [ins[0], inv])
    return g.node("Mul", [out, ins[1]]) if len(ins) > 1 else out


@converts(Op.group_norm)
def _group_norm(node, ins, g, cx):
    """Reshape to [N, G, -1], InstanceNormalization, reshape back, per-channel affine."""
    x_type, groups = node.type, node.spec.groups
    dtype = x_type.dtype
    grouped = g.node("Reshape", [ins[0], g.const([0, groups, -1])])
    ones = g.const([1.0] * groups, dtype)
    zeros = g.const([0.0] * groups, dtype)
    normed = g.node("InstanceNormalization", [grouped, ones, zeros], epsilon=node.spec.eps)
    out = g.node("Reshape", [normed, g.node("Shape", [ins[0]])])
    if len(ins) == 3:
        view = g.const([-1] + [1] * (x_type.rank - 2))
        out = g.node("Mul", [out, g.node("Reshape", [ins[1], view])])
        out = g.node("Add", [out, g.node("Reshape", [ins[2], view])])
    return out


@converts(Op.batch_norm)
def _batch_norm(node, ins, g, cx):
    x, mean, var = ins[:3]
    channels = node.type.shape[1]
    dtype = node.type.dtype
    scale = ins[3] if len(ins) > 3 else _filled(g, mean, (channels,), 1.0, dtype)
    bias = ins[4] if len(ins) > 4 else _filled(g, mean, (channels,), 0.0, dtype)
    return g.node("BatchNormalization", [x, scale, bias, mean, var], epsilon=node.spec.eps)


@converts(Op.attention)
def _attention(node, ins, g, cx):
    """softmax(q k^T * scale + mask) v with the causal mask from Trilu."""
    q, k, v = ins[:3]
    q_type, k_type = cx.type(node.inputs[0]), cx.type(node.inputs[1])
    dtype, rank = q_type.dtype, q_type.rank
    scores = g.node("MatMul", [q, _t(g, k, rank)])
    scores = g.node("Mul", [scores, g.const(node.spec.scale, dtype)])
    neg_inf = g.const(float("-inf"), dtype)
    if node.spec.causal:
        square = (q_type.shape[-2], k_type.shape[-2])
        ones = _filled(g, q, square, 1.0, dtype)
        keep = g.node("Cast", [g.node("Trilu", [ones], upper=0)], to=9)  # to bool
        scores = g.node("Where", [keep, scores, neg_inf])
    if len(ins) < 4:
        return g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
    mask = ins[3]
    boolean = cx.type(node.inputs[3]).dtype is DType.bool
    # a bool mask becomes an additive one: onnxruntime adds faster than it selects, and the
    # (small, broadcast) additive mask is made once for every layer that shares the mask
    additive = g.node("Where", [mask, g.const(0.0, dtype), neg_inf]) if boolean else mask
    scores = g.node("Add", [scores, additive])
    # torch's safe softmax: a row with every key masked attends to nothing (0, not nan).
    # Without a causal mask the test reads the (small, broadcast) mask, not the scores.
    if node.spec.causal:
        dead = g.node("Equal", [g.node("ReduceMax", [scores, g.const([-1])], keepdims=1),
                                neg_inf])
    elif boolean:
        keep = g.node("ReduceMax", [g.node("Cast", [mask], to=ONNX_DTYPE[DType.f32]),
                                    g.const([-1])], keepdims=1)
        dead = g.node("Equal", [keep, g.const(0.0, DType.f32)])
    else:
        dead = g.node("Equal", [g.node("ReduceMax", [mask, g.const([-1])], keepdims=1), neg_inf])
    probs, zero = g.node("Softmax", [scores], axis=-1), g.const(0.0, dtype)
    # rows are independent, so the dead rows may as well be zeroed after the product (their
    # nan stays in their own row), where the tensor is smaller when values are narrower
    # than the keys are many
    keys, width = k_type.shape[-2], cx.type(node.inputs[2]).shape[-1]
    if is_static(keys) and is_static(width) and width < keys:
        return g.node("Where", [dead, zero, g.node("MatMul", [probs, v])])
    return g.node("MatMul", [g.node("Where", [dead, zero, probs]), v])


@converts(Op.lstm)
def _lstm(node, ins, g, cx):
    """One ONNX LSTM per layer (both directions in one where bidirectional); ONNX orders
    the gates (i, o, f, c) where torch has (i, f, g, o)."""
    spec = node.spec
    x, weights, h0s, c0s = lstm_parts(spec, ins)
    hidden = int(node.type.shape[-1]) // (2 if spec.bidirectional else 1)
    order = g.const([k * hidden + j for k in (0, 3, 1, 2) for j in range(hidden)])
    gates = lambda t: g.node("Gather", [t, order], axis=0)  # noqa: E731
    stack = lambda ts: ts[0] if len(ts) == 1 else g.node("Concat", ts, axis=0)  # noqa: E731
    first = lambda t: g.node("Unsqueeze", [t, g.const([0])])  # noqa: E731
    directions = 2 if spec.bidirectional else 1
    for layer in range(spec.layers):
        cells = range(layer * directions, (layer + 1) * directions)
        w = stack([first(gates(weights[k][0])) for k in cells])
        r = stack([first(gates(weights[k][1])) for k in cells])
        b = stack([first(g.node("Concat", [gates(weights[k][2]), gates(weights[k][3])], axis=0))
                   for k in cells])
        h, c = (stack([first(states[k]) for k in cells]) for states in (h0s, c0s))
        direction = "bidirectional" if spec.bidirectional else \
            "reverse" if spec.reverse else "forward"
        y = g.node("LSTM", [x, w, r, b, "", h, c], hidden_size=hidden, direction=direction)
        if directions == 1:
            x = g.node("Squeeze", [y, g.const([1])])  # [T, 1, B, H] -> [T, B, H]
        else:  # [T, 2, B, H] -> [T, B, 2H], forward first as torch concatenates
            x = g.node("Reshape", [g.node("Transpose", [y], perm=[0, 2, 1, 3]),
                                   g.const([0, 0, -1])])
    return x


@converts(Op.gelu)
def _gelu(node, ins, g, cx):
    if g.opset >= 20:
        return g.node("Gelu", ins, approximate=node.spec.approximate)
    dtype = node.type.dtype
    x = ins[0]
    if node.spec.approximate == "tanh":
        cube = g.node("Mul", [g.node("Mul", [x, x]), x])
        inner = g.node("Add", [x, g.node("Mul", [cube, g.const(0.044715, dtype)])])
        inner = g.node("Tanh", [g.node("Mul", [inner, g.const(0.7978845608028654, dtype)])])
    else:
        inner = g.node("Erf", [g.node("Mul", [x, g.const(0.7071067811865476, dtype)])])
    half = g.node("Mul", [x, g.const(0.5, dtype)])
    return g.node("Mul", [half, g.node("Add", [inner, g.const(1.0, dtype)])])


@converts(Op.clamp)
def _clamp(node, ins, g, cx):
    """Max then Min, which propagate nan as torch.clamp does (Clip is not specified to)."""
    dtype, out = node.type.dtype, ins[0]
    if node.spec.lo is not None:
        out = g.node("Max", [out, g.const(node.spec.lo, dtype)])
    if node.spec.hi is not None:
        out = g.node("Min", [out, g.const(node.spec.hi, dtype)])
    return out


@converts(Op.concat)
def _concat(node, ins, g, cx):
    return g.node("Concat", ins, axis=node.spec.axis)


@converts(Op.silu)
def _silu(node, ins, g, cx):
    return g.node("Mul", [ins[0], g.node("Sigmoid", ins)])

