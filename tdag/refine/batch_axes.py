"""How each one-input primitive treats an axis it does not operate on: the rules that
``strip_batch`` (drop the batch axis) and ``add_batch`` (insert one at 0) share.

For an input axis ``p`` each rule says whether the op works *along* it (``touched``: a
reduction over it, a slice of it, merging it with neighbours), where it lands in the output
(``out_axis``), and how the spec reads once the axis is gone (``drop``) or once a new axis 0
is in front of every input axis (``insert0``). Elementwise ops leave every axis alone.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tdag.deinops.movement import (Group, Pad, Permute, Repeat, Select, Slice, Squeeze, Ungroup,
                                   Unsqueeze)
from tdag.deinops.reduce import Reduce
from tdag.ir.op import Op
from tdag.ir.record import Trait, ops_with
from tdag.ir.symbols import dims_equal, is_static
from tdag.ir.types import TensorType


@dataclass(frozen=True)
class AxisRule:
    touched: Callable[[object, TensorType], set]
    out_axis: Callable[[object, TensorType, int], int]
    drop: Callable[[object, int], object]
    insert0: Callable[[object], object]


def _shift(axes, p: int) -> tuple:
    """Axis numbers once axis ``p`` is removed."""
    return tuple(a - (a > p) for a in axes)


def _plus1(axes) -> tuple:
    return tuple(a + 1 for a in axes)


def _before(axes, p: int) -> int:
    return sum(1 for a in axes if a < p)


def _same_axis(spec, ins, p):
    return p


def _nothing(spec, ins):
    return set()


def _unsqueeze_out(spec: Unsqueeze, ins: TensorType, p: int) -> int:
    kept = [i for i in range(ins.rank + len(spec.axes)) if i not in spec.axes]
    return kept[p]


def _slice_touched(spec: Slice, ins: TensorType) -> set:
    """Axes the slice really cuts (a full-range slice of an axis leaves it alone)."""
    return {a for a, start, stop, step in zip(spec.axes, spec.starts, spec.stops, spec.steps)
            if not (is_static(start) and start == 0 and step == 1
                    and dims_equal(stop, ins.shape[a]))}


def _slice_drop(spec: Slice, p: int) -> Slice:
    keep = [i for i, a in enumerate(spec.axes) if a != p]
    return Slice(_shift([spec.axes[i] for i in keep], p), tuple(spec.starts[i] for i in keep),
                 tuple(spec.stops[i] for i in keep), tuple(spec.steps[i] for i in keep))


def _pad_touched(spec: Pad, ins) -> set:
    return {a for a, (lo, hi) in enumerate(spec.widths)
            if not (is_static(lo) and lo == 0 and is_static(hi) and hi == 0)}


RULES: dict[Op, AxisRule] = {
    Op.permute: AxisRule(
        _nothing, lambda s, ins, p: s.perm.index(p),
        lambda s, p: Permute(tuple(q - (q > p) for q in s.perm if q != p)),
        lambda s: Permute((0,) + _plus1(s.perm))),
    Op.group: AxisRule(
        lambda s, ins: set(range(s.axis, s.axis + s.count)) if s.count > 1 else set(),
        lambda s, ins, p: p if p < s.axis else p - s.count + 1,
        lambda s, p: Group(s.axis - (p < s.axis), s.count),
        lambda s: Group(s.axis + 1, s.count)),
    Op.ungroup: AxisRule(
        lambda s, ins: {s.axis},
        lambda s, ins, p: p if p < s.axis else p + len(s.sizes) - 1,
        lambda s, p: Ungroup(s.axis - (p < s.axis), s.sizes),
        lambda s: Ungroup(s.axis + 1, s.sizes)),
    Op.squeeze: AxisRule(
        lambda s, ins: set(s.axes), lambda s, ins, p: p - _before(s.axes, p),
        lambda s, p: Squeeze(_shift(s.axes, p)), lambda s: Squeeze(_plus1(s.axes))),
    Op.unsqueeze: AxisRule(
        _nothing, _unsqueeze_out, None,  # drop needs the output position: see drop_spec
        lambda s: Unsqueeze(_plus1(s.axes))),
    Op.slice: AxisRule(
        _slice_touched, _same_axis, _slice_drop,
        lambda s: replace(s, axes=_plus1(s.axes))),
    Op.pad: AxisRule(
        _pad_touched, _same_axis,
        lambda s, p: replace(s, widths=s.widths[:p] + s.widths[p + 1:]),
        lambda s: replace(s, widths=((0, 0),) + tuple(s.widths))),
    Op.select: AxisRule(
        lambda s, ins: {s.axis}, lambda s, ins, p: p if p < s.axis else p - 1,
        lambda s, p: Select(s.axis - (p < s.axis), s.index),
        lambda s: Select(s.axis + 1, s.index)),
    Op.repeat: AxisRule(
        lambda s, ins: set(s.axes), _same_axis,
        lambda s, p: Repeat(_shift(s.axes, p), s.sizes),
        lambda s: Repeat(_plus1(s.axes), s.sizes)),
    Op.unfold: AxisRule(
        lambda s, ins: {s.axis}, _same_axis,
        lambda s, p: replace(s, axis=s.axis - (p < s.axis)),
        lambda s: replace(s, axis=s.axis + 1)),
    Op.fold: AxisRule(
        lambda s, ins: {s.axis, ins.rank - 1}, _same_axis,
        lambda s, p: replace(s, axis=s.axis - (p < s.axis)),
        lambda s: replace(s, axis=s.axis + 1)),
    Op.reduce: AxisRule(
        lambda s, ins: set(s.axes), lambda s, ins, p: p - _before(s.axes, p),
        lambda s, p: Reduce(s.kind, _shift(s.axes, p)),
        lambda s: Reduce(s.kind, _plus1(s.axes))),
}
_IDENTITY = AxisRule(_nothing, _same_axis, lambda s, p: s, lambda s: s)
for _op in (Op.neg, Op.reciprocal, Op.exp, Op.log, Op.sin, Op.cos, Op.tan, Op.asin, Op.acos,
            Op.atan, Op.sinh, Op.cosh, Op.tanh, Op.asinh, Op.acosh, Op.atanh, Op.erf,
            Op.erfinv, Op.sign, Op.cast):
    RULES[_op] = _IDENTITY


def drop_spec(op: Op, spec, ins: TensorType, p: int):
    """The spec of ``op`` applied to its input with axis ``p`` removed."""
    if op is Op.unsqueeze:
        return Unsqueeze(_shift(spec.axes, _unsqueeze_out(spec, ins, p)))
    return RULES[op].drop(spec, p)


# why an op that works along the batch axis mixes samples, for the error message
MIXING = {
    Op.reduce: "reduces over the batch axis",
    Op.slice: "slices the batch axis (takes some samples)",
    Op.select: "selects one sample",
    Op.pad: "pads the batch axis",
    Op.repeat: "broadcasts a size-1 batch axis",
    Op.squeeze: "squeezes the batch axis away (a static batch of 1: trace with a symbolic "
                "batch)",
    Op.ungroup: "splits the batch axis",
    Op.group: "merges the batch axis as an inner factor of a larger axis",
    Op.unfold: "slides windows along the batch axis",
    Op.fold: "overlap-adds along the batch axis",
    Op.gather: "gathers along the batch axis",
}


__all__ = ["AxisRule", "MIXING", "RULES", "drop_spec"]
