"""Defining an op's record: ``primitive(...)`` and the cost rules records share.

The record type and the registry live in ``tdag/ir/record.py``; every primitive and kernel
calls ``primitive`` once, next to its spec, with every field of its record.
"""
from __future__ import annotations

from typing import Sequence

from tdag.ir.batching import BatchRule
from tdag.ir.op import Op
from tdag.ir.record import (
    Cost,
    CostRule,
    Decomposer,
    Evaluator,
    InPlaceRule,
    JaxEmitter,
    NoSpec,
    OnnxEmitter,
    OpRecord,
    ShapeRule,
    TorchEmitter,
    Trait,
    ViewRule,
    VjpRule,
    WorkspaceRule,
    register,
)
from tdag.errors import ShapeError
from tdag.ir.symbols import Dim, as_dim
from tdag.ir.types import DType, TensorType

# the ops that move or pick values take every element type, complex included
_MOVES_VALUES = Trait.MOVEMENT | Trait.VIEW | Trait.KEEPS_VALUES | Trait.PICKS | Trait.KERNEL
# ... and of those, the ones whose torch kernels take complex32 (gather and scatter do not)
_MOVES_HALF = Trait.MOVEMENT | Trait.VIEW
_HALF_OPS = ("the ops that move values (gather and concat too, not fold), add, multiply, neg, "
             "where, compare[eq, ne], cast and bitcast")


def primitive(op: Op, spec_type: type, arity: int | range, shape: ShapeRule, evaluate: Evaluator,
              cost: CostRule, reason: str, *, traits: Trait, batch: BatchRule | None = None,
              torch: TorchEmitter | None = None, onnx: OnnxEmitter | None = None,
              jax: JaxEmitter, decompose: Decomposer | None = None,
              vjp: VjpRule | None = None, complex_values: bool | None = None,
              complex_half: bool | None = None,
              view: ViewRule | None = None, workspace: WorkspaceRule | None = None,
              in_place: InPlaceRule | None = None) -> OpRecord:
    """Register the record of ``op``; called once per op by the module that defines it. A
    kernel gives ``decompose``, the composition it stands for; a primitive has none. Every
    primitive gives ``vjp``; a kernel may leave it to its composition. ``complex_values``:
    whether the op takes complex operands (its shape rule then says which of its kinds do);
    by default the ops that only move or pick values do, and no arithmetic does.
    ``complex_half``: whether it also takes or gives c32 (torch.complex32), whose CPU kernels
    torch has for few ops; by default the movement and view ops do. ``view``, ``workspace``
    and ``in_place``: what the torch call holds (``tdag/ir/record.py``)."""
    if complex_values is None:
        complex_values = bool(traits & _MOVES_VALUES)
    if complex_half is None:
        complex_half = complex_values and bool(traits & _MOVES_HALF)
    if not complex_values:
        shape = _real_only(op, shape)
    elif not complex_half:
        shape = _no_complex_half(op, shape)
    return register(OpRecord(op, spec_type, arity, shape, evaluate, cost, reason, traits, batch,
                             torch, onnx, jax, decompose, vjp, view, workspace, in_place))


def _real_only(op: Op, shape: ShapeRule) -> ShapeRule:
    """``shape``, refusing complex operands: the op has no complex semantics in tdag."""
    def rule(spec, ins):
        for t in ins:
            if t.dtype.is_complex:
                raise ShapeError(f"{op.value}: takes no complex operand (got {t}); tdag "
                                 "defines complex values for movement, add, multiply, divide, "
                                 "neg, exp, cast, reduce[sum] and fft only")
        return shape(spec, ins)
    return rule


def _no_complex_half(op: Op, shape: ShapeRule) -> ShapeRule:
    """``shape``, refusing c32 operands and results: torch has no complex32 kernel for the op
    on CPU ("not implemented for 'ComplexHalf'"), and computing it in c64 would round
    differently from the framework the program came from."""
    def rule(spec, ins):
        out = shape(spec, ins)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t in (*ins, *outs):
            if t.dtype is DType.c32:
                raise ShapeError(f"{op.value}: takes no c32 (torch.complex32) operand or result "
                                 f"(got {t}): torch computes complex32 in {_HALF_OPS} only")
        return out
    return rule


def traffic(in_types: Sequence[TensorType], out: TensorType, flops: Dim = 0,
            matmul_flops: Dim = 0) -> Cost:
    """Unfused cost: every input is read once and the output written once."""
    read: Dim = 0
    for t in in_types:
        read = as_dim(read + t.nbytes)
    return Cost(as_dim(flops), read, out.nbytes, as_dim(matmul_flops))


def elementwise_cost(spec, in_types: Sequence[TensorType], out: TensorType) -> Cost:
    """One flop per output element (transcendentals included, as fvcore counts them)."""
    return traffic(in_types, out, out.numel)


def movement_cost(spec, in_types: Sequence[TensorType], out: TensorType) -> Cost:
    """No arithmetic; unfused, the output is materialised."""
    return traffic(in_types, out)


__all__ = ["Cost", "NoSpec", "elementwise_cost", "movement_cost", "primitive", "traffic"]
