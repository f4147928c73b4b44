"""Normalisation kernels: layer, RMS, group and batch norm."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tdag import ops
from tdag.lower.kernels.common import (decomposed_onnx, float_input, per_element, reduced_type,
                                      same_shape)
from tdag.deinops.primitive import primitive
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, is_static, product
from tdag.ir.types import DType, TensorType

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


def _tail(x, spec) -> tuple:
    """The normalized_shape of a norm over the trailing ``spec.count`` axes of ``x``."""
    return tuple(x.shape[x.ndim - spec.count:])

# layer and RMS norm count trailing axes rather than name them
_TRAILING = Refuse("normalises over its trailing `count` axes, which may include the batch "
                   "axis: strip the batch before lowering")
# group and batch norm read x as (N, C, *S), channels on axis 1
_CHANNELS = Refuse("works on the framework's fixed (N, C, *S) layout: strip the batch before "
                   "lowering")


def _layer_norm_eval(spec: LayerNorm, xs, resolve):
    x = xs[0]
    w = xs[1] if len(xs) > 1 else None
    b = xs[2] if len(xs) > 2 else None
    return F.layer_norm(x, x.shape[x.dim() - spec.count:], w, b, spec.eps)


def _layer_norm_torch(node, a, code):
    shape = code.shape(node.type.shape[node.type.rank - node.spec.count:], tuple_=True)
    rest = ", ".join(a[1:] + ["None"] * (3 - len(a)))
    return f"F.layer_norm({a[0]}, {shape}, {rest}, {node.spec.eps!r})"


def _layer_norm_onnx(node, ins, g, cx):
    x_type = node.type
    tail = x_type.shape[x_type.rank - node.spec.count:]
    scale = ins[1] if len(ins) > 1 else g.filled(tail, 1.0, x_type.dtype)
    return g.node("LayerNormalization", [ins[0], scale] + ins[2:3], axis=-node.spec.count,
                  epsilon=node.spec.eps)


# mean (2), centre, square, sum, divide, add eps, rsqrt, scale: about 8 per element
def normalize_jax(cx, x, axes, eps: float, center: bool = True):
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance, as torch), or
    without ``center`` the RMS norm ``x / sqrt(mean(x^2) + eps)``."""
    jnp = cx.jnp
    if center:
        x = x - jnp.mean(x, axis=axes, keepdims=True)
    return x * cx.lax.rsqrt(jnp.mean(x * x, axis=axes, keepdims=True) + eps)


def _affine_jax(out, a, weight: int, bias: int, shape=(-1,)):
    """``out * a[weight] + a[bias]`` for those of the two operands given, each reshaped to
    ``shape`` (a per-channel vector against (N, C, *S))."""
    if len(a) > weight:
        out = out * a[weight].reshape(shape)
    if len(a) > bias:
        out = out + a[bias].reshape(shape)
    return out


def _trailing_norm_jax(node, a, cx):
    """layer_norm (centered, weight and bias) and rms_norm (weight only)."""
    axes = tuple(range(a[0].ndim - node.spec.count, a[0].ndim))
    out = normalize_jax(cx, a[0], axes, node.spec.eps, center=node.op is Op.layer_norm)
    return _affine_jax(out, a, 1, 2, a[0].shape[a[0].ndim - node.spec.count:])


def _layer_norm_workspace(spec: LayerNorm, ins, out: TensorType, contiguous) -> Dim:
    """``F.layer_norm``: ATen's native_layer_norm returns a float32 mean and 1/std per row
    beside the output; the functional drops them as it returns."""
    return 2 * 4 * product(out.shape[:out.rank - spec.count])


primitive(Op.layer_norm, LayerNorm, range(1, 4), _layer_norm_shape, _layer_norm_eval,
          per_element(8), "mean/variance/rsqrt chain reads the input several times",
          traits=Trait.KERNEL, batch=_TRAILING, torch=_layer_norm_torch, onnx=_layer_norm_onnx,
          jax=_trailing_norm_jax, workspace=_layer_norm_workspace,
          decompose=lambda s, x, *affine: ops.layer_norm(x, _tail(x, s), *affine, eps=s.eps))


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


def rms_norm(x: torch.Tensor, count: int, weight: torch.Tensor | None,
             eps: float | None) -> torch.Tensor:
    """``F.rms_norm(x, x.shape[-count:], weight, eps)`` in two passes over ``x`` and one
    fresh tensor, where F.rms_norm (a composite in torch 2.13: pow, mean, rsqrt, two
    products) takes five and three: the sum of squares as ``vector_norm`` (one pass, no
    temporary), then x * rstd written into its result, times the weight in place. On one
    Xeon core a [4, 512, 1024] norm took 1.5 against 2.8 ms, a [2048, 4096] one 22 against
    55 ms (most of F.rms_norm's time there is the kernel's page faults on its fresh 32 MB
    tensors), to 2e-7 of float64 where F.rms_norm is at 1.4e-7. Other dtypes (whose
    F.rms_norm computes in float32) and autograd take F.rms_norm."""
    shape = x.shape[x.dim() - count:]
    if x.dtype is not torch.float32 or torch.is_grad_enabled() and (
            x.requires_grad or weight is not None and weight.requires_grad):
        return F.rms_norm(x, shape, weight, eps)
    axes = tuple(range(x.dim() - count, x.dim()))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rstd = torch.linalg.vector_norm(x, 2, axes, keepdim=True)
    rstd = rstd.square_().div_(shape.numel()).add_(eps).rsqrt_()
    out = torch.mul(x, rstd)
    return out if weight is None else out.mul_(weight)


def _rms_norm_torch(node, a, code):
    weight = a[1] if len(a) > 1 else "None"
    return f"_rt.rms_norm({a[0]}, {node.spec.count}, {weight}, {node.spec.eps!r})"


def _rms_norm_onnx(node, ins, g, cx):
    """``RMSNormalization`` from opset 23 (one pass where onnxruntime runs the chain below
    as six); before it x * 1/sqrt(mean(x^2) + eps) [* w], as torch.onnx.export writes it."""
    rank, dtype = node.type.rank, node.type.dtype
    if g.opset >= 23 and dtype is DType.f32:  # its stash_type computes in f32
        scale = ins[1] if len(ins) > 1 else g.const(1.0, dtype)
        return g.node("RMSNormalization", [ins[0], scale], axis=rank - node.spec.count,
                      epsilon=float(node.spec.eps))
    axes = g.const(list(range(rank - node.spec.count, rank)))
    mean = g.node("ReduceMean", [g.node("Mul", [ins[0], ins[0]]), axes], keepdims=1)
    inv = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [mean, g.const(node.spec.eps,
                                                                                dtype)])])])
    out = g.node("Mul", [ins[0], inv])
    return g.node("Mul", [out, ins[1]]) if len(ins) > 1 else out


primitive(Op.rms_norm, RMSNorm, range(1, 3), _rms_norm_shape, _rms_norm_eval,
          per_element(5), "square/mean/rsqrt chain reads the input several times",
          traits=Trait.KERNEL, batch=_TRAILING, torch=_rms_norm_torch, onnx=_rms_norm_onnx,
          jax=_trailing_norm_jax,
          decompose=lambda s, x, *weight: ops.rms_norm(x, _tail(x, s), *weight, eps=s.eps))


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


def _group_norm_torch(node, a, code):
    w, b = (a[1], a[2]) if len(a) == 3 else ("None", "None")
    return f"F.group_norm({a[0]}, {node.spec.groups}, {w}, {b}, {node.spec.eps!r})"


def _group_norm_onnx(node, ins, g, cx):
    """Reshape to [N, G, -1], InstanceNormalization, reshape back, per-channel affine."""
    x_type, groups = node.type, node.spec.groups
    dtype = x_type.dtype
    grouped = g.node("Reshape", [ins[0], g.const([0, groups, -1])])
    ones = g.const([1.0] * groups, dtype)
    zeros = g.const([0.0] * groups, dtype)
    normed = g.node("InstanceNormalization", [grouped, ones, zeros], epsilon=node.spec.eps)
    out = g.node("Reshape", [normed, g.node("Shape", [ins[0]])])
    if len(ins) == 3:
        view = g.const([-1] + [1] * (x_type.rank - 2))
        out = g.node("Mul", [out, g.node("Reshape", [ins[1], view])])
        out = g.node("Add", [out, g.node("Reshape", [ins[2], view])])
    return out


def _group_norm_jax(node, a, cx):
    x = a[0]
    n, c = x.shape[:2]
    grouped = x.reshape((n, node.spec.groups, -1))
    out = normalize_jax(cx, grouped, (2,), node.spec.eps).reshape(x.shape)
    return _affine_jax(out, a, 1, 2, (c,) + (1,) * (x.ndim - 2))


primitive(Op.group_norm, GroupNorm, range(1, 4), _group_norm_shape, _group_norm_eval,
          per_element(8), "ungroup + mean/variance chain reads the input several times",
          traits=Trait.KERNEL, batch=_CHANNELS, torch=_group_norm_torch, onnx=_group_norm_onnx,
          jax=_group_norm_jax,
          decompose=lambda s, x, *affine: ops.group_norm(x, s.groups, *affine, eps=s.eps))


@dataclass(frozen=True, slots=True)
class BatchNorm:
    """Inference batch norm of ``x[N,C,*]`` with given mean and variance per channel:
    ``(x - mean) / sqrt(var + eps) [* weight] [+ bias]``."""

    eps: float


def per_channel_shape(name: str, ins) -> TensorType:
    """x[N, C, *] and vectors of C values of x's dtype (batch norm and its gradient) -> x."""
    x = ins[0]
    float_input(name, x)
    if x.rank < 2:
        raise ShapeError(f"{name}: needs a channel axis, got {x}")
    for t in ins[1:]:
        same_shape(name, t, (x.shape[1],), x.dtype)
    return x


def batch_norm_affine(mean, var, weight, bias, eps: float):
    """Eval-mode batch norm as ``y * scale + shift`` per channel, in float64: what
    lower's fold and the torch module's folded packs scale and shift a weight by (``weight``
    and ``bias`` may be None)."""
    scale = torch.rsqrt(var.double() + eps)
    if weight is not None:
        scale = scale * weight.double()
    shift = -mean.double() * scale + (bias.double() if bias is not None else 0.0)
    return scale, shift


def eval_batch_norm(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor,
                    weight: torch.Tensor | None, bias: torch.Tensor | None,
                    eps: float) -> torch.Tensor:
    """``F.batch_norm`` in eval mode. An imported file's running statistics are weights,
    hence a module's parameters, and torch's kernel refuses to run where autograd would
    differentiate them ("not differentiable with respect to argument 'running_mean'"):
    there, the same normalisation as the per-channel affine it is (``batch_norm_affine``)."""
    if not (torch.is_grad_enabled() and (mean.requires_grad or var.requires_grad)):
        return F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)
    scale, shift = batch_norm_affine(mean, var, weight, bias, eps)
    channel = (-1,) + (1,) * (x.dim() - 2)
    return x * scale.to(x.dtype).reshape(channel) + shift.to(x.dtype).reshape(channel)


def _batch_norm_shape(spec: BatchNorm, ins):
    return per_channel_shape("batch_norm", ins)


def _batch_norm_eval(spec: BatchNorm, xs, resolve):
    w = xs[3] if len(xs) > 3 else None
    b = xs[4] if len(xs) > 4 else None
    return eval_batch_norm(xs[0], xs[1], xs[2], w, b, spec.eps)


def _batch_norm_torch(node, a, code):
    w = a[3] if len(a) > 3 else "None"
    b = a[4] if len(a) > 4 else "None"
    return f"_rt.eval_batch_norm({a[0]}, {a[1]}, {a[2]}, {w}, {b}, {node.spec.eps!r})"


def _batch_norm_onnx(node, ins, g, cx):
    x, mean, var = ins[:3]
    channels = node.type.shape[1]
    dtype = node.type.dtype
    scale = ins[3] if len(ins) > 3 else g.filled((channels,), 1.0, dtype)
    bias = ins[4] if len(ins) > 4 else g.filled((channels,), 0.0, dtype)
    return g.node("BatchNormalization", [x, scale, bias, mean, var], epsilon=node.spec.eps)


def _batch_norm_jax(node, a, cx):
    x, mean, var = a[:3]
    channel = (-1,) + (1,) * (x.ndim - 2)
    out = (x - mean.reshape(channel)) * cx.lax.rsqrt(var.reshape(channel) + node.spec.eps)
    return _affine_jax(out, a, 3, 4, channel)


primitive(Op.batch_norm, BatchNorm, range(3, 6), _batch_norm_shape, _batch_norm_eval,
          per_element(4), "broadcast subtract/scale/shift chain makes several passes",
          traits=Trait.KERNEL, batch=_CHANNELS, torch=_batch_norm_torch, onnx=_batch_norm_onnx,
          jax=_batch_norm_jax,
          decompose=lambda s, x, mean, var, *affine: ops.batch_norm(x, mean, var, *affine,
                                                                     eps=s.eps))


# -- variance ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Variance:
    """sum((x - mean)^2) / (n - correction) over ``axes`` (torch.var's one Welford pass)."""

    axes: tuple
    correction: int = 1
    keepdim: bool = False


primitive(Op.var, Variance, 1, lambda s, ins: reduced_type("var", ins[0], s.axes, s.keepdim),
          lambda s, xs, r: torch.var(xs[0], s.axes, correction=s.correction, keepdim=s.keepdim),
          per_element(4), "sum, divide, subtract, square, sum and divide are four passes over "
          "the tensor; torch.var is one", traits=Trait.KERNEL,
          batch=Refuse("reduces over fixed axes: strip the batch before lowering"),
          torch=lambda node, a, code: f"torch.var({a[0]}, {node.spec.axes!r}, correction="
                                      f"{node.spec.correction}, keepdim={node.spec.keepdim})",
          onnx=decomposed_onnx,  # ONNX has no variance op
          jax=lambda node, a, cx: cx.jnp.var(a[0], axis=node.spec.axes,
                                              ddof=node.spec.correction,
                                              keepdims=node.spec.keepdim),
          decompose=lambda s, x: ops.var(x, s.axes, s.keepdim, s.correction))


# -- vector norms -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class VectorNorm:
    """(sum |x|^ord)^(1/ord) over ``axes`` of a real float tensor: torch.linalg.vector_norm."""

    ord: float
    axes: tuple
    keepdim: bool = False


_ONNX_NORMS = {1.0: "ReduceL1", 2.0: "ReduceL2"}


def _vector_norm_onnx(node, ins, g, cx):
    s = node.spec
    if s.ord not in _ONNX_NORMS:
        return decomposed_onnx(node, ins, g, cx)
    return g.node(_ONNX_NORMS[s.ord], [ins[0], g.const(list(s.axes))], keepdims=int(s.keepdim))


# torch.linalg.vector_norm runs fast over the innermost axes only: over the last axis of a
# [4096, 768] tensor it took 0.80 ms where sum(x * x).sqrt() took 2.8, over the channels of
# a [16, 64, 56, 56] image 16.1 ms against the composition's 2.3 (one core). A 2-norm over
# other axes is written as that sum.
def _vector_norm_torch(node, a, code):
    s, rank = node.spec, code.rank(node.inputs[0])
    args = f"{s.axes!r}, {s.keepdim}"
    if s.ord != 2 or tuple(sorted(s.axes)) == tuple(range(rank - len(s.axes), rank)):
        return f"torch.linalg.vector_norm({a[0]}, {s.ord!r}, {args})"
    return f"torch.sum({a[0]}.square(), {args}).sqrt_()"


primitive(Op.vector_norm, VectorNorm, 1,
          lambda s, ins: reduced_type("vector_norm", ins[0], s.axes, s.keepdim),
          lambda s, xs, r: torch.linalg.vector_norm(xs[0], s.ord, s.axes, s.keepdim),
          per_element(2), "square, sum and root are three passes over the tensor (and a "
          "hand-written |x| four more); vector_norm is one", traits=Trait.KERNEL,
          batch=Refuse("reduces over fixed axes: strip the batch before lowering"),
          torch=_vector_norm_torch, onnx=_vector_norm_onnx,
          jax=lambda node, a, cx: cx.jnp.linalg.vector_norm(
              a[0], ord=node.spec.ord, axis=node.spec.axes, keepdims=node.spec.keepdim),
          decompose=lambda s, x: ops.vector_norm(x, s.ord, s.axes, s.keepdim))
