"""ONNX compositions of the functions ONNX has no op for: erfinv, by Giles' single-precision
approximation ("Approximating the erfinv function", GPU Computing Gems, 2011) refined by
two Newton steps on erf, to float32 accuracy."""
from __future__ import annotations

import math

from tdag.ir.types import DType


def erfinv_onnx(node, ins, g, cx):
    """Giles' single-precision approximation, then two Newton steps on erf(y) = x."""
    dtype = node.type.dtype
    if dtype is not DType.f32:
        x32 = g.cast(ins[0], DType.f32)
        return g.cast(_erfinv_f32(g, x32), dtype)
    return _erfinv_f32(g, ins[0])


def _erfinv_f32(g, x: str) -> str:
    dtype = DType.f32
    c = lambda v: g.const(v, dtype)  # noqa: E731
    w = g.node("Neg", [g.node("Log", [g.node("Mul", [g.node("Sub", [c(1.0), x]),
                                                     g.node("Add", [c(1.0), x])])])])
    central = _poly(g, g.node("Sub", [w, c(2.5)]), dtype,
                    [2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                     0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941])
    tail = _poly(g, g.node("Sub", [g.node("Sqrt", [w]), c(3.0)]), dtype,
                 [-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                  0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682])
    p = g.node("Where", [g.node("Less", [w, c(5.0)]), central, tail])
    y = g.node("Mul", [p, x])
    for _ in range(2):
        err = g.node("Sub", [g.node("Erf", [y]), x])
        slope = g.node("Mul", [c(2.0 / math.sqrt(math.pi)),
                               g.node("Exp", [g.node("Neg", [g.node("Mul", [y, y])])])])
        y = g.node("Sub", [y, g.node("Div", [err, slope])])
    edge = g.node("Equal", [g.node("Abs", [x]), c(1.0)])  # erfinv(+-1) = +-inf
    return g.node("Where", [edge, g.node("Mul", [x, c(float("inf"))]), y])


def _poly(g, t, dtype, coefficients):
    """Horner's rule: coefficients from the highest power down."""
    out = g.const(coefficients[0], dtype)
    for a in coefficients[1:]:
        out = g.node("Add", [g.node("Mul", [out, t]), g.const(a, dtype)])
    return out
