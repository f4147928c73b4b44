"""ONNX ops that make a tensor: Constant, ConstantOfShape, Range, Shape, Size, EyeLike, OneHot
and Trilu (a triangle of its input, from the same row and column comparison as EyeLike).

Constants and shapes become shape values (Knowns, onnx/values.py) where small and integer, so
later Reshape and Expand see their sizes; a size given at run time is a fresh one
(onnx/runtime.py).
"""
from __future__ import annotations

import math

import numpy as np
import sympy
import torch
from onnx import numpy_helper

from tdag import ops
from tdag.canonicalize.onnx import runtime
from tdag.canonicalize.onnx.load import dense_of_sparse, dtype_of, tensor_of
from tdag.canonicalize.onnx.ops.table import is_constant, norm_axis, register
from tdag.canonicalize.onnx.values import MAX_TABLE, Known, dim_max, fits, known_of
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import as_dim, floordiv, is_static, product
from tdag.ops.creation import dim_tensor
from tdag.ir.types import DType, TensorKind


# -- constants and shape values --------------------------------------------------------------------

@register("Constant")
def _constant(ctx):
    attrs = ctx.attrs
    if "value" in attrs:
        dtype_of(attrs["value"].data_type, "Constant's value")
        value = tensor_of(numpy_helper.to_array(attrs["value"]))
    elif "sparse_value" in attrs:
        dtype_of(attrs["sparse_value"].values.data_type, "Constant's sparse_value")
        value = tensor_of(dense_of_sparse(attrs["sparse_value"]))
    elif "value_float" in attrs or "value_floats" in attrs:
        value = torch.tensor(attrs.get("value_float", attrs.get("value_floats")),
                             dtype=torch.float32)
    elif "value_int" in attrs or "value_ints" in attrs:
        value = torch.tensor(attrs.get("value_int", attrs.get("value_ints")), dtype=torch.int64)
    else:
        raise UnsupportedOpError(f"Constant: attribute {sorted(attrs)} is not supported")
    known = known_of(value)
    if known is not None:
        return known
    name = ctx.importer.names(ctx.node.output[0])
    if name in ctx.builder.names.taken:
        name = ctx.builder.fresh(name + "_")
    return ctx.builder.weight(name, TensorKind.const, value)


@register("Shape")
def _shape(ctx, x):
    shape = list(x.shape)
    start, end = ctx.attr("start", 0), ctx.attr("end", len(shape))
    return Known(np.array(shape[slice(start, end)], dtype=object).reshape(-1), DType.i64)


@register("Size")
def _size(ctx, x):
    return Known(np.array(product(x.shape), dtype=object), DType.i64)


@register("ConstantOfShape")
def _constant_of_shape(ctx, shape):
    fill = ctx.attrs.get("value")
    value = tensor_of(numpy_helper.to_array(fill)) if fill is not None else torch.tensor(0.0)
    if value.numel() != 1:
        raise InvalidModelError(f"ConstantOfShape: the value must hold one element, not "
                                f"{value.numel()}")
    value = value.reshape(())
    if ctx.known(shape) is None:
        return runtime.constant_of_shape(ctx, shape, value)
    dims = ctx.ints(shape, "shape")
    if any(is_static(d) and d < 0 for d in dims):
        raise InvalidModelError(f"ConstantOfShape: the shape {dims} has a negative size")
    if fits(dims):  # an empty shape is a scalar (torch's expand() needs a tuple for it)
        known = known_of(value.expand(tuple(int(d) for d in dims)).clone())
        if known is not None:
            return known
    if all(is_static(d) for d in dims):  # a weight the file fills: a const, one element big
        return ctx.const_tensor(value.expand(tuple(int(d) for d in dims)))
    return ops.full(tuple(dims), value.item(), DType.of(value.dtype))


@register("Range")
def _range(ctx, start, limit, delta):
    if not all(is_constant(ctx, v) for v in (start, limit, delta)):
        return runtime.range_(ctx, start, limit, delta, ctx.tensor(start).dtype)
    start_given, limit_given, delta_given = start, limit, delta
    start, limit, delta = (ctx.scalar(v, what) for v, what in
                           ((start, "start"), (limit, "limit"), (delta, "delta")))
    out_type = ctx.importer.types.get(ctx.node.output[0])
    dtype = ctx.dtype(out_type.tensor_type.elem_type) if out_type is not None else DType.i64
    if delta == 0:
        raise InvalidModelError("Range: delta must not be 0")
    static = all(is_static(v) or isinstance(v, float) for v in (start, limit, delta))
    if static and math.ceil((limit - start) / delta) <= MAX_TABLE:  # else a lazy arange
        return ctx.const_tensor(torch.arange(start, limit, delta, dtype=dtype.torch))
    if static:
        return ops.arange(start, limit, delta, dtype)
    if dtype.is_float or not is_static(delta):  # symbolic float bounds or step: as data
        return runtime.range_(ctx, start_given, limit_given, delta_given, dtype)
    # positions past a symbolic size (a KV cache's ``Range(past, past + seq)``): the count
    # max(ceil((limit - start) / delta), 0) stays a Dim, the start is read from the shapes
    count = dim_max(floordiv(as_dim(abs(delta) - 1 + (limit - start if delta > 0 else
                                                       start - limit)), abs(delta)), 0)
    out = ops.mul(ops.iota(count, DType.i64, ctx.builder), delta)
    if not (is_static(start) and start == 0):
        out = ops.add(out, dim_tensor(sympy.sympify(start)) if not is_static(start) else start)
    return ops.cast(out, dtype)


# -- diagonals, triangles and one-hots -------------------------------------------------------------

@register("EyeLike")
def _eye_like(ctx, x):
    x = ctx.tensor(x)
    dtype = ctx.dtype(ctx.attr("dtype")) if ctx.attr("dtype") is not None else x.dtype
    rows = ops.unsqueeze(ops.iota(x.shape[0]), 1)
    cols = ops.unsqueeze(ops.iota(x.shape[1]), 0)
    return ops.cast(ops.eq(ops.sub(cols, rows), ctx.attr("k", 0)), dtype)


@register("Trilu")
def _trilu(ctx, x, k=None):
    """Keep the elements on and above (upper) or below the k-th diagonal; k may be a run-time
    scalar (compared as a tensor)."""
    x = ctx.tensor(x)
    known = ctx.known(k) if k is not None else None
    if k is None:
        offset = 0
    elif known is not None and known.static:
        offset = int(np.asarray(known.values).reshape(-1)[0])
    else:
        offset = ops.reshape(ops.cast(ctx.tensor(k), DType.i64), ())
    rows = ops.unsqueeze(ops.iota(x.shape[-2]), 1)
    cols = ops.unsqueeze(ops.iota(x.shape[-1]), 0)
    diag = ops.sub(cols, rows)  # column minus row: k-th diagonal where it equals k
    keep = ops.ge(diag, offset) if ctx.flag("upper", 1) else ops.le(diag, offset)
    return ops.where(keep, x, ops.zeros((), x.dtype, like=x))


@register("OneHot")
def _one_hot(ctx, index, depth, values):
    """``values[1]`` where the position along the new ``axis`` equals the index (negative
    counts from depth), ``values[0]`` elsewhere; a run-time depth is a fresh size."""
    index, values = ctx.tensor(index), ctx.tensor(values)
    axis = norm_axis(ctx.attr("axis", -1), index.ndim + 1)
    known = ctx.known(depth)
    if known is not None and known.static:
        n = int(float(np.asarray(known.values).reshape(-1)[0]))
        positions, depth_t = ops.iota(n, "i64", index.builder), n
    else:
        depth_t = ops.cast(ops.reshape(ctx.tensor(depth), ()), DType.i64)
        positions = ops.arange_of(depth_t)
    index = ops.cast(index, DType.i64) if not index.dtype.is_float else \
        ops.cast(ops.trunc(index), DType.i64)
    index = ops.where(ops.lt(index, 0), ops.add(index, depth_t), index)
    shape = [1] * (index.ndim + 1)
    shape[axis] = positions.shape[0]
    hit = ops.eq(ops.unsqueeze(index, axis), ops.reshape(positions, tuple(shape)))
    off, on = ops.select(values, 0, 0), ops.select(values, 0, 1)
    return ops.where(hit, on, off)
