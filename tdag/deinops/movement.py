"""Movement primitives: the deconstructed einops and their mirrors.

Axes in specs are non-negative and already normalised by the builder; shape rules check them.
| reversible (this file)           | irreversible                        |
| permute <-> permute              | slice <~> pad       (extent.py)     |
| group <-> ungroup                | select <~> repeat   (extent.py)     |
| squeeze <-> unsqueeze            | unfold <~> fold     (windows.py)    |

The reversible moves keep every element and only rename axes; each is undone exactly by its
mirror.
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from tdag.deinops.codegen import tuple_expr
from tdag.deinops.primitive import movement_cost, primitive
from tdag.deinops.strides import reshape_view
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
    same_values,
    shift,
)
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, format_dim, is_static, product
from tdag.ir.types import TensorType


def check_axis(axis: int, rank: int, op: str) -> None:
    """Refuse an axis of a spec outside ``0 <= axis < rank`` (specs hold normalised axes)."""
    if not (isinstance(axis, int) and 0 <= axis < rank):
        raise ShapeError(f"{op}: axis {axis} out of range for rank {rank}")


def format_shape(shape) -> str:
    """A shape as an error message writes it: ``[b,3,16]``."""
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
    perm = list(node.spec.perm)
    if node.type.dtype.is_complex:  # to_onnx's (real, imaginary) pair stays last
        perm.append(len(perm))
    return g.node("Transpose", ins, perm=perm)


def _permute_jax(node, a, cx):
    return cx.jnp.transpose(a[0], node.spec.perm) if node.spec.perm else a[0]


# leaves every axis alone: the batch goes where the permutation sends it
_PERMUTE_BATCH = AxisRule(
    nothing, lambda s, t, p: s.perm.index(p),
    lambda s, t, p: Permute(shift((q for q in s.perm if q != p), p)),
    lambda s: Permute((0,) + plus1(s.perm)), values=same_values)


def _permute_view(spec, shape, strides, out):
    """``x.permute(perm)``: the strides permuted."""
    return tuple(strides[p] for p in spec.perm) if spec.perm else strides


primitive(Op.permute, Permute, 1, _permute_shape,
          lambda spec, xs, r: xs[0].permute(spec.perm), movement_cost,
          "reorders axes; the mirror of itself (inverse permutation)",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES,
          batch=_PERMUTE_BATCH, torch=_permute_torch, onnx=_permute_onnx, jax=_permute_jax,
          view=_permute_view,
          vjp=lambda spec, xs, y, dy, ops: (
              ops.permute(dy, tuple(spec.perm.index(i) for i in range(len(spec.perm)))),))


# -- group / ungroup --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Group:
    axis: int
    count: int


def _group_shape(spec: Group, ins):
    (x,) = ins
    if spec.count < 1 or spec.axis < 0 or spec.axis + spec.count > x.rank:
        raise ShapeError(f"group: axes {spec.axis}..{spec.axis + spec.count - 1} "
                         f"out of range for {format_shape(x.shape)}")
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
          batch=_GROUP_BATCH, torch=_group_torch, onnx=reshape_onnx, jax=reshape_jax,
          view=reshape_view,
          vjp=lambda spec, xs, y, dy, ops: (
              ops.ungroup(dy, spec.axis, xs[0].shape[spec.axis:spec.axis + spec.count]),))


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
    check_axis(spec.axis, x.rank, "ungroup")
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
    it is the batch alone). A Batched axis splits per sample only into the batch and unit
    axes (``[b] -> [b, 1]``, the column of a take-along's row offsets): they are new per
    sample; any other split of it has no per-sample form."""
    sizes = list(ungroup_sizes(spec, in_type.shape[spec.axis]))
    if isinstance(state, Batched):
        return _batch_and_units(spec.axis, sizes, batch, state)
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


def _batch_and_units(axis: int, sizes: list, batch: Dim, state: Batched) -> tuple | None:
    """A Batched axis split into the batch and unit axes: per sample, the unit axes alone."""
    units = [j for j, d in enumerate(sizes) if is_static(d) and d == 1]
    whole = [j for j in range(len(sizes)) if j not in units]
    if whole and not (len(whole) == 1 and dims_equal(sizes[whole[0]], batch)):
        return None
    j = whole[0] if whole else 0  # a batch of one: any unit part is it
    steps = ((Op.unsqueeze, Unsqueeze(tuple(range(axis, axis + len(sizes) - 1)))),) \
        if len(sizes) > 1 else ()
    return steps, Batched(axis + j, state.broadcast)


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
          batch=_UNGROUP_BATCH, torch=_ungroup_torch, onnx=reshape_onnx, jax=reshape_jax,
          view=reshape_view,
          vjp=lambda spec, xs, y, dy, ops: (ops.group(dy, spec.axis, len(spec.sizes)),))


# -- squeeze / unsqueeze ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Squeeze:
    axes: tuple


def _squeeze_shape(spec: Squeeze, ins):
    (x,) = ins
    for a in spec.axes:
        check_axis(a, x.rank, "squeeze")
        if not (is_static(x.shape[a]) and x.shape[a] == 1):
            raise ShapeError(f"squeeze: axis {a} of {format_shape(x.shape)} has size "
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


def _squeeze_view(spec, shape, strides, out):
    """``x.squeeze(axes)``: the squeezed axes' strides dropped."""
    return tuple(s for i, s in enumerate(strides) if i not in spec.axes)


primitive(Op.squeeze, Squeeze, 1, _squeeze_shape, _squeeze_eval, movement_cost,
          "drops size-1 axes; mirror of unsqueeze",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES,
          batch=_SQUEEZE_BATCH, torch=_squeeze_torch, onnx=_squeeze_onnx, jax=reshape_jax,
          view=_squeeze_view,
          vjp=lambda spec, xs, y, dy, ops: (ops.unsqueeze(dy, spec.axes),))


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


def _unsqueeze_view(spec, shape, strides, out):
    """``x.unsqueeze``: the new size-1 axes (positions in the output) take a stride no view
    rule reads."""
    kept = iter(strides)
    return tuple(1 if i in spec.axes else next(kept) for i in range(len(out)))


primitive(Op.unsqueeze, Unsqueeze, 1, _unsqueeze_shape, _unsqueeze_eval, movement_cost,
          "inserts size-1 axes; mirror of squeeze",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES | Trait.INSERTING,
          batch=_UNSQUEEZE_BATCH, torch=_unsqueeze_torch, onnx=_unsqueeze_onnx,
          jax=_unsqueeze_jax, vjp=lambda spec, xs, y, dy, ops: (ops.squeeze(dy, spec.axes),),
          view=_unsqueeze_view)
