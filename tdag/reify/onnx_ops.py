"""ONNX nodes per op: ``CONVERT[op](node, ins, g, cx) -> output name``.

``ins`` are the ONNX names of the operands, ``g`` the GraphBuilder, ``cx.type(name)`` the tdag
type of an operand. Every primitive and every kernel has an entry; ops ONNX lacks (unfold,
fold, erfinv, rms_norm, attention, group_norm) are short compositions of standard ops, the
same ones ``torch.onnx.export`` emits.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from tdag.deinops.elementwise import CompareKind, DivideMode
from tdag.deinops.reduce import ReduceKind
from tdag.ir.op import Op
from tdag.ir.symbols import as_dim, dims_equal, is_static
from tdag.ir.types import DType
from tdag.reify.onnx_graph import ONNX_DTYPE, GraphBuilder

CONVERT: dict[Op, Callable] = {}


def converts(*ops: Op):
    def register(fn):
        for op in ops:
            CONVERT[op] = fn
        return fn
    return register


def _last_two(rank: int) -> list[int]:
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    return perm


def _cast(g: GraphBuilder, x: str, dtype: DType) -> str:
    return g.node("Cast", [x], to=ONNX_DTYPE[dtype])


# -- movement ---------------------------------------------------------------------------------

@converts(Op.permute)
def _permute(node, ins, g, cx):
    if not node.spec.perm:
        return g.node("Identity", ins)
    return g.node("Transpose", ins, perm=list(node.spec.perm))


@converts(Op.group, Op.ungroup, Op.reshape)
def _reshape(node, ins, g, cx):
    shape = node.type.shape
    zero = any(is_static(d) and d == 0 for d in shape)
    return g.node("Reshape", [ins[0], g.shape(shape)], allowzero=int(zero))


@converts(Op.squeeze)
def _squeeze(node, ins, g, cx):
    if not node.spec.axes:
        return g.node("Identity", ins)
    return g.node("Squeeze", [ins[0], g.const(list(node.spec.axes))])


@converts(Op.unsqueeze)
def _unsqueeze(node, ins, g, cx):
    return g.node("Unsqueeze", [ins[0], g.const(sorted(node.spec.axes))])


@converts(Op.slice)
def _slice(node, ins, g, cx):
    s = node.spec
    return g.node("Slice", [ins[0], g.shape(s.starts, False), g.shape(s.stops, False),
                            g.const(list(s.axes)), g.const(list(s.steps))])


@converts(Op.pad)
def _pad(node, ins, g, cx):
    widths = node.spec.widths
    if not widths:
        return g.node("Identity", ins)
    pads = g.shape([lo for lo, _ in widths] + [hi for _, hi in widths], False)
    dtype = node.type.dtype
    value = bool(node.spec.value) if dtype is DType.bool else \
        (node.spec.value if dtype.is_float else int(node.spec.value))
    return g.node("Pad", [ins[0], pads, g.const(value, dtype)], mode="constant")


@converts(Op.select)
def _select(node, ins, g, cx):
    return g.node("Gather", [ins[0], g.scalar_dim(node.spec.index)], axis=node.spec.axis)


@converts(Op.repeat)
def _repeat(node, ins, g, cx):
    sizes = [1] * node.type.rank
    for a, s in zip(node.spec.axes, node.spec.sizes):
        sizes[a] = s
    return g.node("Expand", [ins[0], g.shape(sizes, False)])


@converts(Op.expand)
def _expand(node, ins, g, cx):
    in_shape = cx.type(node.inputs[0]).shape
    lead = node.type.rank - len(in_shape)
    # Expand broadcasts numpy-style: 1 keeps an input dim (no symbol to compute)
    sizes = [1 if i >= lead and dims_equal(in_shape[i - lead], d) else d
             for i, d in enumerate(node.type.shape)]
    return g.node("Expand", [ins[0], g.shape(sizes, False)])


def _window_index(g: GraphBuilder, n, size: int, step: int, dilation: int) -> str:
    """int64 [n, size] with ``i * step + j * dilation``."""
    offsets = torch.arange(size) * dilation
    if is_static(n):
        index = (torch.arange(n) * step)[:, None] + offsets[None, :]
        return g.const(index.tolist())
    starts = g.node("Range", [g.const(0), g.scalar_dim(as_dim(n * step)), g.const(step)])
    starts = g.node("Unsqueeze", [starts, g.const([1])])
    return g.node("Add", [starts, g.const([offsets.tolist()])])


@converts(Op.unfold)
def _unfold(node, ins, g, cx):
    s = node.spec
    n = node.type.shape[s.axis]
    picked = g.node("Gather", [ins[0], _window_index(g, n, s.size, s.step, s.dilation)],
                    axis=s.axis)  # [..., n, k, ...]
    rank = node.type.rank
    perm = [i for i in range(rank) if i != s.axis + 1] + [s.axis + 1]
    return g.node("Transpose", [picked], perm=perm)


@converts(Op.fold)
def _fold(node, ins, g, cx):
    """Overlap-add with ScatterElements(reduction="add") along a last axis of zeros."""
    s = node.spec
    x_type = cx.type(node.inputs[0])
    rank = x_type.rank
    n, k = x_type.shape[s.axis], x_type.shape[-1]
    moved = [i for i in range(rank - 1) if i != s.axis] + [s.axis, rank - 1]
    x = g.node("Transpose", [ins[0]], perm=moved)                     # [..., n, k]
    lead = rank - 2
    flat = g.node("Reshape", [x, g.const([0] * lead + [-1])])         # [..., n*k]
    index = g.node("Reshape", [_window_index(g, n, k, s.step, s.dilation), g.const([-1])])
    index = g.node("Expand", [index, g.node("Shape", [flat])])
    zeros_shape = g.node("Concat", [g.node("Shape", [flat], end=lead), g.dim(s.length)], axis=0)
    zero = g.const([0], x_type.dtype)
    data = g.node("Expand", [zero, zeros_shape])
    out = g.node("ScatterElements", [data, index, flat], axis=-1, reduction="add")
    back = [0] * (rank - 1)
    order = [i for i in range(rank - 1) if i != s.axis] + [s.axis]
    for pos, axis in enumerate(order):
        back[axis] = pos
    return g.node("Transpose", [out], perm=back)


@converts(Op.gather)
def _gather(node, ins, g, cx):
    return g.node("Gather", ins, axis=node.spec.axis)


@converts(Op.iota)
def _iota(node, ins, g, cx):
    out = g.node("Range", [g.const(0), g.scalar_dim(node.spec.length), g.const(1)])
    return out if node.spec.dtype is DType.i64 else _cast(g, out, node.spec.dtype)


# -- reduction and elementwise ----------------------------------------------------------------

_REDUCE = {ReduceKind.sum: "ReduceSum", ReduceKind.max: "ReduceMax", ReduceKind.min: "ReduceMin",
           ReduceKind.prod: "ReduceProd"}


@converts(Op.reduce)
def _reduce(node, ins, g, cx):
    axes, kind, dtype = node.spec.axes, node.spec.kind, node.type.dtype
    if not axes:
        return g.node("Identity", ins)
    x = ins[0]
    wide = dtype not in (DType.f32, DType.f64, DType.i32, DType.i64)
    if wide:  # onnxruntime reduces only f32/f64 and 32/64-bit ints (f16 in f32, as torch)
        x = _cast(g, x, DType.f32 if dtype.is_float else DType.i64)
    out = g.node(_REDUCE[kind], [x, g.const(list(axes))], keepdims=0)
    return _cast(g, out, dtype) if wide else out


_UNARY = {Op.neg: "Neg", Op.reciprocal: "Reciprocal", Op.exp: "Exp", Op.log: "Log",
          Op.sin: "Sin", Op.cos: "Cos", Op.tan: "Tan", Op.asin: "Asin", Op.acos: "Acos",
          Op.atan: "Atan", Op.sinh: "Sinh", Op.cosh: "Cosh", Op.tanh: "Tanh",
          Op.asinh: "Asinh", Op.acosh: "Acosh", Op.atanh: "Atanh", Op.erf: "Erf",
          Op.sign: "Sign", Op.sigmoid: "Sigmoid", Op.relu: "Relu", Op.hardswish: "HardSwish"}


# onnxruntime implements these for float32 only
_F32_ONLY = frozenset({Op.tan, Op.asin, Op.acos, Op.atan, Op.sinh, Op.cosh, Op.asinh,
                       Op.acosh, Op.atanh, Op.erf})


@converts(*_UNARY)
def _unary(node, ins, g, cx):
    dtype = node.type.dtype
    if node.op in _F32_ONLY and dtype is not DType.f32:
        return _cast(g, g.node(_UNARY[node.op], [_cast(g, ins[0], DType.f32)]), dtype)
    if node.op is Op.sign and dtype.is_float:  # torch: sign(nan) = 0
        zero = g.const(0.0, dtype)
        return g.node("Where", [g.node("IsNaN", ins), zero, g.node("Sign", ins)])
    return g.node(_UNARY[node.op], ins)


@converts(Op.erfinv)
def _erfinv(node, ins, g, cx):
    """Giles' single-precision approximation, then two Newton steps on erf(y) = x."""
    dtype = node.type.dtype
    if dtype is not DType.f32:
        x32 = _cast(g, ins[0], DType.f32)
        return _cast(g, _erfinv_f32(g, x32), dtype)
    return _erfinv_f32(g, ins[0])


def _erfinv_f32(g: GraphBuilder, x: str) -> str:
    dtype = DType.f32
    c = lambda v: g.const(v, dtype)  # noqa: E731
    w = g.node("Neg", [g.node("Log", [g.node("Mul", [g.node("Sub", [c(1.0), x]),
                                                     g.node("Add", [c(1.0), x])])])])
    central = _poly(g, g.node("Sub", [w, c(2.5)]), dtype,
                    [2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                     0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941])
    tail = _poly(g, g.node("Sub", [g.node("Sqrt", [w]), c(3.0)]), dtype,
                 [-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                  0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682])
    p = g.node("Where", [g.node("Less", [w, c(5.0)]), central, tail])
    y = g.node("Mul", [p, x])
    for _ in range(2):
        err = g.node("Sub", [g.node("Erf", [y]), x])
        slope = g.node("Mul", [c(2.0 / math.sqrt(math.pi)),
                               g.node("Exp", [g.node("Neg", [g.node("Mul", [y, y])])])])
        y = g.node("Sub", [y, g.node("Div", [err, slope])])
    edge = g.node("Equal", [g.node("Abs", [x]), c(1.0)])  # erfinv(+-1) = +-inf
    return g.node("Where", [edge, g.node("Mul", [x, c(float("inf"))]), y])


def _poly(g, t, dtype, coefficients):
    out = g.const(coefficients[0], dtype)
    for a in coefficients[1:]:
        out = g.node("Add", [g.node("Mul", [out, t]), g.const(a, dtype)])
    return out


@converts(Op.add)
def _add(node, ins, g, cx):
    return g.node("Add", ins)


@converts(Op.multiply)
def _multiply(node, ins, g, cx):
    return g.node("And" if node.type.dtype is DType.bool else "Mul", ins)


@converts(Op.divide)
def _divide(node, ins, g, cx):
    a, b = ins
    mode, dtype = node.spec.mode, node.type.dtype
    if mode is DivideMode.true:
        return g.node("Div", ins)
    if mode is DivideMode.fmod:
        return g.node("Mod", ins, fmod=1)
    if mode is DivideMode.remainder:
        if not dtype.is_float:
            return g.node("Mod", ins, fmod=0)
        # fmod, then b added where the remainder's sign differs from b's (ONNX float Mod is fmod)
        zero = g.const(0.0, dtype)
        r = g.node("Mod", ins, fmod=1)
        fix = g.node("And", [g.node("Not", [g.node("Equal", [r, zero])]),
                             g.node("Xor", [g.node("Less", [b, zero]), g.node("Less", [r, zero])])])
        return g.node("Where", [fix, g.node("Add", [r, b]), r])
    if not dtype.is_float:
        if mode is DivideMode.trunc:
            return g.node("Div", ins)  # integer Div truncates
        return g.node("Div", [g.node("Sub", [a, g.node("Mod", [a, b])]), b])  # exact
    if mode is DivideMode.floor:
        return _floor_divide_float(g, a, b, dtype)
    q = g.node("Div", ins)
    return g.node("Mul", [g.node("Sign", [q]), g.node("Floor", [g.node("Abs", [q])])])


def _floor_divide_float(g: GraphBuilder, a: str, b: str, dtype: DType) -> str:
    """torch's div_floor for floats: (a - fmod(a, b)) / b, one less when the remainder's
    sign differs from b's, then rounded to the nearest integer."""
    zero = g.const(0.0, dtype)
    mod = g.node("Mod", [a, b], fmod=1)
    div = g.node("Div", [g.node("Sub", [a, mod]), b])
    fix = g.node("And", [g.node("Not", [g.node("Equal", [mod, zero])]),
                         g.node("Xor", [g.node("Less", [b, zero]), g.node("Less", [mod, zero])])])
    div = g.node("Where", [fix, g.node("Sub", [div, g.const(1.0, dtype)]), div])
    floor = g.node("Floor", [div])
    up = g.node("Greater", [g.node("Sub", [div, floor]), g.const(0.5, dtype)])
    floor = g.node("Where", [up, g.node("Add", [floor, g.const(1.0, dtype)]), floor])
    # a zero quotient keeps the sign of a / b; b == 0 gives a / b (inf or nan)
    true = g.node("Div", [a, b])
    signed_zero = g.node("Mul", [g.node("Sign", [true]), zero])
    floor = g.node("Where", [g.node("Equal", [div, zero]), signed_zero, floor])
    return g.node("Where", [g.node("Equal", [b, zero]), true, floor])


@converts(Op.pow)
def _pow(node, ins, g, cx):
    return g.node("Pow", ins)


@converts(Op.where)
def _where(node, ins, g, cx):
    if node.type.dtype is DType.bool:  # onnxruntime has no bool Where: c & a | !c & b
        c, a, b = ins
        return g.node("Or", [g.node("And", [c, a]), g.node("And", [g.node("Not", [c]), b])])
    return g.node("Where", ins)


_COMPARE = {CompareKind.eq: "Equal", CompareKind.lt: "Less", CompareKind.le: "LessOrEqual",
            CompareKind.gt: "Greater", CompareKind.ge: "GreaterOrEqual"}


@converts(Op.compare)
def _compare(node, ins, g, cx):
    if node.spec.kind is CompareKind.ne:
        return g.node("Not", [g.node("Equal", ins)])
    if cx.type(node.inputs[0]).dtype is DType.bool and node.spec.kind is not CompareKind.eq:
        ins = [_cast(g, i, DType.i32) for i in ins]
    return g.node(_COMPARE[node.spec.kind], ins)


@converts(Op.cast)
def _cast_op(node, ins, g, cx):
    return _cast(g, ins[0], node.spec.dtype)
