"""The one reduction primitive: sum / max / min / prod over a set of axes (dropped)."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait


class ReduceKind(enum.Enum):
    sum = "sum"
    max = "max"
    min = "min"
    prod = "prod"


@dataclass(frozen=True, slots=True)
class Reduce:
    kind: ReduceKind
    axes: tuple


def _reduce_shape(spec: Reduce, ins):
    (x,) = ins
    if len(set(spec.axes)) != len(spec.axes) or any(not 0 <= a < x.rank for a in spec.axes):
        raise ShapeError(f"reduce: axes {spec.axes} invalid for rank {x.rank}")
    return x.with_shape(d for i, d in enumerate(x.shape) if i not in spec.axes)


def _reduce_eval(spec: Reduce, xs, resolve):
    (x,) = xs
    if not spec.axes:
        return x
    if spec.kind is ReduceKind.sum:
        out = x.sum(dim=spec.axes)
    elif spec.kind is ReduceKind.prod:
        out = x
        for a in sorted(spec.axes, reverse=True):
            out = out.prod(dim=a)
    elif x.dtype == torch.bool:
        out = (x.any if spec.kind is ReduceKind.max else x.all)(dim=spec.axes)
    else:
        out = (x.amax if spec.kind is ReduceKind.max else x.amin)(dim=spec.axes)
    return out.to(x.dtype)


def _reduce_cost(spec: Reduce, ins, out) -> Cost:
    # one flop per input element, so that multiply + reduce-sum of a [m,k]x[k,n] matmul costs
    # mkn + mkn = 2mkn, the torch.utils.flop_counter convention
    return traffic(ins, out, ins[0].numel)


primitive(Op.reduce, Reduce, 1, _reduce_shape, _reduce_eval, _reduce_cost,
          "sum/max/min/prod over axes: contractions, pooling, norms, softmax; repeat mirrors it",
          traits=Trait.NONE)
