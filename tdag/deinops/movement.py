"""Movement primitives: the deconstructed einops and their mirrors.

Axes in specs are non-negative and already normalised by the builder; shape rules check them.
| reversible                       | irreversible                        |
| permute <-> permute              | slice <~> pad                       |
| group <-> ungroup                | select <~> repeat                   |
| squeeze <-> unsqueeze            | unfold <~> fold                     |
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy
import torch
import torch.nn.functional as F

from tdag.deinops.primitive import Cost, movement_cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, floordiv, format_dim, is_static, product
from tdag.ir.types import TensorType, check_dim


def _check_axis(axis: int, rank: int, op: str) -> None:
    if not (isinstance(axis, int) and 0 <= axis < rank):
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}")


def _fmt(shape) -> str:
    return "[" + ",".join(format_dim(d) for d in shape) + "]"


# -- permute ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Permute:
    perm: tuple


def _permute_shape(spec: Permute, ins):
    (x,) = ins
    if sorted(spec.perm) != list(range(x.rank)):
        raise ShapeError(f"permute: {spec.perm} is not a permutation of {x.rank} axes")
    return x.with_shape(x.shape[p] for p in spec.perm)


primitive(Op.permute, Permute, 1, _permute_shape,
          lambda spec, xs, r: xs[0].permute(spec.perm), movement_cost,
          "reorders axes; the mirror of itself (inverse permutation)",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES)


# -- group / ungroup --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Group:
    axis: int
    count: int


def _group_shape(spec: Group, ins):
    (x,) = ins
    if spec.count < 1 or spec.axis < 0 or spec.axis + spec.count > x.rank:
        raise ShapeError(f"group: axes {spec.axis}..{spec.axis + spec.count - 1} "
                         f"out of range for {_fmt(x.shape)}")
    merged = product(x.shape[spec.axis:spec.axis + spec.count])
    return x.with_shape(x.shape[:spec.axis] + (merged,) + x.shape[spec.axis + spec.count:])


def _group_eval(spec: Group, xs, resolve):
    (x,) = xs
    return x if spec.count == 1 else x.flatten(spec.axis, spec.axis + spec.count - 1)


primitive(Op.group, Group, 1, _group_shape, _group_eval, movement_cost,
          "merges adjacent axes (einops parentheses on the right); mirror of ungroup",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES)


@dataclass(frozen=True, slots=True)
class Ungroup:
    axis: int
    sizes: tuple  # Dims; at most one -1, the wildcard


def ungroup_sizes(spec: Ungroup, dim: Dim) -> tuple:
    """The split sizes with the wildcard resolved against the axis length ``dim``."""
    known = [s for s in spec.sizes if not (is_static(s) and s == -1)]
    wildcards = len(spec.sizes) - len(known)
    if wildcards > 1:
        raise ShapeError(f"ungroup: at most one -1 in sizes {spec.sizes}")
    if any(is_static(s) and s < 0 for s in known):
        raise ShapeError(f"ungroup: negative size in {spec.sizes} (only one -1 wildcard)")
    known_product = product(known)
    if wildcards == 0:
        if not dims_equal(known_product, dim):
            raise ShapeError(f"ungroup: sizes {tuple(format_dim(s) for s in spec.sizes)} do not "
                             f"multiply to the axis length {format_dim(dim)}")
        return spec.sizes
    if is_static(known_product) and known_product == 0:
        raise ShapeError("ungroup: cannot infer -1 next to a zero size")
    rest = as_dim(sympy.sympify(dim) / known_product)
    if not is_static(rest) and not rest.is_integer:
        raise ShapeError(f"ungroup: {format_dim(dim)} is not divisible by {format_dim(known_product)}")
    if is_static(dim) and is_static(known_product) and dim % known_product:
        raise ShapeError(f"ungroup: {dim} is not divisible by {known_product}")
    return tuple(rest if (is_static(s) and s == -1) else s for s in spec.sizes)


def _ungroup_shape(spec: Ungroup, ins):
    (x,) = ins
    _check_axis(spec.axis, x.rank, "ungroup")
    sizes = ungroup_sizes(spec, x.shape[spec.axis])
    return x.with_shape(x.shape[:spec.axis] + tuple(sizes) + x.shape[spec.axis + 1:])


def _ungroup_eval(spec: Ungroup, xs, resolve):
    (x,) = xs
    return x.unflatten(spec.axis, tuple(-1 if (is_static(s) and s == -1) else resolve(s)
                                        for s in spec.sizes))


primitive(Op.ungroup, Ungroup, 1, _ungroup_shape, _ungroup_eval, movement_cost,
          "splits one axis into several (einops parentheses on the left); mirror of group",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES)


# -- squeeze / unsqueeze ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Squeeze:
    axes: tuple


def _squeeze_shape(spec: Squeeze, ins):
    (x,) = ins
    for a in spec.axes:
        _check_axis(a, x.rank, "squeeze")
        if not (is_static(x.shape[a]) and x.shape[a] == 1):
            raise ShapeError(f"squeeze: axis {a} of {_fmt(x.shape)} has size "
                             f"{format_dim(x.shape[a])}, not 1")
    if len(set(spec.axes)) != len(spec.axes):
        raise ShapeError(f"squeeze: repeated axes {spec.axes}")
    return x.with_shape(d for i, d in enumerate(x.shape) if i not in spec.axes)


def _squeeze_eval(spec: Squeeze, xs, resolve):
    return xs[0].squeeze(spec.axes) if spec.axes else xs[0]


primitive(Op.squeeze, Squeeze, 1, _squeeze_shape, _squeeze_eval, movement_cost,
          "drops size-1 axes; mirror of unsqueeze",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES)


@dataclass(frozen=True, slots=True)
class Unsqueeze:
    axes: tuple  # positions in the output


def _unsqueeze_shape(spec: Unsqueeze, ins):
    (x,) = ins
    rank = x.rank + len(spec.axes)
    if len(set(spec.axes)) != len(spec.axes) or any(not 0 <= a < rank for a in spec.axes):
        raise ShapeError(f"unsqueeze: axes {spec.axes} invalid for output rank {rank}")
    dims = iter(x.shape)
    return x.with_shape(1 if i in spec.axes else next(dims) for i in range(rank))


def _unsqueeze_eval(spec: Unsqueeze, xs, resolve):
    x = xs[0]
    for a in sorted(spec.axes):
        x = x.unsqueeze(a)
    return x


primitive(Op.unsqueeze, Unsqueeze, 1, _unsqueeze_shape, _unsqueeze_eval, movement_cost,
          "inserts size-1 axes; mirror of squeeze",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES | Trait.INSERTING)


# -- slice / pad ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Slice:
    axes: tuple
    starts: tuple
    stops: tuple
    steps: tuple


def slice_length(start: Dim, stop: Dim, step: int) -> Dim:
    return floordiv(as_dim(stop - start + step - 1), step)


def _slice_shape(spec: Slice, ins):
    (x,) = ins
    if not (len(spec.axes) == len(spec.starts) == len(spec.stops) == len(spec.steps)):
        raise ShapeError("slice: axes, starts, stops and steps differ in length")
    shape = list(x.shape)
    for a, start, stop, step in zip(spec.axes, spec.starts, spec.stops, spec.steps):
        _check_axis(a, x.rank, "slice")
        if not (isinstance(step, int) and step >= 1):
            raise ShapeError(f"slice: step must be a positive int, got {step}")
        dim = x.shape[a]
        if is_static(start) and start < 0 or is_static(stop) and is_static(start) and stop < start:
            raise ShapeError(f"slice: bad range {format_dim(start)}:{format_dim(stop)} on axis {a}")
        if is_static(stop) and is_static(dim) and stop > dim:
            raise ShapeError(f"slice: stop {stop} past the end of axis {a} (size {dim})")
        shape[a] = slice_length(start, stop, step)
    return x.with_shape(shape)


def _slice_eval(spec: Slice, xs, resolve):
    index = [slice(None)] * xs[0].dim()
    for a, start, stop, step in zip(spec.axes, spec.starts, spec.stops, spec.steps):
        index[a] = slice(resolve(start), resolve(stop), step)
    return xs[0][tuple(index)]


primitive(Op.slice, Slice, 1, _slice_shape, _slice_eval, movement_cost,
          "takes a strided range of an axis; slice of pad recovers the input",
          traits=Trait.MOVEMENT | Trait.VIEW)


@dataclass(frozen=True, slots=True)
class Pad:
    widths: tuple  # one (before, after) pair of Dims per axis
    value: float = 0.0


def _pad_shape(spec: Pad, ins):
    (x,) = ins
    if len(spec.widths) != x.rank:
        raise ShapeError(f"pad: {len(spec.widths)} width pairs for rank {x.rank}")
    for lo, hi in spec.widths:
        if (is_static(lo) and lo < 0) or (is_static(hi) and hi < 0):
            raise ShapeError(f"pad: negative width in {spec.widths}; crop with slice instead")
    return x.with_shape(as_dim(d + lo + hi) for d, (lo, hi) in zip(x.shape, spec.widths))


def _pad_eval(spec: Pad, xs, resolve):
    flat = []
    for lo, hi in reversed(spec.widths):
        flat += [resolve(lo), resolve(hi)]
    x = xs[0]
    if not any(flat):
        return x
    if x.dtype == torch.bool:
        return F.pad(x.to(torch.uint8), flat, value=int(bool(spec.value))).to(torch.bool)
    return F.pad(x, flat, value=spec.value)


primitive(Op.pad, Pad, 1, _pad_shape, _pad_eval, movement_cost,
          "surrounds axes with a constant; mirror of slice (concat is pads + add)",
          traits=Trait.MOVEMENT | Trait.REMAP)


# -- select / repeat --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Select:
    axis: int
    index: Dim


def _select_shape(spec: Select, ins):
    (x,) = ins
    _check_axis(spec.axis, x.rank, "select")
    dim = x.shape[spec.axis]
    if is_static(spec.index) and (spec.index < 0 or (is_static(dim) and spec.index >= dim)):
        raise ShapeError(f"select: index {spec.index} out of range for axis {spec.axis} "
                         f"of size {format_dim(dim)}")
    return x.with_shape(x.shape[:spec.axis] + x.shape[spec.axis + 1:])


primitive(Op.select, Select, 1, _select_shape,
          lambda spec, xs, r: xs[0].select(spec.axis, r(spec.index)), movement_cost,
          "picks one index of an axis and drops the axis; repeat undoes it for size-1 axes",
          traits=Trait.MOVEMENT | Trait.VIEW)


@dataclass(frozen=True, slots=True)
class Repeat:
    axes: tuple
    sizes: tuple


def _repeat_shape(spec: Repeat, ins):
    (x,) = ins
    if len(spec.axes) != len(spec.sizes):
        raise ShapeError("repeat: axes and sizes differ in length")
    shape = list(x.shape)
    for a, size in zip(spec.axes, spec.sizes):
        _check_axis(a, x.rank, "repeat")
        if not (is_static(x.shape[a]) and x.shape[a] == 1):
            raise ShapeError(f"repeat: axis {a} of {_fmt(x.shape)} has size "
                             f"{format_dim(x.shape[a])}; only size-1 axes broadcast")
        shape[a] = check_dim(size, f"repeat: the size of axis {a}")
    return x.with_shape(shape)


def _repeat_eval(spec: Repeat, xs, resolve):
    sizes = [-1] * xs[0].dim()
    for a, size in zip(spec.axes, spec.sizes):
        sizes[a] = resolve(size)
    return xs[0].expand(sizes)


primitive(Op.repeat, Repeat, 1, _repeat_shape, _repeat_eval, movement_cost,
          "broadcasts size-1 axes (explicit broadcasting); select or reduce undoes it",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES | Trait.EXPANDING | Trait.INSERTING)


# -- unfold / fold ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Unfold:
    axis: int
    size: int
    step: int = 1
    dilation: int = 1


def window_count(length: Dim, size: int, step: int, dilation: int) -> Dim:
    span = dilation * (size - 1) + 1
    return as_dim(floordiv(as_dim(length - span), step) + 1)


def _unfold_shape(spec: Unfold, ins):
    (x,) = ins
    _check_axis(spec.axis, x.rank, "unfold")
    if min(spec.size, spec.step, spec.dilation) < 1:
        raise ShapeError(f"unfold: size, step and dilation must be >= 1, got {spec}")
    length = x.shape[spec.axis]
    span = spec.dilation * (spec.size - 1) + 1
    if is_static(length) and length < span:
        raise ShapeError(f"unfold: window span {span} longer than axis {spec.axis} "
                         f"(size {length})")
    n = window_count(length, spec.size, spec.step, spec.dilation)
    return x.with_shape(x.shape[:spec.axis] + (n,) + x.shape[spec.axis + 1:] + (spec.size,))


def _unfold_eval(spec: Unfold, xs, resolve):
    span = spec.dilation * (spec.size - 1) + 1
    windows = xs[0].unfold(spec.axis, span, spec.step)
    return windows[..., ::spec.dilation] if spec.dilation > 1 else windows


primitive(Op.unfold, Unfold, 1, _unfold_shape, _unfold_eval, movement_cost,
          "sliding windows of an axis, the window axis appended last (conv, pooling)",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.EXPANDING | Trait.INSERTING)


@dataclass(frozen=True, slots=True)
class Fold:
    axis: int
    step: int
    dilation: int
    length: Dim


def _fold_shape(spec: Fold, ins):
    (x,) = ins
    if x.rank < 2:
        raise ShapeError("fold: needs a window axis and a last (kernel) axis")
    _check_axis(spec.axis, x.rank - 1, "fold")
    if min(spec.step, spec.dilation) < 1:
        raise ShapeError(f"fold: step and dilation must be >= 1, got {spec}")
    n, k = x.shape[spec.axis], x.shape[-1]
    needed = as_dim((n - 1) * spec.step + (k - 1) * spec.dilation + 1)
    if is_static(needed) and is_static(spec.length) and needed > spec.length:
        raise ShapeError(f"fold: {format_dim(n)} windows of {format_dim(k)} need length "
                         f"{needed}, got {spec.length}")
    return x.with_shape(x.shape[:spec.axis] + (spec.length,) + x.shape[spec.axis + 1:-1])


def _fold_eval(spec: Fold, xs, resolve):
    x = xs[0].movedim(spec.axis, -2)
    n, k = x.shape[-2], x.shape[-1]
    index = (torch.arange(n) * spec.step)[:, None] + (torch.arange(k) * spec.dilation)[None, :]
    out = torch.zeros(*x.shape[:-2], resolve(spec.length), dtype=x.dtype)
    out.index_add_(-1, index.reshape(-1), x.reshape(*x.shape[:-2], n * k))
    return out.movedim(-1, spec.axis)


def _fold_cost(spec: Fold, ins, out: TensorType) -> Cost:
    return traffic(ins, out, ins[0].numel)  # one add per input element (overlap-add)


primitive(Op.fold, Fold, 1, _fold_shape, _fold_eval, _fold_cost,
          "overlap-adds windows back into an axis (transposed conv); mirror of unfold",
          traits=Trait.MOVEMENT)
