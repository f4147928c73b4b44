"""ONNX convolutions: Conv and ConvTranspose (ConvInteger and QLinearConv are in
onnx/ops/quant.py, DeformConv in onnx/ops/vision.py). The window attributes (kernel_shape,
strides, dilations, pads or auto_pad, group) are read by onnx/ops/table.py's helpers, which
the pools share.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import (
    AUTO_PAD,
    group_count,
    kernel_shape,
    pre_pad,
    register,
    window_attrs,
)
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static


@register("Conv")
def _conv(ctx, x, w, b=None):
    x, w = ctx.tensor(x), ctx.tensor(w)
    if x.ndim > 1 and w.ndim > 1:  # the weight fixes the channels an input names
        ctx.pin(x.shape[1], w.shape[1] * group_count(ctx))
    kernel = kernel_shape(ctx, x, w.shape[2:])
    strides, dilations, begins, ends = window_attrs(ctx, x, kernel)
    x, padding = pre_pad(x, begins, ends)
    bias = ctx.tensor(b) if b is not None else None
    return ops.conv(x, w, bias, strides, padding, dilations, group_count(ctx))


@register("ConvTranspose")
def _conv_transpose(ctx, x, w, b=None):
    x, w = ctx.tensor(x), ctx.tensor(w)
    if x.ndim > 1 and w.ndim > 1:
        ctx.pin(x.shape[1], w.shape[0])
    kernel = kernel_shape(ctx, x, w.shape[2:])
    n = len(kernel)
    strides = ctx.sizes("strides", n, 1, least=1)
    dilations = ctx.sizes("dilations", n, 1, least=1)
    # full overlap-add, then crop the pads (the extra output_padding cells are zeros + bias)
    y = ops.conv_transpose(x, w, None, strides, 0, 0, group_count(ctx), dilations)
    y = ops.pad(y, [(0, 0), (0, 0)] + _transpose_crop(ctx, x, y, strides))
    if b is not None:
        y = ops.add(y, ops.reshape(ctx.tensor(b), -1, *([1] * n)))
    return y


def _transpose_crop(ctx, x, full, strides) -> list:
    """(begin, end) widths turning ConvTranspose's full overlap-add into its output: from
    pads and output_padding; or, with output_shape (pads then ignored, as the spec and
    onnxruntime say) or auto_pad SAME_* (an output of input * stride), the total crop split,
    the odd cell at the end for SAME_UPPER and at the start otherwise (onnxruntime's rule;
    the reference crops output_shape at the end only, which differs where it crops)."""
    n = len(strides)
    auto = ctx.choice("auto_pad", "NOTSET", AUTO_PAD)
    extra = ctx.sizes("output_padding", n, 0, least=0)
    target = list(ctx.attr("output_shape") or [])[-n:]
    if not target and auto in ("SAME_UPPER", "SAME_LOWER"):
        target = [x.shape[2 + i] * strides[i] for i in range(n)]
    if not target:
        pads = ctx.sizes("pads", 2 * n, 0, least=0)
        return [(-pads[i], extra[i] - pads[n + i]) for i in range(n)]
    lengths = [full.shape[2 + i] for i in range(n)]
    if not all(is_static(v) for v in lengths + target):
        raise UnsupportedOpError("ConvTranspose: output_shape or auto_pad over a symbolic size")
    widths = []
    for length, more, size in zip(lengths, extra, target):
        total = max(0, length + more - size)  # a larger output is zero-filled at the end
        begin = total // 2 if auto == "SAME_UPPER" else total - total // 2
        widths.append((-begin, size - length + begin))
    return widths
