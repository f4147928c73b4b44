"""Contraction ATen ops: matmul and its BLAS-shaped variants."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten


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


@aten("_cdist_forward")
def cdist(a, b, p=2.0, compute_mode=None):
    """p-norm distances between the rows of a [..., P, M] and b [..., R, M]."""
    diff = ops.abs(ops.sub(ops.unsqueeze(a, a.ndim - 1), ops.unsqueeze(b, b.ndim - 2)))
    axis = diff.ndim - 1
    if p == 0:
        return ops.sum(ops.cast(ops.ne(diff, 0.0), diff.dtype), axis)
    if p == float("inf"):
        return ops.amax(diff, axis)
    if p == 1:
        return ops.sum(diff, axis)
    if p == 2:
        return ops.sqrt(ops.sum(ops.mul(diff, diff), axis))
    return ops.pow(ops.sum(ops.pow(diff, float(p)), axis), 1.0 / p)


@aten("_trilinear")
def trilinear(i1, i2, i3, expand1, expand2, expand3, sumdim, unroll_dim=1):
    """The product of three tensors, each unsqueezed at its ``expand`` axes, summed over
    ``sumdim`` (how bilinear layers are written in ATen)."""
    parts = [ops.unsqueeze(t, tuple(e)) if e else t for t, e in
             ((i1, expand1), (i2, expand2), (i3, expand3))]
    product = ops.mul(ops.mul(parts[0], parts[1]), parts[2])
    return ops.sum(product, tuple(sumdim)) if sumdim else product
