"""Array compositions over the primitive wrappers of ``core``: concatenation and splitting,
tiling, indexing, statistics (mean, var, arg-extremes, prefix sums) and contractions.

Each is built from primitives the seed's way: concat is pads + add, matmul is unsqueeze +
repeat + multiply + reduce-sum (prefix sums are ``tdag.ops.scans``).
"""
from __future__ import annotations

import builtins
from typing import Sequence

import torch

from tdag.ops.core import (
    abs,
    add,
    amax,
    amin,
    as_tensor,
    axis_length,
    broadcast_to,
    cast,
    div,
    eq,
    flatten,
    gather,
    group,
    isnan,
    logical_or,
    mul,
    ne,
    pad,
    pow,
    reduce,
    repeat_axes,
    reshape,
    select,
    slice,
    sqrt,
    squeeze,
    sub,
    sum,
    to_float,
    transpose,
    unsqueeze,
    where,
)
from tdag.ops.creation import arange, full, size_tensor
from tdag.ops.promotion import (
    broadcast_shapes,
    builder_of,
    describe_operands,
    norm_axes,
    norm_axis,
    result_dtype,
)
from tdag.ops.tensor import Tensor
from tdag.deinops.reduce import ReduceKind
from tdag.errors import ShapeError
from tdag.ir.symbols import as_dim, dims_equal, is_static
from tdag.ir.types import DType

# -- concatenation ----------------------------------------------------------------------------


def concat(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Concatenate as pads + add (the seed's composition)."""
    xs = [x for x in xs]
    dtype = xs[0].dtype
    for x in xs[1:]:
        dtype = DType.of(torch.promote_types(dtype.torch, x.dtype.torch))
    axis = norm_axis(axis, xs[0].ndim)
    for x in xs[1:]:
        if x.ndim != xs[0].ndim or not all(dims_equal(d, e) for i, (d, e)
                                           in enumerate(zip(x.shape, xs[0].shape)) if i != axis):
            raise ShapeError(f"concat: operands differ off axis {axis} (operands: "
                             f"{describe_operands(xs)})", origin=x.builder.origin)
    xs = [cast(x, dtype) for x in xs]
    xs = [x for x in xs if not (is_static(x.shape[axis]) and x.shape[axis] == 0)] or xs[:1]
    if len(xs) == 1:
        return xs[0]
    if dtype is DType.bool:
        return cast(concat([cast(x, DType.u8) for x in xs], axis), DType.bool)
    total = as_dim(builtins.sum(x.shape[axis] for x in xs))
    # x + (-0.0) is x for every x, -0.0 included, where x + 0.0 turns -0.0 into 0.0
    fill = -0.0 if (dtype.is_float and not dtype.is_float8) or dtype.is_complex else 0.0
    result, offset = None, 0
    for x in xs:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (offset, as_dim(total - offset - x.shape[axis]))
        part = pad(x, widths, fill)
        result = part if result is None else add(result, part)
        offset = as_dim(offset + x.shape[axis])
    return result


cat = concat


def stack(xs: Sequence[Tensor], axis: int = 0) -> Tensor:
    axis = axis % (xs[0].ndim + 1)
    return concat([unsqueeze(x, axis) for x in xs], axis)


def split(x: Tensor, sizes, axis: int = 0) -> list[Tensor]:
    """``torch.split``: an int chunk size, or a list of sizes."""
    axis = norm_axis(axis, x.ndim)
    dim = x.shape[axis]
    if isinstance(sizes, int):
        if not is_static(dim):
            raise ShapeError(f"split: needs explicit sizes for the symbolic axis {dim}")
        sizes = [builtins.min(sizes, dim - i) for i in range(0, dim, sizes)] or [0]
    out, offset = [], 0
    for size in sizes:
        out.append(slice(x, axis, offset, as_dim(offset + size)))
        offset = as_dim(offset + size)
    return out


def chunk(x: Tensor, chunks: int, axis: int = 0) -> list[Tensor]:
    dim = x.shape[norm_axis(axis, x.ndim)]
    if not is_static(dim):
        raise ShapeError("chunk: the axis must be static")
    return split(x, -(-dim // chunks), axis)


def tile(x: Tensor, *reps) -> Tensor:
    """torch's ``Tensor.repeat``: the whole tensor copied ``reps[i]`` times along axis i."""
    if len(reps) == 1 and isinstance(reps[0], (tuple, list)):
        reps = tuple(reps[0])
    if len(reps) > x.ndim:
        x = unsqueeze(x, tuple(range(len(reps) - x.ndim)))
    reps = (1,) * (x.ndim - len(reps)) + tuple(reps)
    for axis in range(x.ndim - 1, -1, -1):
        if reps[axis] != 1:
            x = unsqueeze(x, axis)
            x = repeat_axes(x, (axis,), (reps[axis],))
            x = group(x, axis, 2)
    return x


def repeat_interleave(x: Tensor, repeats: int, axis: int | None = None) -> Tensor:
    if axis is None:
        x, axis = flatten(x), 0
    axis = norm_axis(axis, x.ndim)
    x = unsqueeze(x, axis + 1)
    x = repeat_axes(x, (axis + 1,), (repeats,))
    return group(x, axis, 2)


def index(x: Tensor, key) -> Tensor:
    """``x[key]`` for ints, slices, None, Ellipsis and one integer-tensor index."""
    if not isinstance(key, tuple):
        key = (key,)
    n_real = builtins.sum(1 for k in key if k is not None and k is not Ellipsis)
    if builtins.sum(1 for k in key if k is Ellipsis) > 1:
        raise ShapeError("index: more than one Ellipsis")
    expanded = []
    for k in key:
        if k is Ellipsis:
            expanded += [builtins.slice(None)] * (x.ndim - n_real)
        else:
            expanded.append(k)
    axis = 0
    for k in expanded:
        if k is None:
            x = unsqueeze(x, axis)
            axis += 1
        elif isinstance(k, builtins.slice):
            x = slice(x, axis, k.start, k.stop, k.step or 1)
            axis += 1
        elif isinstance(k, (Tensor, torch.Tensor)):
            idx = as_tensor(k, x.builder)
            if idx.dtype is DType.bool:
                raise ShapeError("index: boolean masks give data-dependent shapes; use where")
            x = gather(x, idx, axis)
            axis += idx.ndim
        else:
            x = select(x, axis, k)
    return x



# -- statistics -------------------------------------------------------------------------------


def mean(x: Tensor, axis=None, keepdim: bool = False) -> Tensor:
    x = to_float(x)
    axes = norm_axes(axis, x.ndim)
    return div(sum(x, axes, keepdim), size_tensor(x, axes, x.dtype))


def var(x: Tensor, axis=None, keepdim: bool = False, correction: int = 1) -> Tensor:
    x = to_float(x)
    axes = norm_axes(axis, x.ndim)
    centered = sub(x, mean(x, axes, keepdim=True))
    total = sum(mul(centered, centered), axes, keepdim)
    count = size_tensor(x, axes, x.dtype)
    return div(total, sub(count, correction) if correction else count)


def vector_norm(x: Tensor, ord: float = 2.0, axis=None, keepdim: bool = False) -> Tensor:
    """``torch.linalg.vector_norm``: (sum |x|^ord)^(1/ord) over ``axis`` (all by default);
    ord inf and -inf the largest and smallest |x|, 0 the count of nonzeros. A real x's
    2-norm squares x itself (|x|^2 is x * x)."""
    x = to_float(x)
    axes = norm_axes(axis, x.ndim)
    if ord == 2 and x.dtype.is_float:
        return sqrt(sum(mul(x, x), axes, keepdim))
    magnitude = abs(x)
    if ord == float("inf"):
        return amax(magnitude, axes, keepdim)
    if ord == float("-inf"):
        return amin(magnitude, axes, keepdim)
    if ord == 0:
        return sum(cast(ne(magnitude, 0.0), magnitude.dtype), axes, keepdim)
    if ord == 1:
        return sum(magnitude, axes, keepdim)
    if ord == 2:
        return sqrt(sum(mul(magnitude, magnitude), axes, keepdim))
    return pow(sum(pow(magnitude, float(ord)), axes, keepdim), 1.0 / ord)


def argmax(x: Tensor, axis: int, keepdim: bool = False) -> Tensor:
    """First index of the maximum along ``axis``, as torch.argmax."""
    return _arg_extreme(x, axis, keepdim, amax)


def argmin(x: Tensor, axis: int, keepdim: bool = False) -> Tensor:
    return _arg_extreme(x, axis, keepdim, amin)


def _arg_extreme(x: Tensor, axis: int, keepdim: bool, extreme) -> Tensor:
    """The first position where x is the extreme or NaN (torch's rule: the first NaN wins).
    Every row has such a position (a NaN, else the extreme is one of its values), so the
    positions that miss read as n - 1 rather than n: the result, and its bounds as
    strip_batch reads them, stay in [0, n - 1] (an index into the row, as GPT-2's pooler
    uses it)."""
    axis = norm_axis(axis, x.ndim)
    hit = logical_or(eq(x, extreme(x, axis, keepdim=True)), isnan(x))
    positions = arange(0, x.shape[axis], like=x)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    positions = broadcast_to(reshape(positions, shape), x.shape)
    miss = full(x.shape, -1, DType.i64, like=x)
    miss = add(miss, axis_length(x, axis, DType.i64))
    return amin(where(hit, positions, miss), axis, keepdim)


# -- contractions -----------------------------------------------------------------------------


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """torch.matmul as unsqueeze + repeat + multiply + reduce-sum, batch dims broadcast."""
    builder = builder_of(a, b)
    a, b = as_tensor(a, builder), as_tensor(b, builder)
    operands = [a, b]
    dtype = result_dtype(a, b)
    a, b = cast(a, dtype), cast(b, dtype)
    squeeze_a = a.ndim == 1
    squeeze_b = b.ndim == 1
    if squeeze_a:
        a = unsqueeze(a, 0)
    if squeeze_b:
        b = unsqueeze(b, 1)
    if not dims_equal(a.shape[-1], b.shape[-2]):
        raise ShapeError(f"matmul: the contracted axes disagree (operands: "
                         f"{describe_operands(operands)})", origin=builder.origin)
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    m, k = a.shape[-2:]
    n = b.shape[-1]
    a = broadcast_to(unsqueeze(a, a.ndim), batch + (m, k, n))  # [..., m, k, n]
    b = broadcast_to(unsqueeze(b, b.ndim - 2), batch + (m, k, n))
    out = reduce(mul(a, b), ReduceKind.sum, (len(batch) + 1,))  # [..., m, n]
    if squeeze_b:
        out = squeeze(out, out.ndim - 1)
    if squeeze_a:
        out = squeeze(out, out.ndim - 1 if squeeze_b else out.ndim - 2)
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    out = matmul(x, transpose(weight, 0, 1) if weight.ndim == 2 else weight)
    return add(out, bias) if bias is not None else out
