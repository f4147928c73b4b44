"""Complex values in ONNX as (real, imaginary) pairs on a trailing axis of 2: the helpers
of the records' ONNX emitters for their complex operands.

onnxruntime has no kernel that computes on ONNX's complex types; its DFT takes and gives
the pairs instead, and so does every ONNX graph tdag writes (``tdag/reify/onnx/complex.py``).
Arithmetic runs on the parts:

    (a + ib)(c + id) = (ac - bd) + i(ad + bc)        a / b = a * conj(b) / |b|^2
    exp(a + ib) = e^a (cos b + i sin b)              real -> complex: (x, 0)
"""
from __future__ import annotations

from tdag.ir.types import DType


def parts(g, x: str) -> tuple[str, str]:
    return (g.node("Gather", [x, g.const(0)], axis=-1),
            g.node("Gather", [x, g.const(1)], axis=-1))


def pair(g, re: str, im: str) -> str:
    axis = g.const([-1])
    return g.node("Concat", [g.node("Unsqueeze", [re, axis]), g.node("Unsqueeze", [im, axis])],
                  axis=-1)


def product(g, x: str, y: str) -> str:
    (a, b), (c, d) = parts(g, x), parts(g, y)
    re = g.node("Sub", [g.node("Mul", [a, c]), g.node("Mul", [b, d])])
    im = g.node("Add", [g.node("Mul", [a, d]), g.node("Mul", [b, c])])
    return pair(g, re, im)


def quotient(g, x: str, y: str) -> str:
    c, d = parts(g, y)
    conj = pair(g, c, g.node("Neg", [d]))
    norm = g.node("Add", [g.node("Mul", [c, c]), g.node("Mul", [d, d])])
    return g.node("Div", [product(g, x, conj), g.node("Unsqueeze", [norm, g.const([-1])])])


def exp(g, x: str) -> str:
    a, b = parts(g, x)
    scale = g.node("Exp", [a])
    return pair(g, g.node("Mul", [scale, g.node("Cos", [b])]),
                g.node("Mul", [scale, g.node("Sin", [b])]))


def select(g, cond: str, a: str, b: str) -> str:
    """``where``: the condition broadcast over the pair's axis."""
    return g.node("Where", [g.node("Unsqueeze", [cond, g.const([-1])]), a, b])


def equal(g, x: str, y: str) -> str:
    """Both parts equal (complex values have no order)."""
    same = g.node("Equal", [x, y])
    return g.node("And", [g.node("Gather", [same, g.const(0)], axis=-1),
                          g.node("Gather", [same, g.const(1)], axis=-1)])


def cast(g, x: str, source: DType, target: DType, rank: int) -> str:
    """real -> complex: (x, 0), the 0 padded in (exact for inf and NaN); complex -> real:
    the real part (torch's cast); complex -> complex: the parts cast. ``rank``: x's, as
    the tdag type has it (no pair axis)."""
    if source.is_complex and target.is_complex:
        return g.cast(x, target.real)
    if source.is_complex:
        return g.cast(g.node("Gather", [x, g.const(0)], axis=-1), target)
    x = g.node("Unsqueeze", [g.cast(x, target.real), g.const([-1])])
    return g.node("Pad", [x, g.const([0] * (2 * rank + 1) + [1])])
