"""The weight gradient of a convolution: one framework call where the composition unfolds
every window of the input (im2col) and contracts it with the output's cotangent.

    dw[g*Og + o, c, *k] = sum over (n, *s) of
                          dy[n, g*Og + o, *s] * xpad[n, g*Cg + c, s*stride + k*dilation]

torch runs it as ``torch.nn.grad.conv{n}d_weight`` (ATen's ``convolution_backward``, what
autograd calls); ONNX and JAX as the convolution of the input by the cotangent with the
roles of batch and channels exchanged (stride and dilation swap), cropped to the kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag.deinops.codegen import tuple_expr
from tdag.deinops.primitive import primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import as_dim, dims_equal, floordiv, product
from tdag.ir.types import TensorType
from tdag.lower.kernels.common import NDIM
from tdag.lower.kernels.contraction import CONV_BATCH, channels_last_conv_jax, conv_out
from tdag.ops import core


@dataclass(frozen=True, slots=True)
class ConvWeightGrad:
    """``dw[Co, C/g, *kernel]`` of ``conv(x[N,C,*S], w, stride, padding, dilation, groups)``
    from ``dy[N,Co,*O]`` and ``x``; symmetric zero padding."""

    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int = 1


def _shape(spec: ConvWeightGrad, ins) -> TensorType:
    dy, x = ins
    n = len(spec.kernel)
    if dy.rank != n + 2 or x.rank != n + 2 or dy.dtype is not x.dtype or not x.dtype.is_float:
        raise ShapeError(f"conv_weight_grad: {n}-d spec for cotangent {dy} and input {x}")
    windows = tuple(conv_out(x.shape[2 + i], spec.kernel[i], spec.stride[i], spec.padding[i],
                             spec.dilation[i]) for i in range(n))
    if not all(dims_equal(a, b) for a, b in zip(windows, dy.shape[2:])) or \
            not dims_equal(dy.shape[0], x.shape[0]):
        raise ShapeError(f"conv_weight_grad: cotangent {dy} does not fit input {x}")
    return x.with_shape((dy.shape[1], as_dim(floordiv(x.shape[1], spec.groups))) + spec.kernel)


def _evaluate(spec: ConvWeightGrad, xs, resolve):
    dy, x = xs
    weight = (dy.shape[1], x.shape[1] // spec.groups) + tuple(spec.kernel)
    grad = getattr(torch.nn.grad, f"conv{len(spec.kernel)}d_weight")
    return grad(x, weight, dy, spec.stride, spec.padding, spec.dilation, spec.groups)


def _cost(spec: ConvWeightGrad, ins, out: TensorType):
    macs = ins[0].numel * product(out.shape[1:])  # each cotangent meets C/g * prod(K) inputs
    return traffic(ins, out, 2 * macs, 2 * macs)


def _torch(node, a, code):
    s = node.spec
    return (f"torch.nn.grad.conv{NDIM[len(s.kernel)]}_weight({a[1]}, "
            f"({a[0]}.shape[1], {a[1]}.shape[1] // {s.groups}, *{tuple_expr(s.kernel)}), "
            f"{a[0]}, {tuple_expr(s.stride)}, {tuple_expr(s.padding)}, "
            f"{tuple_expr(s.dilation)}, {s.groups})")


def _onnx(node, ins, g, cx):
    """Conv(x as [Cg, g*N, *S], dy as [g*Og, N, *O], group g) -> [Cg, g*Og, *K'], cropped
    to the kernel and transposed."""
    s = node.spec
    d, groups = len(s.kernel), s.groups
    x_type, dy_type = cx.type(node.inputs[1]), cx.type(node.inputs[0])
    x = _onnx_swap(g, ins[1], groups, int(x_type.shape[1]) // groups, d, outer=True)
    dy = _onnx_swap(g, ins[0], groups, int(dy_type.shape[1]) // groups, d, outer=False)
    out = g.node("Conv", [x, dy], strides=list(s.dilation), dilations=list(s.stride),
                 pads=list(s.padding) * 2, group=groups)
    axes = list(range(2, 2 + d))
    out = g.node("Slice", [out, g.const([0] * d), g.const(list(s.kernel)), g.const(axes)])
    return g.node("Transpose", [out], perm=[1, 0] + axes)


def _onnx_swap(g, value, groups: int, per_group: int, d: int, outer: bool):
    """[N, g*P, *S] -> [P, g*N, *S] (``outer``: the group major in the channels) or
    [g*P, N, *S]."""
    spatial = g.node("Slice", [g.node("Shape", [value]), g.const([2]), g.const([2 + d])])
    split = g.node("Reshape", [value, g.node("Concat", [g.const([0, groups, per_group]),
                                                        spatial], axis=0)])
    rest = list(range(3, 3 + d))
    head = [2, 1, 0] if outer else [1, 2, 0]
    moved = g.node("Transpose", [split], perm=head + rest)
    lead = [per_group, -1] if outer else [groups * per_group, -1]
    return g.node("Reshape", [moved, g.node("Concat", [g.const(lead), spatial], axis=0)])


def _jax(node, a, cx):
    """As in ONNX: the convolution of the swapped input by the swapped cotangent."""
    s, (dy, x) = node.spec, a
    n, groups = x.shape[0], s.groups
    cg, og, spatial = x.shape[1] // groups, dy.shape[1] // groups, x.shape[2:]
    xs = x.reshape((n, groups, cg) + spatial).swapaxes(0, 2).reshape((cg, groups * n) + spatial)
    ws = dy.reshape((n, groups, og) + dy.shape[2:])
    ws = cx.jnp.moveaxis(ws, 0, 2).reshape((groups * og, n) + dy.shape[2:])
    out = channels_last_conv_jax(cx, xs, ws, s.dilation, [(p, p) for p in s.padding],
                                 s.stride, groups)
    out = out[(slice(None), slice(None)) + tuple(slice(0, k) for k in s.kernel)]
    return out.swapaxes(0, 1)


def _decompose(s: ConvWeightGrad, dy, x):
    """The contraction of the cotangent with every window of the padded input."""
    d = len(s.kernel)
    x = core.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in s.padding])
    for i in range(d):
        x = core.unfold(x, 2 + i, s.kernel[i], s.stride[i], s.dilation[i])
    x = core.unsqueeze(core.ungroup(x, 1, (s.groups, -1)), 2)        # (N, g, 1, Cg, *O, *K)
    dy = core.ungroup(dy, 1, (s.groups, -1))                         # (N, g, Og, *O)
    dy = core.unsqueeze(dy, (3,) + tuple(range(4 + d, 4 + 2 * d)))  # (N, g, Og, 1, *O, *1)
    summed = core.sum(core.mul(x, dy), (0,) + tuple(range(4, 4 + d)))
    return core.group(summed, 0, 2)                                  # (Co, Cg, *K)


primitive(Op.conv_weight_grad, ConvWeightGrad, 2, _shape, _evaluate, _cost,
          "unfold + multiply + reduce materialises every window of the input (im2col); the "
          "framework's convolution backward does not",
          traits=Trait.KERNEL, batch=CONV_BATCH, torch=_torch, onnx=_onnx, jax=_jax,
          decompose=_decompose)
