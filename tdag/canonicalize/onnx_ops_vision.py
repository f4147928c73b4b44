"""The ONNX op table, vision ops: sampling grids, regions of interest, deformable convolution,
column-to-image and non-maximum suppression. Entries follow onnx_ops.py's convention
``(ctx, *inputs) -> value(s)``; each is a composition of tdag ops:

- GridSample, RoiAlign and DeformConv read the image at fractional points through
  deinops/sampling.py (a gather per interpolation tap, weighted and summed);
- AffineGrid is the affine map of a base grid whose extents may be given at run time (fresh
  sizes, as the window functions' lengths);
- NonMaxSuppression is pairwise IoU arithmetic and a greedy pass over the boxes in score
  order, then ``nonzero`` for the selected triples (their count is a fresh size).
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx_ops import register
from tdag.deinops import boxes as box_ops
from tdag.deinops import sampling, sorting
from tdag.errors import InvalidModelError
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
    score_threshold, the greedy pass (deinops/boxes.py), the first max_per_class kept; then
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

    ordered_scores, order = sorting.sorted_along(scores, -1, True, n)
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
