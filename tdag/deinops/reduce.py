"""The one reduction primitive: sum / max / min / prod over a set of axes (dropped)."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from tdag.deinops.codegen import dtype_expr, tuple_expr
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import UNKNOWN, Affine, AxisRule, before, plus1, shift
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.types import DType


class ReduceKind(enum.Enum):
    sum = "sum"
    max = "max"
    min = "min"
    prod = "prod"


@dataclass(frozen=True, slots=True)
class Reduce:
    kind: ReduceKind
    axes: tuple


def _reduce_shape(spec: Reduce, ins):
    (x,) = ins
    if len(set(spec.axes)) != len(spec.axes) or any(not 0 <= a < x.rank for a in spec.axes):
        raise ShapeError(f"reduce: axes {spec.axes} invalid for rank {x.rank}")
    if x.dtype.is_complex and spec.kind is not ReduceKind.sum:
        raise ShapeError(f"reduce[{spec.kind.value}]: complex values have no order; of the "
                         f"reductions only sum takes them (got {x})")
    return x.with_shape(d for i, d in enumerate(x.shape) if i not in spec.axes)


def _reduce_eval(spec: Reduce, xs, resolve):
    (x,) = xs
    if not spec.axes:
        return x
    if spec.kind is ReduceKind.sum:
        out = x.sum(dim=spec.axes)
    elif spec.kind is ReduceKind.prod:
        out = x
        for a in sorted(spec.axes, reverse=True):
            out = out.prod(dim=a)
    elif x.dtype == torch.bool:
        out = (x.any if spec.kind is ReduceKind.max else x.all)(dim=spec.axes)
    else:
        out = (x.amax if spec.kind is ReduceKind.max else x.amin)(dim=spec.axes)
    return out.to(x.dtype)


def _reduce_cost(spec: Reduce, ins, out) -> Cost:
    # one flop per input element, so that multiply + reduce-sum of a [m,k]x[k,n] matmul costs
    # mkn + mkn = 2mkn, the torch.utils.flop_counter convention
    return traffic(ins, out, ins[0].numel)


def _reduce_values(spec: Reduce, facts, batch, types) -> Affine | None:
    """A max or min picks one of the values it reduces, all of one sample (the walker
    refuses a strided value reduced over the batch axis): the bounds and the stride stay
    (an argmax's ``min(where(is_max, position, n - 1))`` is in [0, n - 1]). A sum or product of a
    strided value has no per-sample form (None)."""
    (a,) = facts
    if spec.kind in (ReduceKind.max, ReduceKind.min):
        return a
    return None if a.stride else UNKNOWN


_REDUCE_BATCH = AxisRule(
    lambda s, t: set(s.axes), lambda s, t, p: p - before(s.axes, p),
    lambda s, t, p: Reduce(s.kind, shift(s.axes, p)), lambda s: Reduce(s.kind, plus1(s.axes)),
    mixing="reduces over the batch axis", values=_reduce_values)


def _reduce_torch(node, a, code):
    """An i64 min over every axis is written ``x.min()``: torch's ``amin`` of int64 is not
    vectorized on CPU (about 6x slower than ``min()`` at 1M entries; amax, other dtypes
    and partial reductions are not affected). Integers have one minimum, so it is exact."""
    axes, kind, x = node.spec.axes, node.spec.kind, a[0]
    dtype = node.type.dtype
    if not axes:
        return x
    if kind is ReduceKind.min and dtype is DType.i64 and node.type.rank == 0:
        x = f"{x}.min()"
    elif kind is ReduceKind.prod:  # torch.prod takes one axis
        for ax in sorted(axes, reverse=True):
            x = f"{x}.prod({ax})"
    elif kind is ReduceKind.sum:
        x = f"{x}.sum({tuple_expr(axes)})"
    elif dtype is DType.bool:
        x = f"{x}.{'any' if kind is ReduceKind.max else 'all'}({tuple_expr(axes)})"
    else:
        x = f"{x}.{'amax' if kind is ReduceKind.max else 'amin'}({tuple_expr(axes)})"
    # torch sums and multiplies small ints (and bools) into int64; tdag keeps the dtype
    if kind in (ReduceKind.sum, ReduceKind.prod) and not dtype.is_float and dtype is not DType.i64:
        x = f"{x}.to({dtype_expr(dtype)})"
    return x


_ONNX_REDUCE = {ReduceKind.sum: "ReduceSum", ReduceKind.max: "ReduceMax",
                ReduceKind.min: "ReduceMin", ReduceKind.prod: "ReduceProd"}


def _reduce_onnx(node, ins, g, cx):
    axes, kind, dtype = node.spec.axes, node.spec.kind, node.type.dtype
    if not axes:
        return g.node("Identity", ins)
    x = ins[0]
    wide = dtype not in (DType.f32, DType.f64, DType.i32, DType.i64)
    if wide:  # onnxruntime reduces only f32/f64 and 32/64-bit ints (f16 in f32, as torch)
        x = g.cast(x, DType.f32 if dtype.is_float else DType.i64)
    out = g.node(_ONNX_REDUCE[kind], [x, g.const(list(axes))], keepdims=0)
    return g.cast(out, dtype) if wide else out


def _reduce_jax(node, a, cx):
    """Bools reduce by any (sum, max) or all (prod, min), as torch's sum-then-cast does."""
    axes, kind, x = node.spec.axes, node.spec.kind, a[0]
    if not axes:
        return x
    if node.type.dtype is DType.bool:
        fn = cx.jnp.any if kind in (ReduceKind.sum, ReduceKind.max) else cx.jnp.all
    else:
        fn = getattr(cx.jnp, kind.value)
    return fn(x, axis=axes).astype(x.dtype)  # torch sums small ints in i64, then casts back


def _reduce_vjp(spec: Reduce, xs, y, dy, ops):
    """sum: the cotangent repeated back (the mirror); max/min: shared evenly by the elements
    that attain the extreme (torch's amax rule); prod: the product of the others, from an
    exclusive scan each way so zeros are exact."""
    (x,) = xs
    if not spec.axes:
        return (dy,)
    back = ops.broadcast_to(ops.unsqueeze(dy, spec.axes), x.shape)
    if spec.kind is ReduceKind.sum:
        return (back,)
    if spec.kind is ReduceKind.prod:
        return (back * _product_of_others(x, spec.axes, ops),)
    hit = x == ops.broadcast_to(ops.unsqueeze(y, spec.axes), x.shape)
    count = ops.sum(ops.cast(hit, x.dtype), spec.axes, keepdim=True)
    return (ops.where(hit, back / count, 0.0),)


def _product_of_others(x, axes: tuple, ops):
    """For each element, the product of the other elements of its reduced group: the reduced
    axes moved last and merged, then the exclusive running products from both ends."""
    kept = [a for a in range(x.ndim) if a not in axes]
    order = kept + list(axes)
    flat = ops.group(ops.permute(x, order), len(kept), len(axes))
    last, n = flat.ndim - 1, flat.shape[-1]

    def exclusive(reverse: bool):
        widths = [(0, 0)] * flat.ndim
        widths[last] = (0, 1) if reverse else (1, 0)
        shifted = ops.pad(ops.scan(flat, last, "mul", reverse), widths, 1.0)
        return ops.slice(shifted, last, 1 if reverse else 0, n + 1 if reverse else n)

    others = exclusive(False) * exclusive(True)
    others = ops.ungroup(others, len(kept), [x.shape[a] for a in axes])
    return ops.permute(others, tuple(order.index(a) for a in range(x.ndim)))


primitive(Op.reduce, Reduce, 1, _reduce_shape, _reduce_eval, _reduce_cost,
          "sum/max/min/prod over axes: contractions, pooling, norms, softmax; repeat mirrors it",
          traits=Trait.ACCUMULATES, batch=_REDUCE_BATCH,
          torch=_reduce_torch, onnx=_reduce_onnx, jax=_reduce_jax, vjp=_reduce_vjp,
          complex_values=True)
