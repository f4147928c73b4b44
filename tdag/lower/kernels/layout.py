"""Layout kernels: a collapsed chain of movement ops is one framework view or copy."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag import ops
from tdag.lower.kernels.common import fmt_shape
from tdag.deinops.extent import broadcast_jax
from tdag.deinops.movement import reshape_jax, reshape_onnx
from tdag.deinops.primitive import movement_cost, primitive
from tdag.deinops.strides import expand_view, reshape_view
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import as_dim, dims_equal, is_static, product

# -- movement: a collapsed chain is one view --------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reshape:
    """Row-major reshape to ``shape`` (Dims): a chain of group/ungroup/squeeze/unsqueeze."""

    shape: tuple


def _reshape_shape(spec: Reshape, ins):
    (x,) = ins
    shape = tuple(as_dim(d) for d in spec.shape)
    if any(is_static(d) and d < 0 for d in shape) or not dims_equal(product(shape), x.numel):
        raise ShapeError(f"reshape: cannot reshape {x} into {fmt_shape(shape)}")
    return x.with_shape(shape)


def _reshape_torch(node, a, code):
    return f"{a[0]}.reshape({code.shape(node.type.shape)})"


primitive(Op.reshape, Reshape, 1, _reshape_shape,
          lambda spec, xs, r: xs[0].reshape([r(d) for d in spec.shape]), movement_cost,
          "one view instead of a chain of group/ungroup/squeeze/unsqueeze",
          traits=Trait.KERNEL | Trait.VIEW | Trait.KEEPS_VALUES,
          batch=Refuse("is a reshape kernel whose spec is the whole target shape, which may merge "
                       "the batch with other axes: strip the batch before lowering"),
          torch=_reshape_torch, onnx=reshape_onnx, jax=reshape_jax,
          decompose=lambda s, x: ops.reshape(x, s.shape), view=reshape_view)


@dataclass(frozen=True, slots=True)
class Expand:
    """Numpy broadcast to ``shape``: the input aligned to the trailing axes, its size-1
    axes (and any new leading ones) repeated. Unsqueeze + repeat as one view."""

    shape: tuple


def _expand_shape(spec: Expand, ins):
    (x,) = ins
    shape = tuple(as_dim(d) for d in spec.shape)
    if x.rank > len(shape):
        raise ShapeError(f"expand: cannot broadcast {x} to {fmt_shape(shape)}")
    for d, t in zip(reversed(x.shape), reversed(shape)):
        if not (dims_equal(d, t) or (is_static(d) and d == 1)):
            raise ShapeError(f"expand: cannot broadcast {x} to {fmt_shape(shape)}")
    return x.with_shape(shape)


def _expand_torch(node, a, code):
    in_shape = code.shape_of(node.inputs[0])
    lead = node.type.rank - len(in_shape)
    sizes = [code.dim(d) if i < lead or not code.same_dim(in_shape[i - lead], d) else "-1"
             for i, d in enumerate(node.type.shape)]
    return f"{a[0]}.expand({', '.join(sizes)})"


def _expand_onnx(node, ins, g, cx):
    in_shape = cx.type(node.inputs[0]).shape
    lead = node.type.rank - len(in_shape)
    # Expand broadcasts numpy-style: 1 keeps an input dim (no symbol to compute)
    sizes = [1 if i >= lead and dims_equal(in_shape[i - lead], d) else d
             for i, d in enumerate(node.type.shape)]
    return g.node("Expand", [ins[0], g.shape(sizes, False)])


primitive(Op.expand, Expand, 1, _expand_shape,
          lambda spec, xs, r: xs[0].expand([r(d) for d in spec.shape]), movement_cost,
          "one broadcast view instead of unsqueeze + repeat",
          traits=Trait.KERNEL | Trait.VIEW | Trait.KEEPS_VALUES | Trait.EXPANDING | Trait.INSERTING,
          batch=Refuse("is an expand kernel whose spec is the whole broadcast shape, the batch "
                       "size included: strip the batch before lowering"),
          torch=_expand_torch, onnx=_expand_onnx, jax=broadcast_jax,
          decompose=lambda s, x: ops.broadcast_to(x, s.shape), view=expand_view)


@dataclass(frozen=True, slots=True)
class Concat:
    """Operands joined along ``axis``: a sum of zero-padded pieces that tile the axis."""

    axis: int


def _concat_shape(spec: Concat, ins):
    first = ins[0]
    if not 0 <= spec.axis < first.rank:
        raise ShapeError(f"concat: axis {spec.axis} out of range for {first}")
    for t in ins[1:]:
        same = t.rank == first.rank and t.dtype is first.dtype and all(
            dims_equal(a, b) for i, (a, b) in enumerate(zip(t.shape, first.shape))
            if i != spec.axis)
        if not same:
            raise ShapeError(f"concat: {t} does not fit {first} along axis {spec.axis}")
    total = as_dim(sum(t.shape[spec.axis] for t in ins))
    return first.with_shape(first.shape[:spec.axis] + (total,) + first.shape[spec.axis + 1:])


def _concat_torch(node, a, code):
    return f"torch.cat([{', '.join(a)}], {node.spec.axis})"


def _concat_onnx(node, ins, g, cx):
    return g.node("Concat", ins, axis=node.spec.axis)


primitive(Op.concat, Concat, range(1, 1 << 16), _concat_shape,
          lambda spec, xs, r: torch.cat(list(xs), spec.axis), movement_cost,
          "pads + adds write every piece at full size; a concat writes the output once",
          traits=Trait.KERNEL,
          batch=Refuse("is a concat kernel of many operands whose batch axes need not line up: "
                       "strip the batch before lowering"),
          torch=_concat_torch, onnx=_concat_onnx,
          jax=lambda node, a, cx: cx.jnp.concatenate(a, axis=node.spec.axis),
          decompose=lambda s, *xs: ops.concat(xs, s.axis), complex_half=True)
