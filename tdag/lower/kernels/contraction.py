"""Contraction kernels: einsum (matmul, bmm, linear), convolutions."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tdag import ops
from tdag.deinops.codegen import last_two, tuple_expr
from tdag.lower.kernels import onednn
from tdag.lower.kernels.common import NDIM, check_bias
from tdag.lower.kernels.einsum_plan import parse_equation, plan_einsum
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, floordiv, format_dim, is_static, product
from tdag.ir.types import DType, TensorKind, TensorType

# -- einsum: every two-operand contraction ----------------------------------------------------

@dataclass(frozen=True, slots=True)
class Einsum:
    """``out = einsum(equation, a, b) [+ bias]``: one letter per axis, no ellipsis. An
    optional third operand is a bias broadcast to the output's trailing axes (nn.Linear)."""

    equation: str


def label_sizes(spec: Einsum, ins) -> dict[str, Dim]:
    (la, lb), _ = parse_equation(spec.equation)
    sizes: dict[str, Dim] = {}
    for labels, t in ((la, ins[0]), (lb, ins[1])):
        if len(labels) != t.rank:
            raise ShapeError(f"einsum: {spec.equation!r} names {len(labels)} axes for {t}")
        for c, d in zip(labels, t.shape):
            if c in sizes and not dims_equal(sizes[c], d):
                raise ShapeError(f"einsum: {spec.equation!r}: axis {c} is {format_dim(sizes[c])} "
                                 f"and {format_dim(d)} ({ins[0]}, {ins[1]})")
            sizes.setdefault(c, d)
    return sizes


def _einsum_shape(spec: Einsum, ins):
    if ins[0].dtype is not ins[1].dtype:
        raise ShapeError(f"einsum: operands {ins[0]} and {ins[1]} differ in dtype")
    sizes = label_sizes(spec, ins)
    out = ins[0].with_shape(sizes[c] for c in parse_equation(spec.equation)[1])
    if len(ins) == 3:
        check_bias("einsum", ins[2], out)
    return out


def _einsum_eval(spec: Einsum, xs, resolve):
    out = torch.einsum(spec.equation, xs[0], xs[1])
    return out + xs[2] if len(xs) == 3 else out


def _einsum_cost(spec: Einsum, ins, out: TensorType) -> Cost:
    matmul = 2 * product(label_sizes(spec, ins).values())  # one multiply and one add per term
    bias = out.numel if len(ins) == 3 else 0
    return traffic(ins, out, matmul + bias, matmul)


# oneDNN's inner product on a prepacked weight (``onednn.linear``) runs a float32 product
# on this machine's AMD EPYC core 5-15% faster than the MKL sgemm F.linear calls, but sets up
# a primitive on every call (~15 us). MKL packs the weight on every call instead, which in a
# model, its weights fetched from memory again each time, costs more than in a loop over one
# product: in isolation MKL wins at [128, 256] x [256, 256] (2**23: 178 against 187 us), yet
# BERT's, Whisper's and T5's modules ran 1.7-2.6% faster with their 2**22-2**23 products
# packed (GPT-2's and Llama's 0.7-0.9%; each call timed right after an eager one).
# Unpacked (a weight computed per call), oneDNN reorders it on every call too, and is taken
# from 2**24 (a [128, 256] x [256, 1024] projection is 2**25: 653 against 701 us).
ONEDNN_MACS = 2 ** 24
PACKED_MACS = 2 ** 22
PACKABLE = (TensorKind.parameter, TensorKind.const)  # weights a call reads unchanged


def _linear_call(node, code, weight: str) -> str:
    """``F.linear``, or ``_rt.linear`` (oneDNN, or MKL's packed sgemm: ``onednn.MKL_PACKED``)
    for a float32 product of a static size of at least ``PACKED_MACS`` multiply-adds on a
    ``weight`` it packs, or ``ONEDNN_MACS``."""
    ins = [code.ctx.type(n) for n in node.inputs[:2]]
    macs = product(label_sizes(node.spec, ins).values())
    if not (is_static(macs) and ins[0].dtype is DType.f32):
        return "F.linear"
    packs = code.prepack and packable(weight, code.ctx)
    return "_rt.linear" if macs >= (PACKED_MACS if packs else ONEDNN_MACS) else "F.linear"


def pack_args(node, operand: str, code) -> str:
    """The (packs, key) arguments of a oneDNN call of ``node`` on the weight ``operand``:
    the module's packs and the call's key where the operand is a weight that no call writes
    (a parameter or const read straight, or through a view the call makes: ``.mT``), else
    ``None, None`` (a value computed per call is not packed)."""
    if not (code.prepack and packable(operand, code.ctx)):
        return "None, None"
    return f"self._tdag_packs, {code.method + '/' + node.name!r}"


def packable(name: str, ctx) -> bool:
    """Whether ``name`` is a weight no call writes: a parameter or const of the graph (a
    training step's parameters are its state, inputs of the graph), or a slice of one (a
    split convolution's piece: a view, stamped as its base changes). ``ctx``: the graph's
    ``tdag.ir.rewrite.Context``."""
    node = ctx.producer(name)
    while node is not None and node.op is Op.slice:
        name = node.inputs[0]
        node = ctx.producer(name)
    weight = ctx.graph.weights.get(name)
    return weight is not None and weight.kind in PACKABLE


def onednn_activation(node) -> tuple[tuple] | None:
    """The post-op (oneDNN's name, scalars, algorithm) of a SiLU, GELU, hardswish or leaky
    ReLU node, which the torch code applies inside the oneDNN call it reads
    (``onednn_product``): one pass over the result fewer, and an activation reading oneDNN's
    result on its own ran slower than on F.linear's; BERT, ViT, ConvNeXt and Whisper's
    modules run 2-4% faster fused. Not a ReLU or a clamp: oneDNN's relu and clip post-ops are
    max/min, which turn a NaN into 0 where torch's keep it. The four fused keep NaN and
    infinities as torch does,
    but past |x| > 1e38, where torch's GELU and hardswish overflow to inf or nan and
    oneDNN's give the finite value."""
    if node.op is Op.silu:  # oneDNN's name for x * sigmoid(x)
        return (("swish", [], ""),)
    if node.op is Op.gelu:
        return (("gelu", [], node.spec.approximate),)
    if node.op is Op.hardswish:
        return (("hardswish", [], ""),)
    if node.op is Op.leaky_relu:  # x > 0 ? x : slope x, NaN kept (YOLO's, GANs' convs)
        return (("leaky_relu", [node.spec.slope], ""),)
    return None


def activation_inside(node, product, code) -> tuple[tuple] | None:
    """``onednn_activation(node)`` where the call of ``product`` (``onednn_product``) takes
    it: not a tanh GELU after a product MKL's packed sgemm or a 1x1 convolution's F.linear
    runs, which apply their post-op after the product, where the tanh GELU's fast form
    (``activations.gelu_tanh``) writes a second tensor; on its own line ``tdag.memory``
    counts that tensor."""
    extra = onednn_activation(node)
    if extra and extra[0][0] == "gelu" and extra[0][2] == "tanh" and \
            not _post_op_inside(product, code):
        return None
    return extra


def _post_op_inside(node, code) -> bool:
    """Whether the call of the product ``node`` applies its post-op inside oneDNN's kernel:
    a 1-d or 2-d convolution (``_rt.conv1d``, ``_rt.conv2d``), or a product MKL's packed
    sgemm does not take (``onednn.mkl_takes``)."""
    if node.op is Op.conv:
        return _conv_call(node, code) in ("_rt.conv2d", "_rt.conv1d")
    return not onednn.mkl_takes(code.shape_of(_product_weight(node, code)))


def folded_norm(node, conv, code) -> bool:
    """Whether ``node`` is a batch norm the torch code folds into the convolution ``conv``
    it reads (an ``_rt.conv2d`` or ``_rt.conv1x1`` call: ``onednn.conv2d``'s ``norm``): its
    statistics and affine weights are the graph's parameters, buffers or consts (a buffer
    the module updates is written over in place, which its pack's stamp sees)."""
    return node.op is Op.batch_norm and conv is not None and conv.op is Op.conv and \
        node.inputs[0] == conv.name and \
        _conv_call(conv, code) in ("_rt.conv2d", "_rt.conv1x1") and \
        all(_weight_kind(name, code) in NORM_SOURCES for name in node.inputs[1:])


NORM_SOURCES = (*PACKABLE, TensorKind.buffer)


def _weight_kind(name: str, code) -> TensorKind | None:
    weight = code.ctx.graph.weights.get(name)
    return weight.kind if weight is not None else None


def onednn_product(node, code) -> bool:
    """Whether the torch code of ``node`` is a oneDNN call taking a post-op: an
    ``_rt.linear`` product or an ``_rt.conv2d`` convolution."""
    if node.op is Op.conv:
        return _conv_call(node, code).startswith("_rt.")
    if node.op is not Op.einsum:
        return False
    bias = len(node.inputs) == 3
    plan = _linear_plan(node, code)
    return plan.kind == "linear" and (plan.bias_inside or not bias) and \
        plan.out_perm is None and _linear_call(node, code, _weight_of(node, plan)) == "_rt.linear"


def _linear_plan(node, code):
    bias = len(node.inputs) == 3
    return plan_einsum(node.spec.equation, code.rank(node.inputs[2]) if bias else None)


def _weight_of(node, plan) -> str:
    """The operand of the einsum ``node`` that its linear call (``plan``) takes as the
    weight."""
    return node.inputs[0] if plan.swap else node.inputs[1]


def _product_weight(node, code) -> str:
    return _weight_of(node, _linear_plan(node, code))


def _einsum_torch(node, a, code):
    bias = a[2] if len(a) == 3 else None
    plan = plan_einsum(node.spec.equation, code.rank(node.inputs[2]) if bias else None)
    if plan.kind == "einsum":
        out = f"torch.einsum({node.spec.equation!r}, {a[0]}, {a[1]})"
        return f"{out} + {bias}" if bias else out
    x, y = (a[1], a[0]) if plan.swap else (a[0], a[1])
    if plan.transpose_a:
        x = f"{x}.mT"
    if plan.transpose_b:
        y = f"{y}.mT"
    if plan.kind == "linear":
        weight = node.inputs[0] if plan.swap else node.inputs[1]
        call = _linear_call(node, code, weight)
        out = f"{call}({x}, {y}, {bias if plan.bias_inside else 'None'}"
        if call == "_rt.linear":
            out += ", " + pack_args(node, weight, code)
        out += ")"
    else:
        out = f"torch.matmul({x}, {y})"
    if plan.out_perm is not None:
        out = f"{out}.permute{tuple_expr(plan.out_perm)}"
    return f"{out} + {bias}" if bias and not plan.bias_inside else out


def _transposed_matmul(equation: str, x: str, y: str, g) -> str | None:
    """``equation`` as Transposes around one MatMul where each operand has one row or
    column label and the two share one summed label (attention's ``acbd,aebd->abce`` on
    [B, S, N, H] heads), else None. onnxruntime's Einsum permutes both operands on every
    call; its optimiser folds these Transposes into the MatMul (FusedMatMul) or cancels them
    with their neighbours."""
    (a, b), out = parse_equation(equation)
    batch = [c for c in out if c in a and c in b]
    rows, cols = [c for c in a if c not in b], [c for c in b if c not in a]
    summed = [c for c in a if c in b and c not in out]
    if not len(rows) == len(cols) == len(summed) == 1 or not set(rows + cols) <= set(out):
        return None
    x = _permuted(x, [a.index(c) for c in batch + rows + summed], g)
    y = _permuted(y, [b.index(c) for c in batch + summed + cols], g)
    order = batch + rows + cols
    return _permuted(g.node("MatMul", [x, y]), [order.index(c) for c in out], g)


def _permuted(x: str, perm: list[int], g) -> str:
    return x if perm == sorted(perm) else g.node("Transpose", [x], perm=perm)


def _einsum_onnx(node, ins, g, cx):
    bias = ins[2] if len(ins) == 3 else None
    plan = plan_einsum(node.spec.equation, cx.type(node.inputs[2]).rank if bias else None)
    if plan.kind == "einsum":
        out = _transposed_matmul(node.spec.equation, ins[0], ins[1], g) or \
            g.node("Einsum", ins[:2], equation=node.spec.equation)
        return g.node("Add", [out, bias]) if bias else out
    (xi, yi) = (1, 0) if plan.swap else (0, 1)
    x, y = ins[xi], ins[yi]
    rx, ry = cx.type(node.inputs[xi]).rank, cx.type(node.inputs[yi]).rank
    if plan.transpose_a:
        x = g.node("Transpose", [x], perm=last_two(rx))
    inside = bias if plan.bias_inside else None
    if plan.kind == "linear" and rx == 2 and not plan.transpose_b:
        out = g.node("Gemm", [x, y] + ([inside] if inside else []), transB=1)  # as torch emits
    else:
        if plan.kind == "linear" and not plan.transpose_b or \
                plan.kind == "matmul" and plan.transpose_b:
            y = g.node("Transpose", [y], perm=last_two(ry))
        out = g.node("MatMul", [x, y])
        if inside:
            out = g.node("Add", [out, inside])
    if plan.out_perm is not None:
        out = g.node("Transpose", [out], perm=list(plan.out_perm))
    return g.node("Add", [out, bias]) if bias and not plan.bias_inside else out


def _einsum_jax(node, a, cx):
    out = cx.jnp.einsum(node.spec.equation, a[0], a[1])  # XLA plans it as one dot_general
    return out + a[2] if len(a) == 3 else out


def _einsum_decompose(spec: Einsum, a, b, *bias):
    out = ops.einsum(spec.equation, a, b)
    return ops.add(out, bias[0]) if bias else out


primitive(Op.einsum, Einsum, range(2, 4), _einsum_shape, _einsum_eval, _einsum_cost,
          "multiply + reduce-sum of broadcast operands materialises the whole product; "
          "matmul/bmm/linear never do",
          traits=Trait.KERNEL,
          batch=Refuse("is an einsum kernel whose equation names every axis and was planned as "
                       "one framework call for them: strip the batch before lowering"),
          torch=_einsum_torch, onnx=_einsum_onnx, jax=_einsum_jax, decompose=_einsum_decompose)


# -- convolutions -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Conv:
    """``F.conv{n}d(x[N,C,*S], w[Co,C/g,*K], bias[Co])``; symmetric zero padding."""

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int = 1


def conv_out(length: Dim, k: Dim, stride: int, pad: int, dilation: int) -> Dim:
    return as_dim(floordiv(as_dim(length + 2 * pad - dilation * (k - 1) - 1), stride) + 1)


def _check_conv_operands(op: str, spec, x: TensorType, w: TensorType) -> int:
    n = len(spec.stride)
    if x.rank != n + 2 or w.rank != n + 2 or not n == len(spec.padding) == len(spec.dilation):
        raise ShapeError(f"{op}: {n}-d spec for input {x} and weight {w}")
    if x.dtype is not w.dtype or not x.dtype.is_float:
        raise ShapeError(f"{op}: input {x} and weight {w} must share a float dtype")
    if spec.groups < 1:
        raise ShapeError(f"{op}: groups must be >= 1, got {spec.groups}")
    return n


def _conv_shape(spec: Conv, ins):
    x, w = ins[0], ins[1]
    n = _check_conv_operands("conv", spec, x, w)
    cout, cin_g = w.shape[0], w.shape[1]
    if not dims_equal(as_dim(cin_g * spec.groups), x.shape[1]) or \
            (is_static(cout) and cout % spec.groups):
        raise ShapeError(f"conv: weight {w} does not fit input {x} with {spec.groups} groups")
    spatial = tuple(conv_out(x.shape[2 + i], w.shape[2 + i], spec.stride[i], spec.padding[i],
                              spec.dilation[i]) for i in range(n))
    out = x.with_shape((x.shape[0], cout) + spatial)
    if len(ins) == 3 and not (ins[2].rank == 1 and dims_equal(ins[2].shape[0], cout)):
        raise ShapeError(f"conv: bias {ins[2]} must be [{format_dim(cout)}]")
    return out


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _conv_eval(spec: Conv, xs, resolve):
    bias = xs[2] if len(xs) == 3 else None
    return _CONV[len(spec.stride)](xs[0], xs[1], bias, spec.stride, spec.padding, spec.dilation,
                                   spec.groups)


def _conv_cost(spec: Conv, ins, out: TensorType) -> Cost:
    w = ins[1]
    macs = out.numel * product(w.shape[1:])  # each output sums C/g * prod(K) products
    return traffic(ins, out, 2 * macs + (out.numel if len(ins) == 3 else 0), 2 * macs)


def _conv_call(node, code) -> str:
    """For a float32 2-d convolution of a weight no call writes, ``_rt.conv1x1`` (a product of
    the image's rows) where the kernel is 1x1, of stride 1, no padding and one group, else
    ``_rt.conv2d`` (oneDNN on a prepacked weight); ``_rt.conv1d`` for such a 1-d one (oneDNN
    too); ``F.conv{n}d`` for the others."""
    s, spatial = node.spec, len(node.spec.stride)
    if not onednn_conv(node, code.ctx):
        return f"F.conv{NDIM[spatial]}"
    if spatial == 1:
        return "_rt.conv1d"
    kernel = code.shape_of(node.inputs[1])[2:]
    if s.groups == 1 and tuple(kernel) == (1, 1) and tuple(s.stride) == (1, 1) and \
            tuple(s.padding) == (0, 0):
        return "_rt.conv1x1"
    return "_rt.conv2d"


def onednn_conv(node, ctx) -> bool:
    """Whether the torch code of the convolution ``node`` calls oneDNN on a packed weight
    (``_rt.conv1d``, ``_rt.conv2d``, ``_rt.conv1x1``): a float32 1-d or 2-d one of a weight no
    call writes. ``ctx``: its graph's ``tdag.ir.rewrite.Context``."""
    return len(node.spec.stride) <= 2 and ctx.type(node.inputs[0]).dtype is DType.f32 and \
        packable(node.inputs[1], ctx)


def _conv_torch(node, a, code):
    s = node.spec
    bias = a[2] if len(a) == 3 else "None"
    call = _conv_call(node, code)
    packs = pack_args(node, node.inputs[1], code)
    if call == "_rt.conv1x1":
        return f"_rt.conv1x1({a[0]}, {a[1]}, {bias}, {packs})"
    if call in ("_rt.conv2d", "_rt.conv1d"):  # lists, as oneDNN's op takes them
        return (f"{call}({a[0]}, {a[1]}, {bias}, {list(s.stride)}, {list(s.padding)}, "
                f"{list(s.dilation)}, {s.groups}, {packs})")
    return (f"{call}({a[0]}, {a[1]}, {bias}, {tuple_expr(s.stride)}, "
            f"{tuple_expr(s.padding)}, {tuple_expr(s.dilation)}, {s.groups})")


def _conv_attrs(spec, kernel) -> dict:
    return dict(kernel_shape=[int(k) for k in kernel], strides=list(spec.stride),
                pads=list(spec.padding) * 2, dilations=list(spec.dilation), group=spec.groups)


def _conv_onnx(node, ins, g, cx):
    kernel = cx.type(node.inputs[1]).shape[2:]
    return g.node("Conv", ins, **_conv_attrs(node.spec, kernel))


def channels_last_conv_jax(cx, x, w, stride, pads, dilation, groups, lhs_dilation=None):
    """``lax.conv_general_dilated`` of torch's (N, C, *S) input and (O, I/g, *K) kernel,
    run channels last: XLA's CPU convolution is several times faster so."""
    letters = "DHW"[3 - len(stride):]
    out = cx.lax.conv_general_dilated(
        cx.jnp.moveaxis(x, 1, -1), cx.jnp.moveaxis(w, (0, 1), (-1, -2)), stride, pads,
        lhs_dilation=lhs_dilation, rhs_dilation=dilation, feature_group_count=groups,
        dimension_numbers=("N" + letters + "C", letters + "IO", "N" + letters + "C"))
    return cx.jnp.moveaxis(out, -1, 1)


def _depthwise_jax(cx, x, w, stride, pads, dilation):
    """One channel per group: a multiply-add per kernel offset over strided slices, which
    XLA fuses into one loop (its grouped convolution is an order of magnitude slower)."""
    x = cx.jnp.pad(x, [(0, 0), (0, 0)] + pads)
    kernel = w.shape[2:]
    out = [(x.shape[2 + i] - d * (k - 1) - 1) // s + 1
           for i, (k, s, d) in enumerate(zip(kernel, stride, dilation))]
    total = None
    for offset in itertools.product(*(range(k) for k in kernel)):
        window = x[(slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s)
            for o, d, n, s in zip(offset, dilation, out, stride))]
        term = window * w[(slice(None), 0) + offset].reshape((-1,) + (1,) * len(out))
        total = term if total is None else total + term
    return total


def _conv_jax(node, a, cx):
    s, (x, w) = node.spec, a[:2]
    pads = [(p, p) for p in s.padding]
    if x.shape[1] == w.shape[0] == s.groups:
        out = _depthwise_jax(cx, x, w, s.stride, pads, s.dilation)
    else:
        out = channels_last_conv_jax(cx, x, w, s.stride, pads, s.dilation, s.groups)
    return out if len(a) == 2 else out + a[2].reshape((-1,) + (1,) * len(s.stride))


CONV_BATCH = Refuse("works on the framework's fixed (N, C, *S) layout: strip the batch "
                     "before lowering")

primitive(Op.conv, Conv, range(2, 4), _conv_shape, _conv_eval, _conv_cost,
          "pad + unfold + multiply + reduce materialises every window; conv kernels do not",
          traits=Trait.KERNEL, batch=CONV_BATCH, torch=_conv_torch, onnx=_conv_onnx,
          jax=_conv_jax,
          decompose=lambda s, x, w, *bias: ops.conv(x, w, *bias, stride=s.stride,
                                                    padding=s.padding, dilation=s.dilation,
                                                    groups=s.groups))


@dataclass(frozen=True, slots=True)
class ConvTranspose:
    """``F.conv_transpose{n}d(x[N,Ci,*S], w[Ci,Co/g,*K], bias[Co])``."""

    stride: tuple
    padding: tuple
    output_padding: tuple
    dilation: tuple
    groups: int = 1


def _conv_t_shape(spec: ConvTranspose, ins):
    x, w = ins[0], ins[1]
    n = _check_conv_operands("conv_transpose", spec, x, w)
    if not dims_equal(w.shape[0], x.shape[1]) or len(spec.output_padding) != n:
        raise ShapeError(f"conv_transpose: weight {w} does not fit input {x}")
    cout = as_dim(w.shape[1] * spec.groups)
    spatial = tuple(as_dim((x.shape[2 + i] - 1) * spec.stride[i] - 2 * spec.padding[i]
                           + spec.dilation[i] * (w.shape[2 + i] - 1) + spec.output_padding[i] + 1)
                    for i in range(n))
    if len(ins) == 3 and not (ins[2].rank == 1 and dims_equal(ins[2].shape[0], cout)):
        raise ShapeError(f"conv_transpose: bias {ins[2]} must be [{format_dim(cout)}]")
    return x.with_shape((x.shape[0], cout) + spatial)


def _conv_t_eval(spec: ConvTranspose, xs, resolve):
    bias = xs[2] if len(xs) == 3 else None
    return _CONV_T[len(spec.stride)](xs[0], xs[1], bias, spec.stride, spec.padding,
                                     spec.output_padding, spec.groups, spec.dilation)


def _conv_t_cost(spec: ConvTranspose, ins, out: TensorType) -> Cost:
    x, w = ins[0], ins[1]
    macs = x.numel * product(w.shape[1:])  # every input element meets Co/g * prod(K) weights
    return traffic(ins, out, 2 * macs + (out.numel if len(ins) == 3 else 0), 2 * macs)


def _conv_transpose_torch(node, a, code):
    s = node.spec
    bias = a[2] if len(a) == 3 else "None"
    return (f"F.conv_transpose{NDIM[len(s.stride)]}({a[0]}, {a[1]}, {bias}, "
            f"{tuple_expr(s.stride)}, {tuple_expr(s.padding)}, {tuple_expr(s.output_padding)}, "
            f"{s.groups}, {tuple_expr(s.dilation)})")


def _conv_transpose_onnx(node, ins, g, cx):
    kernel = cx.type(node.inputs[1]).shape[2:]
    return g.node("ConvTranspose", ins, output_padding=list(node.spec.output_padding),
                  **_conv_attrs(node.spec, kernel))


def _conv_transpose_jax(node, a, cx):
    """The transposed conv as the conv of the input dilated by the stride with the flipped
    kernel, its in and out channels swapped within each group, padded by the kernel span
    less the padding (plus output_padding at the end)."""
    s, (x, w) = node.spec, a[:2]
    n = len(s.stride)
    ci, co_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
    w = w.reshape((s.groups, ci // s.groups, co_g) + kernel).swapaxes(1, 2)
    w = cx.jnp.flip(w.reshape((s.groups * co_g, ci // s.groups) + kernel), range(2, 2 + n))
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op)
            for k, p, op, d in zip(kernel, s.padding, s.output_padding, s.dilation)]
    out = channels_last_conv_jax(cx, x, w, (1,) * n, pads, s.dilation, s.groups,
                                 lhs_dilation=s.stride)
    return out if len(a) == 2 else out + a[2].reshape((-1,) + (1,) * n)


primitive(Op.conv_transpose, ConvTranspose, range(2, 4), _conv_t_shape, _conv_t_eval,
          _conv_t_cost, "fold of a windowed product materialises every window; "
          "transposed-conv kernels do not",
          traits=Trait.KERNEL, batch=CONV_BATCH, torch=_conv_transpose_torch,
          onnx=_conv_transpose_onnx, jax=_conv_transpose_jax,
          decompose=lambda s, x, w, *bias: ops.conv_transpose(
              x, w, *bias, stride=s.stride, padding=s.padding, output_padding=s.output_padding,
              groups=s.groups, dilation=s.dilation))
