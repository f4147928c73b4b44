"""Cumulative ops over the ``scan`` primitive: each runs in n per row, as the framework kernel
it stands for (an unfold of every prefix would be n^2).

``cummax``/``cummin`` return torch's indices: the last position of the running extreme
(ties go to the later element, a NaN is taken wherever it appears, as ATen's CPU kernel
compares ``x >= best || isnan(x)``). They are a second scan: the positions where the input
equals its running extreme (or is NaN), kept by a running max of positions.
``logcumsumexp`` shifts by the row's largest finite value and accumulates in f64 (see there).
"""
from __future__ import annotations

from tdag.deinops.scan import Scan
from tdag.ir.op import Op
from tdag.ir.symbols import is_static
from tdag.ir.types import DType
from tdag.ops.core import (
    add,
    amax,
    broadcast_to,
    cast,
    eq,
    exp,
    isnan,
    log,
    logical_or,
    maximum,
    mul,
    norm_axis,
    reshape,
    sub,
    to_accumulator,
    where,
)
from tdag.ops.creation import arange, full
from tdag.ops.tensor import Tensor

_INF = float("inf")


def scan(x: Tensor, axis: int, combine: str, reverse: bool = False) -> Tensor:
    """The primitive: the inclusive cumulative ``combine`` ("add", "mul", "max", "min")
    along ``axis``, from the end where ``reverse``; x's dtype is kept."""
    if x.ndim == 0:
        return x
    return x.builder.emit(Op.scan, Scan(norm_axis(axis, x.ndim), combine, reverse), x)


def cumsum(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    """``torch.cumsum``: bools and integers sum in i64."""
    return scan(to_accumulator(x), axis, "add", reverse)


def cumprod(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    """``torch.cumprod``: bools and integers multiply in i64."""
    return scan(to_accumulator(x), axis, "mul", reverse)


def cummax(x: Tensor, axis: int, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.cummax``: the running max and the (last) position it was taken from."""
    return _cumulative_extreme(x, axis, "max", reverse)


def cummin(x: Tensor, axis: int, reverse: bool = False) -> tuple[Tensor, Tensor]:
    """``torch.cummin``: the running min and the (last) position it was taken from."""
    return _cumulative_extreme(x, axis, "min", reverse)


def _cumulative_extreme(x: Tensor, axis: int, combine: str, reverse: bool):
    """Position i holds the running extreme where x[i] equals it (or is NaN): the latest
    such i up to j is where the extreme of x[..j] was last taken (the running value never
    goes back, so an earlier holder of a value the later ones beat is overtaken)."""
    if x.ndim == 0:
        return x, full((), 0, DType.i64, like=x)
    axis = norm_axis(axis, x.ndim)
    values = scan(x, axis, combine, reverse)
    held = eq(x, values)
    if x.dtype.is_float:
        held = logical_or(held, isnan(x))
    # i where held, else 0 (n reversed): the running max (min) of those is the index
    positions = _positions(x, axis)
    if reverse:  # the latest from the end is the smallest position: n + held * (i - n)
        n = x.shape[axis]
        return values, scan(add(mul(cast(held, DType.i64), sub(positions, n)), n), axis,
                            "min", True)
    return values, scan(mul(cast(held, DType.i64), positions), axis, "max")


def _positions(x: Tensor, axis: int) -> Tensor:
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    return broadcast_to(reshape(arange(0, x.shape[axis], like=x), shape), x.shape)


def logcumsumexp(x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    """``torch.logcumsumexp``: ``m + log(cumsum(exp(x - m)))`` with ``m`` the row's largest
    finite value (0 for a row with none), so no term overflows; the sum runs in f64, so a
    term underflows only where it lies more than ~700 below the row's top, and the result is
    floored at the running max (which it never falls below). -inf terms add nothing, +inf
    and NaN propagate from where they appear, as in torch."""
    axis = norm_axis(axis, x.ndim) if x.ndim else 0
    if x.ndim == 0 or is_static(x.shape[axis]) and x.shape[axis] == 0:
        return x  # (torch's amax refuses an empty axis)
    wide = cast(x, DType.f64)
    finite = where(logical_or(isnan(wide), eq(wide, _INF)), -_INF, wide)
    top = amax(finite, axis, keepdim=True)
    top = where(eq(top, -_INF), 0.0, top)
    out = add(log(scan(exp(sub(wide, top)), axis, "add", reverse)), top)
    out = maximum(out, scan(wide, axis, "max", reverse))
    return cast(out, x.dtype)
