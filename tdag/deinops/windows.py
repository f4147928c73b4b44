"""Sliding windows: unfold (the windows of one axis, stacked) and its mirror fold
(overlap-add them back). Convolutions and pooling unfold; transposed convolutions fold.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tdag.deinops.movement import check_axis
from tdag.deinops.primitive import Cost, movement_cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import AxisRule, same_axis
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, floordiv, format_dim, is_static
from tdag.ir.types import TensorType


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
    check_axis(spec.axis, x.rank, "unfold")
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


def _unfold_torch(node, a, code):
    s = node.spec
    span = s.dilation * (s.size - 1) + 1
    out = f"{a[0]}.unfold({s.axis}, {span}, {s.step})"
    return f"{out}[..., ::{s.dilation}]" if s.dilation > 1 else out


def _window_index(g, n: Dim, size: int, step: int, dilation: int) -> str:
    """ONNX int64 [n, size] with ``i * step + j * dilation`` (ONNX has no unfold)."""
    offsets = torch.arange(size) * dilation
    if is_static(n):
        index = (torch.arange(n) * step)[:, None] + offsets[None, :]
        return g.const(index.tolist())
    starts = g.node("Range", [g.const(0), g.scalar_dim(as_dim(n * step)), g.const(step)])
    starts = g.node("Unsqueeze", [starts, g.const([1])])
    return g.node("Add", [starts, g.const([offsets.tolist()])])


def _unfold_onnx(node, ins, g, cx):
    s = node.spec
    n = node.type.shape[s.axis]
    picked = g.node("Gather", [ins[0], _window_index(g, n, s.size, s.step, s.dilation)],
                    axis=s.axis)  # [..., n, k, ...]
    rank = node.type.rank
    perm = [i for i in range(rank) if i != s.axis + 1] + [s.axis + 1]
    return g.node("Transpose", [picked], perm=perm)


def _unfold_jax(node, a, cx):
    """One strided slice per window offset, stacked on a last axis: the windows as XLA
    slices (no gather)."""
    s, x = node.spec, a[0]
    n = x.shape[s.axis] - s.dilation * (s.size - 1) - 1
    taps = [cx.lax.slice_in_dim(x, j * s.dilation, j * s.dilation + n + 1, s.step, s.axis)
            for j in range(s.size)]
    return cx.jnp.stack(taps, axis=-1)


def _axis_drop(spec, in_type: TensorType, p: int):
    """The spec of an op on one axis (``spec.axis``) once axis ``p`` is gone."""
    return replace(spec, axis=spec.axis - (p < spec.axis))


def _axis_insert0(spec):
    return replace(spec, axis=spec.axis + 1)


_UNFOLD_BATCH = AxisRule(lambda s, t: {s.axis}, same_axis, _axis_drop, _axis_insert0,
                         mixing="slides windows along the batch axis")


def _unfold_view(spec, shape, strides, out):
    """``x.unfold(axis, span, step)[..., ::dilation]``: the window axis strides as the
    unfolded one did, which now strides ``step`` times as far."""
    base = list(strides)
    inner = base[spec.axis]
    base[spec.axis] = inner * spec.step
    return tuple(base) + (inner * spec.dilation,)


primitive(Op.unfold, Unfold, 1, _unfold_shape, _unfold_eval, movement_cost,
          "sliding windows of an axis, the window axis appended last (conv, pooling)",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.EXPANDING | Trait.INSERTING,
          batch=_UNFOLD_BATCH, torch=_unfold_torch, onnx=_unfold_onnx, jax=_unfold_jax,
          vjp=lambda spec, xs, y, dy, ops: (ops.fold(dy, spec.axis, xs[0].shape[spec.axis],
                                                     spec.step, spec.dilation),),
          view=_unfold_view)


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
    check_axis(spec.axis, x.rank - 1, "fold")
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


def _fold_torch(node, a, code):
    s = node.spec  # torch has no fold along one axis: the generated module's runtime has one
    return f"_rt.fold({a[0]}, {s.axis}, {s.step}, {s.dilation}, {code.dim(s.length)})"


def _fold_onnx(node, ins, g, cx):
    """Overlap-add with ScatterElements(reduction="add") along a last axis of zeros."""
    s = node.spec
    x_type = cx.type(node.inputs[0])
    rank = x_type.rank
    n, k = x_type.shape[s.axis], x_type.shape[-1]
    moved = [i for i in range(rank - 1) if i != s.axis] + [s.axis, rank - 1]
    x = g.node("Transpose", [ins[0]], perm=moved)                     # [..., n, k]
    lead = rank - 2
    flat = g.node("Reshape", [x, g.const([0] * lead + [-1])])         # [..., n*k]
    index = g.node("Reshape", [_window_index(g, n, k, s.step, s.dilation), g.const([-1])])
    index = g.node("Expand", [index, g.node("Shape", [flat])])
    zeros_shape = g.node("Concat", [g.node("Shape", [flat], end=lead), g.dim(s.length)], axis=0)
    zero = g.const([0], x_type.dtype)
    data = g.node("Expand", [zero, zeros_shape])
    out = g.node("ScatterElements", [data, index, flat], axis=-1, reduction="add")
    back = [0] * (rank - 1)
    order = [i for i in range(rank - 1) if i != s.axis] + [s.axis]
    for pos, axis in enumerate(order):
        back[axis] = pos
    return g.node("Transpose", [out], perm=back)


def _fold_jax(node, a, cx):
    """Overlap-add: window offset j adds its column into every step-th cell from j*dilation."""
    s = node.spec
    x = cx.jnp.moveaxis(a[0], s.axis, -2)  # [..., n, k]
    n, k = x.shape[-2], x.shape[-1]
    out = cx.jnp.zeros(x.shape[:-2] + (cx.resolve(s.length),), x.dtype)
    for j in range(k):
        start = j * s.dilation
        out = out.at[..., start:start + (n - 1) * s.step + 1:s.step].add(x[..., j])
    return cx.jnp.moveaxis(out, -1, s.axis)


_FOLD_BATCH = AxisRule(lambda s, t: {s.axis, t.rank - 1}, same_axis, _axis_drop, _axis_insert0,
                       mixing="overlap-adds along the batch axis")


def _fold_vjp(spec: Fold, xs, y, dy, ops):
    """The mirror: the cotangent's windows (those the input had: a longer output holds more)."""
    (x,) = xs
    count = x.shape[spec.axis]
    if is_static(count) and count == 0:
        return (ops.zeros(x.shape, x.dtype, like=x),)
    windows = ops.unfold(dy, spec.axis, x.shape[-1], spec.step, spec.dilation)
    return (ops.slice(windows, spec.axis, 0, count),)


primitive(Op.fold, Fold, 1, _fold_shape, _fold_eval, _fold_cost,
          "overlap-adds windows back into an axis (transposed conv); mirror of unfold",
          traits=Trait.MOVEMENT | Trait.ACCUMULATES,
          batch=_FOLD_BATCH, torch=_fold_torch, onnx=_fold_onnx, jax=_fold_jax,
          vjp=_fold_vjp, complex_half=False)  # a sum: torch has no complex32 col2im or sum
