"""The irreversible moves: those that change how long an axis is, and their mirrors.

| slice <~> pad      | a window of an axis; pad adds a constant border (negative: crops) |
| select <~> repeat  | one index drops an axis; repeat broadcasts a size-1 axis          |

The reversible moves (permute, group/ungroup, squeeze/unsqueeze) are in ``movement.py``,
the windows (unfold/fold) in ``windows.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from tdag.deinops.movement import Squeeze, check_axis, format_shape
from tdag.deinops.primitive import movement_cost, primitive
from tdag.deinops.strides import expand_view
from tdag.errors import ShapeError
from tdag.ir.batching import (
    AxisRule,
    Batched,
    Mixes,
    divide,
    plus1,
    same_axis,
    same_values,
    shift,
)
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, floordiv, format_dim, is_static
from tdag.ir.types import DType, TensorType, check_dim


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
        check_axis(a, x.rank, "slice")
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


def _slice_vjp(spec: Slice, xs, y, dy, ops):
    """The mirror: the cotangent padded back to the input's extent. A strided slice first
    interleaves step-1 zeros after each row (unsqueeze, pad, merge), then pads."""
    (x,) = xs
    for axis, start, step in zip(spec.axes, spec.starts, spec.steps):
        count = dy.shape[axis]
        if step > 1:
            widths = [(0, 0)] * (dy.ndim + 1)
            widths[axis + 1] = (0, step - 1)
            dy = ops.group(ops.pad(ops.unsqueeze(dy, axis + 1), widths), axis, 2)
        widths = [(0, 0)] * dy.ndim
        widths[axis] = (start, as_dim(x.shape[axis] - start - count * step))
        dy = ops.pad(dy, widths)
    return (dy,)


def _slice_view(spec, shape, strides, out):
    """``x[..., start::step]``: a sliced axis strides ``step`` times as far."""
    steps = dict(zip(spec.axes, spec.steps))
    return tuple(s * steps.get(i, 1) for i, s in enumerate(strides))


primitive(Op.slice, Slice, 1, _slice_shape, _slice_eval, movement_cost,
          "takes a strided range of an axis; slice of pad recovers the input",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.PICKS,
          batch=_SLICE_BATCH, torch=_slice_torch, onnx=_slice_onnx, jax=_slice_jax,
          vjp=_slice_vjp, view=_slice_view)


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


def torch_pads(node, code) -> str:
    """F.pad's ``pad`` list of the pad ``node``: (before, after) of the last axis first."""
    flat = []
    for lo, hi in reversed(node.spec.widths):
        flat += [code.dim(lo), code.dim(hi)]
    return f"[{', '.join(flat)}]"


def clamped_pad(x: torch.Tensor, pads: list, value: float, lo: float | None = None,
                hi: float | None = None) -> torch.Tensor:
    """``F.pad(torch.clamp(x, lo, hi), pads, value=value)`` in one pass over ``x``: the clamp
    (a ReLU: ``lo`` 0) written into the interior of the padded result, which has ``x``'s
    layout (channels-last where ``x`` is, as F.pad's). MobileNet-v2's ReLU6 before its
    TF-style "same" padded strided convolutions: a [4, 96, 32, 32] image 246 against 370 us
    clamped in place then padded (its module 1-2% faster). Under autograd, the two ops."""
    if torch.is_grad_enabled() and x.requires_grad or min(pads, default=0) < 0:
        return F.pad(torch.clamp(x, lo, hi), pads, value=value)
    shape, interior, borders = list(x.shape), [slice(None)] * x.dim(), []
    for i in range(0, len(pads), 2):  # F.pad's order: the last axis first
        axis, before, after = x.dim() - 1 - i // 2, pads[i], pads[i + 1]
        if before or after:
            shape[axis] += before + after
            interior[axis] = slice(before, before + x.shape[axis])
            borders += [(axis, 0, before), (axis, shape[axis] - after, after)]
    channels_last = x.dim() == 4 and not x.is_contiguous() and \
        x.is_contiguous(memory_format=torch.channels_last)
    out = torch.empty(shape, dtype=x.dtype, device=x.device, memory_format=torch.channels_last
                      if channels_last else torch.contiguous_format)
    for axis, start, length in borders:  # (corners twice)
        if length:
            out.narrow(axis, start, length).fill_(value)
    torch.clamp(x, lo, hi, out=out[tuple(interior)])
    return out


def _pad_torch(node, a, code):
    pads = torch_pads(node, code)
    if node.type.dtype is DType.bool:  # F.pad has no bool kernel
        return (f"F.pad({a[0]}.to(torch.uint8), {pads}, value={int(bool(node.spec.value))})"
                ".to(torch.bool)")
    return f"F.pad({a[0]}, {pads}, value={code.literal(node.spec.value, node.type.dtype)})"


def _pad_onnx(node, ins, g, cx):
    # a complex value runs as its (real, imaginary) pairs: one more, unpadded, axis
    widths = tuple(node.spec.widths) + ((0, 0),) * (cx.type(node.inputs[0]).rank -
                                                   len(node.spec.widths))
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


def _pad_vjp(spec: Pad, xs, y, dy, ops):
    """The mirror: the input's window of the cotangent (the border's constant has none)."""
    (x,) = xs
    for axis, (lo, _) in enumerate(spec.widths):
        dy = ops.slice(dy, axis, lo, as_dim(lo + x.shape[axis]))
    return (dy,)


primitive(Op.pad, Pad, 1, _pad_shape, _pad_eval, movement_cost,
          "surrounds axes with a constant; mirror of slice (concat is pads + add)",
          traits=Trait.MOVEMENT | Trait.REMAP,
          batch=_PAD_BATCH, torch=_pad_torch, onnx=_pad_onnx, jax=_pad_jax, vjp=_pad_vjp)


# -- select / repeat --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Select:
    axis: int
    index: Dim


def _select_shape(spec: Select, ins):
    (x,) = ins
    check_axis(spec.axis, x.rank, "select")
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


def _select_vjp(spec: Select, xs, y, dy, ops):
    """The mirror: the cotangent as a size-1 axis, padded with zeros to the input's length."""
    (x,) = xs
    widths = [(0, 0)] * x.ndim
    widths[spec.axis] = (spec.index, as_dim(x.shape[spec.axis] - spec.index - 1))
    return (ops.pad(ops.unsqueeze(dy, spec.axis), widths),)


def _select_view(spec, shape, strides, out):
    """``x.select(axis, i)``: the selected axis' stride dropped."""
    return tuple(s for i, s in enumerate(strides) if i != spec.axis)


primitive(Op.select, Select, 1, _select_shape,
          lambda spec, xs, r: xs[0].select(spec.axis, r(spec.index)), movement_cost,
          "picks one index of an axis and drops the axis; repeat undoes it for size-1 axes",
          traits=Trait.MOVEMENT | Trait.VIEW | Trait.PICKS,
          batch=_SELECT_BATCH, torch=_select_torch, onnx=_select_onnx, jax=_select_jax,
          vjp=_select_vjp, view=_select_view)


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
        check_axis(a, x.rank, "repeat")
        if not (is_static(x.shape[a]) and x.shape[a] == 1):
            raise ShapeError(f"repeat: axis {a} of {format_shape(x.shape)} has size "
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
          batch=_REPEAT_BATCH, torch=_repeat_torch, onnx=_repeat_onnx, jax=broadcast_jax,
          vjp=lambda spec, xs, y, dy, ops: (ops.sum(dy, spec.axes, keepdim=True),),
          view=expand_view)
