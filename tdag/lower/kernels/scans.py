"""Scan kernels: torch's ``cummax``/``cummin`` (values or indices) and ``logcumsumexp``.

The indices' composition (``tdag.ops.scans.cummax``) is a second scan over the positions
where the input holds its running extreme, after ~5 elementwise passes; torch computes both
outputs in one pass. A kernel has one output, so values and indices are one node each, and
the torch emitter runs the call once for both (``Code.once``). ``logcumsumexp``'s composition
(``tdag.ops.scans.logcumsumexp``) shifts by the row's largest finite value and sums in f64,
~15 passes; torch's kernel is one pass of a log-add-exp per element.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag import ops
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.deinops.scan import Scan
from tdag.errors import ShapeError
from tdag.ir.batching import AxisRule, same_axis
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.record import Trait, record
from tdag.ir.types import DType
from tdag.lower.kernels.common import decomposed_onnx


@dataclass(frozen=True, slots=True)
class CumExtreme:
    """The running ``combine`` ("max"/"min") along ``axis`` from the start, or (``indices``)
    the last position it was taken from (a NaN is taken where it appears), as torch."""

    axis: int
    combine: str
    indices: bool = False


def _shape(spec: CumExtreme, ins):
    (x,) = ins
    if spec.combine not in ("max", "min") or not 0 <= spec.axis < x.rank:
        raise ShapeError(f"cum_extreme: combine {spec.combine!r} along {spec.axis} of {x}")
    return x.with_dtype(DType.i64) if spec.indices else x


def _eval(spec: CumExtreme, xs, resolve):
    out = getattr(torch, f"cum{spec.combine}")(xs[0], spec.axis)
    return out.indices if spec.indices else out.values


def _cost(spec: CumExtreme, ins, out) -> Cost:
    return traffic(ins, out, ins[0].numel)  # one compare per element


def _torch(node, a, code):
    s = node.spec
    call = code.once((Op.cum_extreme, a[0], s.axis, s.combine),
                     f"torch.cum{s.combine}({a[0]}, {s.axis})")
    return f"{call}.{'indices' if s.indices else 'values'}"


def _as_scan(node: Node, spec: Scan, dtype: DType) -> Node:
    """A scan node standing in for ``node`` where the scan primitive's emitter writes it."""
    return node.replace(op=Op.scan, spec=spec, type=node.type.with_dtype(dtype))


def _onnx(node, ins, g, cx):
    """ONNX has no cumulative max: the values are the scan primitive's (a linear
    Blelloch scan), the indices its running max over the positions that hold the extreme."""
    s, x_type = node.spec, cx.type(node.inputs[0])
    scan_onnx = record(Op.scan).onnx
    values = scan_onnx(_as_scan(node, Scan(s.axis, s.combine, False), x_type.dtype), ins, g, cx)
    if not s.indices:
        return values
    held = g.node("Equal", [ins[0], values])
    if x_type.dtype.is_float:
        held = g.node("Or", [held, g.node("IsNaN", [ins[0]])])
    n = g.node("Gather", [g.node("Shape", [ins[0]]), g.const(s.axis)])
    positions = g.node("Range", [g.const(0), n, g.const(1)])
    unit = [-1 if a == s.axis else 1 for a in range(x_type.rank)]
    positions = g.node("Reshape", [positions, g.const(unit)])
    marked = g.node("Mul", [g.cast(held, DType.i64), positions])
    return scan_onnx(_as_scan(node, Scan(s.axis, "max", False), DType.i64), [marked], g, cx)


def _jax(node, a, cx):
    s, x = node.spec, a[0]
    values = getattr(cx.lax, f"cum{s.combine}")(x, axis=s.axis)
    if not s.indices:
        return values
    jnp = cx.jnp
    held = (x == values) | jnp.isnan(x) if jnp.issubdtype(x.dtype, jnp.floating) \
        else x == values
    shape = [-1 if i == s.axis else 1 for i in range(x.ndim)]
    positions = jnp.arange(x.shape[s.axis], dtype=cx.dtype(DType.i64)).reshape(shape)
    return cx.lax.cummax(jnp.where(held, positions, 0), axis=s.axis)


_BATCH = AxisRule(
    lambda s, t: {s.axis}, same_axis,
    lambda s, t, p: CumExtreme(s.axis - (p < s.axis), s.combine, s.indices),
    lambda s: CumExtreme(s.axis + 1, s.combine, s.indices),
    mixing="accumulates along the batch axis")

primitive(Op.cum_extreme, CumExtreme, 1, _shape, _eval, _cost,
          "the running extreme's indices are a second scan over the positions holding it, "
          "after ~5 elementwise passes (both n); torch's cummax gives values and indices in "
          "one pass",
          traits=Trait.KERNEL, batch=_BATCH, torch=_torch, onnx=_onnx, jax=_jax,
          decompose=lambda s, x: getattr(ops, f"cum{s.combine}")(x, s.axis)[s.indices])


# -- logcumsumexp -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogCumSumExp:
    """``log(cumsum(exp(x)))`` along ``axis`` (from the end where ``reverse``), as torch."""

    axis: int
    reverse: bool = False


def _lcse_shape(spec: LogCumSumExp, ins):
    (x,) = ins
    if not x.dtype.is_float or not 0 <= spec.axis < x.rank:
        raise ShapeError(f"logcumsumexp: a float tensor and an axis, got {x}, {spec.axis}")
    return x


def _lcse_cost(spec: LogCumSumExp, ins, out) -> Cost:
    # torch's log-add-exp per element: min, max, their difference, exp, log1p and the add
    return traffic(ins, out, 6 * ins[0].numel)


def _lcse_eval(spec: LogCumSumExp, x):
    if not spec.reverse:
        return torch.logcumsumexp(x, spec.axis)
    return torch.logcumsumexp(x.flip(spec.axis), spec.axis).flip(spec.axis)


def _lcse_jax(node, a, cx):
    # an associative scan of logaddexp: a tree of adds where torch's runs left to right
    return cx.lax.cumlogsumexp(a[0], axis=node.spec.axis, reverse=node.spec.reverse)


def _lcse_torch(node, a, code):
    s = node.spec
    if not s.reverse:
        return f"torch.logcumsumexp({a[0]}, {s.axis})"
    return f"torch.logcumsumexp({a[0]}.flip({s.axis}), {s.axis}).flip({s.axis})"


primitive(Op.logcumsumexp, LogCumSumExp, 1, _lcse_shape,
          lambda s, xs, r: _lcse_eval(s, xs[0]), _lcse_cost,
          "the composition shifts by the row's largest finite value and sums in f64: ~15 "
          "passes of n; torch's logcumsumexp makes one",
          traits=Trait.KERNEL,
          batch=AxisRule(lambda s, t: {s.axis}, same_axis,
                         lambda s, t, p: LogCumSumExp(s.axis - (p < s.axis), s.reverse),
                         lambda s: LogCumSumExp(s.axis + 1, s.reverse),
                         mixing="accumulates along the batch axis"),
          torch=_lcse_torch, onnx=decomposed_onnx, jax=_lcse_jax,
          decompose=lambda s, x: ops.logcumsumexp(x, s.axis, s.reverse))
