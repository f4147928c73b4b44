"""ONNX movement ops: Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Concat, Split, Slice,
Expand, Tile, Pad, CenterCropPad, DepthToSpace, SpaceToDepth and ReverseSequence (Gather is
with the other reads at computed positions in onnx/ops/indexing.py).

Shape values (Knowns) fold here where every size is known at import time; a size read from
data becomes a fresh one (onnx/runtime.py).
"""
from __future__ import annotations

import numpy as np
import sympy
import torch

from tdag import ops
from tdag.canonicalize.onnx import runtime
from tdag.canonicalize.onnx.ops.table import (
    axes_of,
    is_constant,
    norm_axes,
    norm_axis,
    register,
)
from tdag.canonicalize.onnx.values import END, MAX_TABLE, Known, fits, slice_bounds
from tdag.ops import writes
from tdag.ops.creation import dim_tensor
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import as_dim, is_static, product
from tdag.ir.types import DType


@register("Reshape")
def _reshape(ctx, x, shape=None):
    allow_zero = ctx.flag("allowzero", 0)
    if ctx.opset >= 5 and ctx.known(shape) is None:
        return runtime.reshape(ctx, x, shape, allow_zero)
    dims = list(ctx.attr("shape")) if ctx.opset < 5 else ctx.ints(shape, "shape")
    in_shape = list(x.shape)
    _check_reshape(dims, len(in_shape), allow_zero)
    dims = [in_shape[i] if is_static(d) and d == 0 and not allow_zero else d
            for i, d in enumerate(dims)]
    if any(is_static(d) and d == -1 for d in dims):
        known = product(d for d in dims if not (is_static(d) and d == -1))
        if is_static(known) and known == 0:
            raise InvalidModelError(f"Reshape: -1 in {dims} cannot be inferred beside a 0")
        rest = as_dim(sympy.cancel(sympy.sympify(product(in_shape)) / known))
        if not is_static(rest) and not rest.free_symbols:
            raise InvalidModelError(f"Reshape: {in_shape} does not fit {dims}")
        dims = [rest if is_static(d) and d == -1 else d for d in dims]
    if isinstance(x, Known) and all(is_static(d) for d in dims):
        return Known(x.values.reshape([int(d) for d in dims]), x.dtype)
    return ops.reshape(ctx.tensor(x), *dims)


def _check_reshape(dims, rank: int, allow_zero: bool) -> None:
    """ONNX's rules for a Reshape target: sizes >= -1, one -1 at most, a 0 (copy the input's
    size) only where the input has that axis, and never with -1 under allowzero."""
    static = [(i, d) for i, d in enumerate(dims) if is_static(d)]
    wild = sum(d == -1 for _, d in static)
    if any(d < -1 for _, d in static) or wild > 1 or (allow_zero and wild and
                                                      any(d == 0 for _, d in static)) or \
            (not allow_zero and any(d == 0 and i >= rank for i, d in static)):
        raise InvalidModelError(f"Reshape: the target shape {dims} is malformed for an input "
                                f"of rank {rank}{' (allowzero)' if allow_zero else ''}")


@register("Flatten")
def _flatten(ctx, x):
    shape = list(x.shape)
    axis = norm_axis(ctx.attr("axis", 1), len(shape), end_ok=True)
    return ops.reshape(ctx.tensor(x), product(shape[:axis]), product(shape[axis:]))


@register("Transpose")
def _transpose(ctx, x):
    perm = ctx.attr("perm") or list(reversed(range(len(x.shape))))
    if sorted(perm) != list(range(len(x.shape))):
        raise InvalidModelError(f"Transpose: perm {list(perm)} is not a permutation of the "
                                f"{len(x.shape)} axes")
    if isinstance(x, Known):
        return Known(np.transpose(x.values, perm), x.dtype)
    return ops.permute(ctx.tensor(x), *perm)


@register("Squeeze")
def _squeeze(ctx, x, axes=None):
    axes = axes_of(ctx, axes, 13)
    rank = len(x.shape)
    ones = [i for i, d in enumerate(x.shape) if is_static(d) and d == 1]
    if axes is None:
        axes = ones
    elif not axes and ones:  # ONNX's inference squeezes none, onnxruntime every size-1 axis
        raise UnsupportedOpError("Squeeze: an empty axes input on a shape with size-1 axes")
    axes = norm_axes(axes, rank)
    if isinstance(x, Known):
        return Known(np.squeeze(x.values, axes), x.dtype)
    out = ops.squeeze(ctx.tensor(x), axes)
    runtime.keep_offset(ctx, out, x)
    return out


@register("Unsqueeze")
def _unsqueeze(ctx, x, axes=None):
    axes = axes_of(ctx, axes, 13)
    if axes is None:
        raise InvalidModelError("Unsqueeze: no axes given")
    axes = tuple(sorted(norm_axes(axes, len(x.shape) + len(axes))))
    if isinstance(x, Known):
        return Known(np.expand_dims(x.values, axes), x.dtype)
    out = ops.unsqueeze(ctx.tensor(x), axes)
    runtime.keep_offset(ctx, out, x)
    return out


@register("Concat")
def _concat(ctx, *xs):
    axis = norm_axis(ctx.attr("axis"), len(xs[0].shape))
    if all(isinstance(x, Known) for x in xs) and \
            fits([sum(x.shape[axis] for x in xs), *xs[0].shape[:axis], *xs[0].shape[axis + 1:]]):
        return Known(np.concatenate([x.values for x in xs], axis), xs[0].dtype)
    parts = [ctx.tensor(x) for x in xs if not (is_static(x.shape[axis]) and x.shape[axis] == 0)]
    out = ops.concat(parts, axis) if len(parts) > 1 else parts[0]
    runtime.note_entries(ctx, out, xs)
    return out


@register("Split")
def _split(ctx, x, split=None):
    axis = norm_axis(ctx.attr("axis", 0), len(x.shape))
    if ctx.opset >= 13 and split is not None and ctx.known(split) is None:
        return runtime.split(ctx, x, split, axis)
    sizes = ctx.attr("split") if ctx.opset < 13 else ctx.ints(split, "split")
    if not sizes:
        dim, count = x.shape[axis], ctx.attr("num_outputs", ctx.num_outputs)
        if not is_static(dim):
            raise UnsupportedOpError(f"Split: an equal split of the symbolic axis {dim}")
        if type(count) is not int or count < 1:
            raise InvalidModelError(f"Split: cannot split into {count!r} parts")
        chunk = -(-dim // count)  # ceil: the last part may be smaller (opset 18)
        sizes = [min(chunk, dim - i * chunk) for i in range(count)]
    _check_split(ctx, list(sizes), x.shape[axis])
    if isinstance(x, Known):
        cuts = np.cumsum([int(s) for s in sizes])[:-1]
        return tuple(Known(v, x.dtype) for v in np.split(x.values, cuts, axis))
    return tuple(ops.split(ctx.tensor(x), list(sizes), axis))


def _check_split(ctx, sizes: list, dim) -> None:
    """One size per output, none negative, adding up to the axis (zip would drop the rest)."""
    total = sum(sizes)
    if len(sizes) != ctx.num_outputs or any(is_static(s) and s < 0 for s in sizes) or \
            (is_static(dim) and is_static(total) and total != dim):
        raise InvalidModelError(f"Split: sizes {sizes} do not split an axis of {dim} into "
                                f"{ctx.num_outputs} outputs")


@register("Slice")
def _slice(ctx, x, starts=None, ends=None, axes=None, steps=None):
    if ctx.opset < 10:
        starts, ends, axes, steps = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes"), None
    elif any(v is not None and ctx.known(v) is None for v in (starts, ends, axes, steps)):
        known_axes = ctx.known(axes)  # bounds, axes or steps given at run time
        return runtime.slice_(ctx, x, starts, ends,
                              [int(a) for a in known_axes.dims()] if known_axes is not None
                              else axes, steps)
    else:
        given = starts, ends, axes, steps
        starts, ends = ctx.ints(starts, "starts"), ctx.ints(ends, "ends")
        axes, steps = ctx.ints(axes, "axes"), ctx.ints(steps, "steps")
        if not _decided(x, starts, ends, axes, steps):  # as data: each length a fresh size
            return runtime.slice_(ctx, x, *given[:2], [int(a) for a in axes] if axes
                                  else None, given[3])
    rank = len(x.shape)
    axes = list(norm_axes(axes, rank)) if axes else list(range(len(starts)))
    steps = [int(s) for s in steps] if steps else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or 0 in steps:
        raise InvalidModelError(f"Slice: starts {list(starts)}, ends {list(ends)}, axes {axes} "
                                f"and steps {steps} must have one entry per axis, steps not 0")
    bounds = all(is_static(v) for v in list(starts) + list(ends))
    if isinstance(x, Known) and bounds:
        index = [slice(None)] * rank
        for a, b, e, s in zip(axes, starts, ends, steps):
            index[a] = slice(b, e, s)
        return Known(x.values[tuple(index)], x.dtype)
    picked = runtime.picked_entries(ctx, x, slice(starts[0], ends[0], steps[0])) \
        if bounds and rank == 1 and len(axes) == 1 else None
    return runtime.known_or_noted(ctx, picked, x.dtype, lambda: _slice_axes(
        ctx.tensor(x), axes, starts, ends, steps))


def _decided(x, starts, ends, axes, steps) -> bool:
    """Whether the symbols decide, for each bound on a symbolic axis, if it counts from the
    end (``-s`` does, ``t - s`` is open)."""
    rank = len(x.shape)
    axes = list(norm_axes(axes, rank)) if axes else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    return all(slice_bounds(b, e, x.shape[a]) is not None
               for a, b, e, s in zip(axes, starts, ends, steps)
               if is_static(s) and s > 0 and not all(is_static(v) for v in (b, e, x.shape[a])))


def _checked(x, axis, checks):
    """``x`` read through an identity gather along ``axis`` that raises at run time unless
    a <= b for each pair of Dims (a Slice's bounds lie in its axis, as its shape assumes)."""
    ok = None
    for low, high in checks:
        holds = ops.le(dim_tensor(sympy.sympify(low)), dim_tensor(sympy.sympify(high)))
        ok = holds if ok is None else ops.logical_and(ok, holds)
    index = ops.add(ops.iota(x.shape[axis], DType.i64, x.builder), ops.checked_zero(ok))
    return ops.gather(x, index, axis, wrap=False)


def _slice_axes(x, axes, starts, ends, steps):
    for a, b, e, s in zip(axes, starts, ends, steps):
        x = _slice_axis(x, a, b, e, s)
    return x


def _slice_axis(x, axis, start, stop, step):
    dim = x.shape[axis]
    if step > 0:
        if all(is_static(v) for v in (start, stop, dim)):
            return ops.slice(x, axis, *slice(start, stop).indices(dim)[:2], step)
        start, stop, checks = slice_bounds(start, stop, dim)  # decided: _decided
        x = ops.slice(x, axis, start, stop, step)
        return _checked(x, axis, checks) if checks else x
    if not is_static(dim):
        raise UnsupportedOpError(f"Slice: a negative step on the symbolic axis {dim}")
    if dim > MAX_TABLE:
        raise UnsupportedOpError(f"Slice: a negative step on an axis of {dim} (more than "
                                 f"{MAX_TABLE}, the size of index table tdag builds)")
    index = list(range(dim))[slice(max(min(start, END), -END), max(stop, -dim - 1), step)]
    return ops.gather(x, x.builder.const(torch.tensor(index, dtype=torch.int64)), axis)


@register("Expand")
def _expand(ctx, x, shape):
    if ctx.known(shape) is None:
        return runtime.expand(ctx, x, shape)
    dims = ctx.ints(shape, "shape")
    out = ops.broadcast_shapes(tuple(x.shape), tuple(dims))
    if isinstance(x, Known) and fits(out):
        return Known(np.broadcast_to(x.values, [int(d) for d in out]).copy(), x.dtype)
    return ops.broadcast_to(ctx.tensor(x), out)


@register("Tile")
def _tile(ctx, x, repeats):
    if ctx.known(repeats) is None:
        return runtime.tile(ctx, x, repeats)
    repeats = ctx.ints(repeats, "repeats")
    if len(repeats) != len(x.shape) or any(is_static(r) and r < 0 for r in repeats):
        raise InvalidModelError(f"Tile: repeats {repeats} must be one count >= 0 per axis of "
                                f"{list(x.shape)}")
    return ops.tile(ctx.tensor(x), *repeats)


@register("Pad")
def _pad(ctx, x, pads=None, value=None, axes=None):
    rank = len(x.shape)
    if ctx.opset < 11:  # pads and value were attributes
        pads, fill = list(ctx.attr("pads")), ctx.attr("value", 0.0)
    else:
        fill = value if value is not None else 0
        if value is not None and is_constant(ctx, value):
            fill = ctx.scalar(value, "value")
        if ctx.known(pads) is None or (axes is not None and ctx.known(axes) is None) or \
                not isinstance(fill, (int, float)) and ctx.attr("mode", "constant") != \
                "constant":  # given at run time
            return _pad_runtime(ctx, x, pads, fill, axes)
        pads = ctx.ints(pads, "pads")
    axes = list(norm_axes(ctx.ints(axes, "axes"), rank)) if axes is not None \
        else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise InvalidModelError(f"Pad: {len(pads)} pads for {len(axes)} axes (two per axis)")
    widths = [(0, 0)] * rank
    for i, a in enumerate(axes):
        widths[a] = (pads[i], pads[i + len(axes)])
    mode = ctx.attr("mode", "constant")
    x = ctx.tensor(x)
    if mode == "constant":
        return ops.pad(x, widths, float(fill)) if isinstance(fill, (int, float)) else \
            _pad_with(ctx, x, widths, fill)
    torch_mode = {"reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(mode)
    if torch_mode is None:
        raise UnsupportedOpError(f"Pad: mode {mode!r}")
    first = next((a for a, w in enumerate(widths) if w != (0, 0)), rank)
    flat = [w for pair in reversed(widths[first:]) for w in pair]
    return ops.torch_pad(x, flat, torch_mode) if flat else x


def _pad_with(ctx, x, widths, fill):
    """Static pads, a fill value the graph computes (a CastLike of -inf): pad with 0, then
    the fill where a mask padded the same way says padding."""
    inside = ops.pad(ops.full(x.shape, True, DType.bool, like=x), widths, 0.0)
    fill = ops.reshape(ops.cast(ctx.tensor(fill), x.dtype), ())
    return ops.where(inside, ops.pad(x, widths, 0.0), fill)


def _pad_runtime(ctx, x, pads, fill, axes):
    x = ctx.tensor(x)
    fill = ops.full((), fill, x.dtype, like=x) if isinstance(fill, (int, float)) else \
        ops.reshape(ops.cast(ctx.tensor(fill), x.dtype), ())
    known = ctx.known(axes)
    if axes is None:
        axes = list(range(x.ndim))
    elif known is not None:
        axes = list(norm_axes(known.dims(), x.ndim))
    return runtime.pad(ctx, x, pads, fill, axes, ctx.attr("mode", "constant"))


@register("CenterCropPad")
def _center_crop_pad(ctx, x, shape):
    """Crop (the centre, the extra cell at the end) or zero-pad (likewise) each axis to the
    target size."""
    x = ctx.tensor(x)
    sizes = [int(s) for s in ctx.ints(shape, "shape")]
    axes = ctx.attr("axes") or list(range(x.ndim))
    if len(axes) != len(sizes):
        raise InvalidModelError(f"CenterCropPad: {len(sizes)} sizes for axes {list(axes)}")
    for axis, size in zip(axes, sizes):
        axis = norm_axis(axis, x.ndim)
        dim = x.shape[axis]
        if not is_static(dim):
            raise UnsupportedOpError(f"CenterCropPad of the symbolic axis {dim}")
        if size < dim:
            start = (dim - size) // 2
            x = ops.slice(x, axis, start, start + size)
        elif size > dim:
            before = (size - dim) // 2
            widths = [(0, 0)] * x.ndim
            widths[axis] = (before, size - dim - before)
            x = ops.pad(x, widths, 0)
    return x


# -- space and depth, reversals --------------------------------------------------------------------

@register("DepthToSpace")
def _depth_to_space(ctx, x):
    x = ctx.tensor(x)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    if ctx.attr("mode", "DCR") == "CRD":
        y = ops.reshape(x, n, c // (b * b), b, b, h, w)
        y = ops.permute(y, 0, 1, 4, 2, 5, 3)
    else:
        y = ops.reshape(x, n, b, b, c // (b * b), h, w)
        y = ops.permute(y, 0, 3, 4, 1, 5, 2)
    return ops.reshape(y, n, c // (b * b), h * b, w * b)


@register("SpaceToDepth")
def _space_to_depth(ctx, x):
    x = ctx.tensor(x)
    b = ctx.attr("blocksize")
    n, c, h, w = x.shape
    y = ops.reshape(x, n, c, h // b, b, w // b, b)
    crd = ctx.attr("mode", "DCR") == "CRD"
    y = ops.permute(y, *((0, 1, 3, 5, 2, 4) if crd else (0, 3, 5, 1, 2, 4)))
    return ops.reshape(y, n, c * b * b, h // b, w // b)


@register("ReverseSequence")
def _reverse_sequence(ctx, x, lengths):
    """Reverse the first lengths[b] steps of each batch entry along the time axis: a gather
    along time at index len - 1 - t (t < len), t elsewhere."""
    x = ctx.tensor(x)
    time, batch = ctx.attr("time_axis", 0), ctx.attr("batch_axis", 1)
    lengths = ops.cast(ctx.tensor(lengths), DType.i64)
    steps = ops.iota(x.shape[time], "i64", x.builder)
    shape_t, shape_b = [1] * x.ndim, [1] * x.ndim
    shape_t[time], shape_b[batch] = x.shape[time], x.shape[batch]
    t = ops.reshape(steps, tuple(shape_t))
    n = ops.reshape(lengths, tuple(shape_b))
    index = ops.where(ops.lt(t, n), ops.sub(ops.sub(n, 1), t), t)
    return writes.take_along(x, time, ops.broadcast_to(index, tuple(x.shape)))
