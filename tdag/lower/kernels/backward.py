"""Input gradients of softmax and GELU as one framework call each, where ``tdag.grad``'s
rules give a chain of elementwise products, sums and reductions (the derivative of every
step of the forward composition, the max shift of softmax included).

Each kernel's decomposition is that chain itself: the backward ``tdag.grad`` writes for the
forward composition at the cotangent ``dy`` (``vjp_graph`` on it), so that the lowering rule
meets in a gradient program exactly the template it matches (tdag/lower/backward.py).

    softmax_backward(dy, x, axis)   torch._softmax_backward_data(dy, softmax(x), axis)
    gelu_backward(dy, x, approx)    torch.ops.aten.gelu_backward(dy, x, approximate=...)

ONNX writes the decomposition inline; JAX the closed forms.
"""
from __future__ import annotations

import math

import torch

from tdag import ops
from tdag.deinops.primitive import primitive
from tdag.errors import ShapeError
from tdag.ir.batching import Aligned
from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.lower.kernels.activations import SOFTMAX_BATCH, Gelu, Softmax
from tdag.lower.kernels.common import decomposed_onnx, float_input, per_element, same_shape
from tdag.ops.builder import Builder, active_builder
from tdag.refine.grad.reverse import vjp_graph


def vjp_of(forward, x, dy):
    """The cotangent of ``x`` that ``tdag.grad``'s rules write for ``forward(x)`` at ``dy``,
    emitted into the active builder (the forward values it reads recomputed from ``x``)."""
    local = Builder()
    with local.active():
        out = forward(local.input("x", x.type))
    back = vjp_graph(local.build([out]), [0], ["x"])
    return _inline(back, (x, dy))


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
