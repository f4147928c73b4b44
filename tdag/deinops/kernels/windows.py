"""Window kernels: pooling and resizing."""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F

from tdag.deinops.kernels.contraction import conv_out
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import product
from tdag.ir.types import TensorType

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
    return _AVG_POOL[len(spec.kernel)](xs[0], spec.kernel, spec.stride, spec.padding)


def _pool_cost(spec: Pool, ins, out: TensorType) -> Cost:
    return traffic(ins, out, out.numel * product(spec.kernel))  # one flop per window element


primitive(Op.max_pool, Pool, 1, _pool_shape_rule("max_pool"), _max_pool_eval, _pool_cost,
          "pad + unfold + reduce-max materialises every window",
          traits=Trait.KERNEL)
primitive(Op.avg_pool, Pool, 1, _pool_shape_rule("avg_pool"), _avg_pool_eval, _pool_cost,
          "pad + unfold + reduce-sum + scale materialises every window",
          traits=Trait.KERNEL)


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
          "gathers and weighted sums per axis materialise each pass; one resize does not",
          traits=Trait.KERNEL)
