"""Carrier types on onnxruntime: the element types its CPU kernels leave out.

ONNX's ops take every numeric type, but onnxruntime's CPU provider registers fewer: no
``Where``, ``Pad``, ``Max`` or ``ReduceMax`` for int16 and uint16; no ``TopK``, ``ArgMax``
or reductions for uint32 and uint64; no ``Where`` for uint64; no ``Mul``, ``Add``,
``Where``, ``Equal`` or ``MatMul`` for bfloat16; and for the float8 kinds nothing but casts
and (de)quantization, not even ``Reshape``.

As the torch code does on torch's gaps (``tdag.ir.carriers``), an op meeting int16 or uint16
runs on int32, one meeting uint32 on int64, one meeting bfloat16 or float8 on float32 (float8
views too). Each carrier holds every value; the Cast back wraps modulo 2**16 (2**32), the
narrow type's own arithmetic, or rounds once to the narrow float, as torch's CPU kernels for
bfloat16 compute in float32 and round once.

uint64 has no wider type. Its ``where`` becomes ``c*a + (1-c)*b`` (Mul and Add wrap modulo
2**64, and one term is 0) and its reductions run on int64 exactly (``_reduce_u64``); the
other ops tdag emits for it have uint64 kernels but Pow (a clear error). ONNX's Neg takes
no unsigned type at all: ``0 - x`` wraps as negation does; its Pow no 8-bit integer: int32
carries those.
"""
from __future__ import annotations

from typing import Callable, Sequence

from tdag.errors import UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.types import FLOAT8, DType
from tdag.reify.onnx.complex import emit_complex, touches_complex

CARRIER = {DType.i16: DType.i32, DType.u16: DType.i32, DType.u32: DType.i64,
           DType.bf16: DType.f32, **{f8: DType.f32 for f8 in FLOAT8}}
# ONNX's Pow itself takes no 8-bit integer (nor uint64, which no wider type holds)
_POW_CARRIER = {**CARRIER, DType.u8: DType.i32, DType.i8: DType.i32}


def emit_carried(node, ins: Sequence[str], cx, g, emit: Callable) -> str:
    """``emit(node, ins, cx)``, the ONNX nodes for ``node``, on carriers where it needs
    them; the emitter then sees the widened types of the node and its operands."""
    if touches_complex(node, cx):  # complex values are (real, imaginary) pairs
        return emit_complex(node, ins, cx, g, emit)
    dtypes = [cx.type(n).dtype for n in node.inputs]
    out = node.type.dtype
    if node.op is Op.where and out is DType.u64:
        return _select_u64(g, ins)
    if node.op is Op.reduce and out is DType.u64 and node.spec.axes:
        return _reduce_u64(node, ins[0], cx, g, emit)
    if node.op is Op.neg and out in (DType.u8, DType.u64):  # ONNX's Neg takes no unsigned
        return g.node("Sub", [g.const(0, out), ins[0]])
    if node.op is Op.pow and out is DType.u64:
        raise UnsupportedOpError("pow on uint64: ONNX's Pow takes no uint64 (and no wider "
                                 "integer type holds its values)", node=node.name,
                                 origin=node.origin)
    carrier = _POW_CARRIER if node.op is Op.pow else CARRIER
    types = [*dtypes, out]
    view = has(node.op, Trait.VIEW) and not any(d.is_float8 for d in types)
    if node.op in (Op.cast, Op.bitcast) or view or not any(d in carrier for d in types):
        return emit(node, list(ins), cx)
    wide = [g.cast(x, carrier[d]) if d in carrier else x for x, d in zip(ins, dtypes)]
    widened = {n: cx.type(n).with_dtype(carrier[d]) for n, d in zip(node.inputs, dtypes)
               if d in carrier}
    wide_node = node.replace(type=node.type.with_dtype(carrier.get(out, out)))
    result = emit(wide_node, wide, _Widened(cx, widened))
    return g.cast(result, out) if out in carrier else result


class _Widened:
    """An emitter's context in which the carried operands have their carriers' types."""

    def __init__(self, cx, types: dict):
        self._cx, self._types = cx, types

    def type(self, name: str):
        return self._types.get(name) or self._cx.type(name)

    def __getattr__(self, attr):
        return getattr(self._cx, attr)


def _reduce_u64(node, x: str, cx, g, emit: Callable) -> str:
    """A uint64 reduction, which onnxruntime has no kernel for, on int64 (where its sums
    would overflow, undefined in C++): max and min with the top bit flipped (unsigned order
    becomes signed order); a sum as the sums of the 32-bit halves, joined modulo 2**64."""
    kind = node.spec.kind.value
    wide = node.replace(type=node.type.with_dtype(DType.i64))
    widened = _Widened(cx, {node.inputs[0]: cx.type(node.inputs[0]).with_dtype(DType.i64)})
    reduce = lambda v: emit(wide, [g.cast(v, DType.i64)], widened)  # noqa: E731
    if kind in ("max", "min"):
        top = g.const(2 ** 63, DType.u64)
        flipped = g.node("BitwiseXor", [x, top])
        return g.node("BitwiseXor", [g.cast(reduce(flipped), DType.u64), top])
    if kind == "sum":
        shift = g.const(32, DType.u64)
        low = g.node("BitwiseAnd", [x, g.const(2 ** 32 - 1, DType.u64)])
        high = g.node("BitShift", [x, shift], direction="RIGHT")
        high_sum = g.node("BitShift", [g.cast(reduce(high), DType.u64), shift], direction="LEFT")
        return g.node("Add", [high_sum, g.cast(reduce(low), DType.u64)])
    raise UnsupportedOpError(f"reduce[{kind}] on uint64: onnxruntime has no uint64 kernel for "
                             "it, and its int64 products overflow", node=node.name,
                             origin=node.origin)


def _select_u64(g, ins: Sequence[str]) -> str:
    cond, a, b = ins
    pick = g.cast(cond, DType.u64)
    other = g.cast(g.node("Not", [cond]), DType.u64)
    return g.node("Add", [g.node("Mul", [pick, a]), g.node("Mul", [other, b])])
