"""Indexing and generator primitives."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag.deinops.primitive import Cost, primitive
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim
from tdag.ir.types import DType, TensorType, check_dim


@dataclass(frozen=True, slots=True)
class Gather:
    axis: int


def _gather_shape(spec: Gather, ins):
    table, index = ins
    if not 0 <= spec.axis < table.rank:
        raise ShapeError(f"gather: axis {spec.axis} out of range for {table}")
    if index.dtype not in (DType.i64, DType.i32):
        raise ShapeError(f"gather: index must be i64 or i32, got {index.dtype.value}")
    return table.with_shape(table.shape[:spec.axis] + index.shape + table.shape[spec.axis + 1:])


def _gather_eval(spec: Gather, xs, resolve):
    table, index = xs
    picked = table.index_select(spec.axis, index.reshape(-1).long())
    return picked.reshape(*table.shape[:spec.axis], *index.shape, *table.shape[spec.axis + 1:])


def _gather_cost(spec, ins, out: TensorType) -> Cost:
    # only the picked rows of the table are read
    return Cost(0, as_dim(ins[1].nbytes + out.nbytes), out.nbytes)


primitive(Op.gather, Gather, 2, _gather_shape, _gather_eval, _gather_cost,
          "takes rows by index (embeddings); one-hot x table costs O(vocab) more",
          traits=Trait.NONE)


@dataclass(frozen=True, slots=True)
class Iota:
    length: Dim
    dtype: DType = DType.i64


def _iota_shape(spec: Iota, ins):
    return TensorType((check_dim(spec.length, "iota: the length"),), spec.dtype)


primitive(Op.iota, Iota, 0, _iota_shape,
          lambda s, xs, r: torch.arange(r(s.length), dtype=s.dtype.torch),
          lambda s, ins, out: Cost(0, 0, out.nbytes),
          "0, 1, ..., n-1 for a symbolic n (positions, masks); a const cannot be symbolic",
          traits=Trait.NONE)
