"""Pooling and resampling as compositions of primitives, on the trailing 1-3 spatial axes.

max_pool            = pad + unfold (one per axis) + the sum of each window's first maximum
avg_pool            = pad + unfold (one per axis) + reduce-sum, divided by counts
adaptive pools      = unfold when the windows tile the axis, else gather of (out, k) windows
interpolate         = gather (nearest), or 2 (linear) / 4 (cubic) gathers + a weighted sum
                      per axis, with index and weight consts computed at trace time
"""
from __future__ import annotations

import math

import torch

from tdag.ops import core, creation
from tdag.ops.tensor import Tensor
from tdag.ops.nn.util import as_float, fill_value, ntuple, spatial_rank, static_dims, trailing
from tdag.errors import ShapeError
from tdag.ir.symbols import Dim, as_dim, floordiv, is_static

__all__ = ["max_pool", "avg_pool", "adaptive_avg_pool", "adaptive_max_pool", "interpolate"]

# Index, weight and count tables are computed at trace time in closed form on tensors the size
# of an output axis (never per cell of the input). Past this many entries a table would be a
# const too large to hold, so tracing stops with a ShapeError instead of allocating it.
MAX_TABLE = 2**24
_SMALL_TABLE = 4096  # a divisor vector up to this long is a const; longer ones are traced


def _check_table(entries: int, what: str) -> None:
    if entries > MAX_TABLE:
        raise ShapeError(f"{what}: would build a table of {entries} entries at trace time "
                         f"(the limit is {MAX_TABLE}); the sizes are too large to trace")


# -- windowed pooling -------------------------------------------------------------------------


def _pool_length(length: Dim, k: int, s: int, p: int, dl: int, ceil_mode: bool) -> Dim:
    """Number of windows, torch's pooling_output_shape (ceil mode drops a window that would
    start inside the right padding)."""
    span = dl * (k - 1) + 1
    if not ceil_mode or s == 1:  # with stride 1 ceil and floor agree
        return as_dim(floordiv(as_dim(length + 2 * p - span), s) + 1)
    if not is_static(length):
        raise ShapeError("pooling: ceil_mode with stride > 1 needs a static spatial size")
    out = -(-(length + 2 * p - span) // s) + 1
    return out - 1 if (out - 1) * s >= length + p else out


def pool_windows(x: Tensor, d: int, kernel, stride, padding, dilation, ceil_mode: bool,
                 fill: float) -> Tensor:
    """(..., *S) -> (..., *O, *K): padded with ``fill``, plus extra right padding in ceil
    mode so that the last (partial) window exists."""
    widths = [(0, 0)] * (x.ndim - d)
    for i in range(d):
        length = x.shape[x.ndim - d + i]
        n = _pool_length(length, kernel[i], stride[i], padding[i], dilation[i], ceil_mode)
        needed = as_dim((n - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1)
        extra = as_dim(needed - length - 2 * padding[i])
        extra = max(extra, 0) if is_static(extra) else 0
        widths.append((padding[i], padding[i] + extra))
    x = core.pad(x, widths, fill)
    base = x.ndim - d
    for i in range(d):
        x = core.unfold(x, base + i, kernel[i], stride[i], dilation[i])
    return x


def pool_args(x: Tensor, kernel_size, stride, padding, dilation, spatial_dims, what: str):
    d = spatial_rank(x, kernel_size, spatial_dims, what)
    kernel = ntuple(kernel_size, d, f"{what} kernel_size")
    stride = kernel if stride is None or stride == [] else ntuple(stride, d, f"{what} stride")
    padding = ntuple(padding, d, f"{what} padding")
    dilation = ntuple(dilation, d, f"{what} dilation")
    for k, p in zip(kernel, padding):
        if p > k // 2:  # torch's rule (on the kernel size, dilation aside)
            raise ShapeError(f"{what}: padding {p} must be at most half the kernel size {k}")
    return d, kernel, stride, padding, dilation


def max_pool(x: Tensor, kernel_size, stride=None, padding=0, dilation=1,
             ceil_mode: bool = False, spatial_dims: int | None = None) -> Tensor:
    """``torch.nn.functional.max_pool{1,2,3}d`` on the trailing spatial axes (their count is
    the kernel_size tuple's length, else x.ndim - 2, or ``spatial_dims``). Padding is -inf,
    so it never wins; nan propagates as in torch.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.max_pool(x, 3, stride=2, ceil_mode=True),
    ...                   tdag.TensorSpec(("b", 8, 10, 10)))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[b,8,5,5]']
    """
    d, kernel, stride, padding, dilation = pool_args(x, kernel_size, stride, padding,
                                                     dilation, spatial_dims, "max_pool")
    windows = pool_windows(x, d, kernel, stride, padding, dilation, ceil_mode, fill_value(x, True))
    axes = tuple(range(windows.ndim - d, windows.ndim))
    if not x.dtype.is_float:  # no gradient to route
        return core.amax(windows, axes)
    return core.sum(core.where(first_max(windows, kernel), windows, -0.0), axes)


def first_max(windows: Tensor, kernel: tuple) -> Tensor:
    """The mask of each window's first maximum (or first nan) over its trailing
    ``len(kernel)`` axes, in row-major window order.

    max_pool's value is the window's sum of where(mask, x, -0.0): exactly its max (one cell
    plus negative zeros), and a gradient that goes all to the first maximum, as torch's
    max_pool2d_with_indices_backward and JAX's select_and_scatter give it. A reduce-max
    would split it evenly over tied maxima (torch's amax rule), and ties are common after a
    ReLU. Lowering folds the value back into one max_pool kernel (tdag/lower/pool.py) and
    its gradient into max_pool_backward (tdag/lower/cnn_backward.py)."""
    axes = tuple(range(windows.ndim - len(kernel), windows.ndim))
    count = math.prod(kernel)
    hit = core.logical_or(core.eq(windows, core.amax(windows, axes, keepdim=True)),
                          core.isnan(windows))
    places = windows.builder.const(torch.arange(count).reshape(kernel))
    first = core.amin(core.where(hit, places, count), axes, keepdim=True)
    return core.eq(places, first)


def avg_pool(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
             count_include_pad: bool = True, divisor_override: int | None = None,
             spatial_dims: int | None = None) -> Tensor:
    """``torch.nn.functional.avg_pool{1,2,3}d``: window sums divided by the window size, or
    by the count of real (unpadded) cells when ``count_include_pad`` is False."""
    d, kernel, stride, padding, _ = pool_args(x, kernel_size, stride, padding, 1,
                                              spatial_dims, "avg_pool")
    windows = pool_windows(as_float(x), d, kernel, stride, padding, (1,) * d, ceil_mode, 0.0)
    sums = core.sum(windows, tuple(range(windows.ndim - d, windows.ndim)))
    if divisor_override is not None:
        if divisor_override == 0:
            raise ShapeError("avg_pool: divisor_override must be non-zero")
        return core.div(sums, float(divisor_override))
    counts = [trailing(_window_counts(x, x.ndim - d + i, kernel[i], stride[i], padding[i],
                                      ceil_mode, count_include_pad), d - i) for i in range(d)]
    return core.div(sums, _product(counts, sums))


def _product(parts: list, like: Tensor):
    """The product of per-axis counts (ints, const vectors, traced vectors) as one operand:
    a Python float when every window agrees, else a broadcastable tensor."""
    static = torch.ones((), dtype=torch.float64)
    traced = None
    for part in parts:
        if isinstance(part, Tensor):
            traced = part if traced is None else core.mul(traced, part)
        else:
            static = static * part
    out = float(static) if static.ndim == 0 else like.builder.const(static.to(like.dtype.torch))
    if traced is None or (isinstance(out, float) and out == 1.0):
        return out if traced is None else traced
    return core.mul(traced, out)


def _window_counts(x: Tensor, axis: int, k: int, s: int, p: int, ceil_mode: bool,
                   include_pad: bool):
    """The divisor of each window along one axis: an int when all agree, else a vector (a
    const, or for a long axis a traced k-filled vector with its edge windows' counts)."""
    length = x.shape[axis]
    dtype = x.dtype if x.dtype.is_float else "f32"
    if not is_static(length):
        if include_pad or p == 0:  # without ceil mode every window is whole
            return k
        ones = creation.full((length,), 1.0, dtype, like=x)
        windows = core.unfold(core.pad(ones, [(p, p)]), 0, k, s)
        return core.sum(windows, 1)  # counts the real cells of each window
    n = _pool_length(length, k, s, p, 1, ceil_mode)
    # windows [lo, hi) lie wholly inside the axis and count k; only the edges differ
    lo = min(n, -(-p // s))
    hi = max(lo, min(n, (length + p - k) // s + 1))
    _check_table(lo + n - hi, "avg_pool")
    head = _edge_counts(torch.arange(lo), length, k, s, p, include_pad)
    tail = _edge_counts(torch.arange(hi, n), length, k, s, p, include_pad)
    values = torch.cat([head, tail, torch.tensor([k] if hi > lo else [])])
    if values.numel() == 0 or bool((values == values[0]).all()):
        return int(values[0]) if values.numel() else k
    if n <= _SMALL_TABLE:
        return torch.cat([head, torch.full((hi - lo,), float(k), dtype=torch.float64), tail])
    counts = core.pad(x.builder.const(head, dtype), [(0, n - lo)], float(k))
    if tail.numel():  # add (count - k) over the tail windows
        counts = core.add(counts, core.pad(x.builder.const(tail - k, dtype), [(hi, 0)]))
    return counts


def _edge_counts(o: torch.Tensor, length: int, k: int, s: int, p: int,
                 include_pad: bool) -> torch.Tensor:
    """torch's avg_pool divisor of windows ``o``: the window clips to the padded input first,
    then (without count_include_pad) to the input itself."""
    start = o * s - p
    end = torch.clamp(start + k, max=length + p)
    if include_pad:
        return (end - start).to(torch.float64)
    return (end.clamp(max=length) - start.clamp(min=0)).to(torch.float64)


# -- adaptive pooling -------------------------------------------------------------------------


def _adaptive_sizes(x: Tensor, output_size, spatial_dims, what: str) -> tuple[int, tuple]:
    d = spatial_rank(x, output_size, spatial_dims, what)
    sizes = ntuple(output_size, d, f"{what} output_size")
    lengths = static_dims(x, range(x.ndim - d, x.ndim), what)
    return d, tuple(n if o is None else o for o, n in zip(sizes, lengths))


def _adaptive_windows(length: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's adaptive windows [floor(i*L/out), ceil((i+1)*L/out)), as (starts, ends).

    i*L is split as i*(L//out) + i*(L%out) so that no product leaves int64."""
    _check_table(out, "adaptive pooling")
    whole, part = divmod(length, out)

    def floor_at(i: torch.Tensor) -> torch.Tensor:  # floor(i*L/out)
        return i * whole + i * part // out

    i = torch.arange(out)
    return floor_at(i), floor_at(i + 1) + (((i + 1) * part) % out != 0).to(torch.int64)


def _adaptive_axis(x: Tensor, axis: int, out: int, kind: str) -> Tensor:
    """Reduce one axis to ``out`` windows: unfold when they tile it, else a gather of
    (out, kmax) indices (short windows repeat their last index: harmless for max, masked
    to 0 for sum)."""
    length = x.shape[axis]
    if out == 0 or length == 0:
        raise ShapeError(f"adaptive pooling: cannot pool {length} cells into {out}")
    if out == length:
        return x
    if length % out == 0:
        k = length // out
        return core.reduce(core.unfold(x, axis, k, k), kind, x.ndim)
    starts, ends = _adaptive_windows(length, out)
    kmax = int((ends - starts).max())
    _check_table(out * kmax, "adaptive pooling")
    cells = starts[:, None] + torch.arange(kmax)
    index = torch.minimum(cells, ends[:, None] - 1)
    picked = core.gather(x, index, axis, wrap=False)         # (..., out, kmax, ...)
    if kind == "sum":
        mask = trailing(x.builder.const(cells < ends[:, None]), x.ndim - axis + 1)
        picked = core.where(mask, picked, 0.0)
    return core.reduce(picked, kind, axis + 1)


def adaptive_avg_pool(x: Tensor, output_size, spatial_dims: int | None = None) -> Tensor:
    """``torch.nn.functional.adaptive_avg_pool{1,2,3}d`` for static spatial sizes; a None
    entry in ``output_size`` keeps that axis."""
    d, sizes = _adaptive_sizes(x, output_size, spatial_dims, "adaptive_avg_pool")
    y, counts = as_float(x), []
    for i, out in enumerate(sizes):
        axis = x.ndim - d + i
        y = _adaptive_axis(y, axis, out, "sum")
        starts, ends = _adaptive_windows(x.shape[axis], out)
        counts.append(trailing((ends - starts).to(torch.float64), d - i))
    return core.div(y, _product(counts, y))


def adaptive_max_pool(x: Tensor, output_size, spatial_dims: int | None = None) -> Tensor:
    """``torch.nn.functional.adaptive_max_pool{1,2,3}d`` (values only) for static sizes."""
    d, sizes = _adaptive_sizes(x, output_size, spatial_dims, "adaptive_max_pool")
    for i, out in enumerate(sizes):
        x = _adaptive_axis(x, x.ndim - d + i, out, "max")
    return x


# -- interpolate ------------------------------------------------------------------------------

_LINEAR_RANK = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


def interpolate(x: Tensor, size=None, scale_factor=None, mode: str = "nearest",
                align_corners: bool | None = None,
                recompute_scale_factor: bool | None = None) -> Tensor:
    """``torch.nn.functional.interpolate`` for x (N, C, *S) with static spatial sizes; modes
    nearest, linear, bilinear, bicubic, trilinear. Indices and weights are computed at trace time in
    float32 exactly as torch's CPU kernels do, so results match to rounding."""
    d = x.ndim - 2
    if mode not in _LINEAR_RANK and mode != "nearest":
        raise ShapeError(f"interpolate: unsupported mode {mode!r}")
    if not 1 <= d <= 3 or (mode in _LINEAR_RANK and _LINEAR_RANK[mode] != d):
        raise ShapeError(f"interpolate: mode {mode!r} does not apply to {x.type}")
    if mode == "nearest" and align_corners:
        raise ShapeError("interpolate: align_corners only applies to the linear modes")
    lengths = static_dims(x, range(2, x.ndim), "interpolate")
    sizes, scales = _target_sizes(lengths, size, scale_factor, recompute_scale_factor)
    for out in sizes:  # each axis's indices and weights are a table of its output size
        _check_table(out, "interpolate")
    for i in reversed(range(d)):
        axis = 2 + i
        if mode == "nearest":
            x = core.gather(x, nearest_index(lengths[i], sizes[i], scales[i]), axis,
                              wrap=False)
        else:
            resample = _cubic_axis if mode == "bicubic" else _linear_axis
            x = resample(x, axis, sizes[i], scales[i], bool(align_corners))
    return x


def _target_sizes(lengths: tuple, size, scale_factor, recompute: bool | None):
    """Output sizes and the scales torch hands its kernels (None: derive from the sizes)."""
    d = len(lengths)
    if (size is None) == (scale_factor is None):
        raise ShapeError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        return ntuple(size, d, "interpolate size"), (None,) * d
    many = isinstance(scale_factor, (tuple, list))
    factors = tuple(float(f) for f in scale_factor) if many else (float(scale_factor),) * d
    if len(factors) != d:
        raise ShapeError(f"interpolate: {len(factors)} scale factors for {d} spatial axes")
    sizes = tuple(math.floor(n * f) for n, f in zip(lengths, factors))
    return sizes, ((None,) * d if recompute else factors)


def source_scale(length: int, out: int, scale: float | None, align_corners: bool) -> torch.Tensor:
    """torch's area_pixel_compute_scale, in float32."""
    f32 = torch.float32
    if align_corners:
        return torch.tensor(length - 1, dtype=f32) / (out - 1) if out > 1 else \
            torch.tensor(0.0, dtype=f32)
    if scale is not None and scale > 0:
        return torch.tensor(1.0 / scale, dtype=f32)
    return torch.tensor(length, dtype=f32) / out


def nearest_index(length: int, out: int, scale: float | None) -> torch.Tensor:
    """torch's nearest_idx: floor(dst * scale) clamped to the last cell."""
    dst = torch.arange(out)
    if out == length:
        return dst
    if out == 2 * length:
        return dst // 2
    src = torch.floor(dst.to(torch.float32) * source_scale(length, out, scale, False))
    return src.to(torch.int64).clamp(max=length - 1)


def _linear_axis(x: Tensor, axis: int, out: int, scale: float | None,
                 align_corners: bool) -> Tensor:
    """out = w0 x[i0] + w1 x[i1] along ``axis`` (torch's compute_indices_weights_linear)."""
    length = x.shape[axis]
    dst = torch.arange(out, dtype=torch.float32)
    ratio = source_scale(length, out, scale, align_corners)
    src = ratio * dst if align_corners else (ratio * (dst + 0.5) - 0.5).clamp(min=0)
    i0 = torch.floor(src).to(torch.int64).clamp(max=length - 1)
    lam = (src - i0.to(torch.float32)).clamp(0, 1)
    i1 = i0 + (i0 < length - 1).to(torch.int64)
    return _weighted_taps(x, axis, [(i0, 1 - lam), (i1, lam)])


def _cubic_axis(x: Tensor, axis: int, out: int, scale: float | None,
                align_corners: bool) -> Tensor:
    """Four taps i-1..i+2 (clamped to the axis) with Keys' cubic weights, A = -0.75, as
    torch's upsample_bicubic2d; the source index is not clamped at 0 here."""
    length = x.shape[axis]
    dst = torch.arange(out, dtype=torch.float32)
    ratio = source_scale(length, out, scale, align_corners)
    src = ratio * dst if align_corners else ratio * (dst + 0.5) - 0.5
    base = torch.floor(src)
    t = src - base
    weights = [_keys_far(t + 1), _keys_near(t), _keys_near(1 - t), _keys_far(2 - t)]
    taps = [((base.to(torch.int64) + j - 1).clamp(0, length - 1), w)
            for j, w in enumerate(weights)]
    return _weighted_taps(x, axis, taps)


_KEYS_A = -0.75  # torch's bicubic constant


def _keys_near(v: torch.Tensor) -> torch.Tensor:
    """Keys' cubic kernel for |v| <= 1."""
    return ((_KEYS_A + 2) * v - (_KEYS_A + 3)) * v * v + 1


def _keys_far(v: torch.Tensor) -> torch.Tensor:
    """Keys' cubic kernel for 1 < |v| < 2."""
    return ((_KEYS_A * v - 5 * _KEYS_A) * v + 8 * _KEYS_A) * v - 4 * _KEYS_A


def _weighted_taps(x: Tensor, axis: int, taps: list) -> Tensor:
    """sum over taps of weight * x gathered at index, along ``axis``; weights are consts."""
    rank = x.ndim - axis
    out = None
    for index, weight in taps:
        w = x.builder.const(trailing(weight, rank).to(x.dtype.torch))
        term = core.mul(core.gather(x, index, axis, wrap=False), w)
        out = term if out is None else core.add(out, term)
    return out
