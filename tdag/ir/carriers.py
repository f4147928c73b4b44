"""Carrier types: running an op on an element type torch eager has too few kernels for.

torch has uint16, uint32 and uint64 and the float8 kinds as storage types, but eager runs
almost only conversions on them (no ``add`` for uint32, no arithmetic at all for float8).
Where an op meets such a type, the reference interpreter and the torch code generator run it
on its operands widened to a carrier type that holds every value exactly, then narrow the
result back, which is exact:

- uint16 / uint32 in int64: every value fits, and int64 arithmetic taken modulo 2**16 or
  2**32 by the narrowing conversion is the unsigned type's wrapping arithmetic;
- float8 in float32: every value fits, and the one rounding back to float8 is the rounding
  a float8 kernel does (float32 holds the exact sum or product of two float8 values);
- uint64 in int64 by reinterpreting its bits: exact for the ops two's complement shares with
  unsigned arithmetic (add, multiply, negate, equality, moving values); for the ops that
  order values (comparisons, max and min) the top bit is flipped too, which maps unsigned
  order onto signed order; division by the shift-and-correct of Hacker's Delight (9-3,
  ``divide_u64``); any other raises UnsupportedOpError naming op, type and framework.

Casts are torch's own conversions (they exist between every pair of types), with one fix:
torch saturates a cast to float8_e4m3fn (1e6 gives 448), where tdag's cast, as ONNX's
``saturate=0`` and torch's other float8 kinds, overflows to NaN.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from tdag.errors import UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.types import FLOAT8, DType

CARRIER = {DType.u16: DType.i64, DType.u32: DType.i64, DType.u64: DType.i64,
           **{f8: DType.f32 for f8 in FLOAT8}}

# ops two's complement int64 computes bit for bit as uint64 does
_U64_EXACT = frozenset({Op.add, Op.multiply, Op.neg, Op.where, Op.gather, Op.concat,
                        Op.reshape, Op.expand, Op.pad, Op.fold, Op.unfold, Op.take_along,
                        Op.put_along})
_U64_EXACT_KINDS = frozenset({"eq", "ne", "sum", "prod"})  # of compare and reduce
_U64_ORDER_KINDS = frozenset({"lt", "le", "gt", "ge", "max", "min"})
_U64_SORTS = frozenset({Op.sort, Op.topk})  # order, and move values or give positions
_TOP_BIT = -2 ** 63  # int64's bit pattern 1000...0

# float8_e4m3fn's largest finite value is 448; a value past the midpoint to the next step
# (480, which the format spends on NaN) rounds out of range
_E4M3FN_OVERFLOW = 464.0


def carried(node, input_dtypes: Sequence[DType]) -> bool:
    """Whether ``node`` runs on carriers: an operand or its result has a carried type, and it
    is not a cast, a bitcast or a view (torch runs those on every type)."""
    if node.op in (Op.cast, Op.bitcast) or has(node.op, Trait.VIEW):
        return False
    dtypes = [*input_dtypes, node.type.dtype]
    if not any(d in CARRIER for d in dtypes):
        return False
    if DType.u64 in dtypes and not (_u64_exact(node) or _u64_ordered(node)):
        raise UnsupportedOpError(
            f"{node.op.value} on uint64: torch has no uint64 kernel for it, and on int64 (the "
            "only type that holds its values) it computes another result",
            node=node.name, origin=node.origin)
    return True


def _u64_exact(node) -> bool:
    return node.op in _U64_EXACT or has(node.op, Trait.MOVEMENT) or \
        _kind(node) in _U64_EXACT_KINDS


def _u64_ordered(node) -> bool:
    """Whether ``node`` orders uint64 values: run on int64 with the top bit flipped."""
    return node.op in _U64_SORTS or _kind(node) in _U64_ORDER_KINDS


def _kind(node) -> str | None:
    """The kind of a compare or reduce (``lt``, ``max``), else None."""
    if node.op not in (Op.compare, Op.reduce):
        return None
    return node.spec.kind.value


# -- on tensors (the reference interpreter) ---------------------------------------------------

def widen(value: torch.Tensor, ordered: bool = False) -> torch.Tensor:
    dtype = DType.of(value.dtype)
    if dtype is DType.u64:
        bits = value.view(torch.int64)
        return bits ^ _TOP_BIT if ordered else bits
    return value.to(CARRIER[dtype].torch) if dtype in CARRIER else value


def narrow(value: torch.Tensor, dtype: DType, ordered: bool = False) -> torch.Tensor:
    if dtype not in CARRIER or value.dtype == dtype.torch:
        return value
    if dtype is DType.u64:
        return (value ^ _TOP_BIT if ordered else value).view(torch.uint64)
    return cast_value(value, dtype)


def run_carried(node, evaluate: Callable, args: Sequence[torch.Tensor]) -> torch.Tensor:
    """``evaluate(args)`` on carriers where ``node`` needs them, narrowed back."""
    if _is_e4m3fn_cast(node):
        return cast_value(args[0], DType.f8e4m3fn)
    if _is_u64_divide(node):
        return divide_u64(args[0], args[1], node.spec.mode.value)
    if not carried(node, [DType.of(a.dtype) for a in args]):
        return evaluate(args)
    ordered = _u64_ordered(node)
    return narrow(evaluate([widen(a, ordered) for a in args]), node.type.dtype, ordered)


def _is_e4m3fn_cast(node) -> bool:
    return node.op is Op.cast and node.spec.dtype is DType.f8e4m3fn


def _is_u64_divide(node) -> bool:
    return node.op is Op.divide and node.type.dtype is DType.u64


def divide_u64(a, b, mode: str) -> torch.Tensor:
    """uint64 ``a // b`` (``mode`` floor or trunc, the same for unsigned values) or ``a % b``
    (remainder or fmod) on int64 bits. A divisor from 2**63 up gives the quotient a >= b;
    a smaller one divides a >> 1 (below 2**63, so signed division is exact), doubles the
    quotient and corrects it once: the remainder left is below 2b."""
    like = a if isinstance(a, torch.Tensor) else b
    a, b = (v if isinstance(v, torch.Tensor) else torch.tensor(v, dtype=torch.uint64,
                                                               device=like.device)
            for v in (a, b))
    a, b = torch.broadcast_tensors(a.view(torch.int64), b.view(torch.int64))
    big = b < 0
    divisor = torch.where(big, torch.ones_like(b), b)
    half = (a >> 1) & (2 ** 63 - 1)  # a logical shift: a >= 0 as int64
    quotient = torch.div(half, divisor, rounding_mode="floor") << 1
    rest = a - quotient * divisor  # below 2 * divisor, exact modulo 2**64
    quotient = quotient + ((rest ^ _TOP_BIT) >= (divisor ^ _TOP_BIT)).to(torch.int64)
    quotient = torch.where(big, ((a ^ _TOP_BIT) >= (b ^ _TOP_BIT)).to(torch.int64), quotient)
    result = quotient if mode in ("floor", "trunc") else a - quotient * b
    return result.view(torch.uint64)


def cast_value(value: torch.Tensor, dtype) -> torch.Tensor:
    """tdag's cast: torch's conversion, but float8_e4m3fn overflows to NaN."""
    dtype = DType.of(dtype)
    if dtype is DType.f8e4m3fn and value.dtype != torch.float8_e4m3fn:
        wide = value.to(torch.float64 if value.dtype == torch.float64 else torch.float32)
        value = torch.where(wide.abs() > _E4M3FN_OVERFLOW, float("nan"), wide)
    return value.to(dtype.torch)


# -- as torch source (the code generator) -----------------------------------------------------

def carried_source(node, exprs: Sequence[str], dtypes: Sequence[DType],
                   emit: Callable) -> str:
    """``emit(exprs)``, the line of torch code for ``node``, on carriers where it needs
    them: tensor operands (names; a Python literal needs no widening) widened, the result
    narrowed."""
    if _is_e4m3fn_cast(node):
        return cast_expr(exprs[0], DType.f8e4m3fn)
    if _is_u64_divide(node):
        return f"_rt.divide_u64({exprs[0]}, {exprs[1]}, {node.spec.mode.value!r})"
    if not carried(node, dtypes):
        return emit(list(exprs))
    ordered = _u64_ordered(node)
    wide = [_widen_expr(e, d, ordered) if e.isidentifier() else _literal(e, d, ordered)
            for e, d in zip(exprs, dtypes)]
    return _narrow_expr(emit(wide), node.type.dtype, ordered)


def _widen_expr(expr: str, dtype: DType, ordered: bool) -> str:
    if dtype is DType.u64:
        return f"({expr}.view(torch.int64) ^ {_TOP_BIT})" if ordered else \
            f"{expr}.view(torch.int64)"
    return f"{expr}.to({_name(CARRIER[dtype])})" if dtype in CARRIER else expr


def _literal(expr: str, dtype: DType, ordered: bool) -> str:
    """A Python integer literal of a uint64 operand as the int64 carrier's value."""
    if dtype is not DType.u64:
        return expr
    bits = int(expr) - 2 ** 64 if int(expr) >= 2 ** 63 else int(expr)
    return repr(bits ^ _TOP_BIT if ordered else bits)


def _narrow_expr(expr: str, dtype: DType, ordered: bool) -> str:
    if dtype not in CARRIER:
        return expr
    if dtype is DType.u64:
        return f"(({expr}) ^ {_TOP_BIT}).view(torch.uint64)" if ordered else \
            f"({expr}).view(torch.uint64)"
    return cast_expr(f"({expr})", dtype)


def cast_expr(expr: str, dtype: DType) -> str:
    """``cast_value`` as an expression (the generated code's ``_rt`` holds it)."""
    if dtype is DType.f8e4m3fn:
        return f"_rt.cast_value({expr}, {_name(dtype)})"
    return f"{expr}.to({_name(dtype)})"


def _name(dtype: DType) -> str:
    return f"torch.{str(dtype.torch).split('.')[-1]}"
