"""Index-and-weight resampling along one axis -> the resize kernel (F.interpolate).

    gather(x, I, a)                                  -> resize nearest along a
    gather(x, I0, a) * W0 + gather(x, I1, a) * W1    -> resize linear along a
    resize(resize(x)) on different axes              -> one resize

The constant indices and weights are compared with the ones torch's kernels use (the same
formulas tdag.ops.interpolate composes with), for align_corners and scale-or-size sources;
a match is exactly F.interpolate on that axis and the identity on the others.
"""
from __future__ import annotations

import torch

from tdag.lower.kernels.windows import Resize
from tdag.ops.nn.pool import nearest_index, source_scale
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import is_static
from tdag.ir.types import TensorKind
from tdag.lower.match import trace_axes


def const_vector(ctx: Context, name: str) -> torch.Tensor | None:
    """The values of a constant (seen through broadcasts) as a 1-d tensor."""
    src, _ = trace_axes(ctx, name, units=True)
    weight = ctx.weight(src)
    if weight is None or weight.kind is not TensorKind.const or weight.value is None:
        return None
    return weight.value.reshape(-1)


def is_progression(index: torch.Tensor) -> bool:
    """a, a+s, a+2s, ... with a >= 0, s >= 1 (a slice, which movement makes a view)."""
    if index.numel() < 2:
        return index.numel() == 1 and int(index[0]) >= 0
    step = int(index[1] - index[0])
    return int(index[0]) >= 0 and step >= 1 and \
        torch.equal(index.long(), int(index[0]) + step * torch.arange(index.numel()))


def _linear_reference(length: int, out: int, scale, align: bool):
    """torch's linear source indices and weights (nn_pool._linear_axis)."""
    dst = torch.arange(out, dtype=torch.float32)
    ratio = source_scale(length, out, scale, align)
    src = ratio * dst if align else (ratio * (dst + 0.5) - 0.5).clamp(min=0)
    i0 = torch.floor(src).to(torch.int64).clamp(max=length - 1)
    lam = (src - i0.to(torch.float32)).clamp(0, 1)
    return i0, i0 + (i0 < length - 1).to(torch.int64), lam


def _candidates(length: int, out: int):
    return [(align, scale) for align in (False, True) for scale in (None, out / length)]


def _resize(node: Node, ctx: Context, x: str, axis: int, mode: str, align: bool, scale):
    shape = ctx.type(x).shape
    if not 3 <= len(shape) <= 5 or axis < 2 or not all(is_static(d) for d in shape[2:]):
        return NoMatch("resize needs x[N, C, *S] with static spatial sizes")
    sizes = tuple(node.type.shape[2:])
    scales = None if scale is None else tuple(
        float(scale) if i + 2 == axis else 1.0 for i in range(len(sizes)))
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.resize, Resize(mode, sizes, align, scales), x))


def nearest_rule(node: Node, ctx: Context):
    """gather(x, floor(dst * ratio), a) -> resize nearest"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    index = const_vector(ctx, node.inputs[1])
    x, axis = node.inputs[0], node.spec.axis
    length = ctx.type(x).shape[axis]
    if index is None or ctx.type(node.inputs[1]).rank != 1 or not is_static(length) or \
            is_progression(index):
        return NoMatch("not a nearest resampling")
    for _, scale in _candidates(length, index.numel())[:2]:
        if torch.equal(index.long(), nearest_index(length, index.numel(), scale)):
            return _resize(node, ctx, x, axis, "nearest", False, scale)
    return NoMatch("indices are not torch's nearest")


def _weighted_gather(ctx: Context, name: str):
    """(x, axis, index, weights) of gather(x, I, a) * W."""
    node = ctx.made(name, Op.multiply)
    if node is None:
        return None
    for g, w in (node.inputs, reversed(node.inputs)):
        gather = ctx.made(g, Op.gather)
        weights = const_vector(ctx, w)
        if gather is not None and weights is not None:
            index = const_vector(ctx, gather.inputs[1])
            if index is not None and index.numel() == weights.numel():
                return gather.inputs[0], gather.spec.axis, index.long(), weights
    return None


def linear_rule(node: Node, ctx: Context):
    """gather(x, i0) * (1 - lam) + gather(x, i1) * lam along one axis -> resize linear"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    parts = [_weighted_gather(ctx, n) for n in node.inputs]
    if None in parts or parts[0][:2] != parts[1][:2]:
        return NoMatch("not a weighted pair of gathers")
    x, axis = parts[0][:2]
    length = ctx.type(x).shape[axis]
    if not is_static(length):
        return NoMatch("symbolic axis")
    out = parts[0][2].numel()
    for first, second in (parts, parts[::-1]):
        for align, scale in _candidates(length, out):
            i0, i1, lam = _linear_reference(length, out, scale, align)
            if torch.equal(first[2], i0) and torch.equal(second[2], i1) and \
                    torch.allclose(second[3].double(), lam.double(), atol=1e-6) and \
                    torch.allclose(first[3].double(), 1 - lam.double(), atol=1e-6):
                return _resize(node, ctx, x, axis, "linear", align, scale)
    return NoMatch("indices and weights are not torch's")


def merge_rule(node: Node, ctx: Context):
    """resize(resize(x)) changing different axes, alike otherwise -> one resize"""
    inner = ctx.made(node.inputs[0], Op.resize)
    if inner is None or not ctx.single_use(inner.name):
        return NoMatch("not nested resizes")
    a, b = inner.spec, node.spec
    x_shape = ctx.type(inner.inputs[0]).shape[2:]
    changed_a = {i for i, (s, d) in enumerate(zip(a.sizes, x_shape)) if s != d}
    changed_b = {i for i, (s, d) in enumerate(zip(b.sizes, a.sizes)) if s != d}
    if a.mode != b.mode or a.align_corners != b.align_corners or changed_a & changed_b or \
            (a.scales is None) != (b.scales is None):
        return NoMatch("resizes that do not combine")
    scales = None if a.scales is None else tuple(
        a.scales[i] if i in changed_a else b.scales[i] for i in range(len(b.sizes)))
    emit = ctx.emitter(node)
    spec = Resize(b.mode, b.sizes, b.align_corners, scales)
    return emit.finish(emit(Op.resize, spec, inner.inputs[0]))


RULES = (
    Rule(Op.gather, nearest_rule),  # gather(x, floor(dst * ratio), a) -> resize nearest
    Rule(Op.add, linear_rule),      # gather(x, i0) * (1 - lam) + gather(x, i1) * lam -> linear
    Rule(Op.resize, merge_rule),    # resize(resize(x)) on different axes -> one resize
)
