"""Input gradients of the CNN activations (ReLU, a clamp such as ReLU6, SiLU) as one
framework call each, where ``tdag.grad``'s rules give a mask made in the forward pass and a
``where`` over it in the backward pass per bound (ReLU6: six compares and selects), or the
eight-step derivative of x / (1 + exp(-x)) (SiLU). torch's CPU ``where`` is also an order
of magnitude slower than its fused ``threshold_backward``.

Each kernel's decomposition is the chain ``tdag.grad`` writes (``vjp_of``), so that the rule
(tdag/lower/cnn_backward.py) meets exactly the template it matches:

    relu_backward(dy, x)          where(x < 0, 0, dy): torch's threshold_backward at the
                                  largest float below zero (x <= -tiny is x < 0, -0.0 and nan
                                  kept), so x == 0 passes dy as ops.relu's derivative does
    clamp_backward(dy, x, lo, hi) dy where lo < x < hi or x is nan, else 0:
                                  torch's hardtanh_backward (threshold_backward with no hi)
    silu_backward(dy, x)          torch.ops.aten.silu_backward
    max_pool_backward(dy, x)      dy of each window added at its first maximum (ops.max_pool's
                                  mask, then a fold per axis and a slice of the padding):
                                  torch's max_pool{2,3}d_with_indices_backward, on the
                                  indices of a max_pool{2,3}d_with_indices of x (the forward
                                  kernel runs without them, so they are made again here, on
                                  a channels-last copy: faster than the forward itself).
                                  With several nans in a window torch picks the last one,
                                  the composition the first: only nan gradients differ
    batch_norm_backward(dy, var, w)  dy * (w / sqrt(var + eps)) per channel: inference
                                  batch norm's input gradient (x and the mean do not enter
                                  it), one pass where the chain makes two (dy * w, then the
                                  product with 1/std); torch's native_batch_norm_backward
                                  with only dx asked is slower on CPU than either. Without
                                  a weight the chain is one product already: no kernel

ONNX writes the decomposition inline; JAX the closed forms (max pooling: the transpose of
reduce_window's max, lax's select_and_scatter_add, which also picks the first maximum).
"""
from __future__ import annotations

import torch

from tdag import ops
from tdag.deinops.primitive import NoSpec, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Aligned, Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait, record
from tdag.ir.symbols import dims_equal, product
from tdag.lower.kernels.activations import Clamp
from tdag.lower.kernels.backward import vjp_of
from tdag.deinops.codegen import tuple_expr
from tdag.lower.kernels.common import NDIM, decomposed_onnx, float_input, per_element, same_shape
from tdag.lower.kernels.norms import BatchNorm, per_channel_shape
from tdag.lower.kernels.windows import CHANNELS_LAST, Pool, window_jax

POINTWISE = Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE


def _shape(op: str, needs_lo: bool = False):
    def rule(spec, ins):
        dy, x = ins
        float_input(op, x)
        same_shape(op, dy, x.shape, x.dtype)
        if needs_lo and spec.lo is None:
            raise ShapeError(f"{op}: needs a lower bound (a clamp above only is a where)")
        return x
    return rule


def _below_zero(dtype: torch.dtype) -> float:
    """The largest float of ``dtype`` below zero, minus its smallest subnormal (the smallest
    normal times eps): x <= it exactly where x < 0."""
    info = torch.finfo(dtype)
    return -info.tiny * info.eps


def _relu_eval(spec, xs, resolve):
    dy, x = xs
    return torch.ops.aten.threshold_backward(dy, x, _below_zero(x.dtype))


def _relu_torch(node, a, code):
    below = _below_zero(node.type.dtype.torch)
    return f"torch.ops.aten.threshold_backward({a[0]}, {a[1]}, {below!r})"


def _relu_jax(node, a, cx):
    dy, x = a
    return cx.jnp.where(x < 0, cx.jnp.zeros_like(dy), dy)


def _clamp_eval(spec: Clamp, xs, resolve):
    dy, x = xs
    if spec.hi is None:
        return torch.ops.aten.threshold_backward(dy, x, spec.lo)
    return torch.ops.aten.hardtanh_backward(dy, x, spec.lo, spec.hi)


def _clamp_torch(node, a, code):
    lo, hi = node.spec.lo, node.spec.hi
    if hi is None:
        return f"torch.ops.aten.threshold_backward({a[0]}, {a[1]}, {lo!r})"
    return f"torch.ops.aten.hardtanh_backward({a[0]}, {a[1]}, {lo!r}, {hi!r})"


def _clamp_jax(node, a, cx):
    dy, x = a
    lo, hi = node.spec.lo, node.spec.hi
    cut = x <= lo if hi is None else (x <= lo) | (x >= hi)  # nan compares false: dy passes
    return cx.jnp.where(cut, cx.jnp.zeros_like(dy), dy)


def _silu_jax(node, a, cx):
    dy, x = a
    s = cx.nn.sigmoid(x)
    return dy * s * (1 + x * (1 - s))


# per element: the compare and the select
primitive(Op.relu_backward, NoSpec, 2, _shape("relu_backward"), _relu_eval, per_element(2),
          "a mask kept from the forward pass and torch's where (ten times slower than its "
          "fused threshold_backward on CPU)",
          traits=POINTWISE, batch=Aligned(), torch=_relu_torch, onnx=decomposed_onnx,
          jax=_relu_jax, decompose=lambda s, dy, x: vjp_of(ops.relu, x, dy))
# per bound: compare, nan check, or, select
primitive(Op.clamp_backward, Clamp, 2, _shape("clamp_backward", needs_lo=True), _clamp_eval,
          per_element(8),
          "per bound a compare, a nan check and a select (ReLU6: six passes, two masks kept); "
          "torch's hardtanh_backward is one",
          traits=POINTWISE, batch=Aligned(), torch=_clamp_torch, onnx=decomposed_onnx,
          jax=_clamp_jax, decompose=lambda s, dy, x: vjp_of(
              lambda v: ops.clamp(v, s.lo, s.hi), x, dy))
# the derivative of x / (1 + exp(-x)): neg, exp, add, two divides, products, a sum
primitive(Op.silu_backward, NoSpec, 2, _shape("silu_backward"),
          lambda s, xs, r: torch.ops.aten.silu_backward(*xs), per_element(10),
          "the derivative of x / (1 + exp(-x)) is ten elementwise passes; torch's "
          "silu_backward is one",
          traits=POINTWISE, batch=Aligned(),
          torch=lambda node, a, code: f"torch.ops.aten.silu_backward({a[0]}, {a[1]})",
          onnx=decomposed_onnx, jax=_silu_jax,
          decompose=lambda s, dy, x: vjp_of(ops.silu, x, dy))


def _pool_shape(spec: Pool, ins):
    dy, x = ins
    if len(spec.kernel) not in (2, 3) or spec.exclude_pad:
        raise ShapeError(f"max_pool_backward: a 2-d or 3-d max pooling, got {spec}")
    float_input("max_pool_backward", x)
    out = record(Op.max_pool).shape(spec, (x,))
    if dy.dtype is not x.dtype or dy.rank != out.rank or \
            not all(dims_equal(a, b) for a, b in zip(dy.shape, out.shape)):
        raise ShapeError(f"max_pool_backward: cotangent {dy} does not fit pooled {out}")
    return x


def _pool_args(spec: Pool) -> str:
    return ", ".join(tuple_expr(v) for v in (spec.kernel, spec.stride, spec.padding,
                                             spec.dilation))


def _pool_eval(spec: Pool, xs, resolve):
    dy, x = xs
    geometry = (spec.kernel, spec.stride, spec.padding, spec.dilation)
    d, layout = NDIM[len(spec.kernel)], getattr(torch, CHANNELS_LAST[len(spec.kernel)])
    found = getattr(torch.ops.aten, f"max_pool{d}_with_indices")
    indices = found(x.contiguous(memory_format=layout), *geometry)[1]
    backward = getattr(torch.ops.aten, f"max_pool{d}_with_indices_backward")
    return backward(dy, x, *geometry, False, indices)


def _pool_torch(node, a, code):
    n = len(node.spec.kernel)
    d, args = NDIM[n], _pool_args(node.spec)
    copy = f"{a[1]}.contiguous(memory_format=torch.{CHANNELS_LAST[n]})"
    indices = f"torch.ops.aten.max_pool{d}_with_indices({copy}, {args})[1]"
    return f"torch.ops.aten.max_pool{d}_with_indices_backward({a[0]}, {a[1]}, {args}, " \
           f"False, {indices})"


def _pool_jax(node, a, cx):
    """The cotangent of reduce_window's max: JAX transposes it to select_and_scatter_add,
    whose select (>=) keeps the first of tied maxima."""
    dy, x = a
    _, back = cx.vjp(lambda v: window_jax(cx, v, node.spec, -cx.jnp.inf, cx.lax.max), x)
    return back(dy)[0]


def _pool_cost(spec: Pool, ins, out):
    # the window max again (for the indices), then one add per window
    return traffic(ins, out, ins[0].numel * (product(spec.kernel) + 1))


primitive(Op.max_pool_backward, Pool, 2, _pool_shape, _pool_eval, _pool_cost,
          "the first-maximum mask of every window (a max, compares, a min over positions), "
          "a select and a fold per axis; torch's max_pool2d_with_indices_backward is one pass",
          traits=Trait.KERNEL,
          batch=Refuse("works on the framework's fixed (N, C, *S) layout"),
          torch=_pool_torch, onnx=decomposed_onnx, jax=_pool_jax,
          decompose=lambda s, dy, x: vjp_of(
              lambda v: ops.max_pool(v, s.kernel, s.stride, s.padding, s.dilation), x, dy))


def _bn_shape(spec: BatchNorm, ins):
    return per_channel_shape("batch_norm_backward", ins)


def _bn_channel(rank: int) -> tuple:
    return (-1,) + (1,) * (rank - 2)


def _bn_eval(spec: BatchNorm, xs, resolve):
    dy, var, weight = xs
    return dy * (weight * torch.rsqrt(var + spec.eps)).reshape(_bn_channel(dy.dim()))


def _bn_torch(node, a, code):
    scale = f"({a[2]} * torch.rsqrt({a[1]} + {node.spec.eps!r}))"
    return f"{a[0]} * {scale}.reshape({_bn_channel(node.type.rank)})"


def _bn_jax(node, a, cx):
    dy, var, weight = a
    return dy * (weight * cx.lax.rsqrt(var + node.spec.eps)).reshape(_bn_channel(dy.ndim))


def _bn_decompose(spec: BatchNorm, dy, var, weight):
    """The chain ``tdag.grad`` writes for inference batch norm's input: x and the mean do
    not enter it (the norm is affine in x), so ``dy`` and ``var`` stand in for them."""
    return vjp_of(lambda x, mean, v, w: ops.batch_norm(x, mean, v, w, eps=spec.eps),
                  dy, dy, var, var, weight)


# per element: one product with the per-channel scale
primitive(Op.batch_norm_backward, BatchNorm, 3, _bn_shape, _bn_eval, per_element(1),
          "tdag.grad's chain scales dy by the weight and then by 1/std, two passes over the "
          "activation; one product with their per-channel product is one",
          traits=Trait.KERNEL, batch=Refuse("works on the framework's fixed (N, C, *S) layout"),
          torch=_bn_torch, onnx=decomposed_onnx, jax=_bn_jax, decompose=_bn_decompose)
