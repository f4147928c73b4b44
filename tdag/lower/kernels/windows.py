"""Window kernels: pooling and resizing."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch.nn.functional as F

from tdag import ops
from tdag.deinops.codegen import tuple_expr
from tdag.lower.kernels.common import NDIM
from tdag.lower.kernels.contraction import conv_out
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, is_static, product
from tdag.ir.types import DType, TensorType

# -- pooling ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Pool:
    """Windowed max or mean over the trailing ``len(kernel)`` axes of ``x[N,C,*S]``.
    Padding counts as -inf for max; for avg as zeros, or with ``exclude_pad`` not at all (the
    mean of a window's real cells: ONNX's default, torch's count_include_pad=False)."""

    kernel: tuple
    stride: tuple
    padding: tuple
    dilation: tuple
    exclude_pad: bool = False


def _pool_shape_rule(op: str):
    def rule(spec: Pool, ins):
        (x,) = ins
        n = len(spec.kernel)
        if x.rank != n + 2 or not n == len(spec.stride) == len(spec.padding) == len(spec.dilation):
            raise ShapeError(f"{op}: {n}-d spec for input {x}")
        if not (x.dtype.is_float or op == "max_pool" and x.dtype in (DType.u8, DType.i8)):
            raise ShapeError(f"{op}: needs a float input (max_pool: or 8-bit), got {x}")
        if any(2 * p > k for p, k in zip(spec.padding, spec.kernel)):
            raise ShapeError(f"{op}: padding {spec.padding} over half the kernel {spec.kernel}")
        if op == "avg_pool" and any(d != 1 for d in spec.dilation):
            raise ShapeError("avg_pool: dilation must be 1")
        spatial = tuple(conv_out(x.shape[2 + i], spec.kernel[i], spec.stride[i],
                                  spec.padding[i], spec.dilation[i]) for i in range(n))
        return x.with_shape(x.shape[:2] + spatial)
    return rule


_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _max_pool_eval(spec: Pool, xs, resolve):
    return _MAX_POOL[len(spec.kernel)](xs[0], spec.kernel, spec.stride, spec.padding,
                                       spec.dilation)


def _avg_pool_eval(spec: Pool, xs, resolve):
    return _AVG_POOL[len(spec.kernel)](xs[0], spec.kernel, spec.stride, spec.padding,
                                       count_include_pad=not spec.exclude_pad)


def _pool_cost(spec: Pool, ins, out: TensorType) -> Cost:
    return traffic(ins, out, out.numel * product(spec.kernel))  # one flop per window element


def global_pool(node, in_shape) -> bool:
    """A pool whose one window covers the whole (static) spatial extent."""
    return _covers_all(node.spec, in_shape)


def _covers_all(s, in_shape) -> bool:
    return all(p == 0 for p in s.padding) and all(d == 1 for d in s.dilation) and \
        tuple(in_shape[2:]) == tuple(s.kernel)


# torch's CPU max pooling is several times faster channels-last than on (N, C, *S) (the
# copies there and back included); the values and indices are the same
CHANNELS_LAST = {2: "channels_last", 3: "channels_last_3d"}
# ... but refuses 8-bit integers so (a quantized model's pools; torch 2.13: "Expected
# input_depth * input_height * input_width <= numeric_limits<integer_t>::max()"): those pool
# on (N, C, *S), a value the module holds channels-last copied there and back
EIGHT_BIT = frozenset({DType.i8, DType.u8})


def _max_pool_torch(node, a, code):
    s = node.spec
    if global_pool(node, code.shape_of(node.inputs[0])):  # what adaptive pooling to 1 runs
        return f"{a[0]}.amax({tuple_expr(range(2, node.type.rank))}, keepdim=True)"
    layout = CHANNELS_LAST.get(len(s.kernel))
    held = code.channels_last(node.inputs[0])  # the module's layout (reify/torch/layout)
    if node.type.dtype in EIGHT_BIT:
        pooled = _max_pool_call(s, f"{a[0]}.contiguous()" if held else a[0])
        return f"{pooled}.contiguous(memory_format=torch.{layout})" if held else pooled
    if held:
        return _max_pool_call(s, a[0])
    x = a[0] if layout is None else f"{a[0]}.contiguous(memory_format=torch.{layout})"
    pooled = _max_pool_call(s, x)
    return pooled if layout is None else f"{pooled}.contiguous()"


def _max_pool_call(s, x: str) -> str:
    return (f"F.max_pool{NDIM[len(s.kernel)]}({x}, {tuple_expr(s.kernel)}, "
            f"{tuple_expr(s.stride)}, {tuple_expr(s.padding)}, {tuple_expr(s.dilation)})")


def _max_pool_workspace(spec, ins, out: TensorType, contiguous) -> Dim:
    """The int64 indices ATen's CPU max_pool2d computes and drops (it runs
    max_pool2d_with_indices) beside the pooled result and, for a (N, C, *S) input, its
    channels-last copy, which the copy back to (N, C, *S) replaces once the input's copy is
    freed (``_max_pool_torch``); an input that is not (N, C, *S) is the module's channels-last
    layout, pooled as it is (an 8-bit one copied to (N, C, *S) and its result back). None for
    a global pool (an amax)."""
    if _covers_all(spec, ins[0].shape) or len(spec.kernel) not in CHANNELS_LAST:
        return 0
    copy = ins[0].numel * ins[0].dtype.itemsize
    if ins[0].dtype in EIGHT_BIT:
        copy = 0 if contiguous[0] else copy + out.numel * out.dtype.itemsize
    elif not contiguous[0]:
        copy = 0
    return as_dim(copy + out.numel * 8)


def _max_pool_onnx(node, ins, g, cx):
    s = node.spec
    if global_pool(node, cx.type(node.inputs[0]).shape):
        return g.node("GlobalMaxPool", ins)
    return g.node("MaxPool", ins, kernel_shape=list(s.kernel), strides=list(s.stride),
                  pads=list(s.padding) * 2, dilations=list(s.dilation))


def window_jax(cx, x, spec: Pool, init, combine):
    """``lax.reduce_window`` over the trailing spatial axes, padded with ``init``."""
    lead = (1,) * (x.ndim - len(spec.kernel))
    return cx.lax.reduce_window(  # a Python scalar init: JAX's differentiable max/sum windows
        x, init, combine, lead + tuple(spec.kernel),
        lead + tuple(spec.stride), [(0, 0)] * len(lead) + [(p, p) for p in spec.padding],
        window_dilation=lead + tuple(spec.dilation))


def _max_pool_jax(node, a, cx):
    x = a[0]
    low = -cx.jnp.inf if cx.jnp.issubdtype(x.dtype, cx.jnp.floating) else \
        cx.jnp.array(cx.jnp.iinfo(x.dtype).min, x.dtype)  # an 8-bit max_pool's
    return window_jax(cx, x, node.spec, low, cx.lax.max)


def _avg_pool_jax(node, a, cx):
    """The window sum over the cell count: the kernel's size, or with ``exclude_pad`` the
    real cells only (the same window sum over ones)."""
    s = node.spec
    total = window_jax(cx, a[0], s, 0.0, cx.lax.add)
    if s.exclude_pad and any(s.padding):
        return total / window_jax(cx, cx.jnp.ones(a[0].shape[2:], a[0].dtype)[None, None], s,
                                   0.0, cx.lax.add)
    return total / product(s.kernel)


_LAYOUT = Refuse("works on the framework's fixed (N, C, *S) layout: strip the batch before "
                 "lowering")

primitive(Op.max_pool, Pool, 1, _pool_shape_rule("max_pool"), _max_pool_eval, _pool_cost,
          "pad + unfold + reduce-max materialises every window",
          traits=Trait.KERNEL, batch=_LAYOUT, torch=_max_pool_torch, onnx=_max_pool_onnx,
          jax=_max_pool_jax, workspace=_max_pool_workspace,
          decompose=lambda s, x: ops.max_pool(x, s.kernel, s.stride, s.padding, s.dilation))


def _avg_pool_torch(node, a, code):
    s = node.spec
    if global_pool(node, code.shape_of(node.inputs[0])):
        return f"{a[0]}.mean({tuple_expr(range(2, node.type.rank))}, keepdim=True)"
    exclude = ", count_include_pad=False" if s.exclude_pad and any(s.padding) else ""
    return (f"F.avg_pool{NDIM[len(s.kernel)]}({a[0]}, {tuple_expr(s.kernel)}, "
            f"{tuple_expr(s.stride)}, {tuple_expr(s.padding)}{exclude})")


def _avg_pool_onnx(node, ins, g, cx):
    s = node.spec
    if global_pool(node, cx.type(node.inputs[0]).shape):
        return g.node("GlobalAveragePool", ins)
    return g.node("AveragePool", ins, kernel_shape=list(s.kernel), strides=list(s.stride),
                  pads=list(s.padding) * 2, count_include_pad=0 if s.exclude_pad else 1)


primitive(Op.avg_pool, Pool, 1, _pool_shape_rule("avg_pool"), _avg_pool_eval, _pool_cost,
          "pad + unfold + reduce-sum + scale materialises every window",
          traits=Trait.KERNEL, batch=_LAYOUT, torch=_avg_pool_torch, onnx=_avg_pool_onnx,
          jax=_avg_pool_jax,
          decompose=lambda s, x: ops.avg_pool(x, s.kernel, s.stride, s.padding,
                                              count_include_pad=not s.exclude_pad))


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


def _resize_torch(node, a, code):
    s = node.spec
    align = f", align_corners={s.align_corners}" if s.mode == "linear" else ""
    target = f"size={tuple_expr(s.sizes)}" if s.scales is None else \
        f"scale_factor={tuple_expr(s.scales)}"
    return f"F.interpolate({a[0]}, {target}, mode={torch_mode(s)!r}{align})"


def _resize_onnx(node, ins, g, cx):
    """Resize with torch's coordinates: floor-nearest on asymmetric coordinates, linear on
    pytorch_half_pixel or align_corners; sizes (or torch's explicit scales) as given."""
    s = node.spec
    if s.mode == "nearest":
        attrs = dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                     nearest_mode="floor")
    else:  # half_pixel is pytorch_half_pixel except for size-1 outputs, and runs faster
        half = "half_pixel" if all(n != 1 for n in s.sizes) else "pytorch_half_pixel"
        attrs = dict(mode="linear", coordinate_transformation_mode=(
            "align_corners" if s.align_corners else half))
    scales = s.scales if s.scales is not None else _exact_scales(cx.type(node.inputs[0]), s)
    if scales is not None:  # constant scales let onnxruntime use its fast upsampling
        scales = g.const([1.0, 1.0] + [float(v) for v in scales], DType.f32)
        return g.node("Resize", [ins[0], "", scales], **attrs)
    sizes = g.node("Concat", [g.node("Shape", ins, end=2), g.const(list(s.sizes))], axis=0)
    return g.node("Resize", [ins[0], "", "", sizes], **attrs)


def _exact_scales(x_type, spec) -> tuple | None:
    """out/in per axis when float32 reproduces every size exactly (then the scale and the
    size ratio give the same coordinates)."""
    scales = []
    for n, out in zip(x_type.shape[2:], spec.sizes):
        if not is_static(n) or not n:
            return None
        scale = float(np.float32(out / n))
        if math.floor(np.float32(scale) * np.float32(n)) != out or \
                float(np.float32(n) / np.float32(out)) != float(np.float32(1 / scale)):
            return None
        scales.append(scale)
    return tuple(scales)


def _source_scale(spec: Resize, i: int, n: int, out: int) -> np.float32:
    """torch's step in input cells per output cell (area_pixel_compute_scale), in float32."""
    if spec.mode == "linear" and spec.align_corners:
        return np.float32((n - 1) / (out - 1)) if out > 1 else np.float32(0)
    if spec.scales is not None:
        return np.float32(1.0 / spec.scales[i])
    return np.float32(n) / np.float32(out)


def _resize_axis_jax(cx, x, spec: Resize, i: int):
    """Resize spatial axis ``i`` as torch's CPU kernel does: the source coordinate of each
    output cell in float32, then the floor cell (nearest) or a lerp of two cells (linear).
    The coordinates are static: the gathers and weights are constants."""
    axis, out = 2 + i, int(spec.sizes[i])
    n = x.shape[axis]
    scale, dst = _source_scale(spec, i, n, out), np.arange(out, dtype=np.float32)
    if spec.mode == "nearest":
        index = np.minimum(np.floor(dst * scale).astype(np.int64), n - 1)
        return cx.jnp.take(x, index, axis=axis)
    src = dst * scale if spec.align_corners else np.maximum(scale * (dst + 0.5) - 0.5, 0)
    lo = src.astype(np.int64)
    hi = lo + (lo < n - 1)
    shape = (out,) + (1,) * (x.ndim - axis - 1)
    weight = cx.jnp.asarray((src - lo).reshape(shape), x.dtype)
    a, b = cx.jnp.take(x, lo, axis=axis), cx.jnp.take(x, hi, axis=axis)
    return a * (1 - weight) + b * weight


def _resize_jax(node, a, cx):
    x = a[0]
    for i in range(len(node.spec.sizes)):  # nearest and (bi/tri)linear are separable
        x = _resize_axis_jax(cx, x, node.spec, i)
    return x


def _resize_decompose(spec: Resize, x):
    align = spec.align_corners if spec.mode == "linear" else None
    if spec.scales is None:
        return ops.interpolate(x, size=spec.sizes, mode=torch_mode(spec), align_corners=align)
    return ops.interpolate(x, scale_factor=spec.scales, mode=torch_mode(spec),
                           align_corners=align)


primitive(Op.resize, Resize, 1, _resize_shape, _resize_eval, _resize_cost,
          "gathers and weighted sums per axis materialise each pass; one resize does not",
          traits=Trait.KERNEL, batch=_LAYOUT, torch=_resize_torch, onnx=_resize_onnx,
          jax=_resize_jax, decompose=_resize_decompose)
