"""Input gradients of softmax, GELU and layer norm as one framework call each, where
``tdag.grad``'s rules give a chain of elementwise products, sums and reductions (the
derivative of every step of the forward composition, the max shift of softmax included).

Each kernel's decomposition is that chain itself: the backward ``tdag.grad`` writes for the
forward composition at the cotangent ``dy`` (``vjp_graph`` on it), so that the lowering rule
meets in a gradient program exactly the template it matches (tdag/lower/backward.py).

    softmax_backward(dy, x, axis)   torch._softmax_backward_data(dy, softmax(x), axis)
    gelu_backward(dy, x, approx)    torch.ops.aten.gelu_backward(dy, x, approximate=...)
    layer_norm_backward(dy, x)      aten.native_layer_norm_backward(dy, x, ..., mean, rstd)
                                    (no weight: dy is the gradient of the normalised x)
    rms_norm_backward(dy, x)        rstd * dy - x * rstd^3 * mean(dy * x): torch has no CPU
                                    kernel for it (eager autograd runs transformers' own
                                    chain), so five torch calls, half the chain's time

ONNX writes the decomposition inline; JAX the closed forms.
"""
from __future__ import annotations

import math

import torch

from tdag import ops
from tdag.deinops.primitive import primitive
from tdag.errors import ShapeError
from tdag.ir.batching import Aligned, Refuse
from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, product
from tdag.ir.types import TensorType
from tdag.lower.kernels.activations import SOFTMAX_BATCH, Gelu, Softmax
from tdag.lower.kernels.common import decomposed_onnx, float_input, per_element, same_shape
from tdag.lower.kernels.norms import LayerNorm, RMSNorm, normalize_jax
from tdag.ops.builder import Builder, active_builder
from tdag.refine.grad.reverse import vjp_graph


def vjp_of(forward, x, dy, *others):
    """The cotangent of ``x`` that ``tdag.grad``'s rules write for ``forward(x, *others)``
    at ``dy``, emitted into the active builder (the forward values it reads recomputed
    from ``x`` and ``others``, which get no cotangent)."""
    local = Builder()
    with local.active():
        out = forward(*(local.input(f"x{i}", v.type) for i, v in enumerate((x, *others))))
    back = vjp_graph(local.build([out]), [0], ["x0"])
    return _inline(back, (x, *others, dy))


def _inline(graph: TDAG, operands):
    """``graph``'s one output, its nodes copied into the active builder."""
    builder = active_builder()
    values = {v.name: o for v, o in zip(graph.inputs, operands)}
    for name, w in graph.weights.items():
        values[name] = builder.weight(builder.fresh("c"), w.kind, w.value, w.type)
    for node in graph.nodes:
        values[node.name] = builder.emit(node.op, node.spec,
                                         *(values[n] for n in node.inputs))
    return values[graph.outputs[0]]


def _shape(op: str, check):
    def rule(spec, ins):
        dy, x = ins
        float_input(op, x)
        same_shape(op, dy, x.shape, x.dtype)
        check(spec, x)
        return x
    return rule


def _softmax_axis(spec: Softmax, x) -> None:
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"softmax_backward: axis {spec.axis} out of range for {x}")


def _gelu_mode(spec: Gelu, x) -> None:
    if spec.approximate not in ("none", "tanh"):
        raise ShapeError("gelu_backward: approximate must be 'none' or 'tanh', "
                         f"not {spec.approximate!r}")


def _layer_norm_count(spec: LayerNorm, x) -> None:
    if not 1 <= spec.count <= x.rank:
        raise ShapeError(f"layer_norm_backward: {spec.count} trailing axes of {x}")


def _softmax_eval(spec: Softmax, xs, resolve):
    dy, x = xs
    return torch._softmax_backward_data(dy, torch.softmax(x, spec.axis), spec.axis, x.dtype)


def _softmax_torch(node, a, code):
    axis = node.spec.axis
    return (f"torch._softmax_backward_data({a[0]}, torch.softmax({a[1]}, {axis}), {axis}, "
            f"{a[1]}.dtype)")


def _softmax_jax(node, a, cx):
    dy, x = a
    y = cx.nn.softmax(x, axis=node.spec.axis)
    return y * (dy - cx.jnp.sum(dy * y, axis=node.spec.axis, keepdims=True))


def _gelu_eval(spec: Gelu, xs, resolve):
    return torch.ops.aten.gelu_backward(*xs, approximate=spec.approximate)


def _gelu_torch(node, a, code):
    return (f"torch.ops.aten.gelu_backward({a[0]}, {a[1]}, "
            f"approximate={node.spec.approximate!r})")


def _gelu_jax(node, a, cx):
    """d/dx of x*Phi(x) (erf) or of 0.5*x*(1 + tanh(k*(x + 0.044715*x^3))), times dy."""
    dy, x = a
    jnp = cx.jnp
    if node.spec.approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        t = jnp.tanh(k * (x + 0.044715 * x ** 3))
        grad = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x)
    else:
        cdf = 0.5 * (1 + cx.lax.erf(x / math.sqrt(2)))
        grad = cdf + x * jnp.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return dy * grad


# per element: the softmax and the product with y and with (dy - sum); erf/exp and products
primitive(Op.softmax_backward, Softmax, 2, _shape("softmax_backward", _softmax_axis),
          _softmax_eval, per_element(8),
          "the derivative of each step of softmax (its max shift too) is a dozen passes over "
          "memory; the framework's softmax backward makes one",
          traits=Trait.KERNEL, batch=SOFTMAX_BATCH, torch=_softmax_torch,
          onnx=decomposed_onnx, jax=_softmax_jax,
          decompose=lambda s, dy, x: vjp_of(lambda v: ops.softmax(v, s.axis), x, dy))
primitive(Op.gelu_backward, Gelu, 2, _shape("gelu_backward", _gelu_mode), _gelu_eval,
          per_element(10),
          "the derivative of each step of gelu is ten elementwise passes; the framework's "
          "gelu backward makes one",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_gelu_torch, onnx=decomposed_onnx, jax=_gelu_jax,
          decompose=lambda s, dy, x: vjp_of(lambda v: ops.gelu(v, s.approximate), x, dy))


def layer_norm_backward(dy: torch.Tensor, x: torch.Tensor, count: int,
                        eps: float) -> torch.Tensor:
    """The input gradient of ``F.layer_norm(x)`` (no affine) at ``dy``: torch's own backward,
    its mean and rstd from one more forward pass over ``x`` (the forward kernel keeps none)."""
    shape = x.shape[x.dim() - count:]
    _, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, None, None, eps)
    return torch.ops.aten.native_layer_norm_backward(dy, x, shape, mean, rstd, None, None,
                                                     (True, False, False))[0]


def _layer_norm_eval(spec: LayerNorm, xs, resolve):
    return layer_norm_backward(*xs, spec.count, spec.eps)


def _layer_norm_torch(node, a, code):
    """``layer_norm_backward`` written inline (its two aten calls)."""
    shape = code.shape(node.type.shape[node.type.rank - node.spec.count:], tuple_=True)
    stats = f"torch.ops.aten.native_layer_norm({a[1]}, {shape}, None, None, {node.spec.eps!r})"
    return (f"torch.ops.aten.native_layer_norm_backward({a[0]}, {a[1]}, {shape}, "
            f"*{stats}[1:], None, None, (True, False, False))[0]")


def _layer_norm_jax(node, a, cx):
    """rstd * (dy - mean(dy) - xhat * mean(dy * xhat)) over the trailing axes."""
    dy, x = a
    jnp = cx.jnp
    axes = tuple(range(x.ndim - node.spec.count, x.ndim))
    xhat = normalize_jax(cx, x, axes, node.spec.eps)
    rstd = cx.lax.rsqrt(jnp.var(x, axis=axes, keepdims=True) + node.spec.eps)
    mean = jnp.mean(dy, axis=axes, keepdims=True)
    return rstd * (dy - mean - xhat * jnp.mean(dy * xhat, axis=axes, keepdims=True))


def _layer_norm_workspace(spec: LayerNorm, ins, out: TensorType, contiguous) -> Dim:
    """The recomputed forward's output and its float32 mean and 1/std per row, freed as
    the call returns."""
    return out.nbytes + 2 * 4 * product(out.shape[:out.rank - spec.count])


# per element: the forward's mean/variance pass again, then the two sums and the combination
primitive(Op.layer_norm_backward, LayerNorm, 2,
          _shape("layer_norm_backward", _layer_norm_count), _layer_norm_eval, per_element(12),
          "the derivative of each step of layer norm (mean, centring, variance, rsqrt) is some "
          "twenty passes over memory; the framework's layer norm backward makes two",
          traits=Trait.KERNEL, batch=Refuse("normalises over its trailing `count` axes, "
                                            "which may include the batch axis"),
          torch=_layer_norm_torch, onnx=decomposed_onnx, jax=_layer_norm_jax,
          workspace=_layer_norm_workspace,
          decompose=lambda s, dy, x: vjp_of(
              lambda v: ops.layer_norm(v, tuple(v.shape[len(v.shape) - s.count:]), eps=s.eps),
              x, dy))


def rms_norm_backward(dy: torch.Tensor, x: torch.Tensor, count: int,
                      eps: float) -> torch.Tensor:
    """The input gradient of ``F.rms_norm(x)`` (no weight) at ``dy``: rstd * dy + x * c
    with c = -rstd^3 * mean(dy * x), rstd from one more pass over ``x``."""
    axes = tuple(range(x.dim() - count, x.dim()))
    rstd = torch.rsqrt(x.pow(2).mean(axes, keepdim=True) + eps)
    c = (dy * x).mean(axes, keepdim=True) * -rstd.pow(3)
    return torch.addcmul(dy * rstd, x, c)


def _rms_norm_jax(node, a, cx):
    dy, x = a
    axes = tuple(range(x.ndim - node.spec.count, x.ndim))
    rstd = cx.lax.rsqrt(cx.jnp.mean(x * x, axis=axes, keepdims=True) + node.spec.eps)
    return dy * rstd - x * rstd ** 3 * cx.jnp.mean(dy * x, axis=axes, keepdims=True)


def _rms_norm_count(spec: RMSNorm, x) -> None:
    if not 1 <= spec.count <= x.rank:
        raise ShapeError(f"rms_norm_backward: {spec.count} trailing axes of {x}")


# per element: the square and its sum, the product dy * x and its sum, two products and an add
primitive(Op.rms_norm_backward, RMSNorm, 2, _shape("rms_norm_backward", _rms_norm_count),
          lambda s, xs, r: rms_norm_backward(*xs, s.count, s.eps), per_element(7),
          "the derivative of each step of rms norm (square, mean, rsqrt, and x's two uses) is "
          "some fifteen passes over memory; its closed form makes five",
          traits=Trait.KERNEL, batch=Refuse("normalises over its trailing `count` axes, "
                                            "which may include the batch axis"),
          torch=lambda node, a, code: (f"_rt.rms_norm_backward({a[0]}, {a[1]}, "
                                       f"{node.spec.count}, {node.spec.eps!r})"),
          onnx=decomposed_onnx, jax=_rms_norm_jax,
          decompose=lambda s, dy, x: vjp_of(
              lambda v: ops.rms_norm(v, tuple(v.shape[len(v.shape) - s.count:]), eps=s.eps),
              x, dy))
