"""Contraction ATen ops: matmul and its BLAS-shaped variants."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.aten.registry import aten


def _scale(x, factor):
    return x if factor == 1 else ops.mul(x, factor)


def _blas(bias, product, beta, alpha):
    """beta * bias + alpha * product; beta == 0 ignores bias (even nan), as BLAS does."""
    out = _scale(product, alpha)
    return out if beta == 0 else ops.add(_scale(bias, beta), out)


@aten("mm", "bmm", "matmul", "dot", "mv", "vdot", "inner.default")
def matmul(a, b):
    return ops.matmul(a, b)


@aten("linear")
def linear(x, weight, bias=None):
    return ops.linear(x, weight, bias)


@aten("addmm", "baddbmm", "addmv")
def addmm(bias, a, b, beta=1, alpha=1):
    return _blas(bias, ops.matmul(a, b), beta, alpha)


@aten("addbmm")
def addbmm(bias, a, b, beta=1, alpha=1):  # the batch of products is summed
    return _blas(bias, ops.sum(ops.matmul(a, b), 0), beta, alpha)


@aten("addr")
def addr(bias, a, b, beta=1, alpha=1):
    return _blas(bias, outer(a, b), beta, alpha)


@aten("outer", "ger")
def outer(a, b):
    return ops.mul(ops.unsqueeze(a, 1), ops.unsqueeze(b, 0))
