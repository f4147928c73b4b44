"""The two series evaluators of the Cephes tables, over tdag.ops: Horner's rule (polevl) and
Clenshaw's recurrence for a Chebyshev series (chbevl); each is len(coefficients) multiply-adds
per element."""
from __future__ import annotations

import math

import torch

from tdag.ops import core, creation
from tdag.ops.masking import checked_zero
from tdag.ops.tensor import Tensor


def filled(like: Tensor, value: float) -> Tensor:
    """A constant of like's shape and dtype (not like * 0 + value: inf * 0 is NaN)."""
    return creation.full(tuple(like.shape), value, like.dtype, like=like)


def expm1(x: Tensor) -> Tensor:
    """exp(x) - 1 without cancellation near 0 (Kahan): (u - 1) x / log u, u = exp(x)."""
    u = core.exp(x)
    um1 = core.sub(u, 1.0)
    exact = core.logical_or(core.eq(um1, 0.0), core.eq(um1, -1.0))
    fixed = core.mul(um1, core.div(x, core.log(core.where(exact, 2.0, u))))
    value = core.where(core.eq(u, float("inf")), u, core.where(core.eq(um1, -1.0), um1, fixed))
    return core.where(core.eq(um1, 0.0), x, value)


def logaddexp(a, b) -> Tensor:
    """torch.logaddexp: log(exp(a) + exp(b)) as max(a, b) + log1p(exp(-|a - b|)), which
    neither overflows nor loses the smaller term's digits; a == b infinite gives a (inf - inf
    is nan), nan where either is nan."""
    a, b = (core.to_float(t) if isinstance(t, Tensor) else t for t in (a, b))
    spread = core.sub(a, b)
    tail = log1p(core.exp(core.neg(core.abs(spread))))
    same_infinity = core.logical_and(core.eq(a, b), core.eq(core.abs(a), float("inf")))
    return core.where(same_infinity, a, core.add(core.maximum(a, b), tail))


def nan_to_num(x: Tensor, nan: float | None = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Tensor:
    """torch.nan_to_num: nan, +inf and -inf replaced by ``nan``, ``posinf`` and ``neginf``
    (by default 0 and the dtype's largest and smallest finite values); an integer or bool x
    has none and is returned as it is."""
    if not x.dtype.is_float:
        return x
    largest = torch.finfo(x.dtype.torch).max
    x = core.where(core.isnan(x), 0.0 if nan is None else nan, x)
    x = core.where(core.eq(x, float("inf")), largest if posinf is None else posinf, x)
    return core.where(core.eq(x, -float("inf")), -largest if neginf is None else neginf, x)


def log1p(x: Tensor) -> Tensor:
    """log(1 + x) without cancellation near 0 (Kahan): log(u) x / (u - 1), u = 1 + x; the
    unused sides kept finite (x / 0 where u is 1, inf / inf where x is inf), so that no nan
    reaches a gradient through where()."""
    u = core.add(x, 1.0)
    um1 = core.sub(u, 1.0)
    exact = core.eq(um1, 0.0)
    fixed = core.mul(core.log(u), core.div(x, core.where(exact, 1.0, um1)))
    return core.where(exact, x, core.where(core.eq(u, float("inf")), u, fixed))


def horner(x: Tensor, coefficients) -> Tensor:
    """sum_i c_i x^(len-1-i): Cephes' polevl, highest power first."""
    result = filled(x, 0.0)
    for c in coefficients:
        result = core.add(core.mul(result, x), float(c))
    return result


def chbevl(x: Tensor, coefficients) -> Tensor:
    """Clenshaw's sum of a Chebyshev series at x (already mapped to [-2, 2]), Cephes' chbevl."""
    b0 = filled(x, float(coefficients[0]))
    b1 = b2 = filled(x, 0.0)
    for c in coefficients[1:]:
        b2, b1 = b1, b0
        b0 = core.add(core.sub(core.mul(x, b1), b2), float(c))
    return core.mul(core.sub(b0, b2), 0.5)


def refuse_where(value: Tensor, bad: Tensor, what: str) -> Tensor:
    """value, raising at run time (tdag.run, torch, onnxruntime) where any element of ``bad``
    holds: for inputs past what the unrolled composition covers, or that torch refuses;
    ``what`` names the check in tdag.run's error."""
    if math.prod(int(d) for d in bad.shape) == 0:
        return value
    worst = core.amax(core.reshape(core.cast(bad, "i64"), (-1,)), 0)
    return core.add(value, core.cast(checked_zero(core.eq(worst, 0), what), value.dtype))
