"""Resampling ATen ops: grid sampling at run-time coordinates, antialiased resizing.

``grid_sampler_3d`` gathers the 8 (trilinear) or 1 (nearest) cells around each grid point
from the input flattened to rows of channels, weighted and masked as torch's kernel does (the
2-d op is decomposed by torch itself). The antialiased resizes are linear maps with
static sizes: one constant [out, in] matrix per axis, computed at canonicalization time with
ATen's weight formula, then contracted with the input.
"""
from __future__ import annotations

import itertools

import torch

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.ops.nn.util import static_dims
from tdag.ir.types import DType

# -- grid sampling ------------------------------------------------------------------------------


def _unnormalize(coord, size, align_corners):
    """[-1, 1] to pixel coordinates: corners at -1/1, or pixel edges there."""
    if align_corners:
        return ops.mul(ops.add(coord, 1.0), (size - 1) / 2)
    return ops.div(ops.sub(ops.mul(ops.add(coord, 1.0), float(size)), 1.0), 2.0)


def _reflect(coord, twice_low, twice_high):
    """Fold coord back into [low, high] as a mirror would, as ATen's reflect_coordinates."""
    if twice_low == twice_high:
        return ops.mul(coord, 0.0)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    dist = ops.abs(ops.sub(coord, low))
    extra = ops.fmod(dist, span)
    even = ops.eq(ops.remainder(ops.floor(ops.div(dist, span)), 2.0), 0.0)
    return ops.where(even, ops.add(extra, low), ops.sub(span + low, extra))


def _source(coord, size, padding_mode, align_corners):
    """Pixel coordinates with border (1) or reflection (2) padding applied; zeros (0) masks
    out-of-range cells later instead."""
    coord = _unnormalize(coord, size, align_corners)
    if padding_mode == 1:
        return ops.clamp(coord, 0.0, float(size - 1))
    if padding_mode == 2:
        twice = (0, 2 * (size - 1)) if align_corners else (-1, 2 * size - 1)
        return ops.clamp(_reflect(coord, *twice), 0.0, float(size - 1))
    return coord


def _sample(rows, corners, sizes, batch):
    """sum over corners of weight * input at the corner (0 outside): rows [N*prod(S), C],
    corners [(per-axis integer coords [N, *O] as f32, weight)], sizes S (slowest first)."""
    out = None
    for coords, weight in corners:
        inside = None
        linear = None
        for c, size in zip(coords, sizes):
            ok = ops.logical_and(ops.ge(c, 0.0), ops.lt(c, float(size)))
            inside = ok if inside is None else ops.logical_and(inside, ok)
            c = ops.cast(c, DType.i64)
            linear = c if linear is None else ops.add(ops.mul(linear, size), c)
        base = ops.reshape(ops.mul(ops.iota(batch, "i64", rows.builder), _volume(sizes)),
                           (batch,) + (1,) * (linear.ndim - 1))
        linear = ops.where(inside, ops.add(linear, base), 0)
        term = ops.mul(ops.gather(rows, linear, 0),
                       ops.unsqueeze(ops.where(inside, weight, 0.0), linear.ndim))
        out = term if out is None else ops.add(out, term)
    return out


def _volume(sizes):
    total = 1
    for s in sizes:
        total *= s
    return total


@aten("grid_sampler_3d")
def grid_sampler_3d(x, grid, interpolation_mode, padding_mode, align_corners):
    """x [N, C, D, H, W] sampled at grid [N, oD, oH, oW, 3] (x, y, z in [-1, 1]);
    interpolation 0 trilinear, 1 nearest; padding 0 zeros, 1 border, 2 reflection."""
    n, c = x.shape[:2]
    sizes = static_dims(x, range(2, 5), "grid_sampler_3d")  # D, H, W
    rows = ops.reshape(ops.permute(x, (0, 2, 3, 4, 1)), (-1, c))
    # grid's last axis is (x, y, z) = (W, H, D): reverse to match sizes
    coords = [_source(ops.select(grid, -1, k), sizes[2 - k], padding_mode, align_corners)
              for k in (2, 1, 0)]
    if interpolation_mode == 1:
        corners = [([ops.round(p) for p in coords], ops.full(coords[0].shape, 1.0, x.dtype,
                                                              like=x))]
    elif interpolation_mode == 0:
        low = [ops.floor(p) for p in coords]
        frac = [ops.sub(p, f) for p, f in zip(coords, low)]
        corners = []
        for offsets in itertools.product((0, 1), repeat=3):
            weight = None
            for o, f in zip(offsets, frac):
                w = f if o else ops.sub(1.0, f)
                weight = w if weight is None else ops.mul(weight, w)
            corners.append(([ops.add(f, float(o)) for f, o in zip(low, offsets)], weight))
    else:
        raise NotImplementedError(f"grid_sampler_3d interpolation mode {interpolation_mode}")
    out = _sample(rows, corners, sizes, n)  # [N, oD, oH, oW, C]
    return ops.permute(out, (0, 4, 1, 2, 3))


# -- antialiased resizing -----------------------------------------------------------------------


def _triangle(t: torch.Tensor) -> torch.Tensor:
    t = t.abs()
    return torch.where(t < 1, 1 - t, torch.zeros_like(t))


def _keys_half(t: torch.Tensor) -> torch.Tensor:
    """Keys' cubic kernel with a = -0.5, the antialiased bicubic filter."""
    a, t = -0.5, t.abs()
    near = ((a + 2) * t - (a + 3)) * t * t + 1
    far = (((t - 5) * t + 8) * t - 4) * a
    return torch.where(t < 1, near, torch.where(t < 2, far, torch.zeros_like(t)))


def aa_matrix(length: int, out: int, scale: float | None, align_corners: bool, filter_fn,
              taps: int) -> torch.Tensor:
    """The [out, length] resampling matrix of ATen's antialiased kernel (as PIL): the filter
    is widened by the downscale factor, sampled at the input cells under its support and
    normalised to sum 1; float32 throughout, as ATen computes it for float32 inputs."""
    f32 = torch.float32
    if align_corners:
        ratio = torch.tensor((length - 1) / (out - 1) if out > 1 else 0.0, dtype=f32)
    elif scale is not None and scale > 0:
        ratio = torch.tensor(1.0 / scale, dtype=f32)
    else:
        ratio = torch.tensor(length, dtype=f32) / out
    support = taps * 0.5 * ratio if ratio >= 1 else torch.tensor(taps * 0.5, dtype=f32)
    invscale = 1.0 / ratio if ratio >= 1 else torch.tensor(1.0, dtype=f32)
    matrix = torch.zeros(out, length, dtype=f32)
    for i in range(out):
        center = ratio * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), length)
        cells = torch.arange(lo, hi, dtype=f32)
        w = filter_fn((cells - center + 0.5) * invscale)
        total = w.sum()
        matrix[i, lo:hi] = w / total if total != 0 else w
    return matrix


def _resize_aa(x, output_size, align_corners, scales, filter_fn, taps):
    """x [N, C, H, W] resized by one constant matrix per spatial axis."""
    lengths = static_dims(x, range(2, x.ndim), "antialiased resize")
    for i in reversed(range(len(lengths))):
        axis = 2 + i
        m = aa_matrix(lengths[i], int(output_size[i]), scales[i], align_corners, filter_fn,
                      taps)
        moved = ops.movedim(x, axis, -1)
        x = ops.movedim(ops.matmul(moved, x.builder.const(m.T.contiguous().to(
            x.dtype.torch))), -1, axis)
    return x


def _aa_entry(filter_fn, taps):
    def entry(x, output_size, align_corners, *scales):
        if scales and isinstance(scales[0], (list, tuple)):  # the .vec overload
            factors = scales[0]
            if not output_size:
                output_size = [int(n * f) for n, f in zip(x.shape[2:], factors)]
            scales = tuple(factors)
        scales = tuple(scales) + (None,) * (2 - len(scales))
        return _resize_aa(x, output_size, align_corners, scales, filter_fn, taps)
    return entry


aten("_upsample_bilinear2d_aa")(_aa_entry(_triangle, 2))
aten("_upsample_bicubic2d_aa")(_aa_entry(_keys_half, 4))
