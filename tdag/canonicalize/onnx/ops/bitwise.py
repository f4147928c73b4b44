"""ONNX bit ops: BitShift, BitwiseNot, BitwiseAnd, BitwiseOr, BitwiseXor and BitCast.

On integers each is exact integer arithmetic: a shift is a multiply or a floor-divide by 2**s,
NOT is -x - 1, AND / OR / XOR sum their bits (floor-divide and remainder by 2). BitCast
reinterprets the bytes (tdag/deinops/bitcast.py).
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import register
from tdag.deinops.bitcast import bitcast
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType


def _bits(dtype: DType) -> int:
    if dtype.is_float or dtype is DType.bool:
        raise UnsupportedOpError(f"bit operations on {dtype.value}")
    return dtype.itemsize * 8


@register("BitShift")
def _bit_shift(ctx, x, shift):
    """x * 2**s (wrapping, as the integer type does) or floor(x / 2**s) (an arithmetic right
    shift); a shift below 0 or past the width gives the full-width result, 0 (or -1 for a
    negative x shifted right), as the spec's cases say."""
    x, shift = ctx.tensor(x), ctx.tensor(shift)
    bits, dtype = _bits(x.dtype), x.dtype
    x = ops.cast(x, DType.i64)  # narrower types: computed wide, wrapped by the cast back
    direction = ctx.choice("direction", "", ("LEFT", "RIGHT"))
    wide = ops.cast(shift, DType.i64)
    outside = ops.logical_or(ops.lt(wide, 0), ops.ge(wide, bits))
    safe = ops.clamp(wide, 0, min(bits - 1, 62))  # 2**62 is the largest i64 power
    factor = ops.pow(ops.full((), 2, DType.i64, like=x), safe)
    zero = ops.zeros((), DType.i64, like=x)
    if direction == "LEFT":
        out = ops.mul(x, factor)
        if bits == 64:  # 2**63 wraps to -2**63, the same product modulo 2**64
            out = ops.where(ops.eq(wide, 63), ops.mul(x, -(2 ** 63)), out)
        return ops.cast(ops.where(outside, zero, out), dtype)
    fill = ops.where(ops.lt(x, 0), ops.full((), -1, DType.i64, like=x), zero)
    out = ops.floor_divide(x, factor)
    if bits == 64:
        out = ops.where(ops.eq(wide, 63), fill, out)
    if dtype is DType.u64:  # a logical shift: the top bit (int64's sign) shifts in as 0
        fill, out = zero, _logical_right_u64(x, wide, safe, factor)
    return ops.cast(ops.where(outside, fill, out), dtype)


def _logical_right_u64(x, shift, safe, factor):
    """uint64 x (as int64 bits) >> s: x = 2**63 + r where the top bit is set, so the result
    is r >> s plus the top bit moved down, 2**(63 - s); s = 0 keeps x."""
    low = ops.sub(x, -(2 ** 63))  # r: wraps into [0, 2**63)
    top = ops.pow(ops.full((), 2, DType.i64, like=x), ops.sub(63, ops.maximum(safe, 1)))
    moved = ops.add(ops.floor_divide(low, factor), top)
    out = ops.where(ops.lt(x, 0), moved, ops.floor_divide(x, factor))
    out = ops.where(ops.eq(shift, 63), ops.cast(ops.lt(x, 0), DType.i64), out)
    return ops.where(ops.eq(shift, 0), x, out)


@register("BitwiseNot")
def _bitwise_not(ctx, x):
    x = ctx.tensor(x)
    if x.dtype is DType.bool:
        return ops.logical_not(x)
    _bits(x.dtype)
    if x.dtype is DType.u8:  # 255 - x, in a signed type (onnxruntime has no uint8 Neg)
        return ops.cast(ops.sub(255, ops.cast(x, DType.i16)), DType.u8)
    return ops.sub(ops.neg(x), 1)


def _bitwise(combine):
    """Bit k of an integer is floor(x / 2**k) mod 2 (two's complement too); the result sums
    combine(bit_a, bit_b) * 2**k, the top bit of a signed type weighing -2**(n-1)."""
    def convert(ctx, a, b):
        a, b = ctx.tensor(a), ctx.tensor(b)
        if a.dtype is DType.bool:
            return {"and": ops.logical_and, "or": ops.logical_or, "xor": ops.ne}[combine](a, b)
        n = _bits(a.dtype)
        # uint64's top bit weighs 2**63, which int64 holds as -2**63: the same modulo 2**64,
        # where the cast back to uint64 takes the sum
        signed = not a.dtype.is_unsigned or a.dtype is DType.u64
        wide = DType.i64
        a64, b64 = ops.cast(a, wide), ops.cast(b, wide)
        total = None
        for k in range(n):
            step = 2 ** k if k < 63 else None
            bit_a = ops.remainder(ops.floor_divide(a64, step), 2) if step else \
                ops.cast(ops.lt(a64, 0), wide)
            bit_b = ops.remainder(ops.floor_divide(b64, step), 2) if step else \
                ops.cast(ops.lt(b64, 0), wide)
            if combine == "and":
                bit = ops.mul(bit_a, bit_b)
            elif combine == "or":
                bit = ops.maximum(bit_a, bit_b)
            else:
                bit = ops.remainder(ops.add(bit_a, bit_b), 2)
            weight = -(2 ** (n - 1)) if signed and k == n - 1 else 2 ** k
            term = ops.mul(bit, weight)
            total = term if total is None else ops.add(total, term)
        return ops.cast(total, a.dtype)
    return convert


register("BitwiseAnd")(_bitwise("and"))


register("BitwiseOr")(_bitwise("or"))


register("BitwiseXor")(_bitwise("xor"))


@register("BitCast")
def _bit_cast(ctx, x):
    x, dtype = ctx.tensor(x), ctx.dtype(ctx.attr("to"))
    if x.dtype.itemsize != dtype.itemsize:
        raise InvalidModelError(f"BitCast from {x.dtype.value} to {dtype.value}: the widths "
                                "differ")
    return bitcast(x, dtype)
