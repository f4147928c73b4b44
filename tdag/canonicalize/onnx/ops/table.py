"""The ONNX op table: one entry per op type, each a short function over tdag.ops.

An entry takes ``(ctx, *inputs)``: ``ctx`` is the NodeContext (attributes, opset, helpers),
inputs are Tensors, Knowns (shape values, see onnx/values.py) or None for an omitted
optional input. It returns one value or a tuple (None for an output tdag does not compute).
Opset differences live inside the entry: an attribute in old opsets is an input in new ones.
This file holds the elementwise ops, constants and shape values, reductions and sizes data
decides; onnx/ops/movement.py the movement ops, onnx/ops/nn.py the neural-network ones, and
the other onnx_ops_*.py files a family each.
"""
from __future__ import annotations

import math
import operator

import numpy as np
import sympy
import torch
from onnx import numpy_helper

from tdag import ops
from tdag.canonicalize.onnx import runtime
from tdag.canonicalize.onnx.load import dense_of_sparse, dtype_of, tensor_of
from tdag.canonicalize.onnx.values import (
    MAX_TABLE,
    Known,
    absolute,
    cast_known,
    decide,
    fits,
    fold_arith,
    fold_compare,
    fold_reduce,
    known_of,
    logical,
    mod,
    trunc_div,
)
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import as_dim, is_static, product
from tdag.ir.types import DType, TensorKind

OPS: dict = {}


def register(*names):
    def deco(fn):
        for name in names:
            OPS[name] = fn
        return fn
    return deco


def _norm(axis: int, rank: int, end_ok: bool = False) -> int:
    """An axis in [-rank, rank) (to rank inclusive where ``end_ok``: an insertion point, as
    Flatten's), counted from 0; any other is a malformed model."""
    if type(axis) is not int or not -rank <= axis < rank + end_ok:
        raise InvalidModelError(f"axis {axis!r} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _norm_axes(axes, rank: int) -> tuple:
    """Distinct axes, each in range (a repeated one is malformed, not merged)."""
    normed = tuple(_norm(int(a), rank) for a in axes)
    if len(set(normed)) != len(normed):
        raise InvalidModelError(f"axes {list(axes)} repeat an axis")
    return normed


# -- elementwise --------------------------------------------------------------------------------

_UNARY = {
    "Neg": ops.neg, "Abs": ops.abs, "Sqrt": ops.sqrt, "Reciprocal": ops.reciprocal,
    "Exp": ops.exp, "Log": ops.log, "Tanh": ops.tanh, "Sigmoid": ops.sigmoid, "Relu": ops.relu,
    "Erf": ops.erf, "Sin": ops.sin, "Cos": ops.cos, "Tan": ops.tan, "Asin": ops.asin,
    "Acos": ops.acos, "Atan": ops.atan, "Sinh": ops.sinh, "Cosh": ops.cosh, "Asinh": ops.asinh,
    "Acosh": ops.acosh, "Atanh": ops.atanh, "Floor": ops.floor, "Ceil": ops.ceil,
    "Sign": ops.sign, "Not": ops.logical_not, "Round": ops.round, "IsNaN": ops.isnan,
    "Softplus": ops.softplus, "Mish": ops.mish, "HardSwish": ops.hardswish,
}


# the unary ops shape arithmetic uses, on Dims (``Neg`` of a count of axes, ``Not`` of a
# decided comparison)
_UNARY_FOLDS = {"Neg": operator.neg, "Abs": absolute, "Not": logical(operator.not_)}


def _unary(fn, fold=None):
    def convert(ctx, x):
        if fold is not None and isinstance(x, Known):
            folded = fold_arith(fold, [x], x.dtype)
            if folded is not None:
                return folded
        return fn(ctx.tensor(x))
    return convert


for _name, _fn in _UNARY.items():
    OPS[_name] = _unary(_fn, _UNARY_FOLDS.get(_name))


def _binary(fn, fold=None):
    """``fn`` on tensors; ``fold`` on Dims when both operands are shape values."""
    def convert(ctx, a, b):
        if fold is not None and isinstance(a, Known) and isinstance(b, Known):
            folded = fold_arith(fold, [a, b], a.dtype)
            if folded is not None:
                return folded
        return fn(ctx.tensor(a), ctx.tensor(b))
    return convert


def _offset(fn, sign: int):
    """Add and Sub, noting an integer tensor a constant away from another (a loop counter
    plus one): a Slice between the two has a constant length."""
    def convert(ctx, a, b):
        out = fn(ctx, a, b)
        runtime.note_offset(ctx, out, a, b, sign)
        return out
    return convert


OPS["Add"] = _offset(_binary(ops.add, operator.add), 1)
OPS["Sub"] = _offset(_binary(ops.sub, operator.sub), -1)
OPS["Mul"] = _binary(ops.mul, operator.mul)
OPS["And"] = _binary(ops.logical_and, logical(operator.and_))
OPS["Or"] = _binary(ops.logical_or, logical(operator.or_))
OPS["Xor"] = _binary(ops.ne, logical(operator.xor))


@register("Div")
def _div(ctx, a, b):
    if isinstance(a, Known) and isinstance(b, Known):
        folded = fold_arith(trunc_div, [a, b], a.dtype)
        if folded is not None:
            return folded
    a, b = ctx.tensor(a), ctx.tensor(b)
    return ops.div(a, b) if a.dtype.is_float else ops.trunc_divide(a, b)  # ints truncate


@register("Pow")
def _pow(ctx, a, b):
    a = ctx.tensor(a)
    return ops.cast(ops.pow(a, ctx.tensor(b)), a.dtype)  # ONNX keeps the base's type


@register("Mod")
def _mod(ctx, a, b):
    truncated = ctx.flag("fmod", 0)
    if isinstance(a, Known) and isinstance(b, Known):
        folded = fold_arith(lambda x, y: mod(x, y, truncated), [a, b], a.dtype)
        if folded is not None:
            return folded
    return (ops.fmod if truncated else ops.remainder)(ctx.tensor(a), ctx.tensor(b))


def _compare(fn, rel):
    def convert(ctx, a, b):
        if isinstance(a, Known) and isinstance(b, Known):
            folded = fold_compare(rel, a, b)
            if folded is not None:
                return folded
        return fn(ctx.tensor(a), ctx.tensor(b))
    return convert


OPS["Equal"] = _compare(ops.eq, sympy.Eq)
OPS["Less"] = _compare(ops.lt, sympy.Lt)
OPS["Greater"] = _compare(ops.gt, sympy.Gt)
OPS["LessOrEqual"] = _compare(ops.le, sympy.Le)
OPS["GreaterOrEqual"] = _compare(ops.ge, sympy.Ge)


@register("Where")
def _where(ctx, cond, a, b):
    if all(isinstance(v, Known) for v in (cond, a, b)) and cond.static and \
            fits(np.broadcast_shapes(cond.shape, a.shape, b.shape)):
        return Known(np.where(cond.values.astype(bool), a.values, b.values), a.dtype)
    return ops.where(ctx.tensor(cond), ctx.tensor(a), ctx.tensor(b))


def _variadic(fn, fold=None):
    def convert(ctx, *xs):
        if fold is not None and all(isinstance(x, Known) for x in xs):
            folded = fold_arith(fold, list(xs), xs[0].dtype)
            if folded is not None:
                return folded
        result = ctx.tensor(xs[0])
        for x in xs[1:]:
            result = fn(result, ctx.tensor(x))
        return result
    return convert


def _dim_max(a, b):
    choice = decide(sympy.Ge(sympy.sympify(a), b))
    if choice is None:
        return as_dim(sympy.Max(a, b))
    return a if choice else b


def _dim_min(a, b):
    choice = decide(sympy.Le(sympy.sympify(a), b))
    if choice is None:
        return as_dim(sympy.Min(a, b))
    return a if choice else b


OPS["Max"] = _variadic(ops.maximum, _dim_max)
OPS["Min"] = _variadic(ops.minimum, _dim_min)
OPS["Sum"] = _variadic(ops.add, operator.add)


@register("Mean")
def _mean(ctx, *xs):
    return ops.div(_variadic(ops.add)(ctx, *xs), float(len(xs)))


@register("Clip")
def _clip(ctx, x, lo=None, hi=None):
    x = ctx.tensor(x)
    if ctx.opset < 11:  # bounds were attributes
        lo, hi = ctx.attr("min"), ctx.attr("max")
        return ops.clamp(x, lo, hi)
    lo = ctx.tensor(lo) if lo is not None else None
    hi = ctx.tensor(hi) if hi is not None else None
    return ops.clamp(x, lo, hi)


@register("LeakyRelu")
def _leaky_relu(ctx, x):
    return ops.leaky_relu(ctx.tensor(x), ctx.attr("alpha", 0.01))


@register("Elu")
def _elu(ctx, x):
    return ops.elu(ctx.tensor(x), ctx.attr("alpha", 1.0))


@register("Selu")
def _selu(ctx, x):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    return ops.mul(ops.elu(ctx.tensor(x), alpha), gamma)


@register("Gelu")
def _gelu(ctx, x):
    return ops.gelu(ctx.tensor(x), ctx.attr("approximate", "none"))


@register("HardSigmoid")
def _hard_sigmoid(ctx, x):
    # ONNX's defaults (0.2, 0.5) are not torch's (1/6, 1/2)
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return ops.clamp(ops.add(ops.mul(ctx.tensor(x), alpha), beta), 0.0, 1.0)


@register("PRelu")
def _prelu(ctx, x, slope):
    x = ctx.tensor(x)
    return ops.where(ops.lt(x, 0.0), ops.mul(x, ctx.tensor(slope)), x)


@register("Cast")
def _cast(ctx, x):
    dtype = ctx.dtype(ctx.attr("to"))
    return _cast_to(ctx, x, dtype)


@register("CastLike")
def _cast_like(ctx, x, like):
    return _cast_to(ctx, x, like.dtype)


def _cast_to(ctx, x, dtype: DType):
    if isinstance(x, Known) and not dtype.is_float:
        folded = cast_known(x, dtype)
        if folded is not None:
            return folded
    x = ctx.tensor(x)
    if not dtype.is_float8 or x.dtype is DType.bool:
        return ops.cast(x, dtype)
    saturate = ctx.flag("saturate", 1)
    if dtype is DType.f8e8m0fnu and not saturate:
        raise UnsupportedOpError("Cast to float8e8m0 with saturate=0 (NaN for 0, negatives "
                                 "and values out of range; tdag's cast saturates below)")
    if not x.dtype.is_float:  # exact below 2**53; larger integers are out of range anyway
        x = ops.cast(x, DType.f64)
    if saturate:
        x = saturate_float8(x, dtype)
    if dtype is DType.f8e8m0fnu:
        return _round_power_of_two(x, ctx.choice("round_mode", "up", ("up", "down", "nearest")))
    return ops.cast(x, dtype)


def _round_power_of_two(x, mode: str):
    """A cast to float8_e8m0 (a power of two) rounding as ONNX's ``round_mode`` says. tdag's
    cast, as torch's, rounds to the nearest power; a power below (above) x, one step away at
    most, is doubled (halved) for ``up`` (``down``)."""
    near = ops.cast(x, DType.f8e8m0fnu)
    if mode == "nearest":
        return near
    wide = DType.f64 if x.dtype is DType.f64 else DType.f32
    x, value = ops.cast(x, wide), ops.cast(near, wide)
    if mode == "up":
        value = ops.where(ops.lt(value, x), ops.mul(value, 2.0), value)
    else:
        value = ops.where(ops.gt(value, x), ops.mul(value, 0.5), value)
    return ops.cast(value, DType.f8e8m0fnu)


def saturate_float8(x, dtype: DType):
    """ONNX's ``saturate=1`` on a cast to float8: a value past the type's largest finite one
    (an infinity too) becomes that one, NaN stays NaN. tdag's cast does not saturate (past
    the range it gives NaN, or inf for e5m2), as ONNX's ``saturate=0``."""
    top = torch.finfo(dtype.torch).max
    if dtype is DType.f8e8m0fnu:  # no sign: 0 and below become the least power of two
        return ops.clamp(x, 0.0, top)
    return ops.clamp(x, -top, top)


@register("Identity")
def _identity(ctx, x):
    return x


@register("Dropout")
def _dropout(ctx, x, ratio=None, training_mode=None):
    """Inference is the identity, every element kept (the mask output all true); so is
    training with a constant ratio of 0. Any other training drops at random, which tdag
    does not model."""
    rate = 0.5 if ratio is None else _constant_or_none(ctx, ratio)
    training = False if training_mode is None else _constant_or_none(ctx, training_mode)
    if training is None:
        raise UnsupportedOpError("Dropout: training_mode given at run time (a random mask "
                                 "where it is true)")
    if training and rate != 0:
        raise UnsupportedOpError("Dropout: training mode is not supported")
    if ctx.num_outputs < 2 or not ctx.node.output[1]:
        return x
    x = ctx.tensor(x)
    return x, ops.full(tuple(x.shape), True, DType.bool, like=x)


def _constant_or_none(ctx, value):
    """A scalar input's value where it is a constant, else None."""
    try:
        return ctx.scalar(value)
    except UnsupportedOpError:
        return None


# -- constants and shape values ---------------------------------------------------------------

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
    if name in ctx.builder._taken:
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
    if fits(dims):
        known = known_of(value.expand(*dims).clone())
        if known is not None:
            return known
    if all(is_static(d) for d in dims):  # a weight the file fills: a const, one element big
        return ctx.const_tensor(value.expand(*dims))
    return ops.full(tuple(dims), value.item(), DType.of(value.dtype))


@register("Range")
def _range(ctx, start, limit, delta):
    if not all(_is_constant(ctx, v) for v in (start, limit, delta)):
        return runtime.range_(ctx, start, limit, delta, ctx.tensor(start).dtype)
    start, limit, delta = (ctx.scalar(v, what) for v, what in
                           ((start, "start"), (limit, "limit"), (delta, "delta")))
    out_type = ctx.importer.types.get(ctx.node.output[0])
    dtype = ctx.dtype(out_type.tensor_type.elem_type) if out_type is not None else DType.i64
    if delta == 0:
        raise InvalidModelError("Range: delta must not be 0")
    static = all(is_static(v) or isinstance(v, float) for v in (start, limit, delta))
    if static and math.ceil((limit - start) / delta) <= MAX_TABLE:  # else a lazy arange
        return ctx.const_tensor(torch.arange(start, limit, delta, dtype=dtype.torch))
    return ops.arange(start, limit, delta, dtype)


def _is_constant(ctx, value) -> bool:
    """Whether a scalar input is known at import time (a Known or a constant weight)."""
    try:
        ctx.scalar(value)
    except UnsupportedOpError:
        return False
    return True


def _axes(ctx, axes_input, first_input_opset: int):
    """Axes from the attribute (before ``first_input_opset``) or the input (from it on)."""
    if ctx.opset < first_input_opset:
        axes = ctx.attr("axes")
        return list(axes) if axes is not None else None
    return [int(a) for a in ctx.ints(axes_input, "axes")] if axes_input is not None else None


# -- reductions and scans -----------------------------------------------------------------------

def _sum_square(x, axes, keep):
    return ops.sum(ops.mul(x, x), axes, keep)


_REDUCE = {
    "ReduceSum": (ops.sum, 13), "ReduceMean": (ops.mean, 18), "ReduceMax": (ops.amax, 18),
    "ReduceMin": (ops.amin, 18), "ReduceProd": (ops.prod, 18),
    "ReduceSumSquare": (_sum_square, 18),
    "ReduceL1": (lambda x, a, k: ops.sum(ops.abs(x), a, k), 18),
    "ReduceL2": (lambda x, a, k: ops.sqrt(_sum_square(x, a, k)), 18),
    "ReduceLogSumExp": (ops.logsumexp, 18),
    "ReduceLogSum": (lambda x, a, k: ops.log(ops.sum(x, a, k)), 18),
}


def _reduce(fn, axes_input_opset):
    def convert(ctx, x, axes=None):
        axes = _axes(ctx, axes, axes_input_opset)
        keep = ctx.flag("keepdims", 1)
        rank = len(x.shape)
        if not axes:
            if ctx.flag("noop_with_empty_axes", 0):
                return x
            axes = list(range(rank))
        axes = _norm_axes(axes, rank)
        fold = _REDUCE_FOLDS.get(ctx.node.op_type)
        if fold is not None and isinstance(x, Known):  # the product of a shape's tail
            folded = fold_reduce(fold, x, axes, keep)
            if folded is not None:
                return folded
        x = ctx.tensor(x)
        if any(is_static(x.shape[a]) and x.shape[a] == 0 for a in axes):
            return _reduce_empty(ctx, x, axes, keep)
        return fn(x, axes, keep)
    return convert


_REDUCE_FOLDS = {"ReduceSum": operator.add, "ReduceProd": operator.mul,
                 "ReduceMax": _dim_max, "ReduceMin": _dim_min}


def _reduce_empty(ctx, x, axes, keep):
    """A reduction over no element is the op's identity (ONNX: -inf for a max, False for a
    max of bools, ...); torch's amax refuses an empty axis."""
    op = ctx.node.op_type
    if op in ("ReduceMax", "ReduceMin"):
        low = op == "ReduceMax"
        if x.dtype is DType.bool:
            value = not low
        elif x.dtype.is_float:
            value = -math.inf if low else math.inf
        else:
            info = torch.iinfo(x.dtype.torch)
            value = info.min if low else info.max
    else:
        value = {"ReduceProd": 1, "ReduceMean": math.nan, "ReduceLogSumExp": -math.inf,
                 "ReduceLogSum": -math.inf}.get(op, 0)
    shape = [1 if a in axes else d for a, d in enumerate(x.shape) if keep or a not in axes]
    return ops.full(tuple(shape), value, x.dtype)


for _name, (_fn, _opset) in _REDUCE.items():
    OPS[_name] = _reduce(_fn, _opset)


def _cumsum_symbolic(x, axis):
    """Prefix sums over a symbolic axis (for onnx/ops/tensor.py's CumSum): a product with the
    mask ``j <= i`` (from iota)."""
    n = x.shape[axis]
    mask = ops.le(ops.unsqueeze(ops.iota(n), 1), ops.unsqueeze(ops.iota(n), 0))
    moved = ops.movedim(x, axis, -1)
    return ops.movedim(ops.matmul(moved, ops.cast(mask, x.dtype)), -1, axis)


@register("Einsum")
def _einsum(ctx, *xs):
    equation = ctx.attr("equation").replace(" ", "")
    return ops.einsum(equation, *[ctx.tensor(x) for x in xs])


# -- sizes data decides (tdag/deinops/runtime.py) ------------------------------------------------

@register("NonZero")
def _nonzero(ctx, x):
    return ops.permute(ops.nonzero(ctx.tensor(x)), (1, 0))  # ONNX: one row per axis


@register("Compress")
def _compress(ctx, x, condition):
    x, condition = ctx.tensor(x), ctx.tensor(condition)
    if condition.ndim != 1:
        raise InvalidModelError(f"Compress: the condition must be 1-d, got {condition.type}")
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = ops.reshape(x, (-1,)), 0
    axis = _norm(axis, x.ndim)
    n, length = x.shape[axis], condition.shape[0]
    if is_static(n) and is_static(length) and length > n:
        raise InvalidModelError(f"Compress: a condition of {length} for an axis of {n}")
    if length != n:  # a shorter condition selects among the first elements only
        x = ops.slice(x, axis, 0, length)
    return ops.gather(x, ops.flat_nonzero(ops.cast(condition, DType.bool)), axis, wrap=False)


@register("Unique")
def _unique(ctx, x):
    x, axis, ordered = ctx.tensor(x), ctx.attr("axis"), bool(ctx.attr("sorted", 1))
    if axis is None:
        return ops.unique_all(x, ordered)
    return ops.unique_slices(x, _norm(axis, x.ndim), ordered)
