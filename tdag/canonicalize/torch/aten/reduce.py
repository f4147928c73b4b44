"""Reduction ATen ops: sum, mean, max/min with indices, var, any/all; cumulative ops as scans."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten, axes_or_all
from tdag.ops.core import to_accumulator
from tdag.ir.types import DType


def _dtype(x, dtype):
    return ops.cast(x, dtype) if dtype is not None else x


@aten("sum")
def sum_(x, dim=None, keepdim=False, dtype=None):
    return ops.sum(_dtype(x, dtype), axes_or_all(dim, x.ndim), keepdim)


@aten("mean")
def mean(x, dim=None, keepdim=False, dtype=None):
    return ops.mean(_dtype(x, dtype), axes_or_all(dim, x.ndim), keepdim)


@aten("prod")
def prod(x, dim=None, keepdim=False, dtype=None):
    x = _dtype(x, dtype)
    if x.dtype is DType.bool or not x.dtype.is_float:
        x = ops.cast(x, DType.i64)
    return ops.prod(x, axes_or_all(dim, x.ndim), keepdim)


@aten("amax")
def amax(x, dim=(), keepdim=False):
    return ops.amax(x, axes_or_all(dim, x.ndim), keepdim)


@aten("amin")
def amin(x, dim=(), keepdim=False):
    return ops.amin(x, axes_or_all(dim, x.ndim), keepdim)


@aten("max.default")
def max_all(x):
    return ops.amax(x)


@aten("min.default")
def min_all(x):
    return ops.amin(x)


@aten("max.dim")
def max_dim(x, dim, keepdim=False):
    return ops.amax(x, dim, keepdim), ops.argmax(x, dim, keepdim)


@aten("min.dim")
def min_dim(x, dim, keepdim=False):
    return ops.amin(x, dim, keepdim), ops.argmin(x, dim, keepdim)


def _arg(fn):
    def entry(x, dim=None, keepdim=False):
        if dim is None:  # over the flattened tensor; keepdim keeps every axis as size 1
            out = fn(ops.reshape(x, (-1,)) if x.ndim else ops.unsqueeze(x, 0), 0)
            return ops.reshape(out, (1,) * x.ndim) if keepdim else out
        return fn(x, dim, keepdim) if x.ndim else ops.cast(ops.mul(x, 0), DType.i64)
    return entry


aten("argmax")(_arg(ops.argmax))
aten("argmin")(_arg(ops.argmin))


@aten("any")
def any_(x, dim=None, keepdim=False):
    return ops.amax(ops.cast(x, DType.bool), axes_or_all(dim, x.ndim), keepdim)


@aten("all")
def all_(x, dim=None, keepdim=False):
    return ops.amin(ops.cast(x, DType.bool), axes_or_all(dim, x.ndim), keepdim)


@aten("count_nonzero")
def count_nonzero(x, dim=None):
    return ops.sum(ops.ne(x, 0), axes_or_all(dim, x.ndim))


def _correction(correction, unbiased):
    if correction is not None:
        return correction
    return 1 if unbiased in (None, True) else 0


@aten("var")
def var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):  # var.default(x, unbiased)
        dim, unbiased = None, dim
    return ops.var(x, axes_or_all(dim, x.ndim), keepdim, _correction(correction, unbiased))


@aten("var_mean")
def var_mean(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    axes = axes_or_all(dim, x.ndim)
    return (ops.var(x, axes, keepdim, _correction(correction, unbiased)),
            ops.mean(x, axes, keepdim))


@aten("std")
def std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    return ops.sqrt(var(x, dim, unbiased, keepdim, correction=correction))


@aten("logsumexp")
def logsumexp(x, dim, keepdim=False):
    """max + log(sum(exp(x - max))), with the max of an all -inf row taken as 0."""
    return ops.logsumexp(x, axes_or_all(dim, x.ndim), keepdim)


@aten("linalg_vector_norm")
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    return ops.vector_norm(_dtype(x, dtype), ord, axes_or_all(dim, x.ndim), keepdim)


# -- cumulative ops: scans, linear in the axis ------------------------------------------------

def _accumulator(x, dtype):
    """torch accumulates in ``dtype`` where it is given, else bools and integers in i64."""
    return ops.cast(x, dtype) if dtype is not None else to_accumulator(x)


@aten("cumsum")
def cumsum(x, dim, dtype=None):
    return ops.scan(_accumulator(x, dtype), dim, "add")


@aten("cumprod")
def cumprod(x, dim, dtype=None):
    return ops.scan(_accumulator(x, dtype), dim, "mul")


aten("cummax")(ops.cummax)
aten("cummin")(ops.cummin)
aten("logcumsumexp")(ops.logcumsumexp)


@aten("diff")
def diff(x, n=1, dim=-1, prepend=None, append=None):
    """The n-th forward difference along ``dim`` (a bool's is xor), after joining ``prepend``
    and ``append``; transformers' mask functions call it on position ids."""
    x = ops.concat([p for p in (prepend, x, append) if p is not None], dim)
    for _ in range(n):
        after, before = ops.slice(x, dim, 1, None), ops.slice(x, dim, 0, -1)
        x = ops.ne(after, before) if x.dtype is DType.bool else ops.sub(after, before)
    return x
