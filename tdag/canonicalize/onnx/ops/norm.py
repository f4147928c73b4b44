"""ONNX normalisations: LayerNormalization (with its Mean and InvStdDev outputs),
RMSNormalization, BatchNormalization (inference and training), InstanceNormalization,
GroupNormalization, MeanVarianceNormalization, LpNormalization and LRN. Each is a composition
of tdag ops written after the ONNX reference implementation (onnx/reference/ops), whose
outputs the conformance cases ship.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import norm_axis, register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType


def _stash(ctx, x):
    """x in the stash type (the precision the statistics are computed in; float32)."""
    stash = ctx.attr("stash_type", 1)
    if stash != 1:
        raise UnsupportedOpError(f"{ctx.node.op_type}: stash_type={stash} (only float32)")
    return ops.cast(x, DType.f32) if x.dtype is not DType.f32 else x


@register("LayerNormalization")
def _layer_norm(ctx, x, scale, bias=None):
    """(x - mean) * inv_std_dev * scale + bias over the axes from ``axis`` on; Mean and
    InvStdDev keep those axes as size 1."""
    x = ctx.tensor(x)
    axes = tuple(range(norm_axis(ctx.attr("axis", -1), x.ndim), x.ndim))
    xs = _stash(ctx, x)
    mean = ops.mean(xs, axes, True)
    centered = ops.sub(xs, mean)
    variance = ops.mean(ops.mul(centered, centered), axes, True)
    inv_std = ops.reciprocal(ops.sqrt(ops.add(variance, ctx.attr("epsilon", 1e-5))))
    y = ops.cast(ops.mul(centered, inv_std), x.dtype)
    y = ops.mul(y, ctx.tensor(scale))
    if bias is not None:
        y = ops.add(y, ctx.tensor(bias))
    return (y, ops.cast(mean, x.dtype), ops.cast(inv_std, x.dtype))[:ctx.num_outputs]


@register("RMSNormalization")
def _rms_norm(ctx, x, scale):
    x = ctx.tensor(x)
    axes = tuple(range(norm_axis(ctx.attr("axis", -1), x.ndim), x.ndim))
    xs = _stash(ctx, x)
    rms = ops.sqrt(ops.add(ops.mean(ops.mul(xs, xs), axes, True), ctx.attr("epsilon", 1e-5)))
    return ops.mul(ops.cast(ops.mul(xs, ops.reciprocal(rms)), x.dtype), ctx.tensor(scale))


@register("BatchNormalization")
def _batch_norm(ctx, x, scale, bias, mean, var, *rest):
    if ctx.flag("training_mode", 0):
        return _batch_norm_training(ctx, ctx.tensor(x), ctx.tensor(scale), ctx.tensor(bias),
                                    ctx.tensor(mean), ctx.tensor(var))
    y = ops.batch_norm(ctx.tensor(x), ctx.tensor(mean), ctx.tensor(var), ctx.tensor(scale),
                       ctx.tensor(bias), ctx.attr("epsilon", 1e-5))
    return (y,) + (None,) * (ctx.num_outputs - 1)


def _batch_norm_training(ctx, x, scale, bias, mean, var):
    """Normalised by the batch's own statistics (the population variance over every axis
    but the channels); the running statistics move toward them by 1 - momentum."""
    axes = tuple(a for a in range(x.ndim) if a != 1)
    batch_mean = ops.mean(x, axes)
    centred = ops.sub(x, ops.reshape(batch_mean, (-1,) + (1,) * (x.ndim - 2)))
    batch_var = ops.mean(ops.mul(centred, centred), axes)
    y = ops.batch_norm(x, batch_mean, batch_var, scale, bias, ctx.attr("epsilon", 1e-5))
    momentum = float(ctx.attr("momentum", 0.9))
    running = [ops.add(ops.mul(old, momentum), ops.mul(new, 1.0 - momentum))
               for old, new in ((mean, batch_mean), (var, batch_var))]
    return (y, *running)[:max(ctx.num_outputs, 1)]


@register("InstanceNormalization")
def _instance_norm(ctx, x, scale, bias):
    return ops.instance_norm(ctx.tensor(x), weight=ctx.tensor(scale), bias=ctx.tensor(bias),
                             eps=ctx.attr("epsilon", 1e-5))


@register("GroupNormalization")
def _group_norm(ctx, x, scale, bias):
    x, scale, bias = ctx.tensor(x), ctx.tensor(scale), ctx.tensor(bias)
    groups, channels = ctx.attr("num_groups"), x.shape[1]
    if type(groups) is not int or groups < 1:
        raise InvalidModelError(f"GroupNormalization: num_groups must be at least 1, got "
                                f"{groups!r}")
    if is_static(channels) and scale.shape[0] == groups != channels:
        # opset 18 gave one scale per group (21 changed it to one per channel)
        scale = ops.repeat_interleave(scale, channels // groups, 0)
        bias = ops.repeat_interleave(bias, channels // groups, 0)
    return ops.group_norm(x, groups, scale, bias, ctx.attr("epsilon", 1e-5))


@register("MeanVarianceNormalization")
def _mvn(ctx, x):
    x = ctx.tensor(x)
    axes = tuple(norm_axis(a, x.ndim) for a in (ctx.attr("axes") or [0, 2, 3]))
    mean = ops.mean(x, axes, True)
    spread = ops.sqrt(ops.sub(ops.mean(ops.mul(x, x), axes, True), ops.mul(mean, mean)))
    return ops.div(ops.sub(x, mean), ops.add(spread, 1e-9))


@register("LpNormalization")
def _lp_norm(ctx, x):
    x = ctx.tensor(x)
    axis, p = norm_axis(ctx.attr("axis", -1), x.ndim), ctx.attr("p", 2)
    if p not in (1, 2):
        raise InvalidModelError(f"LpNormalization: p must be 1 or 2, got {p!r}")
    norm = ops.sum(ops.abs(x), (axis,), True) if p == 1 else \
        ops.sqrt(ops.sum(ops.mul(x, x), (axis,), True))
    zero = ops.eq(norm, 0)  # 0 / 0 is 0, as the spec's reference says
    return ops.where(zero, ops.zeros((), x.dtype, like=x), ops.div(x, norm))


@register("LRN")
def _lrn(ctx, x):
    size = ctx.attr("size")
    if type(size) is not int or size < 1:
        raise InvalidModelError(f"LRN: size must be a positive int, got {size!r}")
    return ops.local_response_norm(ctx.tensor(x), size, ctx.attr("alpha", 1e-4),
                                   ctx.attr("beta", 0.75), ctx.attr("bias", 1.0),
                                   before=(size - 1) // 2)
