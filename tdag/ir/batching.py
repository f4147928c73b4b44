"""Batch rules: how an op treats the batch axis, for ``strip_batch`` and ``add_batch``.

Every op record carries one (``OpRecord.batch``). There are four kinds, and the walker in
``tdag/refine/batch/`` knows only these kinds, never an op:

- ``AxisRule``: a one-input op that works along some axes (``touched``) and leaves the others
  alone: where an untouched axis lands (``out_axis``) and how the spec reads once the axis is
  gone (``drop``), once it holds a folded batch (``folded``) or once a new axis 0 is in front
  of every input axis (``insert0``). Two optional hooks cover ops whose batch handling is
  more than axis arithmetic: ``along`` (a per-sample form although the op works along the
  batch axis: a group folds it into a merged axis, an ungroup splits it back out) and
  ``broadcast`` (a node with free input that broadcasts a value over the batch: a repeat);
- ``Aligned``: an elementwise op: every batched operand carries the batch on the same axis,
  the output on that axis too, and the spec is unchanged;
- ``OperandRule``: a multi-input op with its own logic (``gather``): given the state of each
  operand it returns the spec and the output's state, or raises ``Mixes``;
- ``Refuse``: an op that has no per-sample form, with the reason (kernels work on a fixed
  framework layout: strip the batch before lowering).

The walker tracks where each value holds the batch: ``None`` (free: it does not depend on the
batch), ``Batched`` or ``Folded``. The states live here so that rules can read and return
them. A rule that turns a node into other nodes returns *steps*: ``(op, spec)`` pairs, the
first applied to the node's operands and each next one to the previous result; no steps make
the node the identity per sample (its users read its first operand).

Integer values carry a second fact, ``Affine``: the value is ``stride * i + r`` with ``i`` the
sample index and ``lo <= r <= hi``. It is how index arithmetic over ``arange(batch)`` is read
per sample (transformers' causal masks gather ``i * 7 + j`` from positions flattened over the
batch): the per-sample program computes ``r`` only, so a value with a stride may reach only
ops whose rule has a ``values`` hook (which says how the stride and the bounds go through the
op, or that the op picks one operand, ``Pick``) and lookups whose rule honours the stride.
The same bounds decide comparisons (``idx < 0`` for an index known to be >= 0), so the
negative-index wrap ``where(idx < 0, idx + n, idx)`` goes, with ``n`` (often the batch size).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import sympy

from tdag.ir.symbols import Dim, as_dim, dims_equal, is_static
from tdag.ir.types import TensorType


@dataclass(frozen=True)
class Batched:
    """Axis ``axis`` is the batch. A ``broadcast`` one does not depend on the samples: a
    weight repeated to the batch size (zeros for a first hidden state, a bias)."""

    axis: int
    broadcast: bool = False


@dataclass(frozen=True)
class Folded:
    """A reshape merged the batch into axis ``axis``, with ``inner`` elements after each
    batch index (``[b, s, d] -> [b*s, d]`` has inner ``s``)."""

    axis: int
    inner: Dim = 1


@dataclass(frozen=True)
class Affine:
    """An integer (or bool, as 0 / 1) value known to be ``stride * i + r``: ``i`` the sample
    index along the batch axis, ``lo <= r <= hi`` (None: no bound). The per-sample program
    holds ``r``; a free value has stride 0."""

    stride: int = 0
    lo: Dim | None = None
    hi: Dim | None = None

    @property
    def constant(self) -> Dim | None:
        """The value where it is one known number, else None."""
        if self.stride == 0 and self.lo is not None and self.hi is not None \
                and dims_equal(self.lo, self.hi):
            return self.lo
        return None


UNKNOWN = Affine()


class SampleCount(int):
    """A static batch size whose iota is the sample index: strip_batch's second reading of
    a static batch. At a batch of 3, ``arange(3)`` may be three positions (the first
    reading, which leaves it free) or the sample index (``arange(batch)`` in transformers'
    masks); an iota of a symbolic batch's length is always the latter."""


@dataclass(frozen=True)
class Pick:
    """Returned by a ``values`` hook: the node is operand ``operand`` (a ``where`` whose
    condition is known); the other operands are not computed per sample."""

    operand: int


class Mixes(Exception):
    """Raised by a batch rule: the op mixes samples. The message says how, as a phrase
    after "it" ("reduces over the batch axis")."""


class BatchRule:
    """The base of the four kinds; ``mixing`` says how the op mixes samples when it works
    along the batch axis, for the error message (a phrase after "it")."""

    mixing: str = "works along the batch axis"


def keep_spec(spec, in_type: TensorType, p: int):
    """The spec as it is: the default ``AxisRule.folded``."""
    return spec


@dataclass(frozen=True)
class AxisRule(BatchRule):
    """For an untouched batch axis ``p``: ``out_axis(spec, in_type, p)``, ``drop(spec,
    in_type, p)`` and ``folded(spec, in_type, p)`` (the spec when axis ``p`` is ``1/batch``
    as long: unchanged unless the spec names the axis's size); ``insert0(spec)``.

    The hooks, None where the op has no such form:

    - ``along(spec, in_type, state, batch) -> (steps, state) | None``: the per-sample form
      where the op touches the batch axis (None: it mixes samples, as ``mixing`` says);
    - ``broadcast(spec, target, batch) -> steps | None``: a node of the op whose input is
      free, read per sample as if its output were in state ``target`` (a broadcast over the
      batch on that axis); None where its output is no such broadcast.

    - ``values(spec, facts, batch, types) -> Affine | None``: the output's ``Affine`` given
      the input's (``same_values`` for an op that only moves values; ``types``: the
      operands' full-size types, for a bound that needs a size); None where the op has no
      per-sample form for a strided input.

    Both may raise ``Mixes``."""

    touched: Callable[[object, TensorType], set]
    out_axis: Callable[[object, TensorType, int], int]
    drop: Callable[[object, TensorType, int], object]
    insert0: Callable[[object], object]
    mixing: str = "works along the batch axis"
    folded: Callable[[object, TensorType, int], object] = keep_spec
    along: Callable[..., tuple | None] | None = None
    broadcast: Callable[..., tuple | None] | None = None
    values: Callable[..., Affine | Pick | None] | None = None


@dataclass(frozen=True)
class Aligned(BatchRule):
    """Elementwise: operands share the batch axis; the spec does not mention axes.

    ``values(spec, facts, batch, types) -> Affine | Pick | None``: the output's ``Affine`` from the
    operands' (the op applied to their per-sample parts ``r`` must give the output's, or the
    output must be a known number, which the walker then builds), ``Pick(k)`` where the output
    is operand k, None where a strided operand has no per-sample form here.
    ``broadcast(spec, target, batch) -> steps | None``: as ``AxisRule``'s, for an op with no
    operands (an iota over the batch, read per sample: its ``values`` gives it a stride)."""

    mixing: str = "combines operands that carry the batch on different axes"
    values: Callable[..., Affine | Pick | None] | None = None
    broadcast: Callable[..., tuple | None] | None = None


@dataclass(frozen=True)
class OperandRule(BatchRule):
    """``strip(spec, in_types, states, facts) -> (spec, state)``: the per-sample spec and the
    output's state, given each operand's full-size type, state (None: free) and ``Affine``
    (a strided index is honoured or refused here; ``values`` gives the output's);
    ``insert(spec, in_types, batched) -> (spec, axis)``: the spec once the operands where
    ``batched[i]`` gain a batch axis 0 (``in_types`` per sample), and the output axis that
    holds the batch (the walker moves it to 0). Both raise ``Mixes``.

    The walker, not the rule, handles broadcasts: where the op mixes samples only through
    operands that are broadcasts over the batch, it rebuilds them at full size and asks
    again with them free."""

    strip: Callable[[object, Sequence[TensorType], Sequence, Sequence], tuple]
    insert: Callable[[object, Sequence[TensorType], Sequence[bool]], tuple]
    mixing: str = "works along the batch axis"
    values: Callable[..., Affine | Pick | None] | None = None


@dataclass(frozen=True)
class Refuse(BatchRule):
    """No per-sample form: ``mixing`` is the reason (a phrase after "it")."""

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


def same_values(spec, facts, batch, types) -> Affine:
    """The ``values`` hook of an op that only moves values (a view, a repeat, a slice)."""
    return facts[0]


def _add(a: Dim | None, b: Dim | None) -> Dim | None:
    return None if a is None or b is None else as_dim(a + b)


def _scale(a: Dim | None, k: int) -> Dim | None:
    return None if a is None else as_dim(a * k)


def nonnegative(x: Dim | None) -> bool:
    """``x >= 0`` provably (symbols are positive integers)."""
    if x is None:
        return False
    return x >= 0 if is_static(x) else bool(sympy.sympify(x).is_nonnegative)


def plus(a: Affine, b: Affine) -> Affine:
    """``a + b``."""
    return Affine(a.stride + b.stride, _add(a.lo, b.lo), _add(a.hi, b.hi))


def times(a: Affine, k: int) -> Affine:
    """``a * k`` for a known integer ``k``."""
    lo, hi = _scale(a.lo, k), _scale(a.hi, k)
    return Affine(a.stride * k, *((lo, hi) if k >= 0 else (hi, lo)))


def union(a: Affine, b: Affine) -> Affine | None:
    """Either ``a`` or ``b``, elementwise (a ``where``): None where their strides differ."""
    if a.stride != b.stride:
        return None
    lo = None if a.lo is None or b.lo is None else as_dim(sympy.Min(a.lo, b.lo))
    hi = None if a.hi is None or b.hi is None else as_dim(sympy.Max(a.hi, b.hi))
    return Affine(a.stride, lo, hi)


def span(a: Affine, batch: Dim) -> tuple:
    """``(lo, hi)`` of the value over every sample ``0 <= i < batch`` (None: no bound)."""
    top = _scale(as_dim(batch - 1), a.stride)
    if a.stride >= 0:
        return a.lo, _add(a.hi, top)
    return _add(a.lo, top), a.hi


def divide(dim: Dim, by: Dim) -> Dim | None:
    """``dim / by`` where it divides exactly (symbolically: a polynomial), else None."""
    if is_static(dim) and is_static(by):
        return dim // by if by and dim % by == 0 else None
    q = sympy.cancel(sympy.sympify(dim) / by)
    return as_dim(q) if q.is_polynomial() and sympy.denom(q) == 1 else None


__all__ = ["UNKNOWN", "Affine", "Aligned", "AxisRule", "BatchRule", "Batched", "Folded", "Mixes",
           "OperandRule", "Pick", "Refuse", "before", "divide", "keep_spec", "nonnegative",
           "nothing", "plus", "plus1", "same_axis", "same_values", "shift", "span", "times",
           "union"]
