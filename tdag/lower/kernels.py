"""Kernels: placeholder ops that ``tdag.lower`` puts in place of primitive patterns.

Each kernel stands for one fast framework call (``torch.matmul``, ``F.conv2d``, ``Softmax``)
and has, like a primitive, a spec, a shape rule, a reference evaluator, a cost and a reason.
Costs follow the primitives' convention (``tdag/refine/cost.py``): a contraction costs
``2*M*K*N`` flops as ``torch.utils.flop_counter``; a fused elementwise chain costs what its
decomposition costs per element; bytes are unfused traffic (inputs read, output written once).

This module holds the contractions, windows and movement kernels; ``kernels_nn`` holds the
normalisations, softmax, attention and activations. Importing ``tdag.lower`` registers both.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F

from tdag.deinops.primitive import Cost, movement_cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.symbols import Dim, as_dim, dims_equal, floordiv, format_dim, is_static, product
from tdag.ir.types import TensorType


def _fmt(shape) -> str:
    return "[" + ",".join(format_dim(d) for d in shape) + "]"


def check_bias(op: str, bias: TensorType, out: TensorType) -> None:
    """A bias is added with numpy broadcasting aligned to the output's trailing axes."""
    if bias.dtype is not out.dtype or bias.rank > out.rank:
        raise ShapeError(f"{op}: bias {bias} does not broadcast to {out}")
    for b, o in zip(reversed(bias.shape), reversed(out.shape)):
        if not (dims_equal(b, o) or (is_static(b) and b == 1)):
            raise ShapeError(f"{op}: bias {bias} does not broadcast to {out}")


# -- einsum: every two-operand contraction ----------------------------------------------------

@dataclass(frozen=True, slots=True)
class Einsum:
    """``out = einsum(equation, a, b) [+ bias]``: one letter per axis, no ellipsis. An
    optional third operand is a bias broadcast to the output's trailing axes (nn.Linear)."""

    equation: str


@lru_cache(maxsize=None)
def parse_equation(equation: str) -> tuple[tuple[str, str], str]:
    """``"bmk,nk->bmn"`` -> ``(("bmk", "nk"), "bmn")``, checked."""
    lhs, arrow, out = equation.partition("->")
    ins = tuple(lhs.split(","))
    if not arrow or len(ins) != 2:
        raise ShapeError(f"einsum: {equation!r} is not of the form 'ab,bc->ac'")
    for labels in ins + (out,):
        if not all(c.isalpha() for c in labels) or len(set(labels)) != len(labels):
            raise ShapeError(f"einsum: {equation!r}: labels must be distinct letters per operand")
    if not set(out) <= set(ins[0]) | set(ins[1]):
        raise ShapeError(f"einsum: {equation!r}: an output label is in no operand")
    return ins, out


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
    flops = 2 * product(label_sizes(spec, ins).values())  # one multiply and one add per term
    if len(ins) == 3:
        flops = flops + out.numel
    return traffic(ins, out, flops)


primitive(Op.einsum, Einsum, range(2, 4), _einsum_shape, _einsum_eval, _einsum_cost,
          "multiply + reduce-sum of broadcast operands materialises the whole product; "
          "matmul/bmm/linear never do")


# -- convolutions -----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Conv:
    """``F.conv{n}d(x[N,C,*S], w[Co,C/g,*K], bias[Co])``; symmetric zero padding."""

    stride: tuple
    padding: tuple
    dilation: tuple
    groups: int = 1


def _conv_out(length: Dim, k: Dim, stride: int, pad: int, dilation: int) -> Dim:
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
    spatial = tuple(_conv_out(x.shape[2 + i], w.shape[2 + i], spec.stride[i], spec.padding[i],
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
    flops = 2 * macs + (out.numel if len(ins) == 3 else 0)
    return traffic(ins, out, flops)


primitive(Op.conv, Conv, range(2, 4), _conv_shape, _conv_eval, _conv_cost,
          "pad + unfold + multiply + reduce materialises every window; conv kernels do not")


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
    flops = 2 * macs + (out.numel if len(ins) == 3 else 0)
    return traffic(ins, out, flops)


primitive(Op.conv_transpose, ConvTranspose, range(2, 4), _conv_t_shape, _conv_t_eval,
          _conv_t_cost, "fold of a windowed product materialises every window; "
          "transposed-conv kernels do not")


# -- pooling ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Pool:
    """Windowed max or mean over the trailing ``len(kernel)`` axes of ``x[N,C,*S]``.
    Padding counts as -inf for max and as zeros for avg (count_include_pad)."""

    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple


def _pool_shape_rule(op: str):
    def rule(spec: Pool, ins):
        (x,) = ins
        n = len(spec.kernel)
        if x.rank != n + 2 or not n == len(spec.stride) == len(spec.padding) == len(spec.dilation):
            raise ShapeError(f"{op}: {n}-d spec for input {x}")
        if not x.dtype.is_float:
            raise ShapeError(f"{op}: needs a float input, got {x}")
        if any(2 * p > k for p, k in zip(spec.padding, spec.kernel)):
            raise ShapeError(f"{op}: padding {spec.padding} over half the kernel {spec.kernel}")
        if op == "avg_pool" and any(d != 1 for d in spec.dilation):
            raise ShapeError("avg_pool: dilation must be 1")
        spatial = tuple(_conv_out(x.shape[2 + i], spec.kernel[i], spec.stride[i],
                                  spec.padding[i], spec.dilation[i]) for i in range(n))
        return x.with_shape(x.shape[:2] + spatial)
    return rule


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _max_pool_eval(spec: Pool, xs, resolve):
    return _MAX_POOL[len(spec.kernel)](xs[0], spec.kernel, spec.stride, spec.padding,
                                       spec.dilation)


def _avg_pool_eval(spec: Pool, xs, resolve):
    return _AVG_POOL[len(spec.kernel)](xs[0], spec.kernel, spec.stride, spec.padding)


def _pool_cost(spec: Pool, ins, out: TensorType) -> Cost:
    return traffic(ins, out, out.numel * product(spec.kernel))  # one flop per window element


primitive(Op.max_pool, Pool, 1, _pool_shape_rule("max_pool"), _max_pool_eval, _pool_cost,
          "pad + unfold + reduce-max materialises every window")
primitive(Op.avg_pool, Pool, 1, _pool_shape_rule("avg_pool"), _avg_pool_eval, _pool_cost,
          "pad + unfold + reduce-sum + scale materialises every window")


# -- resizing ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Resize:
    """``F.interpolate`` of the trailing ``len(sizes)`` axes of ``x[N, C, *S]``: "nearest"
    (floor of the scaled index) or "linear" (bi-/trilinear). ``scales`` None: the source
    step is in/out per axis; else torch's 1/scale (and the sizes are floor(in * scale))."""

    mode: str
    sizes: tuple
    align_corners: bool = False
    scales: tuple | None = None


_LINEAR_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


def torch_mode(spec: Resize) -> str:
    return "nearest" if spec.mode == "nearest" else _LINEAR_MODES[len(spec.sizes)]


def _resize_shape(spec: Resize, ins):
    (x,) = ins
    d = len(spec.sizes)
    if spec.mode not in ("nearest", "linear") or not 1 <= d <= 3 or x.rank != d + 2 or \
            not x.dtype.is_float or (spec.scales is not None and len(spec.scales) != d):
        raise ShapeError(f"resize: {spec} does not apply to {x}")
    return x.with_shape(x.shape[:2] + tuple(spec.sizes))


def _resize_eval(spec: Resize, xs, resolve):
    align = spec.align_corners if spec.mode == "linear" else None
    if spec.scales is None:
        return F.interpolate(xs[0], size=spec.sizes, mode=torch_mode(spec), align_corners=align)
    return F.interpolate(xs[0], scale_factor=spec.scales, mode=torch_mode(spec),
                         align_corners=align)


def _resize_cost(spec: Resize, ins, out: TensorType) -> Cost:
    per = 1 if spec.mode == "nearest" else 3 * len(spec.sizes)  # a lerp per axis
    return traffic(ins, out, out.numel * per if spec.mode == "linear" else 0)


primitive(Op.resize, Resize, 1, _resize_shape, _resize_eval, _resize_cost,
          "gathers and weighted sums per axis materialise each pass; one resize does not")


# -- movement: a collapsed chain is one view --------------------------------------------------

@dataclass(frozen=True, slots=True)
class Reshape:
    """Row-major reshape to ``shape`` (Dims): a chain of group/ungroup/squeeze/unsqueeze."""

    shape: tuple


def _reshape_shape(spec: Reshape, ins):
    (x,) = ins
    shape = tuple(as_dim(d) for d in spec.shape)
    if any(is_static(d) and d < 0 for d in shape) or not dims_equal(product(shape), x.numel):
        raise ShapeError(f"reshape: cannot reshape {x} into {_fmt(shape)}")
    return x.with_shape(shape)


primitive(Op.reshape, Reshape, 1, _reshape_shape,
          lambda spec, xs, r: xs[0].reshape([r(d) for d in spec.shape]), movement_cost,
          "one view instead of a chain of group/ungroup/squeeze/unsqueeze")


@dataclass(frozen=True, slots=True)
class Expand:
    """Numpy broadcast to ``shape``: the input aligned to the trailing axes, its size-1
    axes (and any new leading ones) repeated. Unsqueeze + repeat as one view."""

    shape: tuple


def _expand_shape(spec: Expand, ins):
    (x,) = ins
    shape = tuple(as_dim(d) for d in spec.shape)
    if x.rank > len(shape):
        raise ShapeError(f"expand: cannot broadcast {x} to {_fmt(shape)}")
    for d, t in zip(reversed(x.shape), reversed(shape)):
        if not (dims_equal(d, t) or (is_static(d) and d == 1)):
            raise ShapeError(f"expand: cannot broadcast {x} to {_fmt(shape)}")
    return x.with_shape(shape)


primitive(Op.expand, Expand, 1, _expand_shape,
          lambda spec, xs, r: xs[0].expand([r(d) for d in spec.shape]), movement_cost,
          "one broadcast view instead of unsqueeze + repeat")


@dataclass(frozen=True, slots=True)
class Concat:
    """Operands joined along ``axis``: a sum of zero-padded pieces that tile the axis."""

    axis: int


def _concat_shape(spec: Concat, ins):
    first = ins[0]
    if not 0 <= spec.axis < first.rank:
        raise ShapeError(f"concat: axis {spec.axis} out of range for {first}")
    for t in ins[1:]:
        same = t.rank == first.rank and t.dtype is first.dtype and all(
            dims_equal(a, b) for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != spec.axis)
        if not same:
            raise ShapeError(f"concat: {t} does not fit {first} along axis {spec.axis}")
    total = as_dim(sum(t.shape[spec.axis] for t in ins))
    return first.with_shape(first.shape[:spec.axis] + (total,) + first.shape[spec.axis + 1:])


primitive(Op.concat, Concat, range(1, 1 << 16), _concat_shape,
          lambda spec, xs, r: torch.cat(list(xs), spec.axis), movement_cost,
          "pads + adds write every piece at full size; a concat writes the output once")
