"""Orthogonal polynomials of a degree n given per element (a tensor, truncated to an integer,
as torch casts it) or as a Python int, by torch's three-term recurrences. A tensor degree
unrolls MAX_DEGREE steps and picks step n per element; where torch switches to a closed form
(Chebyshev, |x| < 1 and n past 6 or 8) so does this. An element whose degree needs more steps
than the unrolled ones raises at run time: a refusal, never a truncated value."""
from __future__ import annotations

from typing import Callable

from tdag.ops import core
from tdag.ops.special.series import filled, refuse_where
from tdag.ops.tensor import Tensor

MAX_DEGREE = 64
HERMITE_LIMIT = 128  # torch's float32 limit: NaN past it

Step = Callable[[int, Tensor, Tensor], Tensor]  # (degree d, p_{d-2}, p_{d-1}) -> p_d


def _recurrence(x: Tensor, n, first: Tensor, step: Step) -> tuple[Tensor, Tensor | None]:
    """(p_n, elements past the unrolled steps or None); p_0 = 1, p_1 = first, 0 for n < 0."""
    one = filled(x, 1.0)
    if isinstance(n, int):
        values = [one, first]
        for d in range(2, n + 1):
            values.append(step(d, values[-2], values[-1]))
        return (values[n] if n >= 0 else filled(x, 0.0)), None
    result = core.where(core.eq(n, 0.0), one, core.where(core.eq(n, 1.0), first, 0.0))
    p, q = one, first
    for d in range(2, MAX_DEGREE + 1):
        p, q = q, step(d, p, q)
        result = core.where(core.eq(n, float(d)), q, result)
    return result, core.gt(n, float(MAX_DEGREE))


def _degree(n):
    """torch's static_cast<int64_t>: truncation; an int stays an int."""
    return n if isinstance(n, int) else core.trunc(core.cast(n, "f32") if not n.dtype.is_float
                                                   else n)


def _finish(value: Tensor, past: Tensor | None, closed: Tensor | None = None) -> Tensor:
    """value, refusing elements past the unrolled steps that no closed form covers."""
    if past is None:
        return value
    if closed is not None:
        past = core.logical_and(past, core.logical_not(closed))
    return refuse_where(value, past, f"polynomial_degree_past_{MAX_DEGREE}")


def _as(n, like: Tensor) -> Tensor:
    return filled(like, float(n)) if isinstance(n, int) else n


def _chebyshev(x: Tensor, n, kind: str, threshold: int) -> Tensor:
    """T, U, V or W at x (already shifted for the shifted family)."""
    n = _degree(n)
    two_x = core.add(x, x)
    first = {"t": x, "u": two_x, "v": core.sub(two_x, 1.0), "w": core.add(two_x, 1.0)}[kind]
    value, past = _recurrence(x, n, first, lambda d, p, q: core.sub(core.mul(two_x, q), p))
    nt = _as(n, x)
    even = core.eq(core.remainder(nt, 2.0), 0.0)
    at_one, at_minus_one = {
        "t": (1.0, core.where(even, 1.0, -1.0)),
        "u": (core.add(nt, 1.0), core.where(even, core.add(nt, 1.0), core.neg(core.add(nt, 1.0)))),
        "v": (1.0, core.where(even, core.add(core.add(nt, nt), 1.0),
                              core.neg(core.add(core.add(nt, nt), 1.0)))),
        "w": (core.add(core.add(nt, nt), 1.0), core.where(even, 1.0, -1.0)),
    }[kind]
    inside = core.logical_and(core.gt(nt, float(threshold)), core.lt(core.abs(x), 1.0))
    theta = core.acos(x)
    closed = {"t": lambda: core.cos(core.mul(nt, theta)),
              "u": lambda: _u_closed(nt, theta, x),
              "v": lambda: _vw_closed(nt, theta, at_minus_one, cosine=True),
              "w": lambda: _vw_closed(nt, theta, at_one, cosine=False)}[kind]()
    value = core.where(inside, closed, value)
    value = core.where(core.eq(x, 1.0), at_one, core.where(core.eq(x, -1.0), at_minus_one, value))
    value = core.where(core.lt(nt, 0.0), 0.0, value)
    return _finish(value, past, core.logical_or(inside, core.eq(core.abs(x), 1.0)))


def _u_closed(nt: Tensor, theta: Tensor, x: Tensor) -> Tensor:
    s = core.sin(theta)
    m = core.add(nt, 1.0)
    return core.where(core.ne(s, 0.0), core.div(core.sin(core.mul(m, theta)), s),
                      core.div(core.mul(m, core.cos(core.mul(m, theta))), x))


def _vw_closed(nt: Tensor, theta: Tensor, degenerate, cosine: bool) -> Tensor:
    """V: cos((n + 1/2) t) / cos(t / 2); W: sin((n + 1/2) t) / sin(t / 2)."""
    half = core.mul(theta, 0.5)
    angle = core.mul(core.add(nt, 0.5), theta)
    if cosine:
        ok = core.ne(core.sin(half), 1.0)
        return core.where(ok, core.div(core.cos(angle), core.cos(half)), degenerate)
    ok = core.ne(core.cos(half), 1.0)
    return core.where(ok, core.div(core.sin(angle), core.sin(half)), degenerate)


def chebyshev(x: Tensor, n, kind: str) -> Tensor:
    return _chebyshev(x, n, kind, 6 if kind == "t" else 8)


def shifted_chebyshev(x: Tensor, n, kind: str) -> Tensor:
    """The family on [0, 1]: the polynomial at 2x - 1 (closed forms past degree 6)."""
    return _chebyshev(core.sub(core.add(x, x), 1.0), n, kind, 6)


def hermite_h(x: Tensor, n) -> Tensor:
    """The physicists' Hermite polynomial: H_d = 2x H_{d-1} - 2(d-1) H_{d-2}."""
    return _hermite(x, n, core.add(x, x), lambda d, p, q: core.sub(
        core.mul(core.add(x, x), q), core.mul(p, float(2 * (d - 1)))))


def hermite_he(x: Tensor, n) -> Tensor:
    """The probabilists' Hermite polynomial: He_d = x He_{d-1} - (d-1) He_{d-2}."""
    return _hermite(x, n, x, lambda d, p, q: core.sub(core.mul(x, q), core.mul(p, float(d - 1))))


def _hermite(x: Tensor, n, first: Tensor, step: Step) -> Tensor:
    if not isinstance(n, int):  # torch maps an infinite or NaN degree to -1
        n = core.where(core.logical_or(core.isnan(n), core.eq(core.abs(n), float("inf"))),
                       -1.0, n)
    n = _degree(n)
    if isinstance(n, int) and n > HERMITE_LIMIT:
        return filled(x, float("nan"))
    value, past = _recurrence(x, n, first, step)
    if past is None:
        return value
    value = core.where(core.gt(n, float(HERMITE_LIMIT)), float("nan"), value)
    return _finish(value, past, core.gt(n, float(HERMITE_LIMIT)))


def laguerre(x: Tensor, n) -> Tensor:
    """L_d = ((2d - 1 - x) L_{d-1} - (d-1) L_{d-2}) / d; 1 at x = 0."""
    n = _degree(n)
    value, past = _recurrence(x, n, core.sub(1.0, x), lambda d, p, q: core.div(core.sub(
        core.mul(core.sub(float(2 * d - 1), x), q), core.mul(p, float(d - 1))), float(d)))
    nt = _as(n, x)
    value = core.where(core.eq(x, 0.0), 1.0, value)
    value = core.where(core.lt(nt, 0.0), 0.0, value)
    return _finish(value, past, core.eq(x, 0.0))


def legendre(x: Tensor, n) -> Tensor:
    """P_d = ((2d - 1) x P_{d-1} - (d-1) P_{d-2}) / d; +-1 at x = +-1."""
    n = _degree(n)
    value, past = _recurrence(x, n, x, lambda d, p, q: core.div(core.sub(
        core.mul(core.mul(x, q), float(2 * d - 1)), core.mul(p, float(d - 1))), float(d)))
    nt = _as(n, x)
    even = core.eq(core.remainder(nt, 2.0), 0.0)
    value = core.where(core.eq(x, 1.0), 1.0,
                       core.where(core.eq(x, -1.0), core.where(even, 1.0, -1.0), value))
    value = core.where(core.lt(nt, 0.0), 0.0, value)
    return _finish(value, past, core.eq(core.abs(x), 1.0))
