"""The ONNX op table, vision ops: sampling grids, regions of interest, deformable convolution,
column-to-image and non-maximum suppression. Entries follow onnx/ops/table.py's convention
``(ctx, *inputs) -> value(s)``; each is a composition of tdag ops:

- GridSample, RoiAlign and DeformConv read the image at fractional points through
  ops/sampling.py (a gather per interpolation tap, weighted and summed);
- AffineGrid is the affine map of a base grid whose extents may be given at run time (fresh
  sizes, as the window functions' lengths);
- NonMaxSuppression is pairwise IoU arithmetic and a greedy pass over the boxes in score
  order, then ``nonzero`` for the selected triples (their count is a fresh size);
- Col2Im gathers, per output pixel and kernel tap, the column that lands there, and
  MaxUnpool writes each value at its index (ops/writes.py); shapes given at run time
  make fresh sizes.
"""
from __future__ import annotations

import functools
import operator

from tdag import ops
from tdag.canonicalize.onnx.ops.table import arange_i64, register
from tdag.ops import boxes as box_ops
from tdag.ops import sampling
from tdag.ops import sorting
from tdag.ops import writes
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

_MODES = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic",
          "nearest": "nearest"}


@register("GridSample")
def _grid_sample(ctx, x, grid):
    default = "bilinear" if ctx.opset < 20 else "linear"
    mode = _MODES[ctx.choice("mode", default, _MODES)]
    padding = ctx.choice("padding_mode", "zeros", sampling.PADDINGS)
    return sampling.grid_sample(ctx.tensor(x), ctx.tensor(grid), mode, padding,
                                ctx.flag("align_corners", 0))


def _extent(ctx, size, k: int):
    """The positions 0..L-1 (float32) and the length L of ``size[k]``: static where the size
    is known while importing, else a fresh size read from the tensor."""
    known = ctx.known(size)
    if known is not None and known.static:
        length = int(known.dims()[k])
        return ops.cast(ops.iota(length, "i64", ctx.builder), DType.f32), float(length)
    length = ops.cast(ops.select(ctx.tensor(size), 0, k), DType.i64)
    return ops.cast(ops.arange_of(length), DType.f32), ops.cast(length, DType.f32)


def _base_coords(positions, length, align_corners: bool):
    """The normalized centre of each cell: -1 + 2i/(L-1) with align_corners (-1 alone where
    L = 1), else -1 + (2i + 1)/L."""
    if align_corners:
        span = ops.maximum(ops.sub(length, 1.0), 1.0) if not isinstance(length, float) \
            else max(length - 1.0, 1.0)
        return ops.sub(ops.div(ops.mul(positions, 2.0), span), 1.0)
    return ops.sub(ops.div(ops.add(ops.mul(positions, 2.0), 1.0), length), 1.0)


@register("AffineGrid")
def _affine_grid(ctx, theta, size):
    """grid[n, *p, j] = sum_k theta[n, j, k] * base_k(p) + theta[n, j, d], base_0 the
    innermost (x) coordinate."""
    theta = ctx.tensor(theta)
    d = theta.ndim and theta.shape[1]
    if theta.ndim != 3 or d not in (2, 3) or theta.shape[2] != d + 1:
        raise InvalidModelError(f"AffineGrid: theta must be (N, 2, 3) or (N, 3, 4), got "
                                f"{theta.type}")
    align = ctx.flag("align_corners", 0)
    column_shape = (-1,) + (1,) * d + (d,)  # theta[:, :, k] broadcast over the grid
    out = ops.reshape(ops.select(theta, 2, d), column_shape)
    for axis in range(d):  # outermost first; its coefficient is theta[:, :, d - 1 - axis]
        positions, length = _extent(ctx, size, 2 + axis)
        coords = ops.cast(_base_coords(positions, length, align), theta.dtype)
        shape = [1] * (d + 2)
        shape[1 + axis] = -1
        column = ops.reshape(ops.select(theta, 2, d - 1 - axis), column_shape)
        out = ops.add(out, ops.mul(ops.reshape(coords, tuple(shape)), column))
    return out



def _scalar_input(ctx, value, dtype: DType):
    """An optional one-element input as a 0-d tensor (None where it is absent or empty)."""
    if value is None:
        return None
    t = ctx.tensor(value)
    if t.shape == (0,):
        return None
    return ops.cast(ops.reshape(t, ()), dtype)


@register("NonMaxSuppression")
def _non_max_suppression(ctx, boxes, scores, max_per_class=None, iou_threshold=None,
                         score_threshold=None):
    """Per batch and class: the boxes in score order (ties by index), the candidates above
    score_threshold, the greedy pass (ops/boxes.py), the first max_per_class kept; then
    (batch, class, box) of each kept box from ``nonzero`` of the kept mask, which lists them
    by batch, class and score order, as ONNX does."""
    boxes, scores = ctx.tensor(boxes), ctx.tensor(scores)
    if boxes.ndim != 3 or scores.ndim != 3 or boxes.shape[-1] != 4:
        raise InvalidModelError(f"NonMaxSuppression: boxes {boxes.type} must be (B, N, 4) "
                                f"and scores {scores.type} (B, C, N)")
    n = boxes.shape[1]
    limit = _scalar_input(ctx, max_per_class, DType.i64)
    if limit is None:  # no limit given: ONNX selects nothing
        limit = ops.full((), 0, DType.i64, like=scores)
    threshold = _scalar_input(ctx, iou_threshold, scores.dtype)
    floor = _scalar_input(ctx, score_threshold, scores.dtype)

    ordered_scores, order = sorting.sort(scores, -1, True)
    rows = ops.reshape(ops.iota(boxes.shape[0], "i64", ctx.builder), (-1, 1, 1))
    flat_boxes = ops.reshape(boxes, (-1, 4))
    ordered = ops.gather(flat_boxes, ops.add(ops.mul(rows, n), order), 0, wrap=False)
    corners = box_ops.corners(ordered, ctx.flag("center_point_box", 0))
    suppressed = box_ops.suppresses(corners, 0.0 if threshold is None else threshold)
    candidate = ops.full(tuple(scores.shape), True, DType.bool, like=scores) \
        if floor is None else ops.gt(ordered_scores, floor)
    keep = box_ops.greedy_keep(candidate, suppressed)
    count = ops.cumsum(ops.cast(keep, DType.i64), -1)
    keep = ops.logical_and(keep, ops.le(count, limit))

    picked = ops.nonzero(keep)  # (K, 3): batch, class, position in score order
    batch, cls, rank = (ops.select(picked, 1, k) for k in range(3))
    position = ops.add(ops.mul(ops.add(ops.mul(batch, scores.shape[1]), cls), n), rank)
    box_index = ops.gather(ops.reshape(order, (-1,)), position, 0, wrap=False)
    return ops.concat([ops.slice(picked, 1, 0, 2), ops.unsqueeze(box_index, 1)], 1)


# -- regions of interest ------------------------------------------------------------------------

def _roi_samples(start, end, bins: int, grid: int, at: int, at_least_one: bool):
    """The sample coordinates along one axis of each region: start + b * bin + (i + 0.5) *
    bin / grid for bin b (on axis ``at`` of the (R, bins_h, bins_w, grid_h, grid_w) points)
    and sample i (on axis at + 2), in the reference's order of float operations."""
    size = ops.sub(end, start)
    if at_least_one:  # output_half_pixel: a malformed region is made 1x1
        size = ops.maximum(size, 1.0)
    step = ops.reshape(ops.div(size, float(bins)), (-1, 1, 1, 1, 1))
    shape = [1] * 5
    shape[at] = bins
    bin_index = ops.reshape(ops.cast(ops.iota(bins, "i64", start.builder), step.dtype),
                            tuple(shape))
    shape[at], shape[at + 2] = 1, grid
    sample = ops.reshape(ops.add(ops.cast(ops.iota(grid, "i64", start.builder), step.dtype),
                                 0.5), tuple(shape))
    within = ops.div(ops.mul(sample, step), float(grid))
    return ops.add(ops.add(ops.reshape(start, (-1, 1, 1, 1, 1)), ops.mul(bin_index, step)),
                   within)


@register("RoiAlign")
def _roi_align(ctx, x, rois, batch_indices):
    """Each region (x1, y1, x2, y2) * spatial_scale cut into output_height x output_width
    bins, each bin the average (or max) of sampling_ratio^2 bilinear samples; a sample past
    the image by more than a pixel reads 0, one nearer is clamped to the image (the ONNX
    reference's rules). The max mode takes the largest weighted corner, as the reference."""
    x, rois = ctx.tensor(x), ctx.tensor(rois)
    batch = ops.reshape(ops.cast(ctx.tensor(batch_indices), DType.i64), (-1, 1, 1, 1, 1))
    mode = ctx.choice("mode", "avg", ("avg", "max"))
    default = "half_pixel" if ctx.opset >= 16 else "output_half_pixel"
    half_pixel = ctx.choice("coordinate_transformation_mode", default,
                            ("half_pixel", "output_half_pixel")) == "half_pixel"
    out_h, out_w = ctx.attr("output_height", 1), ctx.attr("output_width", 1)
    grid = ctx.attr("sampling_ratio", 0)
    if grid <= 0:
        raise UnsupportedOpError("RoiAlign: sampling_ratio 0 (each region's sample count "
                                 "decided by its size at run time)")
    if rois.ndim != 2 or rois.shape[1] != 4:
        raise InvalidModelError(f"RoiAlign: rois must be (R, 4), got {rois.type}")
    table, (height, width) = sampling.image_rows(x)
    offset = 0.5 if half_pixel else 0.0
    x0, y0, x1, y1 = (ops.sub(ops.mul(ops.select(rois, 1, k), float(ctx.attr(
        "spatial_scale", 1.0))), offset) for k in range(4))
    ys = _roi_samples(y0, y1, out_h, grid, 1, not half_pixel)
    xs = _roi_samples(x0, x1, out_w, grid, 2, not half_pixel)
    inside = ops.logical_and(
        ops.logical_and(ops.ge(ys, -1.0), ops.le(ys, float(height))),
        ops.logical_and(ops.ge(xs, -1.0), ops.le(xs, float(width))))
    values = sampling.read_points(
        table, (height, width), batch,
        [ops.clamp(ys, 0.0, height - 1.0), ops.clamp(xs, 0.0, width - 1.0)], "linear",
        "border", combine="sum" if mode == "avg" else "max")
    values = ops.where(ops.unsqueeze(inside, -1), values, 0.0)
    pooled = ops.div(ops.sum(values, (3, 4)), float(grid * grid)) if mode == "avg" else \
        ops.amax(values, (3, 4))
    return ops.movedim(pooled, -1, 1)


# -- deformable convolution ---------------------------------------------------------------------

def _deformed_points(offset, axis: int, out_len, stride: int, before: int, dilation: int,
                     kernel: tuple):
    """Where each kernel tap reads along one spatial axis: out * stride - pad + tap *
    dilation + its learned offset, (N, offset_groups, kH, kW, oH, oW)."""
    shape = [1] * 6
    shape[4 + axis] = out_len
    origin = ops.reshape(ops.sub(ops.mul(ops.cast(ops.iota(out_len, "i64", offset.builder),
                                                  offset.dtype), float(stride)),
                                 float(before)), tuple(shape))
    shape = [1] * 6
    shape[2 + axis] = kernel[axis]
    tap = ops.reshape(ops.mul(ops.cast(ops.iota(kernel[axis], "i64", offset.builder),
                                       offset.dtype), float(dilation)), tuple(shape))
    return ops.add(ops.add(origin, tap), ops.select(offset, 4, axis))


@register("DeformConv")
def _deform_conv(ctx, x, w, offset, bias=None, mask=None):
    """Each output cell reads its kH x kW taps at learned fractional offsets (bilinear, 0
    outside the image: ops/sampling.py, one read per offset group's channels), scaled
    by the mask, then contracted with the weights per group (an einsum)."""
    x, w, offset = ctx.tensor(x), ctx.tensor(w), ctx.tensor(offset)
    if x.ndim != 4:
        raise UnsupportedOpError(f"DeformConv of a {x.ndim - 2}-d image (2-d only)")
    n, channels = x.shape[0], x.shape[1]
    kernel = tuple(ctx.attr("kernel_shape") or w.shape[2:])
    groups, offset_groups = ctx.attr("group", 1), ctx.attr("offset_group", 1)
    strides, dilations = ctx.sizes("strides", 2, 1, 1), ctx.sizes("dilations", 2, 1, 1)
    pads = ctx.sizes("pads", 4, 0, 0)
    out_h, out_w = offset.shape[2], offset.shape[3]
    if channels % offset_groups or channels % groups or \
            offset.shape[1] != offset_groups * 2 * kernel[0] * kernel[1]:
        raise InvalidModelError(f"DeformConv: X {x.type}, W {w.type} and offset "
                                f"{offset.type} disagree on the groups")
    offset = ops.reshape(offset, (n, offset_groups, kernel[0], kernel[1], 2, out_h, out_w))
    ys, xs = (_deformed_points(offset, a, (out_h, out_w)[a], strides[a], pads[a],
                               dilations[a], kernel) for a in range(2))
    table, sizes = sampling.image_rows(x)
    rows = ops.reshape(ops.iota(n, "i64", ctx.builder), (-1, 1, 1, 1, 1))
    per_group = channels // offset_groups
    columns = []
    for g in range(offset_groups):  # (N, kH, kW, oH, oW, C / offset_groups)
        part = ops.slice(table, 1, g * per_group, (g + 1) * per_group)
        columns.append(sampling.read_points(part, sizes, rows, [ops.select(ys, 1, g),
                                                                ops.select(xs, 1, g)],
                                            "linear", "zeros"))
    columns = ops.concat(columns, -1) if offset_groups > 1 else columns[0]
    if mask is not None:
        scale = ops.reshape(ctx.tensor(mask), (n, offset_groups, kernel[0], kernel[1], out_h,
                                               out_w))
        scale = ops.repeat_interleave(ops.movedim(scale, 1, -1), per_group, -1)
        columns = ops.mul(columns, scale)
    columns = ops.reshape(columns, (n, kernel[0], kernel[1], out_h, out_w, groups, -1))
    weights = ops.reshape(w, (groups, -1) + tuple(w.shape[1:]))
    out = ops.einsum("nijhwgc,gocij->ngohw", columns, weights)
    out = ops.reshape(out, (n, -1, out_h, out_w))
    if bias is not None:
        out = ops.add(out, ops.reshape(ctx.tensor(bias), (-1, 1, 1)))
    return out


# -- Col2Im -------------------------------------------------------------------------------------

def _elements(ctx, value, count: int, what: str) -> list:
    """The elements of a 1-d integer input: ints where known while importing, else 0-d
    tensors read at run time."""
    known = ctx.known(value)
    if known is not None and known.static:
        return [int(v) for v in known.dims()]
    t = ops.cast(ctx.tensor(value), DType.i64)
    if t.shape != (count,):
        raise InvalidModelError(f"{ctx.node.op_type}: {what} must hold {count} values, got "
                                f"{t.type}")
    return [ops.select(t, 0, k) for k in range(count)]


def _static_or(fn, op):
    """``fn`` on two ints (a static result), else the tdag op on tensors."""
    def apply(a, b):
        return fn(a, b) if isinstance(a, int) and isinstance(b, int) else op(a, b)
    return apply


_add, _sub = _static_or(operator.add, ops.add), _static_or(operator.sub, ops.sub)
_mul, _div = _static_or(operator.mul, ops.mul), _static_or(operator.floordiv, ops.floor_divide)


def _grid_axis(positions, axis: int, rank: int):
    """1-d positions shaped to lie along ``axis`` of a rank-``rank`` grid."""
    shape = [1] * rank
    shape[axis] = -1
    return ops.reshape(positions, tuple(shape))


@register("Col2Im")
def _col2im(ctx, x, image_shape, block_shape):
    """The inverse of im2col: each output pixel sums, over the kernel taps k, the column of
    the block whose tap k lands on it (the block index is (y + pad - k * dilation) / stride
    where that divides and lies in range). Gathered per (channel, pixel, tap), then summed
    over taps; image and block shapes given at run time make fresh sizes."""
    x = ctx.tensor(x)
    if x.ndim != 3 or not is_static(x.shape[2]):
        raise InvalidModelError(f"Col2Im: the input must be (N, C * prod(block), L), got "
                                f"{x.type}")
    rank = ctx.tensor(image_shape).shape[0] if ctx.known(image_shape) is None else \
        len(ctx.known(image_shape).dims())
    image = _elements(ctx, image_shape, rank, "image_shape")
    block = _elements(ctx, block_shape, rank, "block_shape")
    strides, dilations = ctx.sizes("strides", rank, 1, 1), ctx.sizes("dilations", rank, 1, 1)
    pads = ctx.sizes("pads", 2 * rank, 0, 0)
    taps = functools.reduce(_mul, block)
    channels = _div(x.shape[1], taps)
    counts = [_add(_div(_sub(_add(size, pads[d] + pads[rank + d] - 1),
                             _mul(_sub(block[d], 1), dilations[d])), strides[d]), 1)
              for d, size in enumerate(image)]
    grid = rank + 2  # (C, *image, K)
    tap = _grid_axis(arange_i64(taps, ctx.builder), grid - 1, grid)
    column = ops.mul(_grid_axis(arange_i64(channels, ctx.builder), 0, grid), taps)
    column = ops.add(column, tap)
    block_index, valid, inner = None, None, functools.reduce(_mul, block[1:], 1)
    for d in range(rank):  # tap d's coordinate, then the block it reads along axis d
        k_d = ops.remainder(_div(tap, inner), block[d]) if d < rank - 1 else \
            ops.remainder(tap, block[d])
        inner = _div(inner, block[d + 1]) if d + 1 < rank else 1
        y = _grid_axis(arange_i64(image[d], ctx.builder), 1 + d, grid)
        shifted = ops.sub(ops.add(y, pads[d]), ops.mul(k_d, dilations[d]))
        along = ops.floor_divide(shifted, strides[d])
        ok = ops.logical_and(ops.logical_and(ops.ge(shifted, 0),
                                             ops.eq(ops.remainder(shifted, strides[d]), 0)),
                             ops.lt(along, counts[d]))
        valid = ok if valid is None else ops.logical_and(valid, ok)
        block_index = along if block_index is None else \
            ops.add(ops.mul(block_index, counts[d]), along)
    flat = ops.where(valid, ops.add(ops.mul(column, x.shape[2]), block_index), 0)
    values = ops.gather(ops.reshape(x, (x.shape[0], -1)), flat, 1, wrap=False)
    return ops.sum(ops.where(ops.unsqueeze(valid, 0), values, 0.0), -1)


# -- MaxUnpool ----------------------------------------------------------------------------------

@register("MaxUnpool")
def _max_unpool(ctx, x, indices, output_shape=None):
    """MaxPool's inverse: zeros of the shape pooling came from, each value written at its
    flat index (ops/writes.py), then zero-filled at the end of each axis up to
    output_shape (a fresh size where it is given at run time), as the ONNX reference and
    its test case; onnxruntime reads the indices in output_shape instead."""
    x, indices = ctx.tensor(x), ops.cast(ctx.tensor(indices), DType.i64)
    n = x.ndim - 2
    kernel = ctx.sizes("kernel_shape", n, 0, 1)
    strides, pads = ctx.sizes("strides", n, 1, 1), ctx.sizes("pads", 2 * n, 0, 0)
    if not all(is_static(d) for d in x.shape):
        raise UnsupportedOpError(f"MaxUnpool of {x.type} (static sizes only)")
    sizes = [(x.shape[2 + d] - 1) * strides[d] - pads[d] - pads[n + d] + kernel[d]
             for d in range(n)]
    zeros = ops.zeros(tuple(x.shape[:2]) + tuple(sizes), x.dtype, like=x)
    out = writes.write(zeros, indices, x)
    if output_shape is None:
        return out
    target = _elements(ctx, output_shape, x.ndim, "output_shape")[2:]
    for d, size in enumerate(target):
        axis = 2 + d
        if isinstance(size, int):
            out = ops.pad(out, [(0, 0)] * axis + [(0, size - sizes[d])] +
                          [(0, 0)] * (x.ndim - axis - 1))
            continue
        cells = arange_i64(size, ctx.builder)  # a run-time length: gather, zero past the end
        inside = _grid_axis(ops.lt(cells, sizes[d]), axis, x.ndim)
        out = ops.gather(out, ops.minimum(cells, sizes[d] - 1), axis, wrap=False)
        out = ops.where(inside, out, 0.0)
    return out
