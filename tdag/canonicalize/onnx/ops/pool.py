"""ONNX pooling: MaxPool (with its Indices), AveragePool, GlobalAveragePool, GlobalMaxPool and
LpPool (MaxUnpool is in onnx/ops/vision.py).

Torch's pooling kernels take pads up to half the kernel; other pads, dilated averages and
LpPool are pad + unfold + reduce over every window.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import kernel_shape, pre_pad, register, window_attrs
from tdag.ops import writes
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static


@register("MaxPool")
def _max_pool(ctx, x):
    x = ctx.tensor(x)
    kernel = kernel_shape(ctx, x)
    strides, dilations, begins, ends = window_attrs(ctx, x, kernel)
    ceil, column_major = ctx.flag("ceil_mode", 0), ctx.flag("storage_order", 0)
    indices = _max_indices(x, kernel, strides, dilations, begins, ends, ceil, column_major) \
        if ctx.num_outputs > 1 and ctx.node.output[1] else None
    if not _torch_style(kernel, begins, ends):
        return _pool_windows(x, "max", kernel, strides, dilations, begins, ends, ceil,
                             float("-inf")), indices
    x, padding = pre_pad(x, begins, ends, float("-inf"))
    return ops.max_pool(x, kernel, strides, padding, dilations, ceil), indices


@register("AveragePool")
def _avg_pool(ctx, x):
    x = ctx.tensor(x)
    kernel = kernel_shape(ctx, x)
    strides, dilations, begins, ends = window_attrs(ctx, x, kernel)
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
        sums, counts = (ops.avg_pool(pre_pad(t, begins, ends)[0], kernel, strides,
                                     [0] * len(kernel), ceil, True) for t in (x, ones))
        return ops.div(sums, counts)
    x, padding = pre_pad(x, begins, ends)
    return ops.avg_pool(x, kernel, strides, padding, ceil, include)


@register("GlobalAveragePool")
def _global_avg_pool(ctx, x):
    x = ctx.tensor(x)
    return ops.mean(x, tuple(range(2, x.ndim)), True)


@register("GlobalMaxPool")
def _global_max_pool(ctx, x):
    x = ctx.tensor(x)
    return ops.amax(x, tuple(range(2, x.ndim)), True)


@register("LpPool")
def _lp_pool(ctx, x):
    """(sum over each window of |x|**p) ** (1/p), pads counting as zeros: window sums of
    |x|**p (dilations and pads past half the kernel included)."""
    x = ctx.tensor(x)
    kernel = kernel_shape(ctx, x)
    strides, dilations, begins, ends = window_attrs(ctx, x, kernel)
    p = ctx.attr("p", 2)
    powered = ops.pow(ops.abs(x), float(p))
    sums = _pool_windows(powered, "sum", kernel, strides, dilations, begins, ends,
                         ctx.flag("ceil_mode", 0), 0.0)
    return ops.pow(sums, 1.0 / p)


# -- windows ---------------------------------------------------------------------------------------

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
