"""Reading an image at computed, fractional coordinates: the composition behind grid_sample
(torch.nn.functional.grid_sample, ONNX GridSample), RoiAlign and DeformConv.

An image x (N, C, *S) with static spatial sizes S is viewed as a table of N*prod(S) rows of C
channels; a point is read with one ``gather`` per interpolation tap (1 for nearest, 2 per axis
for linear, 4 per axis for cubic), each tap's row being ``n * prod(S) + flat(i_1, .., i_d)``,
and the taps are summed with their weights:

    value(p) = sum over taps t of  weight_t(p) * x[n(p), :, index_t(p)]

Indices past the border follow a padding rule per tap (``zeros``: the tap reads 0; ``border``:
the index is clamped; ``reflection``: the index is reflected at the borders), as the ONNX
reference and torch's CPU kernels do. Everything is elementwise arithmetic on the coordinate
tensors plus gathers, so it runs unchanged in every target.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from tdag.ops import core, creation
from tdag.ops.tensor import Tensor
from tdag.errors import ShapeError
from tdag.ir.symbols import is_static, product

__all__ = ["Borders", "image_rows", "reflect", "read_points", "grid_sample", "unnormalize"]

PADDINGS = ("zeros", "border", "reflection")
MODES = ("nearest", "linear", "cubic")
_CUBIC_A = -0.75  # Keys' constant, as torch and the ONNX reference use


@dataclass(frozen=True)
class Borders:
    """Where reflection turns around on one axis: [-0.5, L - 0.5], or [0, L - 1] with
    align_corners (the pixel centres at the ends)."""
    low: float
    high: float

    @staticmethod
    def of(length: int, align_corners: bool) -> "Borders":
        return Borders(0.0, length - 1.0) if align_corners else Borders(-0.5, length - 0.5)


def image_rows(x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """x (N, C, *S) as a table (N * prod(S), C) and the static sizes S."""
    sizes = tuple(x.shape[2:])
    if not all(is_static(s) for s in sizes):
        raise ShapeError(f"sampling needs static spatial sizes, got {x.type}")
    channels_last = core.movedim(x, 1, -1)
    return core.reshape(channels_last, (-1, x.shape[1])), sizes


def unnormalize(g: Tensor, length: int, align_corners: bool) -> Tensor:
    """A coordinate in [-1, 1] as a pixel coordinate: -1 and 1 are the centres of the end
    pixels with align_corners, else their outer edges."""
    if align_corners:
        return core.mul(core.div(core.add(g, 1.0), 2.0), float(length - 1))
    return core.div(core.sub(core.mul(core.add(g, 1.0), float(length)), 1.0), 2.0)


def reflect(x: Tensor, borders: Borders) -> Tensor:
    """x mirrored at the borders until it lies between them (the ONNX reference's
    _gs_reflect): an even number of bounces from the near border, else from the far one."""
    span = borders.high - borders.low
    if span <= 0:
        return creation.full(tuple(x.shape), borders.low, x.dtype, like=x)
    below, above = core.lt(x, borders.low), core.gt(x, borders.high)
    distance = core.where(below, core.sub(borders.low, x), core.sub(x, borders.high))
    bounces = core.floor(core.div(distance, span))
    rest = core.sub(distance, core.mul(bounces, span))
    even = core.eq(core.remainder(bounces, 2.0), 0.0)
    from_low, from_high = core.add(rest, borders.low), core.sub(borders.high, rest)
    return core.where(below, core.where(even, from_low, from_high),
                      core.where(above, core.where(even, from_high, from_low), x))


def _tap_index(i: Tensor, length: int, padding: str, borders: Borders):
    """An integral float index as an in-range i64 index and, for zeros padding, whether the
    tap lies inside (else None)."""
    inside = None
    if padding == "zeros":
        inside = core.logical_and(core.ge(i, 0.0), core.le(i, length - 1.0))
    elif padding == "reflection":
        i = core.trunc(reflect(i, borders))
    return core.cast(core.clamp(i, 0.0, length - 1.0), "i64"), inside


def _cubic_weights(t: Tensor) -> list[Tensor]:
    """Keys' cubic weights of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    a = _CUBIC_A

    def near(v):  # |v| <= 1
        return core.add(core.mul(core.mul(core.sub(core.mul(v, a + 2), a + 3), v), v), 1.0)

    def far(v):  # 1 < |v| < 2
        inner = core.add(core.mul(core.sub(core.mul(v, a), 5 * a), v), 8 * a)
        return core.sub(core.mul(inner, v), 4 * a)

    return [far(core.add(t, 1.0)), near(t), near(core.sub(1.0, t)), far(core.sub(2.0, t))]


def _axis_taps(c: Tensor, mode: str) -> list[tuple[Tensor, Tensor | None]]:
    """(integral float index, weight or None) of each tap along one axis."""
    if mode == "nearest":
        return [(core.trunc(c), None)]
    base = core.floor(c)
    t = core.sub(c, base)
    if mode == "linear":
        return [(base, core.sub(1.0, t)), (core.add(base, 1.0), t)]
    return [(core.add(base, float(k - 1)), w) for k, w in enumerate(_cubic_weights(t))]


def read_points(table: Tensor, sizes: tuple[int, ...], batch: Tensor, coords: list[Tensor],
                mode: str, padding: str, borders: list[Borders] | None = None,
                combine: str = "sum") -> Tensor:
    """The image rows ``table`` (from image_rows) read at points: ``batch`` (i64) and
    ``coords`` (float pixel coordinates, one per spatial axis, outermost first) broadcast to
    the points' shape P; the result is (*P, C): the weighted taps summed, or with
    ``combine="max"`` their largest (RoiAlign's max mode)."""
    if mode not in MODES or padding not in PADDINGS:
        raise ShapeError(f"sampling: mode {mode!r} / padding {padding!r}")
    borders = borders or [Borders.of(n, False) for n in sizes]
    strides = [product(sizes[k + 1:]) for k in range(len(sizes))]
    per_axis = [_axis_taps(c, mode) for c in coords]
    out = None
    for combo in itertools.product(*per_axis):
        row = core.mul(core.cast(batch, "i64"), product(sizes))
        weight, inside = None, None
        for (i, w), n, stride, border in zip(combo, sizes, strides, borders):
            index, ok = _tap_index(i, n, padding, border)
            row = core.add(row, core.mul(index, stride) if stride != 1 else index)
            weight = w if weight is None else (weight if w is None else core.mul(weight, w))
            inside = ok if inside is None else (inside if ok is None else
                                                core.logical_and(inside, ok))
        value = core.gather(table, row, 0, wrap=False)
        if inside is not None:
            value = core.where(core.unsqueeze(inside, -1), value, 0.0)
        if weight is not None:
            value = core.mul(value, core.unsqueeze(core.cast(weight, table.dtype), -1))
        out = value if out is None else \
            (core.add if combine == "sum" else core.maximum)(out, value)
    return out


def grid_sample(x: Tensor, grid: Tensor, mode: str = "linear", padding: str = "zeros",
                align_corners: bool = False) -> Tensor:
    """x (N, C, *S) read at ``grid`` (N, *P, d) of normalized coordinates in [-1, 1], the
    last axis ordered innermost first (x, y, z): (N, C, *P). A coordinate outside the
    image is first clamped (border) or reflected (reflection), nearest rounding half to even
    before that; but cubic with border padding clamps each of its taps instead, as torch and
    onnxruntime do (the ONNX reference clamps the point, which differs within 2 pixels of
    the border: the spec's "border values for out-of-bound grid locations" allows both)."""
    d = x.ndim - 2
    if grid.ndim != d + 2 or not (is_static(grid.shape[-1]) and grid.shape[-1] == d):
        raise ShapeError(f"grid_sample: a grid {grid.type} for an image {x.type}")
    table, sizes = image_rows(x)
    coords = []
    for axis, n in enumerate(sizes):
        borders = Borders.of(n, align_corners)
        c = unnormalize(core.select(grid, -1, d - 1 - axis), n, align_corners)
        if mode == "nearest":
            c = core.round(c)
        if padding == "border" and mode != "cubic":
            c = core.clamp(c, 0.0, n - 1.0)
        elif padding == "reflection":
            c = reflect(c, borders)
        coords.append(c)
    rows = core.reshape(creation.iota(x.shape[0], "i64", x.builder), (-1,) + (1,) * (grid.ndim - 2))
    out = read_points(table, sizes, rows, coords, mode, padding,
                      [Borders.of(n, align_corners) for n in sizes])
    return core.movedim(out, -1, 1)
