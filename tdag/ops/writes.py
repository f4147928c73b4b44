"""Reads and writes at computed positions, shared by the front ends (ATen and ONNX).

tdag has one indexing primitive, ``gather`` (numpy ``take`` along one axis), and no scatter:
``take_along`` (torch.gather, ONNX GatherElements) gathers at linear row positions, and every
write is brought to one form on the flattened target: ``positions`` (where each value goes)
and ``values``; the positions are found by running the matching *read* on a tensor of flat
positions (``positions_of``), so the two can never disagree. The write itself compares each
position with every target element (one-hot, O(M*N)): exact, but a reference implementation
for modest sizes. Among duplicate positions without accumulation the last write wins, as in
torch's CPU kernels (torch leaves it unspecified).
"""
from __future__ import annotations

from tdag import ops
from tdag.ops.nn.util import fill_value
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static, product
from tdag.ir.types import DType


def as_index(index):
    if index.dtype is DType.bool:
        raise UnsupportedOpError("indexing with a boolean mask gives a data-dependent shape")
    return ops.cast(index, DType.i64)


def wrap(index, x, axis):
    """Negative indices count from the end, as in torch."""
    length = ops.size_tensor(x, (axis,), DType.i64)
    return ops.where(ops.lt(index, 0), ops.add(index, length), index)


def take_along(x, dim, index):
    """``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``dim``: the other axes
    are flattened into a row number, so that one gather on the flat tensor does it."""
    if x.ndim == 0:
        return ops.reshape(x, index.shape)
    dim = dim % x.ndim
    index = as_index(index)
    for axis in range(x.ndim):  # ATen allows index to be smaller than x off ``dim``
        if axis != dim and not (is_static(index.shape[axis]) and is_static(x.shape[axis])
                                and index.shape[axis] == x.shape[axis]):
            x = ops.slice(x, axis, 0, index.shape[axis])
    x, index = ops.movedim(x, dim, -1), ops.movedim(index, dim, -1)
    rows = ops.iota(product(x.shape[:-1]), "i64", x.builder)
    rows = ops.reshape(rows, tuple(x.shape[:-1]) + (1,))
    linear = ops.add(ops.mul(rows, ops.size_tensor(x, (x.ndim - 1,), DType.i64)), index)
    out = ops.gather(ops.reshape(x, (-1,)), linear, 0)
    return ops.movedim(out, -1, dim)


def positions_of(x):
    """The flat position of every element of x, shaped like x."""
    return ops.reshape(ops.iota(product(x.shape), "i64", x.builder), x.shape) if x.ndim else \
        ops.full((), 0, DType.i64, like=x)


def write(x, positions, values, reduce="replace", include_self=True):
    """x with ``values`` reduced into the flat ``positions`` (same shapes)."""
    flat = ops.reshape(x, (-1,))
    pos = ops.reshape(positions, (-1, 1))
    vals = ops.reshape(ops.broadcast_to(ops.cast(values, x.dtype), positions.shape), (-1, 1))
    hit = ops.eq(pos, ops.unsqueeze(ops.iota(flat.shape[0], "i64", x.builder), 0))  # [M, N]
    touched = ops.amax(hit, 0)
    if reduce == "replace":  # the last write wins, as torch's sequential CPU kernels do
        order = ops.unsqueeze(ops.iota(pos.shape[0], "i64", x.builder), 1)
        last = ops.amax(ops.where(hit, order, -1), 0)
        picked = ops.gather(ops.reshape(vals, (-1,)), ops.maximum(last, 0), 0)
        out = ops.where(touched, picked, flat)
    elif reduce in ("sum", "mean"):
        total = ops.sum(ops.where(hit, vals, ops.full((), 0, x.dtype, like=x)), 0)
        out = ops.add(total, flat) if include_self else ops.where(touched, total, flat)
        if reduce == "mean":
            count = ops.add(ops.sum(ops.cast(hit, DType.i64), 0), 1 if include_self else 0)
            count = ops.cast(ops.maximum(count, 1), x.dtype)
            out = ops.where(touched, ops.div(out, count) if x.dtype.is_float else
                            ops.floor_divide(out, count), flat)
    elif reduce in ("prod", "amax", "amin"):
        identity = {"prod": 1, "amax": fill_value(x, True), "amin": fill_value(x, False)}[reduce]
        kind = {"prod": "prod", "amax": "max", "amin": "min"}[reduce]
        part = ops.reduce(ops.where(hit, vals, ops.full((), identity, x.dtype, like=x)), kind, 0)
        if include_self:
            both = ops.stack([part, flat], 0)
            part = ops.reduce(both, kind, 0)
        out = ops.where(touched, part, flat)
    else:
        raise UnsupportedOpError(f"scatter reduction {reduce!r}")
    return ops.reshape(out, x.shape)
