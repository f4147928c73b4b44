"""Movement primitives: the deconstructed einops and their mirrors.

Axes in specs are non-negative and already normalised by the builder; shape rules check them.
| reversible                       | irreversible                        |
| permute <-> permute              | slice <~> pad                       |
| group <-> ungroup                | select <~> repeat                   |
| squeeze <-> unsqueeze            | unfold <~> fold (windows.py)        |
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import sympy
import torch
import torch.nn.functional as F

from tdag.deinops.codegen import tuple_expr
from tdag.deinops.primitive import movement_cost, primitive
from tdag.errors import ShapeError
from tdag.ir.batching import (
    AxisRule,
    Batched,
    Folded,
    Mixes,
    before,
    divide,
    nothing,
    plus1,
    same_axis,
    same_values,
    shift,
)
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, floordiv, format_dim, is_static, product
from tdag.ir.types import DType, TensorType, check_dim


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


def _permute_torch(node, a, code):
    return f"{a[0]}.permute{tuple_expr(node.spec.perm)}" if node.spec.perm else a[0]


def _permute_onnx(node, ins, g, cx):
    if not node.spec.perm:
        return g.node("Identity", ins)
    return g.node("Transpose", ins, perm=list(node.spec.perm))


def _permute_jax(node, a, cx):
    return cx.jnp.transpose(a[0], node.spec.perm) if node.spec.perm else a[0]


# leaves every axis alone: the batch goes where the permutation sends it
_PERMUTE_BATCH = AxisRule(
    nothing, lambda s, t, p: s.perm.index(p),
    lambda s, t, p: Permute(shift((q for q in s.perm if q != p), p)),
    lambda s: Permute((0,) + plus1(s.perm)), values=same_values)


primitive(Op.permute, Permute, 1, _permute_shape,
          lambda spec, xs, r: xs[0].permute(spec.perm), movement_cost,
          "reorders axes; the mirror of itself (inverse permutation)",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES,
          batch=_PERMUTE_BATCH, torch=_permute_torch, onnx=_permute_onnx, jax=_permute_jax)


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


def _group_torch(node, a, code):
    s = node.spec
    return f"{a[0]}.flatten({s.axis}, {s.axis + s.count - 1})"


def reshape_onnx(node, ins, g, cx):
    """A Reshape to the node's own shape: group, ungroup and the reshape kernel."""
    shape = node.type.shape
    zero = any(is_static(d) and d == 0 for d in shape)
    return g.node("Reshape", [ins[0], g.shape(shape)], allowzero=int(zero))


def reshape_jax(node, a, cx):
    """A row-major reshape to the node's own shape: group, ungroup, squeeze and the reshape
    kernel (the symbols resolved from the input shapes)."""
    return a[0].reshape(cx.shape(node.type.shape))


def _group_fold(spec: Group, in_type: TensorType, state, batch: Dim) -> tuple:
    """Merging the batch axis with others folds the batch into the merged axis, as a factor
    with ``inner`` elements after each batch index (torch's [b, s, d] -> [b*s, d])."""
    inner = as_dim(product(in_type.shape[state.axis + 1:spec.axis + spec.count]))
    if isinstance(state, Folded):
        return ((Op.group, spec),), Folded(spec.axis, as_dim(state.inner * inner))
    steps = ((Op.group, Group(spec.axis, spec.count - 1)),) if spec.count > 2 else ()
    return steps, Folded(spec.axis, inner)


_GROUP_BATCH = AxisRule(
    lambda s, t: set(range(s.axis, s.axis + s.count)) if s.count > 1 else set(),
    lambda s, t, p: p if p < s.axis else p - s.count + 1,
    lambda s, t, p: Group(s.axis - (p < s.axis), s.count),
    lambda s: Group(s.axis + 1, s.count),
    mixing="merges the batch axis as an inner factor of a larger axis", along=_group_fold,
    values=same_values)


primitive(Op.group, Group, 1, _group_shape, _group_eval, movement_cost,
          "merges adjacent axes (einops parentheses on the right); mirror of ungroup",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES,
          batch=_GROUP_BATCH, torch=_group_torch, onnx=reshape_onnx, jax=reshape_jax)


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
        raise ShapeError(f"ungroup: {format_dim(dim)} is not divisible by "
                         f"{format_dim(known_product)}")
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


def _ungroup_torch(node, a, code):
    sizes = [-1 if is_static(s) and s == -1 else code.dim(s) for s in node.spec.sizes]
    return f"{a[0]}.unflatten({node.spec.axis}, {tuple_expr(sizes)})"


def _ungroup_split(spec: Ungroup, in_type: TensorType, state, batch: Dim) -> tuple | None:
    """Splitting a folded axis: the part that holds the batch keeps it (Batched again where
    it is the batch alone). A Batched axis has no per-sample split."""
    if not isinstance(state, Folded):
        return None
    sizes = list(ungroup_sizes(spec, in_type.shape[spec.axis]))
    suffix: Dim = 1
    fits = []
    for j in reversed(range(len(sizes))):
        rest = divide(state.inner, suffix)  # the inner part left for sizes[j]
        if rest is not None and divide(sizes[j], as_dim(batch * rest)) is not None:
            fits.append((not dims_equal(sizes[j], batch), j, rest))
        suffix = as_dim(suffix * sizes[j])
    if not fits:
        raise Mixes(f"splits the axis that holds the batch {format_dim(batch)} across its "
                    "boundary")
    # several parts fit only where the batch is 1 (any size divides by it): the part that is
    # the batch alone ([7, d] -> [1, 7, d]) gives it back its own axis
    _, j, rest = min(fits, key=lambda f: f[0])
    return _split_at(spec.axis, sizes, j, rest, batch)


def _split_at(axis: int, sizes: list, j: int, rest: Dim, batch: Dim) -> tuple:
    """The per-sample ungroup once part ``j`` holds the batch, with ``rest`` after it."""
    alone = dims_equal(sizes[j], batch)
    if alone:
        del sizes[j]
    else:
        sizes[j] = divide(sizes[j], batch)
    steps = ((Op.ungroup, Ungroup(axis, tuple(sizes))),) if len(sizes) > 1 else ()
    return steps, Batched(axis + j) if alone else Folded(axis + j, rest)


_UNGROUP_BATCH = AxisRule(
    lambda s, t: {s.axis}, lambda s, t, p: p if p < s.axis else p + len(s.sizes) - 1,
    lambda s, t, p: Ungroup(s.axis - (p < s.axis), s.sizes),
    lambda s: Ungroup(s.axis + 1, s.sizes), mixing="splits the batch axis", along=_ungroup_split,
    values=same_values)


primitive(Op.ungroup, Ungroup, 1, _ungroup_shape, _ungroup_eval, movement_cost,
          "splits one axis into several (einops parentheses on the left); mirror of group",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES,
          batch=_UNGROUP_BATCH, torch=_ungroup_torch, onnx=reshape_onnx, jax=reshape_jax)


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


def _squeeze_torch(node, a, code):
    return f"{a[0]}.squeeze({tuple_expr(node.spec.axes)})" if node.spec.axes else a[0]


def _squeeze_onnx(node, ins, g, cx):
    if not node.spec.axes:
        return g.node("Identity", ins)
    return g.node("Squeeze", [ins[0], g.const(list(node.spec.axes))])


_SQUEEZE_BATCH = AxisRule(
    lambda s, t: set(s.axes), lambda s, t, p: p - before(s.axes, p),
    lambda s, t, p: Squeeze(shift(s.axes, p)), lambda s: Squeeze(plus1(s.axes)),
    mixing="squeezes the batch axis away (a static batch of 1: trace with a symbolic batch)",
    values=same_values)


primitive(Op.squeeze, Squeeze, 1, _squeeze_shape, _squeeze_eval, movement_cost,
          "drops size-1 axes; mirror of unsqueeze",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES,
          batch=_SQUEEZE_BATCH, torch=_squeeze_torch, onnx=_squeeze_onnx, jax=reshape_jax)


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


def _unsqueeze_torch(node, a, code):
    axes = set(node.spec.axes)
    index = ", ".join("None" if i in axes else ":" for i in range(max(axes) + 1))
    return f"{a[0]}[{index}]"


def _unsqueeze_onnx(node, ins, g, cx):
    return g.node("Unsqueeze", [ins[0], g.const(sorted(node.spec.axes))])


def _unsqueeze_jax(node, a, cx):
    return cx.jnp.expand_dims(a[0], sorted(node.spec.axes))  # axes name output positions


def _unsqueeze_out(spec: Unsqueeze, in_type: TensorType, p: int) -> int:
    """Where input axis ``p`` lands: the ``p``-th output axis that is not inserted."""
    return [i for i in range(in_type.rank + len(spec.axes)) if i not in spec.axes][p]


# spec.axes are output positions: without the batch, those after its landing place shift
_UNSQUEEZE_BATCH = AxisRule(
    nothing, _unsqueeze_out,
    lambda s, t, p: Unsqueeze(shift(s.axes, _unsqueeze_out(s, t, p))),
    lambda s: Unsqueeze(plus1(s.axes)), values=same_values)


primitive(Op.unsqueeze, Unsqueeze, 1, _unsqueeze_shape, _unsqueeze_eval, movement_cost,
          "inserts size-1 axes; mirror of squeeze",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES | Trait.INSERTING,
          batch=_UNSQUEEZE_BATCH, torch=_unsqueeze_torch, onnx=_unsqueeze_onnx,
          jax=_unsqueeze_jax)


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


def _slice_torch(node, a, code):
    s = node.spec
    index = [":"] * (max(s.axes) + 1)
    for ax, start, stop, step in zip(s.axes, s.starts, s.stops, s.steps):
        index[ax] = f"{code.dim(start)}:{code.dim(stop)}" + (f":{step}" if step != 1 else "")
    return f"{a[0]}[{', '.join(index)}]"


def _slice_onnx(node, ins, g, cx):
    s = node.spec
    return g.node("Slice", [ins[0], g.shape(s.starts, False), g.shape(s.stops, False),
                            g.const(list(s.axes)), g.const(list(s.steps))])


def _slice_jax(node, a, cx):
    s = node.spec
    index = [slice(None)] * a[0].ndim
    for ax, start, stop, step in zip(s.axes, s.starts, s.stops, s.steps):
        index[ax] = slice(cx.resolve(start), cx.resolve(stop), step)
    return a[0][tuple(index)]


def _slice_touched(spec: Slice, in_type: TensorType) -> set:
    """Axes the slice really cuts (a full-range slice of an axis leaves it alone)."""
    return {a for a, start, stop, step in zip(spec.axes, spec.starts, spec.stops, spec.steps)
            if not (is_static(start) and start == 0 and step == 1
                    and dims_equal(stop, in_type.shape[a]))}


def _slice_folded(spec: Slice, in_type: TensorType, p: int) -> Slice:
    """A full-range entry on ``p`` names the full length: per sample, the entry goes."""
    keep = [i for i, a in enumerate(spec.axes) if a != p]
    return Slice(*(tuple(field[i] for i in keep)
                   for field in (spec.axes, spec.starts, spec.stops, spec.steps)))


def _slice_drop(spec: Slice, in_type: TensorType, p: int) -> Slice:
    kept = _slice_folded(spec, in_type, p)
    return replace(kept, axes=shift(kept.axes, p))


_SLICE_BATCH = AxisRule(
    _slice_touched, same_axis, _slice_drop, lambda s: replace(s, axes=plus1(s.axes)),
    mixing="slices the batch axis (takes some samples)", folded=_slice_folded,
    values=same_values)


primitive(Op.slice, Slice, 1, _slice_shape, _slice_eval, movement_cost,
          "takes a strided range of an axis; slice of pad recovers the input",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.PICKS,
          batch=_SLICE_BATCH, torch=_slice_torch, onnx=_slice_onnx, jax=_slice_jax)


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


def _pad_torch(node, a, code):
    flat = []
    for lo, hi in reversed(node.spec.widths):
        flat += [code.dim(lo), code.dim(hi)]
    pads = f"[{', '.join(flat)}]"
    if node.type.dtype is DType.bool:  # F.pad has no bool kernel
        return (f"F.pad({a[0]}.to(torch.uint8), {pads}, value={int(bool(node.spec.value))})"
                ".to(torch.bool)")
    return f"F.pad({a[0]}, {pads}, value={code.literal(node.spec.value, node.type.dtype)})"


def _pad_onnx(node, ins, g, cx):
    widths = node.spec.widths
    if not widths:
        return g.node("Identity", ins)
    pads = g.shape([lo for lo, _ in widths] + [hi for _, hi in widths], False)
    dtype = node.type.dtype
    value = bool(node.spec.value) if dtype is DType.bool else \
        (node.spec.value if dtype.is_float else int(node.spec.value))
    return g.node("Pad", [ins[0], pads, g.const(value, dtype)], mode="constant")


def _pad_jax(node, a, cx):
    widths = [(cx.resolve(lo), cx.resolve(hi), 0) for lo, hi in node.spec.widths]
    if not any(lo or hi for lo, hi, _ in widths):
        return a[0]
    value = cx.jnp.asarray(node.spec.value).astype(a[0].dtype)  # bool(value) for a mask
    return cx.lax.pad(a[0], value, widths)


def _pad_touched(spec: Pad, in_type: TensorType) -> set:
    return {a for a, (lo, hi) in enumerate(spec.widths)
            if not (is_static(lo) and lo == 0 and is_static(hi) and hi == 0)}


_PAD_BATCH = AxisRule(
    _pad_touched, same_axis, lambda s, t, p: replace(s, widths=s.widths[:p] + s.widths[p + 1:]),
    lambda s: replace(s, widths=((0, 0),) + tuple(s.widths)), mixing="pads the batch axis")


primitive(Op.pad, Pad, 1, _pad_shape, _pad_eval, movement_cost,
          "surrounds axes with a constant; mirror of slice (concat is pads + add)",
          traits=Trait.MOVEMENT | Trait.REMAP,
          batch=_PAD_BATCH, torch=_pad_torch, onnx=_pad_onnx, jax=_pad_jax)


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


def _select_torch(node, a, code):
    return f"{a[0]}.select({node.spec.axis}, {code.dim(node.spec.index)})"


def _select_onnx(node, ins, g, cx):
    return g.node("Gather", [ins[0], g.scalar_dim(node.spec.index)], axis=node.spec.axis)


def _select_jax(node, a, cx):
    return cx.lax.index_in_dim(a[0], cx.resolve(node.spec.index), node.spec.axis, keepdims=False)


_SELECT_BATCH = AxisRule(
    lambda s, t: {s.axis}, lambda s, t, p: p if p < s.axis else p - 1,
    lambda s, t, p: Select(s.axis - (p < s.axis), s.index),
    lambda s: Select(s.axis + 1, s.index), mixing="selects one sample", values=same_values)


primitive(Op.select, Select, 1, _select_shape,
          lambda spec, xs, r: xs[0].select(spec.axis, r(spec.index)), movement_cost,
          "picks one index of an axis and drops the axis; repeat undoes it for size-1 axes",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.PICKS,
          batch=_SELECT_BATCH, torch=_select_torch, onnx=_select_onnx, jax=_select_jax)


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


def _repeat_torch(node, a, code):
    sizes = ["-1"] * node.type.rank
    for ax, size in zip(node.spec.axes, node.spec.sizes):
        sizes[ax] = code.dim(size)
    return f"{a[0]}.expand({', '.join(sizes)})"


def _repeat_onnx(node, ins, g, cx):
    sizes = [1] * node.type.rank  # Expand broadcasts numpy-style: 1 keeps the input's dim
    for ax, size in zip(node.spec.axes, node.spec.sizes):
        sizes[ax] = size
    return g.node("Expand", [ins[0], g.shape(sizes, False)])


def broadcast_jax(node, a, cx):
    """A broadcast to the node's own shape: repeat and the expand kernel."""
    return cx.jnp.broadcast_to(a[0], cx.shape(node.type.shape))


def _repeat_broadcast(spec: Repeat, target, batch: Dim) -> tuple | None:
    """A repeat of a free value over the batch axis is the same for every sample: per
    sample, it repeats the other axes only (Batched), or to 1/batch the size (Folded)."""
    p = target.axis
    if p not in spec.axes:
        return None
    i = spec.axes.index(p)
    axes, sizes = list(spec.axes), list(spec.sizes)
    steps: tuple = ()
    if isinstance(target, Batched):
        steps = ((Op.squeeze, Squeeze((p,))),)
        del axes[i], sizes[i]
        axes = list(shift(axes, p))
    else:
        sizes[i] = divide(sizes[i], batch)
        if sizes[i] is None:
            raise Mixes("broadcasts to a size that is not a multiple of the batch")
        if sizes[i] == 1:
            del axes[i], sizes[i]
    return steps + (((Op.repeat, Repeat(tuple(axes), tuple(sizes))),) if axes else ())


_REPEAT_BATCH = AxisRule(
    lambda s, t: set(s.axes), same_axis, lambda s, t, p: Repeat(shift(s.axes, p), s.sizes),
    lambda s: Repeat(plus1(s.axes), s.sizes), mixing="broadcasts a size-1 batch axis",
    broadcast=_repeat_broadcast, values=same_values)


primitive(Op.repeat, Repeat, 1, _repeat_shape, _repeat_eval, movement_cost,
          "broadcasts size-1 axes (explicit broadcasting); select or reduce undoes it",
          traits=(Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES | Trait.EXPANDING
                  | Trait.INSERTING),
          batch=_REPEAT_BATCH, torch=_repeat_torch, onnx=_repeat_onnx, jax=broadcast_jax)
