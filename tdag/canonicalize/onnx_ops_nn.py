"""The ONNX op table, neural-network part: contractions, convolution, pooling, norms,
softmax and resize. Entries follow onnx_ops.py's convention ``(ctx, *inputs) -> value(s)``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tdag import ops
from tdag.canonicalize.onnx_ops import _norm, _norm_axes, register
from tdag.canonicalize.onnx_values import MAX_TABLE
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import dims_equal, is_static, product

# -- contractions -------------------------------------------------------------------------------


@register("MatMul")
def _matmul(ctx, a, b):
    return ops.matmul(ctx.tensor(a), ctx.tensor(b))


@register("Gemm")
def _gemm(ctx, a, b, c=None):
    a, b = ctx.tensor(a), ctx.tensor(b)
    if ctx.flag("transA", 0):
        a = ops.permute(a, 1, 0)
    if ctx.flag("transB", 0):
        b = ops.permute(b, 1, 0)
    y = ops.matmul(a, b)
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    if alpha != 1.0:
        y = ops.mul(y, alpha)
    if c is not None:
        c = ctx.tensor(c)
        y = ops.add(y, c if beta == 1.0 else ops.mul(c, beta))
    return y


# -- convolution and pooling ---------------------------------------------------------------------

_AUTO_PAD = ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER")


def _pads(ctx, spatial, kernel, strides, dilations):
    """(begins, ends) per spatial axis, from ``pads`` or ``auto_pad``."""
    n, auto = len(kernel), ctx.choice("auto_pad", "NOTSET", _AUTO_PAD)
    if auto in ("NOTSET", ""):
        pads = ctx.sizes("pads", 2 * n, 0, least=0)
        return pads[:n], pads[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        if not is_static(size):
            raise UnsupportedOpError(f"{ctx.node.op_type}: auto_pad={auto} on a symbolic size")
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins, ends


def _kernel(ctx, x, default=None) -> list:
    """kernel_shape: one size >= 1 per spatial axis of ``x`` (Conv's default: the weight's)."""
    if ctx.attr("kernel_shape") is not None:
        return ctx.sizes("kernel_shape", x.ndim - 2, 0, least=1)
    if default is None:
        raise InvalidModelError(f"{ctx.node.op_type}: kernel_shape is required")
    return list(default)


def _window(ctx, x, kernel):
    n = len(kernel)
    strides = ctx.sizes("strides", n, 1, least=1)
    dilations = ctx.sizes("dilations", n, 1, least=1)
    begins, ends = _pads(ctx, x.shape[2:], kernel, strides, dilations)
    return strides, dilations, begins, ends


def _pre_pad(x, begins, ends, value=0.0):
    """Asymmetric padding as an explicit pad, so the kernel op sees symmetric (zero) padding."""
    if begins == ends:
        return x, list(begins)
    return ops.pad(x, [(0, 0), (0, 0)] + list(zip(begins, ends)), value), [0] * len(begins)


@register("Conv")
def _conv(ctx, x, w, b=None):
    x, w = ctx.tensor(x), ctx.tensor(w)
    kernel = _kernel(ctx, x, w.shape[2:])
    strides, dilations, begins, ends = _window(ctx, x, kernel)
    x, padding = _pre_pad(x, begins, ends)
    bias = ctx.tensor(b) if b is not None else None
    return ops.conv(x, w, bias, strides, padding, dilations, _group(ctx))


def _group(ctx) -> int:
    group = ctx.attr("group", 1)
    if type(group) is not int or group < 1:
        raise InvalidModelError(f"{ctx.node.op_type}: group must be at least 1, got {group!r}")
    return group


@register("ConvTranspose")
def _conv_transpose(ctx, x, w, b=None):
    x, w = ctx.tensor(x), ctx.tensor(w)
    kernel = _kernel(ctx, x, w.shape[2:])
    n = len(kernel)
    if ctx.attr("output_shape") or ctx.choice("auto_pad", "NOTSET", _AUTO_PAD) not in \
            ("NOTSET", ""):
        raise UnsupportedOpError("ConvTranspose: output_shape / auto_pad")
    strides = ctx.sizes("strides", n, 1, least=1)
    dilations = ctx.sizes("dilations", n, 1, least=1)
    pads = ctx.sizes("pads", 2 * n, 0, least=0)
    extra = ctx.sizes("output_padding", n, 0, least=0)
    # full overlap-add, then crop the pads (the extra output_padding cells are zeros + bias)
    y = ops.conv_transpose(x, w, None, strides, 0, 0, _group(ctx), dilations)
    y = ops.pad(y, [(0, 0), (0, 0)] + [(-pads[i], extra[i] - pads[n + i]) for i in range(n)])
    if b is not None:
        y = ops.add(y, ops.reshape(ctx.tensor(b), -1, *([1] * n)))
    return y


@register("MaxPool")
def _max_pool(ctx, x):
    x = ctx.tensor(x)
    kernel = _kernel(ctx, x)
    strides, dilations, begins, ends = _window(ctx, x, kernel)
    ctx.flag("storage_order", 0)  # only the Indices output, not computed, depends on it
    x, padding = _pre_pad(x, begins, ends, float("-inf"))
    y = ops.max_pool(x, kernel, strides, padding, dilations, ctx.flag("ceil_mode", 0))
    return y, None  # Indices: not computed


@register("AveragePool")
def _avg_pool(ctx, x):
    x = ctx.tensor(x)
    kernel = _kernel(ctx, x)
    strides, dilations, begins, ends = _window(ctx, x, kernel)
    include = ctx.flag("count_include_pad", 0)  # ONNX's default is not torch's
    if any(d != 1 for d in dilations):
        raise UnsupportedOpError("AveragePool: dilations")
    ceil = ctx.flag("ceil_mode", 0)
    if begins != ends and not include:
        # the mean of the real cells: windowed sums of x and of a ones mask, padded alike
        ones = ops.full((1, 1, *x.shape[2:]), 1.0, x.dtype, like=x)
        sums, counts = (ops.avg_pool(_pre_pad(t, begins, ends)[0], kernel, strides,
                                     [0] * len(kernel), ceil, True) for t in (x, ones))
        return ops.div(sums, counts)
    x, padding = _pre_pad(x, begins, ends)
    return ops.avg_pool(x, kernel, strides, padding, ceil, include)


@register("GlobalAveragePool")
def _global_avg_pool(ctx, x):
    x = ctx.tensor(x)
    return ops.mean(x, tuple(range(2, x.ndim)), True)


@register("GlobalMaxPool")
def _global_max_pool(ctx, x):
    x = ctx.tensor(x)
    return ops.amax(x, tuple(range(2, x.ndim)), True)


# -- norms ----------------------------------------------------------------------------------------

@register("BatchNormalization")
def _batch_norm(ctx, x, scale, bias, mean, var, *rest):
    if ctx.flag("training_mode", 0):
        raise UnsupportedOpError("BatchNormalization: training_mode=1")
    y = ops.batch_norm(ctx.tensor(x), ctx.tensor(mean), ctx.tensor(var), ctx.tensor(scale),
                       ctx.tensor(bias), ctx.attr("epsilon", 1e-5))
    return (y,) + (None,) * (ctx.num_outputs - 1)


@register("LayerNormalization")
def _layer_norm(ctx, x, scale, bias=None):
    x = ctx.tensor(x)
    axis = _norm(ctx.attr("axis", -1), x.ndim)
    y = ops.layer_norm(x, x.shape[axis:], ctx.tensor(scale),
                       ctx.tensor(bias) if bias is not None else None, ctx.attr("epsilon", 1e-5))
    return (y,) + (None,) * (ctx.num_outputs - 1)  # Mean, InvStdDev: not computed


@register("LRN")
def _lrn(ctx, x):
    size = ctx.attr("size")
    if type(size) is not int or size < 1:
        raise InvalidModelError(f"LRN: size must be a positive int, got {size!r}")
    return ops.local_response_norm(ctx.tensor(x), size, ctx.attr("alpha", 1e-4),
                                   ctx.attr("beta", 0.75), ctx.attr("bias", 1.0),
                                   before=(size - 1) // 2)


@register("InstanceNormalization")
def _instance_norm(ctx, x, scale, bias):
    return ops.instance_norm(ctx.tensor(x), weight=ctx.tensor(scale), bias=ctx.tensor(bias),
                             eps=ctx.attr("epsilon", 1e-5))


@register("GroupNormalization")
def _group_norm(ctx, x, scale, bias):
    x, scale, bias = ctx.tensor(x), ctx.tensor(scale), ctx.tensor(bias)
    groups, channels = ctx.attr("num_groups"), x.shape[1]
    if type(groups) is not int or groups < 1:
        raise InvalidModelError(f"GroupNormalization: num_groups must be at least 1, got "
                                f"{groups!r}")
    if is_static(channels) and scale.shape[0] == groups != channels:
        # opset 18 gave one scale per group (21 changed it to one per channel)
        scale = ops.repeat_interleave(scale, channels // groups, 0)
        bias = ops.repeat_interleave(bias, channels // groups, 0)
    return ops.group_norm(x, groups, scale, bias, ctx.attr("epsilon", 1e-5))


# -- softmax --------------------------------------------------------------------------------------

def _softmax(fn):
    def convert(ctx, x):
        x = ctx.tensor(x)
        if ctx.opset >= 13:
            return fn(x, _norm(ctx.attr("axis", -1), x.ndim))
        # before 13: the input is viewed as 2-D at ``axis`` and normalised over the second part
        axis = _norm(ctx.attr("axis", 1), x.ndim)
        if axis == x.ndim - 1:
            return fn(x, axis)
        flat = ops.reshape(x, product(x.shape[:axis]), product(x.shape[axis:]))
        return ops.reshape(fn(flat, 1), *x.shape)
    return convert


register("Softmax")(_softmax(ops.softmax))
register("LogSoftmax")(_softmax(ops.log_softmax))


# -- resize ---------------------------------------------------------------------------------------

@register("Resize", "Upsample")
def _resize(ctx, x, *rest):
    x = ctx.tensor(x)
    scales, sizes = _resize_targets(ctx, x, rest)
    mode = ctx.attr("mode", "nearest")
    if mode not in ("nearest", "linear", "bilinear") or ctx.flag("antialias", 0):
        raise UnsupportedOpError(f"{ctx.node.op_type}: mode {mode!r}"
                                 f"{' with antialias' if ctx.flag('antialias', 0) else ''}")
    for axis in range(x.ndim):
        if scales[axis] == 1.0 and sizes[axis] == x.shape[axis]:
            continue
        if not is_static(x.shape[axis]):
            raise UnsupportedOpError(f"{ctx.node.op_type}: resizing a symbolic axis")
        if not 0 <= sizes[axis] <= MAX_TABLE:
            raise UnsupportedOpError(f"{ctx.node.op_type}: an output axis of {sizes[axis]} "
                                     f"(tdag builds an index table per axis, at most "
                                     f"{MAX_TABLE})")
        coords = _source_coords(ctx, x.shape[axis], sizes[axis], scales[axis])
        x = _nearest(ctx, x, axis, coords) if mode == "nearest" else _linear(x, axis, coords)
    return x


def _resize_targets(ctx, x, rest):
    """Per-axis (scales, sizes); a scale is in/out when only sizes are given."""
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        raw = ctx.attr("scales") or _floats(ctx, rest[0])
        scales, sizes = list(raw), None
    else:
        if ctx.attr("coordinate_transformation_mode", "") == "tf_crop_and_resize":
            raise UnsupportedOpError("Resize: tf_crop_and_resize")
        scales = _floats(ctx, rest[1]) if len(rest) > 1 and rest[1] is not None else None
        sizes = ctx.ints(rest[2], "sizes") if len(rest) > 2 and rest[2] is not None else None
        scales = scales or None
        if sizes and ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise UnsupportedOpError("Resize: sizes with a keep_aspect_ratio_policy other "
                                     "than stretch")
    if any(not float(s) > 0 for s in scales or ()) or \
            any(is_static(s) and s < 0 for s in sizes or ()):
        raise InvalidModelError(f"{ctx.node.op_type}: scales {scales} must be > 0 and sizes "
                                f"{sizes} >= 0")
    axes = list(_norm_axes(ctx.attr("axes") or range(x.ndim), x.ndim))
    if len(scales or sizes or ()) != len(axes):
        raise InvalidModelError(f"{ctx.node.op_type}: {len(scales or sizes or ())} scales or "
                                f"sizes for {len(axes)} axes")
    full_scales, full_sizes = [1.0] * x.ndim, list(x.shape)
    for i, axis in enumerate(axes):
        if dims_equal(sizes[i], x.shape[axis]) if sizes else float(scales[i]) == 1.0:
            continue  # e.g. the batch axis, symbolic, kept as it is
        if sizes:
            full_sizes[axis] = int(sizes[i])
            full_scales[axis] = int(sizes[i]) / x.shape[axis]
        else:
            full_scales[axis] = float(scales[i])
            full_sizes[axis] = int(math.floor(x.shape[axis] * float(scales[i])))
    return full_scales, full_sizes


def _floats(ctx, value):
    weight = ctx.builder.weights.get(getattr(value, "name", None))
    if weight is None or weight.value is None:
        raise UnsupportedOpError(f"{ctx.node.op_type}: scales must be a constant")
    return weight.value.reshape(-1).tolist()


def _source_coords(ctx, size_in: int, size_out: int, scale: float) -> np.ndarray:
    """The input coordinate each output cell samples (float32, as onnxruntime computes it)."""
    mode = ctx.attr("coordinate_transformation_mode", "half_pixel")
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        mode = "asymmetric"
    x = np.arange(size_out, dtype=np.float32)
    scale = np.float32(scale)
    if mode == "half_pixel":
        return (x + np.float32(0.5)) / scale - np.float32(0.5)
    if mode == "pytorch_half_pixel":
        return (x + np.float32(0.5)) / scale - np.float32(0.5) if size_out > 1 else x * 0
    if mode == "align_corners":
        return x * np.float32((size_in - 1) / (size_out - 1)) if size_out > 1 else x * 0
    if mode == "asymmetric":
        return x / scale
    if mode == "tf_half_pixel_for_nn":
        return (x + np.float32(0.5)) / scale
    raise UnsupportedOpError(f"Resize: coordinate_transformation_mode {mode!r}")


def _nearest(ctx, x, axis, coords):
    rule = ctx.attr("nearest_mode", "round_prefer_floor")
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        rule = "floor"
    ties = coords - np.floor(coords) == 0.5
    index = {"floor": np.floor(coords), "ceil": np.ceil(coords),
             "round_prefer_floor": np.where(ties, np.floor(coords), np.round(coords)),
             "round_prefer_ceil": np.where(ties, np.ceil(coords), np.round(coords))}.get(rule)
    if index is None:
        raise UnsupportedOpError(f"Resize: nearest_mode {rule!r}")
    index = np.clip(index, 0, x.shape[axis] - 1).astype(np.int64)
    return ops.gather(x, x.builder.const(torch.from_numpy(index)), axis)


def _linear(x, axis, coords):
    """Separable linear interpolation along one axis: a blend of two gathers."""
    coords = np.clip(coords, 0, x.shape[axis] - 1)
    low = np.floor(coords).astype(np.int64)
    high = np.minimum(low + 1, x.shape[axis] - 1)
    frac = (coords - low).astype(np.float32).reshape([-1] + [1] * (x.ndim - axis - 1))
    a = ops.gather(x, x.builder.const(torch.from_numpy(low)), axis)
    b = ops.gather(x, x.builder.const(torch.from_numpy(high)), axis)
    w = x.builder.const(torch.from_numpy(frac), x.dtype)
    return ops.add(ops.mul(a, ops.sub(1.0, w)), ops.mul(b, w))
