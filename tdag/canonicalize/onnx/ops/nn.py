"""The ONNX op table, neural-network part: contractions, convolution, pooling, norms and
softmax (Resize is in onnx/ops/resize.py, LayerNormalization in onnx/ops/norm.py). Entries
follow onnx/ops/table.py's convention ``(ctx, *inputs) -> value(s)``.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import _norm, register
from tdag.ops import writes
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static, product

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
    strides = ctx.sizes("strides", n, 1, least=1)
    dilations = ctx.sizes("dilations", n, 1, least=1)
    # full overlap-add, then crop the pads (the extra output_padding cells are zeros + bias)
    y = ops.conv_transpose(x, w, None, strides, 0, 0, _group(ctx), dilations)
    y = ops.pad(y, [(0, 0), (0, 0)] + _transpose_crop(ctx, x, y, strides))
    if b is not None:
        y = ops.add(y, ops.reshape(ctx.tensor(b), -1, *([1] * n)))
    return y


def _torch_style(kernel, begins, ends) -> bool:
    """Whether torch's pooling kernels take these pads (at most half the kernel)."""
    return all(max(b, e) <= k // 2 for k, b, e in zip(kernel, begins, ends))


def _pool_windows(x, kind: str, kernel, strides, dilations, begins, ends, ceil: bool,
                  fill: float):
    """ONNX pooling as pad + unfold + reduce, for what torch's pooling kernels do not take
    (dilated averages, pads past half the kernel): every window of _windows reduced
    (``kind`` sum or max)."""
    neutral = 0.0 if kind == "sum" else float("-inf")
    x = _windows(x, kernel, strides, dilations, begins, ends, ceil, fill, neutral)
    return ops.reduce(x, kind, tuple(range(x.ndim - len(kernel), x.ndim)))


def _windows(x, kernel, strides, dilations, begins, ends, ceil: bool, fill, neutral):
    """x (N, C, *S) padded by (begins, ends) with ``fill``, unfolded: (N, C, *O, *K). In
    ceil mode the last window may reach past the end pads: those cells are ``neutral`` (0,
    -inf: never counted); a window that would start in the end padding is dropped."""
    for i, length in enumerate(x.shape[2:]):
        if not is_static(length):
            raise UnsupportedOpError(f"pooling a symbolic axis {length} with dilations, "
                                     f"pads past half the kernel or Indices")
        axis, span = 2 + i, dilations[i] * (kernel[i] - 1) + 1
        room = length + begins[i] + ends[i] - span
        count = (-(-room // strides[i]) if ceil else room // strides[i]) + 1
        if ceil and (count - 1) * strides[i] >= length + begins[i]:
            count -= 1
        after = (count - 1) * strides[i] + span - length - begins[i]  # < ends[i]: cropped
        widths = [(0, 0)] * x.ndim
        widths[axis] = (begins[i], min(after, ends[i]))
        x = ops.pad(x, widths, fill)
        if after > ends[i]:
            widths[axis] = (0, after - ends[i])
            x = ops.pad(x, widths, neutral)
        x = ops.unfold(x, axis, kernel[i], strides[i], dilations[i])
    return x


def _max_indices(x, kernel, strides, dilations, begins, ends, ceil: bool, column_major: bool):
    """MaxPool's Indices: the flat position in x of each window's first maximum, counting
    the spatial axes row-major (or column-major with storage_order 1)."""
    sizes = list(x.shape[2:])
    order = range(len(sizes)) if column_major else reversed(range(len(sizes)))
    steps, step = [0] * len(sizes), 1
    for axis in order:
        steps[axis], step = step, step * sizes[axis]
    positions = ops.reshape(ops.mul(ops.iota(x.shape[0] * x.shape[1], "i64", x.builder),
                                    step), (x.shape[0], x.shape[1]) + (1,) * len(sizes))
    for axis, size in enumerate(sizes):
        shape = [1] * x.ndim
        shape[2 + axis] = size
        cells = ops.reshape(ops.mul(ops.iota(size, "i64", x.builder), steps[axis]),
                            tuple(shape))
        positions = ops.add(positions, cells)
    values, where = (ops.flatten(_windows(t, kernel, strides, dilations, begins, ends, ceil,
                                          fill, fill), x.ndim, -1)
                     for t, fill in ((x, float("-inf")), (positions, -1)))
    first = ops.argmax(values, -1, True)  # ties: the first in scan order, as the reference
    return ops.squeeze(writes.take_along(where, where.ndim - 1, first), -1)


def _transpose_crop(ctx, x, full, strides) -> list:
    """(begin, end) widths turning ConvTranspose's full overlap-add into its output: from
    pads and output_padding; or, with output_shape (pads then ignored, as the spec and
    onnxruntime say) or auto_pad SAME_* (an output of input * stride), the total crop split,
    the odd cell at the end for SAME_UPPER and at the start otherwise (onnxruntime's rule;
    the reference crops output_shape at the end only, which differs where it crops)."""
    n = len(strides)
    auto = ctx.choice("auto_pad", "NOTSET", _AUTO_PAD)
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


@register("MaxPool")
def _max_pool(ctx, x):
    x = ctx.tensor(x)
    kernel = _kernel(ctx, x)
    strides, dilations, begins, ends = _window(ctx, x, kernel)
    ceil, column_major = ctx.flag("ceil_mode", 0), ctx.flag("storage_order", 0)
    indices = _max_indices(x, kernel, strides, dilations, begins, ends, ceil, column_major) \
        if ctx.num_outputs > 1 and ctx.node.output[1] else None
    if not _torch_style(kernel, begins, ends):
        return _pool_windows(x, "max", kernel, strides, dilations, begins, ends, ceil,
                             float("-inf")), indices
    x, padding = _pre_pad(x, begins, ends, float("-inf"))
    return ops.max_pool(x, kernel, strides, padding, dilations, ceil), indices


@register("AveragePool")
def _avg_pool(ctx, x):
    x = ctx.tensor(x)
    kernel = _kernel(ctx, x)
    strides, dilations, begins, ends = _window(ctx, x, kernel)
    include = ctx.flag("count_include_pad", 0)  # ONNX's default is not torch's
    ceil = ctx.flag("ceil_mode", 0)
    if any(d != 1 for d in dilations) or not _torch_style(kernel, begins, ends):
        # window sums over the cells a window counts (the pads too with count_include_pad)
        ones = ops.full((1, 1, *x.shape[2:]), 1.0, x.dtype, like=x)
        sums, counts = (_pool_windows(t, "sum", kernel, strides, dilations, begins, ends,
                                      ceil, fill) for t, fill in ((x, 0.0),
                                                                  (ones, float(include))))
        return ops.div(sums, counts)
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
        return _batch_norm_training(ctx, ctx.tensor(x), ctx.tensor(scale), ctx.tensor(bias),
                                    ctx.tensor(mean), ctx.tensor(var))
    y = ops.batch_norm(ctx.tensor(x), ctx.tensor(mean), ctx.tensor(var), ctx.tensor(scale),
                       ctx.tensor(bias), ctx.attr("epsilon", 1e-5))
    return (y,) + (None,) * (ctx.num_outputs - 1)


def _batch_norm_training(ctx, x, scale, bias, mean, var):
    """Normalised by the batch's own statistics (the population variance over every axis
    but the channels); the running statistics move toward them by 1 - momentum."""
    axes = tuple(a for a in range(x.ndim) if a != 1)
    batch_mean = ops.mean(x, axes)
    centred = ops.sub(x, ops.reshape(batch_mean, (-1,) + (1,) * (x.ndim - 2)))
    batch_var = ops.mean(ops.mul(centred, centred), axes)
    y = ops.batch_norm(x, batch_mean, batch_var, scale, bias, ctx.attr("epsilon", 1e-5))
    momentum = float(ctx.attr("momentum", 0.9))
    running = [ops.add(ops.mul(old, momentum), ops.mul(new, 1.0 - momentum))
               for old, new in ((mean, batch_mean), (var, batch_var))]
    return (y, *running)[:max(ctx.num_outputs, 1)]


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
