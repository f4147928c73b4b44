"""JAX contractions, reductions and windows: dot_general, conv_general_dilated, reduce_*,
argmax/argmin, reduce_window_* (pools) and the cumulative ops."""
from __future__ import annotations

import string

from tdag import ops
from tdag.canonicalize.jax.ops.table import dtype_of_np, op
from tdag.canonicalize.jax.ops.shape import interior_pad
from tdag.ops.nn.pool import first_max
from tdag.ops.nn.util import fill_value
from tdag.ir.types import DType


@op("dot_general")
def _dot_general(ctx, a, b):
    """An einsum: batch axes first, then a's free axes, then b's (lax's output order)."""
    (a_contract, b_contract), (a_batch, b_batch) = ctx.params["dimension_numbers"]
    letters = iter(string.ascii_letters)
    a_axes = [next(letters) for _ in range(a.ndim)]
    b_axes = [next(letters) for _ in range(b.ndim)]
    for i, j in zip(list(a_contract) + list(a_batch), list(b_contract) + list(b_batch)):
        b_axes[j] = a_axes[i]
    batch = [a_axes[i] for i in a_batch]
    free_a = [c for i, c in enumerate(a_axes) if i not in a_contract and i not in a_batch]
    free_b = [c for j, c in enumerate(b_axes) if j not in b_contract and j not in b_batch]
    out = ctx.out_dtype
    a, b = ops.cast(a, out), ops.cast(b, out)  # int8 x int8 -> int32 accumulates in int32
    return ops.einsum(f"{''.join(a_axes)},{''.join(b_axes)}->"
                      f"{''.join(batch + free_a + free_b)}", a, b)


@op("conv_general_dilated")
def _conv(ctx, x, w):
    """To (N, C, *S) and (O, I, *K) by the dimension numbers, lhs dilation as interior
    padding, the padding (negative crops), then tdag's conv; back to the output layout."""
    p = ctx.params
    if p.get("batch_group_count", 1) != 1:
        raise ctx.unsupported("batch_group_count > 1 (the gradient of a grouped conv)")
    lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
    x, w = ops.permute(x, *lhs_spec), ops.permute(w, *rhs_spec)
    x, w = ops.cast(x, ctx.out_dtype), ops.cast(w, ctx.out_dtype)
    for k, dilation in enumerate(p.get("lhs_dilation") or ()):
        x = interior_pad(x, 2 + k, int(dilation) - 1, 0.0)
    x = ops.pad(x, [(0, 0), (0, 0)] + [tuple(pair) for pair in p["padding"]])
    y = ops.conv(x, w, stride=tuple(p["window_strides"]), padding=0,
                 dilation=tuple(p.get("rhs_dilation") or (1,) * (w.ndim - 2)),
                 groups=int(p["feature_group_count"]))
    inverse = sorted(range(len(out_spec)), key=lambda k: out_spec[k])
    return ops.permute(y, *inverse)


# -- reductions ---------------------------------------------------------------------------------

@op("reduce_sum", "reduce_max", "reduce_min", "reduce_prod")
def _reduce(ctx, x):
    kind = ctx.prim.removeprefix("reduce_")
    return ops.reduce(x, kind, tuple(ctx.params["axes"]))


@op("reduce_and", "reduce_or")
def _reduce_bool(ctx, x):
    kind = "min" if ctx.prim == "reduce_and" else "max"
    return ops.cast(ops.reduce(ops.cast(x, DType.i32), kind, tuple(ctx.params["axes"])),
                    DType.bool)


@op("argmax", "argmin")
def _argmax(ctx, x):
    (axis,) = ctx.params["axes"]
    fn = ops.argmax if ctx.prim == "argmax" else ops.argmin
    return ops.cast(fn(x, axis), dtype_of_np(ctx.params["index_dtype"]))


# -- windows --------------------------------------------------------------------------------------

_IDENTITY = {"sum": lambda x: 0.0, "prod": lambda x: 1.0,
             "max": lambda x: fill_value(x, True), "min": lambda x: fill_value(x, False)}


@op("reduce_window_sum", "reduce_window_max", "reduce_window_min")
def _reduce_window(ctx, x):
    """Pad with the reduction's identity, one unfold per windowed axis, reduce the windows."""
    p = ctx.params
    kind = ctx.prim.removeprefix("reduce_window_")
    fill = _IDENTITY[kind](x)
    for axis, dilation in enumerate(p.get("base_dilation") or ()):
        x = interior_pad(x, axis, int(dilation) - 1, fill)
    x = ops.pad(x, [tuple(pair) for pair in p["padding"]], fill)
    rank, windows = x.ndim, 0
    for axis, (size, step, dilation) in enumerate(zip(
            p["window_dimensions"], p["window_strides"],
            p.get("window_dilation") or (1,) * x.ndim)):
        if size == 1 and step == 1:
            continue
        x = ops.unfold(x, axis, int(size), int(step), int(dilation))
        windows += 1
    if not windows:
        return x
    axes = tuple(range(rank, rank + windows))
    if kind == "max" and x.dtype.is_float:  # jax.grad gives each window's to its first max
        return ops.sum(ops.where(first_max(x, tuple(x.shape[rank:])), x, -0.0), axes)
    return ops.reduce(x, kind, axes)


@op("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
def _cumulative(ctx, x):
    """XLA's cumulative primitives keep the operand's dtype: the scan primitive, linear."""
    kind, axis = ctx.prim.removeprefix("cum"), ctx.params["axis"]
    reverse = bool(ctx.params.get("reverse"))
    if kind == "logsumexp":
        return ops.logcumsumexp(x, axis, reverse)
    return ops.scan(x, axis, {"sum": "add", "prod": "mul"}.get(kind, kind), reverse)
