"""Batch rules: how an op treats the batch axis, for ``strip_batch`` and ``add_batch``.

Every op record carries one (``OpRecord.batch``). There are four kinds, and the walker in
``tdag/refine/strip_batch.py`` knows only these kinds, never an op:

- ``AxisRule``: a one-input op that works along some axes (``touched``) and leaves the others
  alone: where an untouched axis lands (``out_axis``) and how the spec reads once the axis is
  gone (``drop``) or once a new axis 0 is in front of every input axis (``insert0``);
- ``Aligned``: an elementwise op: every batched operand carries the batch on the same axis,
  the output on that axis too, and the spec is unchanged;
- ``OperandRule``: a multi-input op with its own logic (``gather``): given the batch axis of
  each operand (None where an operand does not depend on the batch) it returns the spec and
  the output's batch axis, or raises ``Mixes``;
- ``Refuse``: an op that has no per-sample form, with the reason (kernels work on a fixed
  framework layout: strip the batch before lowering).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from tdag.ir.types import TensorType


class Mixes(Exception):
    """Raised by a batch rule: the op mixes samples (the message says how)."""


class BatchRule:
    """The base of the four kinds; ``mixing`` says how the op mixes samples when it works
    along the batch axis, for the error message."""

    mixing: str = "works along the batch axis"


@dataclass(frozen=True)
class AxisRule(BatchRule):
    touched: Callable[[object, TensorType], set]
    out_axis: Callable[[object, TensorType, int], int]
    drop: Callable[[object, TensorType, int], object]
    insert0: Callable[[object], object]
    mixing: str = "works along the batch axis"


@dataclass(frozen=True)
class Aligned(BatchRule):
    """Elementwise: operands share the batch axis; the spec does not mention axes."""

    mixing: str = "mixes operands that carry the batch on different axes"


@dataclass(frozen=True)
class OperandRule(BatchRule):
    """``strip(spec, in_types, axes) -> (spec, out_axis)`` with ``axes[i]`` the batch axis of
    operand i in ``in_types`` (full-size types) or None; ``insert(spec, in_types, batched)``
    the same for a new batch axis 0 on the operands where ``batched[i]`` (per-sample types)."""

    strip: Callable[[object, Sequence[TensorType], Sequence[int | None]], tuple]
    insert: Callable[[object, Sequence[TensorType], Sequence[bool]], tuple]
    mixing: str = "works along the batch axis"


@dataclass(frozen=True)
class Refuse(BatchRule):
    """No per-sample form: ``mixing`` is the reason."""

    mixing: str = "has no per-sample form"


# -- helpers for the axis arithmetic of rules -------------------------------------------------

def shift(axes, p: int) -> tuple:
    """Axis numbers once axis ``p`` is removed."""
    return tuple(a - (a > p) for a in axes)


def plus1(axes) -> tuple:
    """Axis numbers once a new axis 0 is in front."""
    return tuple(a + 1 for a in axes)


def before(axes, p: int) -> int:
    """How many of ``axes`` come before ``p``."""
    return sum(1 for a in axes if a < p)


def same_axis(spec, in_type, p: int) -> int:
    return p


def nothing(spec, in_type) -> set:
    return set()


__all__ = ["Aligned", "AxisRule", "BatchRule", "Mixes", "OperandRule", "Refuse", "before",
           "nothing", "plus1", "same_axis", "shift"]
