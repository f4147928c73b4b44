"""ONNX Resize (and Upsample): separable, one axis at a time, each output cell a weighted sum
of a few input cells along the axis: a gather per tap, times a const weight per output cell.

The taps and weights of an axis are computed while importing, in float64, by the ONNX
reference's rules (onnx/reference/ops/op_resize.py, vectorised): the source coordinate of
each output cell (every coordinate_transformation_mode), the n nearest input cells (edge
cells repeated past the borders) and their weights: nearest (one tap), linear (2), cubic (4,
cubic_coeff_a, exclude_outside), and with antialias the kernel widened by 1/scale when
downsampling. tf_crop_and_resize's cells outside the crop take extrapolation_value.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from tdag import ops
from tdag.canonicalize.onnx.ops.table import norm_axes, register
from tdag.canonicalize.onnx.values import MAX_TABLE
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import dims_equal, is_static
from tdag.ir.types import DType

_NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
_COORDINATES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")


@register("Resize", "Upsample")
def _resize(ctx, x, *rest):
    x = ctx.tensor(x)
    legacy = ctx.node.op_type == "Upsample" or ctx.opset < 11
    mode = {"bilinear": "linear"}.get(ctx.attr("mode", "nearest"), ctx.attr("mode", "nearest"))
    if mode not in ("nearest", "linear", "cubic"):
        raise InvalidModelError(f"{ctx.node.op_type}: mode {mode!r}")
    antialias = ctx.flag("antialias", 0)
    if antialias and mode == "nearest":
        raise InvalidModelError("Resize: antialias applies to linear and cubic modes only")
    coordinates = "asymmetric" if legacy else \
        ctx.choice("coordinate_transformation_mode", "half_pixel", _COORDINATES)
    if legacy and not ctx.attr("scales") and _run_time(ctx, rest[0]):
        return _legacy_at_run_time(ctx, x, ctx.tensor(rest[0]), mode)
    scales, sizes, rois, from_scale = _targets(ctx, x, rest, legacy)
    for axis in range(x.ndim):
        if scales[axis] == 1.0 and sizes[axis] == x.shape[axis] and rois[axis] == (0.0, 1.0):
            continue
        length = x.shape[axis]
        if not is_static(length):
            raise UnsupportedOpError(f"{ctx.node.op_type}: resizing a symbolic axis")
        if not 0 <= sizes[axis] <= MAX_TABLE:
            raise UnsupportedOpError(f"{ctx.node.op_type}: an output axis of {sizes[axis]} "
                                     f"(tdag builds an index table per axis, at most "
                                     f"{MAX_TABLE})")
        source, outside = _source(coordinates, sizes[axis], length, scales[axis], rois[axis],
                                  from_scale)
        if mode == "nearest":
            rule = "floor" if legacy else ctx.choice("nearest_mode", "round_prefer_floor",
                                                     _NEAREST)
            index, weight = _nearest(source, length, rule)
        else:
            index, weight = _taps(source, length, scales[axis], mode, antialias,
                                  ctx.attr("cubic_coeff_a", -0.75),
                                  ctx.flag("exclude_outside", 0))
        x = _apply(x, axis, index, weight)
        if outside is not None and outside.any():
            mask = x.builder.const(torch.from_numpy(_trailing(outside, x.ndim - axis)))
            x = ops.where(mask, float(ctx.attr("extrapolation_value", 0.0)), x)
    return x


def _run_time(ctx, value) -> bool:
    weight = ctx.builder.weights.get(getattr(value, "name", None))
    return weight is None or weight.value is None


def _legacy_at_run_time(ctx, x, scales, mode: str):
    """Upsample (and Resize before opset 11) with scales given at run time: each output
    length floor(L * scale) is a fresh size; output cell y reads y / scale (asymmetric, in
    float32 as onnxruntime), the floor for nearest, else a blend of the two cells around."""
    if mode == "cubic" or scales.shape != (x.ndim,):
        raise UnsupportedOpError(f"{ctx.node.op_type}: mode {mode!r} with scales {scales.type} "
                                 f"given at run time")
    if not all(is_static(d) for d in x.shape):
        raise UnsupportedOpError(f"{ctx.node.op_type}: scales at run time for {x.type}")
    scales = ops.cast(scales, DType.f32)
    for axis, length in enumerate(x.shape):
        scale = ops.select(scales, 0, axis)
        size = ops.cast(ops.floor(ops.mul(scale, float(length))), DType.i64)
        source = ops.div(ops.cast(ops.arange_of(size), DType.f32), scale)
        low = ops.clamp(ops.floor(source), 0.0, length - 1.0)
        lower = ops.gather(x, ops.cast(low, DType.i64), axis, wrap=False)
        if mode == "nearest":
            x = lower
            continue
        high = ops.cast(ops.minimum(ops.add(low, 1.0), length - 1.0), DType.i64)
        shape = [1] * x.ndim
        shape[axis] = -1
        frac = ops.reshape(ops.clamp(ops.sub(source, low), 0.0, 1.0), tuple(shape))
        upper = ops.gather(x, high, axis, wrap=False)
        x = ops.add(lower, ops.mul(ops.sub(upper, lower), ops.cast(frac, x.dtype)))
    return x


# -- the output sizes, scales and crop of each axis ---------------------------------------------

def _targets(ctx, x, rest, legacy: bool):
    """Per axis: the scale (out/in where only sizes are given, or the policy's common scale),
    the output length and the crop (start, end) in [0, 1]; and whether scales were given."""
    if legacy:
        scales = list(ctx.attr("scales") or _floats(ctx, rest[0], "scales"))
        sizes, roi = None, None
    else:
        roi = _floats(ctx, rest[0], "roi") if rest and rest[0] is not None else None
        scales = _floats(ctx, rest[1], "scales") if len(rest) > 1 and rest[1] is not None \
            else None
        sizes = ctx.ints(rest[2], "sizes") if len(rest) > 2 and rest[2] is not None else None
        scales = scales or None
    if any(not float(s) > 0 for s in scales or ()) or \
            any(is_static(s) and s < 0 for s in sizes or ()):
        raise InvalidModelError(f"{ctx.node.op_type}: scales {scales} must be > 0 and sizes "
                                f"{sizes} >= 0")
    axes = list(norm_axes(ctx.attr("axes") or range(x.ndim), x.ndim))
    if len(scales or sizes or ()) != len(axes):
        raise InvalidModelError(f"{ctx.node.op_type}: {len(scales or sizes or ())} scales or "
                                f"sizes for {len(axes)} axes")
    full_scales, full_sizes, rois = [1.0] * x.ndim, list(x.shape), [(0.0, 1.0)] * x.ndim
    if roi and ctx.attr("coordinate_transformation_mode", "") == "tf_crop_and_resize":
        if len(roi) != 2 * len(axes):
            raise InvalidModelError(f"Resize: roi {roi} for axes {axes}")
        for i, axis in enumerate(axes):
            rois[axis] = (float(roi[i]), float(roi[len(axes) + i]))
    if sizes:
        policy = ctx.choice("keep_aspect_ratio_policy", "stretch",
                            ("stretch", "not_larger", "not_smaller"))
        changed = [(a, int(s)) for a, s in zip(axes, sizes) if not dims_equal(s, x.shape[a])]
        if not all(is_static(x.shape[a]) for a, _ in changed):
            raise UnsupportedOpError(f"{ctx.node.op_type}: resizing a symbolic axis")
        if policy == "stretch":
            for axis, size in changed:
                full_sizes[axis], full_scales[axis] = size, size / x.shape[axis]
            return full_scales, full_sizes, rois, False
        if not all(is_static(x.shape[a]) for a in axes):
            raise UnsupportedOpError(f"{ctx.node.op_type}: {policy} over a symbolic axis")
        # one scale for every axis given, each size rounded half up
        scale = (min if policy == "not_larger" else max)(
            int(s) / x.shape[a] for a, s in zip(axes, sizes))
        for axis in axes:
            full_sizes[axis], full_scales[axis] = int(scale * x.shape[axis] + 0.5), scale
        return full_scales, full_sizes, rois, False
    for i, axis in enumerate(axes):
        if float(scales[i]) != 1.0:
            full_scales[axis] = float(scales[i])
            full_sizes[axis] = int(math.floor(x.shape[axis] * float(scales[i])))
    return full_scales, full_sizes, rois, True


def _floats(ctx, value, what: str) -> list:
    weight = ctx.builder.weights.get(getattr(value, "name", None))
    if weight is None or weight.value is None:
        raise UnsupportedOpError(f"{ctx.node.op_type}: {what} must be a constant")
    return weight.value.reshape(-1).tolist()


# -- one axis: source coordinates, taps and weights (float64, as the ONNX reference) ------------

def _source(mode: str, size: int, length: int, scale: float, roi, from_scale: bool):
    """The source coordinate of each output cell, and (tf_crop_and_resize) which cells fall
    outside the input. In float32, as onnxruntime computes them: where a nearest cell is a
    tie (4.5) in float32 but not in the reference's float64 (4.49999985), it falls as there."""
    f32 = np.float32
    y, scale = np.arange(size, dtype=f32), f32(scale)
    width = scale * f32(length)  # the reference's output_width, fractional for a scale
    if mode == "align_corners" and from_scale and width != size:
        # The reference divides by width - 1, onnxruntime and torch by size - 1: no answer
        # agrees with both, so tdag refuses rather than pick one.
        raise UnsupportedOpError(f"Resize: align_corners with a scale ({scale}) that gives a "
                                 f"fractional output length ({width}); give sizes instead")
    outside = None
    if mode == "align_corners":
        source = y * f32(0) if size == 1 else y * f32((length - 1) / (size - 1))
    elif mode == "asymmetric":
        source = y / scale
    elif mode == "pytorch_half_pixel":
        source = y * f32(0) - f32(0.5) if size == 1 else (y + f32(0.5)) / scale - f32(0.5)
    elif mode == "half_pixel":
        source = (y + f32(0.5)) / scale - f32(0.5)
    elif mode == "half_pixel_symmetric":
        offset = f32(length / 2) * (f32(1) - f32(size) / width)
        source = offset + (y + f32(0.5)) / scale - f32(0.5)
    elif mode == "tf_half_pixel_for_nn":
        source = (y + f32(0.5)) / scale
    else:  # tf_crop_and_resize
        start, end = f32(roi[0]), f32(roi[1])
        source = y * f32(0) + (end - start) * f32(length - 1) / f32(2) if size == 1 else \
            y * (end - start) * f32(length - 1) / f32(size - 1)
        source = source + start * f32(length - 1)
        outside = (source < 0) | (source > length - 1)
    return source.astype(np.float64), outside


def _ratio(source):
    """The fraction past the cell on the left, 1 (not 0) at a whole coordinate: the reference
    prefers the left cell."""
    whole = np.floor(source)
    return np.where(source == whole, 1.0, source - whole)


def _neighbours(source, n: int, length: int):
    """The n cells nearest each source coordinate (ties to the left), clamped to the axis
    (the reference pads with edge cells): (out, n) and whether each was outside."""
    pad = math.ceil(n / 2)
    shifted = source + pad
    cell = np.floor(shifted).astype(np.int64)
    frac = shifted - cell
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    index = (cell + offset)[:, None] + np.arange(n)[None, :] - pad
    return np.clip(index, 0, length - 1), (index < 0) | (index >= length)


def _nearest(source, length: int, rule: str):
    ratio = _ratio(source)
    whole = ratio == 1.0
    pick_right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                  "floor": np.zeros_like(whole), "ceil": np.ones_like(whole)}[rule] | whole
    index, _ = _neighbours(source, 2, length)
    return index[np.arange(len(source)), pick_right.astype(np.int64)][:, None], None


def _keys(v, a: float):
    """Keys' cubic kernel at |v| (0 from 2 on)."""
    v = np.abs(v)
    near = ((a + 2) * v - (a + 3)) * v * v + 1
    far = ((a * v - 5 * a) * v + 8 * a) * v - 4 * a
    return np.where(v <= 1, near, np.where(v < 2, far, 0.0))


def _taps(source, length: int, scale: float, mode: str, antialias: bool, a: float,
          exclude_outside: bool):
    ratio = _ratio(source)[:, None]
    if antialias:  # the kernel stretched by 1/scale when downsampling, weights normalised
        scale = min(scale, 1.0)
        reach = 1 if mode == "linear" else 2
        start = int(np.floor(-reach / scale) + 1)
        offsets = np.arange(start, 2 - start if mode == "cubic" else start + 2 - 2 * start)
        args = scale * (offsets[None, :] - ratio)
        weight = np.clip(1 - np.abs(args), 0, 1) if mode == "linear" else _keys(args, a)
        weight = weight / weight.sum(axis=1, keepdims=True)
    elif mode == "linear":
        weight = np.concatenate([1 - ratio, ratio], axis=1)
    else:
        weight = _keys(np.concatenate([ratio + 1, ratio, 1 - ratio, 2 - ratio], axis=1), a)
    index, outside = _neighbours(source, weight.shape[1], length)
    if exclude_outside:
        weight = np.where(outside, 0.0, weight)
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    return index, weight


def _trailing(values: np.ndarray, rank: int) -> np.ndarray:
    """A per-output-cell vector shaped to broadcast over the axes after it."""
    return values.reshape(values.shape + (1,) * (rank - 1))


def _apply(x, axis: int, index: np.ndarray, weight: np.ndarray | None):
    """sum over taps t of weight[:, t] * x gathered at index[:, t] along ``axis``."""
    out = None
    for t in range(index.shape[1]):
        term = ops.gather(x, x.builder.const(torch.from_numpy(np.ascontiguousarray(
            index[:, t]))), axis, wrap=False)
        if weight is not None:
            w = _trailing(weight[:, t].astype(np.float32), x.ndim - axis)
            term = ops.mul(term, x.builder.const(torch.from_numpy(w), x.dtype))
        out = term if out is None else ops.add(out, term)
    return out
