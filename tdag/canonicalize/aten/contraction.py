"""Contraction ATen ops: matmul and its BLAS-shaped variants."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.aten.registry import aten


def _scale(x, factor):
    return x if factor == 1 else ops.mul(x, factor)


@aten("mm", "bmm", "matmul", "dot", "mv", "vdot", "inner.default")
def matmul(a, b):
    return ops.matmul(a, b)


@aten("linear")
def linear(x, weight, bias=None):
    return ops.linear(x, weight, bias)


@aten("addmm", "addbmm.default", "baddbmm", "addmv")
def addmm(bias, a, b, beta=1, alpha=1):
    out = _scale(ops.matmul(a, b), alpha)
    return out if beta == 0 else ops.add(_scale(bias, beta), out)


@aten("outer", "ger")
def outer(a, b):
    return ops.mul(ops.unsqueeze(a, 1), ops.unsqueeze(b, 0))
