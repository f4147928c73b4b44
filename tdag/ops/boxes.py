"""Boxes: corner form, pairwise overlap (IoU) and greedy non-maximum suppression, the
composition behind ONNX NonMaxSuppression (torchvision.ops.nms keeps the same boxes).

Greedy suppression is sequential: a box is kept unless a box kept before it (in score order)
overlaps it by more than the threshold. With the boxes in score order that is, for i = 0..n-1,

    keep[i] = candidate[i] and not any_j (keep[j] and suppresses[i, j])      (keep[j] = 0, j >= i)

unrolled over the static number of boxes: n steps of O(n) elementwise work, the pairwise
overlaps computed once. The unrolled DAG grows with n, so it is refused past MAX_BOXES.
"""
from __future__ import annotations

from tdag.ops import core, creation
from tdag.ops.tensor import Tensor
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

__all__ = ["MAX_BOXES", "corners", "suppresses", "greedy_keep"]

MAX_BOXES = 4096  # boxes per row of the unrolled greedy pass (n steps, a few nodes each)


def corners(boxes: Tensor, center_point: bool) -> list[Tensor]:
    """(x_min, x_max, y_min, y_max) of boxes (..., 4) given as [y1, x1, y2, x2] (any two
    opposite corners) or, with center_point, [x_center, y_center, width, height]."""
    part = [core.select(boxes, -1, k) for k in range(4)]
    if center_point:
        half_w, half_h = core.div(part[2], 2.0), core.div(part[3], 2.0)
        return [core.sub(part[0], half_w), core.add(part[0], half_w),
                core.sub(part[1], half_h), core.add(part[1], half_h)]
    return [core.minimum(part[1], part[3]), core.maximum(part[1], part[3]),
            core.minimum(part[0], part[2]), core.maximum(part[0], part[2])]


def suppresses(box_corners: list[Tensor], threshold) -> Tensor:
    """bool (..., n, n): whether box j overlaps box i by an IoU above ``threshold``, with the
    ONNX reference's guards (no overlap, an empty box or union never suppresses) and its
    order of float operations (so a tie at the threshold falls the same way)."""
    x0, x1, y0, y1 = box_corners
    def pair(v):  # (..., n, 1) against (..., 1, n)
        return core.unsqueeze(v, -1), core.unsqueeze(v, -2)
    (x0i, x0j), (x1i, x1j), (y0i, y0j), (y1i, y1j) = map(pair, (x0, x1, y0, y1))
    ix0, ix1 = core.maximum(x0i, x0j), core.minimum(x1i, x1j)
    iy0, iy1 = core.maximum(y0i, y0j), core.minimum(y1i, y1j)
    inter = core.mul(core.sub(ix1, ix0), core.sub(iy1, iy0))
    area = core.mul(core.sub(x1, x0), core.sub(y1, y0))
    area_i, area_j = pair(area)
    union = core.sub(core.add(area_i, area_j), inter)
    overlapping = [core.gt(ix1, ix0), core.gt(iy1, iy0), core.gt(inter, 0.0),
                   core.gt(area_i, 0.0), core.gt(area_j, 0.0), core.gt(union, 0.0)]
    iou = core.div(inter, core.where(overlapping[-1], union, 1.0))
    out = core.gt(iou, threshold)
    for condition in overlapping:
        out = core.logical_and(out, condition)
    return out


def greedy_keep(candidate: Tensor, suppressed_by: Tensor) -> Tensor:
    """bool (..., n): the greedy pass over boxes in order, ``candidate`` (..., n) and
    ``suppressed_by`` (..., n, n) as from suppresses."""
    n = candidate.shape[-1]
    if not is_static(n) or n > MAX_BOXES:
        raise UnsupportedOpError(f"non-maximum suppression of {n} boxes per row (tdag unrolls "
                                 f"the greedy pass; at most {MAX_BOXES})")
    positions = creation.iota(n, "i64", candidate.builder)
    keep = creation.full(tuple(candidate.shape), False, DType.bool, like=candidate)
    for i in range(n):
        blocked = core.amax(core.cast(core.logical_and(
            keep, core.select(suppressed_by, -2, i)), DType.i64), -1)
        kept = core.logical_and(core.select(candidate, -1, i), core.eq(blocked, 0))
        this_one = core.eq(positions, i)
        keep = core.logical_or(keep, core.logical_and(this_one, core.unsqueeze(kept, -1)))
    return keep
