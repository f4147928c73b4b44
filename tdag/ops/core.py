"""Array-API style functions over traced Tensors, each emitting primitives.

These take torch-like arguments (negative axes, numpy broadcasting, Python scalars, type
promotion) and reduce them to the strict primitives, whose operands always agree exactly:
the elementwise ops, the moves, gather and the reductions. Functions that make a tensor from
sizes and values (iota, arange, full, ...) are in ``creation``, which builds on these.
What dtype and shape operands meet at is decided in ``promotion``; how a reshape pairs axes,
in ``reshape_plan``.
"""
from __future__ import annotations

import builtins
from typing import Sequence

import torch

from tdag.ops.builder import Builder, active_builder
from tdag.ops.promotion import (
    broadcast_shapes,
    builder_of,
    describe_operands,
    norm_axes,
    norm_axis,
    result_dtype,
)
from tdag.ops.reshape_plan import reshape_segments, resolve_wildcard
from tdag.ops.tensor import Tensor
from tdag.deinops.bitcast import bitcast
from tdag.deinops.elementwise import Cast, Compare, CompareKind, Divide, DivideMode
from tdag.deinops.indexing import Gather
from tdag.deinops.extent import Pad, Repeat, Select, Slice
from tdag.deinops.movement import Group, Permute, Squeeze, Ungroup, Unsqueeze
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.windows import Fold, Unfold
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.symbols import Dim, as_dim, dims_equal, is_static
from tdag.ir.types import DType

# -- helpers ----------------------------------------------------------------------------------


def as_tensor(value, builder: Builder | None = None, dtype=None) -> Tensor:
    """A Tensor for a Tensor, a Python scalar or a torch tensor (made a const)."""
    if isinstance(value, Tensor):
        return value if dtype is None else cast(value, dtype)
    return (builder or active_builder()).const(value, dtype)


def broadcast_to(x: Tensor, shape) -> Tensor:
    shape = tuple(as_dim(d) for d in shape)
    if len(shape) < x.ndim:
        raise ShapeError(f"cannot broadcast {x.type} to rank {len(shape)}")
    extra = len(shape) - x.ndim
    if extra:
        x = unsqueeze(x, tuple(range(extra)))
    axes = tuple(i for i, (d, t) in enumerate(zip(x.shape, shape))
                 if not dims_equal(d, t) and is_static(d) and d == 1)
    for i, (d, t) in enumerate(zip(x.shape, shape)):
        if i not in axes and not dims_equal(d, t):
            raise ShapeError(f"cannot broadcast {x.type} to {list(shape)}")
    if axes:
        x = x.builder.emit(Op.repeat, Repeat(axes, tuple(shape[a] for a in axes)), x)
    return x


expand = broadcast_to


def _operands(*values, dtype: DType | None = None, what: str = "elementwise") -> list[Tensor]:
    """Promote and broadcast operands of an elementwise op to one type."""
    builder = builder_of(*values)
    if dtype is None:
        dtype = result_dtype(*values)
    tensors = [as_tensor(v, builder, dtype) for v in values]
    try:
        shape = broadcast_shapes(*(t.shape for t in tensors))
    except ShapeError as exc:
        raise ShapeError(f"{what}: {exc.args[0]} (operands: {describe_operands(values)})",
                         origin=builder.origin) from None
    return [broadcast_to(t, shape) for t in tensors]


def _binary(op: Op, a, b, spec=None, dtype=None) -> Tensor:
    x, y = _operands(a, b, dtype=dtype, what=op.value)
    return x.builder.emit(op, spec, x, y)


# -- elementwise ------------------------------------------------------------------------------


def add(a, b) -> Tensor:
    return _binary(Op.add, a, b)


def mul(a, b) -> Tensor:
    return _binary(Op.multiply, a, b)


multiply = mul


def neg(x: Tensor) -> Tensor:
    return x.builder.emit(Op.neg, None, x)


def sub(a, b) -> Tensor:
    x, y = _operands(a, b, what="sub")
    return x.builder.emit(Op.add, None, x, neg(y))


def div(a, b) -> Tensor:
    """True division; integers are promoted to float as in torch."""
    dtype = result_dtype(a, b)
    if not (dtype.is_float or dtype.is_complex):
        dtype = DType.f32
    return _binary(Op.divide, a, b, Divide(DivideMode.true), dtype)


def floor_divide(a, b) -> Tensor:
    return _binary(Op.divide, a, b, Divide(DivideMode.floor))


def trunc_divide(a, b) -> Tensor:
    return _binary(Op.divide, a, b, Divide(DivideMode.trunc))


def remainder(a, b) -> Tensor:
    """Python-style modulo (the sign of the divisor), as torch.remainder.

    A primitive mode, not ``a - b*floor(a/b)``: that rounds twice in floats."""
    return _binary(Op.divide, a, b, Divide(DivideMode.remainder))


def fmod(a, b) -> Tensor:
    """C-style modulo (the sign of the dividend), as torch.fmod."""
    return _binary(Op.divide, a, b, Divide(DivideMode.fmod))


def pow(a, b) -> Tensor:
    return _binary(Op.pow, a, b)


def reciprocal(x: Tensor) -> Tensor:
    return x.builder.emit(Op.reciprocal, None, to_float(x))


def to_float(x: Tensor) -> Tensor:
    """x, or x cast to f32 where it is neither float nor complex (as torch computes exp or
    sqrt of an int)."""
    return x if x.dtype.is_float or x.dtype.is_complex else cast(x, DType.f32)


def _unary(op: Op):
    def fn(x: Tensor) -> Tensor:
        x = to_float(x) if op not in (Op.neg, Op.sign) else x
        return x.builder.emit(op, None, x)
    fn.__name__ = op.value
    fn.__doc__ = f"Elementwise {op.value} (a primitive)."
    return fn


exp, log, sin, cos, tan = (_unary(o) for o in (Op.exp, Op.log, Op.sin, Op.cos, Op.tan))
asin, acos, atan = (_unary(o) for o in (Op.asin, Op.acos, Op.atan))
sinh, cosh, tanh = (_unary(o) for o in (Op.sinh, Op.cosh, Op.tanh))
asinh, acosh, atanh = (_unary(o) for o in (Op.asinh, Op.acosh, Op.atanh))
erf, erfinv, sign = _unary(Op.erf), _unary(Op.erfinv), _unary(Op.sign)


def abs(x: Tensor) -> Tensor:
    """|x| = x * sign(x): exact, inf and nan included, 0.0 for either zero; an unsigned x is
    its own; a complex x's modulus, the ``hypot`` of its pair (a bitcast); a c32's in
    float32, rounded to float16 once, as torch computes it (re^2 overflows float16 from
    |re| = 256)."""
    if x.dtype is DType.c32:
        return cast(abs(cast(x, DType.c64)), DType.f16)
    if x.dtype.is_complex:
        pair = bitcast(x, x.dtype.real)
        return hypot(select(pair, -1, 0), select(pair, -1, 1))
    if not x.dtype.is_float:
        return x if x.dtype.is_unsigned else mul(x, sign(x))
    return where(eq(x, 0.0), 0.0, mul(x, sign(x)))  # |-0.0| is 0.0, where -0.0 * 0 is -0.0


def hypot(x, y) -> Tensor:
    """sqrt(x^2 + y^2) as libm's hypot computes it: scaled by the larger magnitude, so the
    squares neither overflow (|x| past 1.8e19 in float32) nor underflow; inf where either
    is infinite, even beside a nan (C99), nan where either is nan otherwise."""
    ax, ay = abs(x), abs(y)
    big, small = maximum(ax, ay), minimum(ax, ay)
    ratio = div(small, where(eq(big, 0.0), 1.0, big))
    norm = mul(big, sqrt(add(mul(ratio, ratio), 1.0)))
    return where(logical_or(eq(ax, float("inf")), eq(ay, float("inf"))), float("inf"), norm)


def sqrt(x: Tensor) -> Tensor:
    x = to_float(x)
    return pow(x, 0.5)


def rsqrt(x: Tensor) -> Tensor:
    return reciprocal(sqrt(x))


def square(x: Tensor) -> Tensor:
    return mul(x, x)


def cast(x: Tensor, dtype) -> Tensor:
    dtype = DType.of(dtype)
    return x if x.dtype is dtype else x.builder.emit(Op.cast, Cast(dtype), x)


def _compare(kind: CompareKind):
    def fn(a, b) -> Tensor:
        return _binary(Op.compare, a, b, Compare(kind))
    fn.__name__ = kind.value
    return fn


eq, ne, lt, le, gt, ge = (_compare(k) for k in CompareKind)


def where(cond, a, b) -> Tensor:
    builder = builder_of(cond, a, b)
    dtype = result_dtype(a, b)
    c = as_tensor(cond, builder, DType.bool)
    x, y = as_tensor(a, builder, dtype), as_tensor(b, builder, dtype)
    try:
        shape = broadcast_shapes(c.shape, x.shape, y.shape)
    except ShapeError as exc:
        raise ShapeError(f"where: {exc.args[0]} (operands: {describe_operands([c, x, y])})",
                         origin=builder.origin) from None
    return builder.emit(Op.where, None, broadcast_to(c, shape), broadcast_to(x, shape),
                        broadcast_to(y, shape))


def isnan(x: Tensor) -> Tensor:
    return ne(x, x)


def logical_not(x: Tensor) -> Tensor:
    return eq(cast(x, DType.bool), False)


def logical_and(a, b) -> Tensor:
    return _binary(Op.multiply, a, b, dtype=DType.bool)


def logical_or(a, b) -> Tensor:
    return where(a, True, cast(as_tensor(b, builder_of(a, b)), DType.bool))


def maximum(a, b) -> Tensor:
    """Elementwise max that propagates nan, as torch.maximum."""
    x, y = _operands(a, b, what="maximum")
    if not x.dtype.is_float:  # no nan to propagate: one compare
        return where(gt(x, y), x, y)
    return where(logical_or(gt(x, y), isnan(x)), x, y)


def minimum(a, b) -> Tensor:
    x, y = _operands(a, b, what="minimum")
    if not x.dtype.is_float:
        return where(lt(x, y), x, y)
    return where(logical_or(lt(x, y), isnan(x)), x, y)


def clamp(x: Tensor, min=None, max=None) -> Tensor:
    if min is not None:
        x = maximum(x, min)
    if max is not None:
        x = minimum(x, max)
    return x


def floor(x: Tensor) -> Tensor:
    """trunc(x), less one where that rounded up; exact, infinities included (inf//1 is nan)."""
    if not x.dtype.is_float:
        return x
    t = trunc(x)
    return where(lt(x, t), sub(t, 1.0), t)


def ceil(x: Tensor) -> Tensor:
    return x if not x.dtype.is_float else neg(floor(neg(x)))


def trunc(x: Tensor) -> Tensor:
    return x if not x.dtype.is_float else trunc_divide(x, 1.0)


def round(x: Tensor) -> Tensor:
    """Round half to even, as torch.round."""
    if not x.dtype.is_float:
        return x
    low = floor(x)
    frac = sub(x, low)
    odd = eq(remainder(low, 2.0), 1.0)
    up = logical_or(gt(frac, 0.5), logical_and(eq(frac, 0.5), odd))
    return where(up, add(low, 1.0), low)


# -- movement ---------------------------------------------------------------------------------


def permute(x: Tensor, *perm) -> Tensor:
    if len(perm) == 1 and isinstance(perm[0], (tuple, list)):
        perm = tuple(perm[0])
    perm = tuple(norm_axis(p, x.ndim) for p in perm)
    if perm == tuple(range(x.ndim)):
        return x
    return x.builder.emit(Op.permute, Permute(perm), x)


def transpose(x: Tensor, a: int, b: int) -> Tensor:
    perm = list(range(x.ndim))
    a, b = norm_axis(a, x.ndim), norm_axis(b, x.ndim)
    perm[a], perm[b] = perm[b], perm[a]
    return permute(x, *perm)


def movedim(x: Tensor, source: int, destination: int) -> Tensor:
    perm = list(range(x.ndim))
    src = perm.pop(norm_axis(source, x.ndim))
    perm.insert(norm_axis(destination, x.ndim), src)
    return permute(x, *perm)


def group(x: Tensor, axis: int, count: int) -> Tensor:
    """Merge ``count`` adjacent axes starting at ``axis`` into one."""
    if count == 1:
        return x
    return x.builder.emit(Op.group, Group(norm_axis(axis, x.ndim), count), x)


def ungroup(x: Tensor, axis: int, sizes: Sequence) -> Tensor:
    """Split ``axis`` into ``sizes`` (one entry may be -1)."""
    sizes = tuple(as_dim(s) for s in sizes)
    if len(sizes) == 1:
        return x
    return x.builder.emit(Op.ungroup, Ungroup(norm_axis(axis, x.ndim), sizes), x)


def squeeze(x: Tensor, axes=None) -> Tensor:
    if axes is None:
        axes = tuple(i for i, d in enumerate(x.shape) if is_static(d) and d == 1)
    axes = norm_axes(axes, x.ndim)
    return x.builder.emit(Op.squeeze, Squeeze(axes), x) if axes else x


def unsqueeze(x: Tensor, axes) -> Tensor:
    if isinstance(axes, int):
        axes = (axes,)
    rank = x.ndim + len(axes)
    axes = tuple(sorted(a % rank for a in axes))
    return x.builder.emit(Op.unsqueeze, Unsqueeze(axes), x) if axes else x


def flatten(x: Tensor, start: int = 0, end: int = -1) -> Tensor:
    if x.ndim == 0:
        return unsqueeze(x, 0)
    start, end = norm_axis(start, x.ndim), norm_axis(end, x.ndim)
    return group(x, start, end - start + 1)


def reshape(x: Tensor, *shape) -> Tensor:
    """Reshape as group/ungroup over matching segments; squeeze/unsqueeze for size-1 axes."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    try:
        target = resolve_wildcard(x.shape, tuple(as_dim(s) for s in shape))
    except ShapeError as exc:
        raise ShapeError(f"{exc.args[0]} (operand: {describe_operands([x])})",
                         origin=x.builder.origin) from None
    segments = reshape_segments(x.shape, target)
    if segments is None:  # no segment structure (symbolic mismatch): merge all, split all
        x = group(x, 0, x.ndim) if x.ndim else unsqueeze(x, 0)
        if not target:
            return squeeze(x, 0)
        return ungroup(x, 0, target) if len(target) > 1 else x
    pos = 0
    for n_in, sizes in segments:
        if n_in == 0:
            x = unsqueeze(x, tuple(range(pos, pos + len(sizes))))
        else:
            x = group(x, pos, n_in)
            if not sizes:
                x = squeeze(x, pos)
            elif len(sizes) > 1:
                x = ungroup(x, pos, sizes)
        pos += len(sizes)
    return x


def slice(x: Tensor, axis: int, start: Dim = 0, stop: Dim | None = None, step: int = 1) -> Tensor:
    """``x[..., start:stop:step, ...]`` on ``axis`` with Python's rules for negative bounds."""
    axis = norm_axis(axis, x.ndim)
    start, stop = _norm_bounds(start, stop, step, x.shape[axis])
    if is_static(start) and start == 0 and dims_equal(stop, x.shape[axis]) and step == 1:
        return x
    return x.builder.emit(Op.slice, Slice((axis,), (start,), (stop,), (step,)), x)


def _norm_bounds(start, stop, step, dim):
    if step is None:
        step = 1
    if step < 1:
        raise ShapeError(f"slice step must be positive, got {step}")
    start = 0 if start is None else as_dim(start)
    stop = dim if stop is None else as_dim(stop)
    if is_static(start) and start < 0:
        start = as_dim(dim + start)
    if is_static(stop) and stop < 0:
        stop = as_dim(dim + stop)
    if is_static(dim):
        start = builtins.min(builtins.max(start, 0), dim) if is_static(start) else start
        stop = builtins.min(builtins.max(stop, 0), dim) if is_static(stop) else stop
    if is_static(start) and is_static(stop) and stop < start:
        stop = start
    return start, stop


def pad(x: Tensor, widths: Sequence, value: float = 0.0) -> Tensor:
    """Pad every axis by ``(before, after)``; negative widths crop."""
    widths = [tuple(as_dim(w) for w in pair) for pair in widths]
    if len(widths) != x.ndim:
        raise ShapeError(f"pad: {len(widths)} width pairs for rank {x.ndim}")
    for axis, (lo, hi) in enumerate(widths):
        if (is_static(lo) and lo < 0) or (is_static(hi) and hi < 0):
            x = slice(x, axis, -lo if is_static(lo) and lo < 0 else 0,
                      as_dim(x.shape[axis] + hi) if is_static(hi) and hi < 0 else None)
    clipped = tuple((lo if not (is_static(lo) and lo < 0) else 0,
                     hi if not (is_static(hi) and hi < 0) else 0) for lo, hi in widths)
    if all(is_static(w) and w == 0 for pair in clipped for w in pair):
        return x
    return x.builder.emit(Op.pad, Pad(clipped, float(value)), x)


def select(x: Tensor, axis: int, index: Dim) -> Tensor:
    axis = norm_axis(axis, x.ndim)
    index = as_dim(index)
    if is_static(index) and index < 0:
        index = as_dim(x.shape[axis] + index)
    return x.builder.emit(Op.select, Select(axis, index), x)


def repeat_axes(x: Tensor, axes, sizes) -> Tensor:
    """Broadcast size-1 ``axes`` to ``sizes`` (the primitive repeat)."""
    axes = tuple(norm_axis(a, x.ndim) for a in axes)
    return x.builder.emit(Op.repeat, Repeat(axes, tuple(as_dim(s) for s in sizes)), x)


def unfold(x: Tensor, axis: int, size: int, step: int = 1, dilation: int = 1) -> Tensor:
    return x.builder.emit(Op.unfold, Unfold(norm_axis(axis, x.ndim), size, step, dilation), x)


def fold(x: Tensor, axis: int, length: Dim, step: int = 1, dilation: int = 1) -> Tensor:
    return x.builder.emit(Op.fold, Fold(norm_axis(axis, x.ndim - 1), step, dilation,
                                        as_dim(length)), x)


def gather(table: Tensor, index, axis: int = 0, wrap: bool = True) -> Tensor:
    """Rows of ``table`` along ``axis`` at ``index`` (numpy take): a Tensor, or ints (a
    Python int, list or torch tensor, made a const). Negative indices count from the end;
    ``wrap=False`` says the caller knows every index is in range, which saves the select."""
    known = None if isinstance(index, Tensor) else torch.as_tensor(index, dtype=torch.int64)
    idx = as_tensor(index if known is None else known, table.builder)
    if idx.dtype not in (DType.i64, DType.i32):
        idx = cast(idx, DType.i64)
    axis = norm_axis(axis, table.ndim)
    if wrap and not (known is not None and bool((known >= 0).all())):
        idx = where(lt(idx, 0), add(idx, axis_length(table, axis, idx.dtype)), idx)
    return table.builder.emit(Op.gather, Gather(axis), table, idx)


def axis_length(x: Tensor, axis: int, dtype="f32") -> Tensor:
    """The length of ``axis`` as a scalar tensor (a const when static): the sum of ones along
    it. Here, not with the creation functions, because ``gather`` wraps negative indices by it
    and ``creation`` builds on this module."""
    dim = x.shape[axis]
    if is_static(dim):
        return x.builder.const(dim, dtype)
    ones_ = broadcast_to(x.builder.const(1, DType.i64), (dim,))  # creation.full, inlined
    return cast(reduce(ones_, "sum", (0,)), dtype)


# -- reductions -------------------------------------------------------------------------------


def reduce(x: Tensor, kind: str | ReduceKind, axes=None, keepdim: bool = False) -> Tensor:
    axes = norm_axes(axes, x.ndim)
    kind = ReduceKind(kind) if isinstance(kind, str) else kind
    out = x.builder.emit(Op.reduce, Reduce(kind, axes), x) if axes else x
    return unsqueeze(out, axes) if keepdim and axes else out


def to_accumulator(x: Tensor) -> Tensor:
    """torch sums and multiplies bool and integer tensors in i64."""
    return x if x.dtype.is_float or x.dtype.is_complex else cast(x, DType.i64)


def sum(x: Tensor, axis=None, keepdim: bool = False) -> Tensor:
    return reduce(to_accumulator(x), ReduceKind.sum, axis, keepdim)


def prod(x: Tensor, axis=None, keepdim: bool = False) -> Tensor:
    return reduce(to_accumulator(x), ReduceKind.prod, axis, keepdim)


def amax(x: Tensor, axis=None, keepdim: bool = False) -> Tensor:
    return reduce(x, ReduceKind.max, axis, keepdim)


def amin(x: Tensor, axis=None, keepdim: bool = False) -> Tensor:
    return reduce(x, ReduceKind.min, axis, keepdim)
