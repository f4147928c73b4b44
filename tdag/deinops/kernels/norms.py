"""Normalisation kernels: layer, RMS, group and batch norm."""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from tdag.deinops.kernels.common import float_input, per_element, same_shape
from tdag.deinops.primitive import primitive
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import is_static

# -- normalisations ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LayerNorm:
    """Normalise over the trailing ``count`` axes; optional weight and bias of that shape."""

    count: int
    eps: float


def _trailing_norm_shape(name: str):
    """Shape rule of a norm over the trailing ``spec.count`` axes with optional affine
    operands of exactly those axes' shape (layer_norm, rms_norm)."""
    def rule(spec, ins):
        x = ins[0]
        float_input(name, x)
        if not 1 <= spec.count <= x.rank:
            raise ShapeError(f"{name}: {spec.count} trailing axes of {x}")
        for t in ins[1:]:
            same_shape(name, t, x.shape[x.rank - spec.count:], x.dtype)
        return x
    return rule


_layer_norm_shape = _trailing_norm_shape("layer_norm")


def _layer_norm_eval(spec: LayerNorm, xs, resolve):
    x = xs[0]
    w = xs[1] if len(xs) > 1 else None
    b = xs[2] if len(xs) > 2 else None
    return F.layer_norm(x, x.shape[x.dim() - spec.count:], w, b, spec.eps)


# mean (2), centre, square, sum, divide, add eps, rsqrt, scale: about 8 per element
primitive(Op.layer_norm, LayerNorm, range(1, 4), _layer_norm_shape, _layer_norm_eval,
          per_element(8), "mean/variance/rsqrt chain reads the input several times",
          traits=Trait.KERNEL)


@dataclass(frozen=True, slots=True)
class RMSNorm:
    """``x / sqrt(mean(x^2) + eps) [* weight]`` over the trailing ``count`` axes."""

    count: int
    eps: float


_rms_norm_shape = _trailing_norm_shape("rms_norm")


def _rms_norm_eval(spec: RMSNorm, xs, resolve):
    x = xs[0]
    w = xs[1] if len(xs) > 1 else None
    return F.rms_norm(x, x.shape[x.dim() - spec.count:], w, spec.eps)


primitive(Op.rms_norm, RMSNorm, range(1, 3), _rms_norm_shape, _rms_norm_eval,
          per_element(5), "square/mean/rsqrt chain reads the input several times",
          traits=Trait.KERNEL)


@dataclass(frozen=True, slots=True)
class GroupNorm:
    """Normalise ``x[N,C,*]`` over groups of ``C/groups`` channels and all trailing axes;
    optional per-channel weight and bias (both or neither)."""

    groups: int
    eps: float


def _group_norm_shape(spec: GroupNorm, ins):
    x = ins[0]
    float_input("group_norm", x)
    if x.rank < 2 or spec.groups < 1 or (is_static(x.shape[1]) and x.shape[1] % spec.groups):
        raise ShapeError(f"group_norm: {spec.groups} groups do not divide the channels of {x}")
    if len(ins) == 2:
        raise ShapeError("group_norm: give both weight and bias, or neither")
    for t in ins[1:]:
        same_shape("group_norm", t, (x.shape[1],), x.dtype)
    return x


def _group_norm_eval(spec: GroupNorm, xs, resolve):
    w, b = (xs[1], xs[2]) if len(xs) == 3 else (None, None)
    return F.group_norm(xs[0], spec.groups, w, b, spec.eps)


primitive(Op.group_norm, GroupNorm, range(1, 4), _group_norm_shape, _group_norm_eval,
          per_element(8), "ungroup + mean/variance chain reads the input several times",
          traits=Trait.KERNEL)


@dataclass(frozen=True, slots=True)
class BatchNorm:
    """Inference batch norm of ``x[N,C,*]`` with given mean and variance per channel:
    ``(x - mean) / sqrt(var + eps) [* weight] [+ bias]``."""

    eps: float


def _batch_norm_shape(spec: BatchNorm, ins):
    x = ins[0]
    float_input("batch_norm", x)
    if x.rank < 2:
        raise ShapeError(f"batch_norm: needs a channel axis, got {x}")
    for t in ins[1:]:
        same_shape("batch_norm", t, (x.shape[1],), x.dtype)
    return x


def _batch_norm_eval(spec: BatchNorm, xs, resolve):
    w = xs[3] if len(xs) > 3 else None
    b = xs[4] if len(xs) > 4 else None
    return F.batch_norm(xs[0], xs[1], xs[2], w, b, False, 0.0, spec.eps)


primitive(Op.batch_norm, BatchNorm, range(3, 6), _batch_norm_shape, _batch_norm_eval,
          per_element(4), "broadcast subtract/scale/shift chain makes several passes",
          traits=Trait.KERNEL)
