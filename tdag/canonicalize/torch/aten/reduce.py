"""Reduction ATen ops: sum, mean, max/min with indices, var, any/all, cumulative sums."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten, axes_or_all
from tdag.ops.nn.util import fill_value
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
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


@aten("cumsum")
def cumsum(x, dim, dtype=None):
    x = _dtype(x, dtype)
    if not x.dtype.is_float:
        x = ops.cast(x, DType.i64)
    return ops.cumsum(x, dim) if x.ndim else x


@aten("linalg_vector_norm")
def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    x, axes = ops.abs(_dtype(x, dtype)), axes_or_all(dim, x.ndim)
    if ord == float("inf"):
        return ops.amax(x, axes, keepdim)
    if ord == float("-inf"):
        return ops.amin(x, axes, keepdim)
    if ord == 0:
        return ops.sum(ops.cast(ops.ne(x, 0.0), x.dtype), axes, keepdim)
    if ord == 1:
        return ops.sum(x, axes, keepdim)
    if ord == 2:
        return ops.sqrt(ops.sum(ops.mul(x, x), axes, keepdim))
    return ops.pow(ops.sum(ops.pow(x, float(ord)), axes, keepdim), 1.0 / ord)


def _prefixes(x, dim, fill):
    """Windows of every prefix: [..., n, ...] -> [..., n, ..., n], window j ending at j
    (pad n-1 ``fill`` values in front, then unfold n)."""
    n = x.shape[dim]
    if not is_static(n):
        raise UnsupportedOpError("cumulative op along a symbolic axis")
    widths = [(0, 0)] * x.ndim
    widths[dim] = (n - 1, 0)
    return ops.unfold(ops.pad(x, widths, fill), dim, n)


@aten("cumprod")
def cumprod(x, dim, dtype=None):
    x = _dtype(x, dtype)
    return ops.prod(_prefixes(x, dim % x.ndim, 1), x.ndim) if x.ndim else x


def _cumulative_extreme(low: bool):
    def entry(x, dim):
        if x.ndim == 0:
            return x, ops.full((), 0, DType.i64, like=x)
        dim = dim % x.ndim
        windows = _prefixes(x, dim, fill_value(x, low))
        best = ops.amax(windows, x.ndim) if low else ops.amin(windows, x.ndim)
        positions = ops.arange(0, x.shape[dim], like=x)
        shape = [1] * x.ndim
        shape[dim] = x.shape[dim]
        places = _prefixes(ops.broadcast_to(ops.reshape(positions, shape), x.shape), dim, -1)
        hit = ops.logical_or(ops.eq(windows, ops.unsqueeze(best, x.ndim)), ops.isnan(windows))
        return best, ops.amax(ops.where(hit, places, -1), x.ndim)  # the latest, as ATen
    return entry


aten("cummax")(_cumulative_extreme(True))
aten("cummin")(_cumulative_extreme(False))


@aten("logcumsumexp")
def logcumsumexp(x, dim):
    return logsumexp(_prefixes(x, dim % x.ndim, float("-inf")), x.ndim) if x.ndim else x
