"""The ONNX op table (``OPS``, a Registry) and the helpers its entries share.

An entry takes ``(ctx, *inputs)``: ``ctx`` is the NodeContext (onnx/context.py: attributes,
opset, value helpers), inputs are Tensors, Knowns (shape values, see onnx/values.py) or None
for an omitted optional input. It returns one value or a tuple (None for an output tdag does
not compute). Opset differences live inside the entry: an attribute in old opsets is an input
in new ones.

The entries live a family a file beside this one (onnx/ops/__init__.py imports them all):
elementwise, bitwise, activations, creation, passthrough, movement, indexing, sorting,
reductions, linalg, conv, pool, norm, attention, signal, resize, quant, loss, ml (and
ml_linear, ml_svm, ml_trees, ml_features), functions, training, vision and contrib
(onnxruntime's com.microsoft domain).
``OPS.where("Gelu")`` names the file that maps an op.

The helpers here: axes counted from 0 (``norm_axis``, ``norm_axes``, ``axes_of``), whether a
scalar input is known at import time (``is_constant``), the window attributes convolutions and
pools read (``kernel_shape``, ``window_attrs``, ``pre_pad``, ``group_count``) and 0..n-1
positions for a static or run-time count (``arange_i64``).
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.common.registry import Registry
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

OPS = Registry("the ONNX op table")
register = OPS.register


def table_key(op_type: str, domain: str) -> str:
    """A node's key in ``OPS``: ``domain:op`` where that domain's op means something else
    than the default domain's of the same name (com.microsoft's Attention packs its Q/K/V
    weights, the default domain's takes Q, K and V), else the op type itself."""
    qualified = f"{domain}:{op_type}"
    return qualified if qualified in OPS else op_type


# -- axes ------------------------------------------------------------------------------------------

def norm_axis(axis: int, rank: int, end_ok: bool = False) -> int:
    """An axis in [-rank, rank) (to rank inclusive where ``end_ok``: an insertion point, as
    Flatten's), counted from 0; any other is a malformed model."""
    if type(axis) is not int or not -rank <= axis < rank + end_ok:
        raise InvalidModelError(f"axis {axis!r} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(axes, rank: int) -> tuple:
    """Distinct axes, each in range (a repeated one is malformed, not merged)."""
    normed = tuple(norm_axis(int(a), rank) for a in axes)
    if len(set(normed)) != len(normed):
        raise InvalidModelError(f"axes {list(axes)} repeat an axis")
    return normed


def axes_of(ctx, axes_input, first_input_opset: int):
    """Axes from the attribute (before ``first_input_opset``) or the input (from it on)."""
    if ctx.opset < first_input_opset:
        axes = ctx.attr("axes")
        return list(axes) if axes is not None else None
    return [int(a) for a in ctx.ints(axes_input, "axes")] if axes_input is not None else None


def is_constant(ctx, value) -> bool:
    """Whether a scalar input is known at import time (a Known or a constant weight)."""
    try:
        ctx.scalar(value)
    except UnsupportedOpError:
        return False
    return True


# -- windows: convolutions and pools ---------------------------------------------------------------

AUTO_PAD = ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER")


def _pads(ctx, spatial, kernel, strides, dilations):
    """(begins, ends) per spatial axis, from ``pads`` or ``auto_pad``."""
    n, auto = len(kernel), ctx.choice("auto_pad", "NOTSET", AUTO_PAD)
    if auto in ("NOTSET", ""):
        pads = ctx.sizes("pads", 2 * n, 0, least=0)
        return pads[:n], pads[n:]
    if auto == "VALID":
        return [0] * n, [0] * n
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        if not is_static(size):
            raise UnsupportedOpError(f"{ctx.node.op_type}: auto_pad={auto} on a symbolic size")
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(big if auto == "SAME_UPPER" else small)
    return begins, ends


def kernel_shape(ctx, x, default=None) -> list:
    """kernel_shape: one size >= 1 per spatial axis of ``x`` (Conv's default: the weight's)."""
    if ctx.attr("kernel_shape") is not None:
        return ctx.sizes("kernel_shape", x.ndim - 2, 0, least=1)
    if default is None:
        raise InvalidModelError(f"{ctx.node.op_type}: kernel_shape is required")
    return list(default)


def window_attrs(ctx, x, kernel):
    """(strides, dilations, begins, ends) per spatial axis: the window a kernel slides."""
    n = len(kernel)
    strides = ctx.sizes("strides", n, 1, least=1)
    dilations = ctx.sizes("dilations", n, 1, least=1)
    begins, ends = _pads(ctx, x.shape[2:], kernel, strides, dilations)
    return strides, dilations, begins, ends


def pre_pad(x, begins, ends, value=0.0):
    """Asymmetric padding as an explicit pad, so the kernel op sees symmetric (zero) padding."""
    if begins == ends:
        return x, list(begins)
    return ops.pad(x, [(0, 0), (0, 0)] + list(zip(begins, ends)), value), [0] * len(begins)


def group_count(ctx) -> int:
    """A convolution's ``group`` attribute: at least 1."""
    group = ctx.attr("group", 1)
    if type(group) is not int or group < 1:
        raise InvalidModelError(f"{ctx.node.op_type}: group must be at least 1, got {group!r}")
    return group


# -- positions -------------------------------------------------------------------------------------

def arange_i64(count, builder):
    """0..count-1 as i64: an iota for a static count, an arange of a run-time scalar."""
    if isinstance(count, int):
        return ops.iota(count, "i64", builder)
    return ops.arange_of(ops.cast(count, DType.i64))
