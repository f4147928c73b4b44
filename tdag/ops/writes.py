"""Reads and writes at computed positions, shared by the front ends (ATen, ONNX, JAX).

Reads are ``gather`` (numpy ``take`` along one axis); ``take_along`` (torch.gather, ONNX
GatherElements) gathers at linear row positions. Writes are the ``scatter`` primitive
(tdag/deinops/scatter.py), whose cost is linear in what it reads and writes:

- ``combine_at``: rows written along one axis with torch's reductions (``sum``, ``prod``,
  ``mean``, ``amax``, ``amin``, ``replace``), the target's own value included or not
  (``include_self=False`` resets the rows written to the combine's identity first, found by
  a scatter-add count);
- ``write``: the same on the flattened target at flat ``positions`` (any shape);
- ``scatter_elements``: torch.scatter's and ONNX ScatterElements' per-element index, a write
  at computed linear positions; an index that is one column broadcast over whole rows (a
  graph network's ``index.expand_as(src)``) is the row form instead, at the kernel's speed.

Among duplicate positions under ``replace`` the last write (in the index's row-major order)
wins, as torch's sequential CPU kernels do (torch, ONNX and XLA leave it unspecified).
"""
from __future__ import annotations

from tdag.ops import core, masking
from tdag.ops.core import add, broadcast_to, cast, gather, mul, reshape, where
from tdag.ops.creation import full, iota, size_tensor, zeros
from tdag.ops.nn.util import fill_value
from tdag.ops.promotion import norm_axis
from tdag.ops.tensor import Tensor
from tdag.deinops.scatter import COMBINES, Scatter, values_shape
from tdag.errors import UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.symbols import dims_equal, is_static, product
from tdag.ir.types import DType


def as_index(index):
    if index.dtype is DType.bool:
        raise UnsupportedOpError("indexing with a boolean mask gives a data-dependent shape")
    return cast(index, DType.i64)


def wrap(index, x, axis):
    """Negative indices count from the end, as in torch; a sort's permutation (top-p's
    mask sent back to vocabulary order) has none, and is left as it is."""
    made = _producer(index)
    if made is not None and made.op is Op.sort:
        return index
    length = size_tensor(x, (axis,), DType.i64)
    return where(core.lt(index, 0), add(index, length), index)


def take_along(x, dim, index):
    """``out[..., j, ...] = x[..., index[..., j, ...], ...]`` along ``dim``: the other axes
    are flattened into a row number, so that one gather on the flat tensor does it."""
    if x.ndim == 0:
        return reshape(x, index.shape)
    dim = dim % x.ndim
    index = as_index(index)
    for axis in range(x.ndim):  # ATen allows index to be smaller than x off ``dim``
        if axis != dim and not (is_static(index.shape[axis]) and is_static(x.shape[axis])
                                and index.shape[axis] == x.shape[axis]):
            x = core.slice(x, axis, 0, index.shape[axis])
    x, index = core.movedim(x, dim, -1), core.movedim(index, dim, -1)
    rows = iota(product(x.shape[:-1]), "i64", x.builder)
    rows = reshape(rows, tuple(x.shape[:-1]) + (1,))
    linear = add(mul(rows, size_tensor(x, (x.ndim - 1,), DType.i64)), index)
    out = gather(reshape(x, (-1,)), linear, 0)
    return core.movedim(out, -1, dim)


def positions_of(x):
    """The flat position of every element of x, shaped like x."""
    return reshape(iota(product(x.shape), "i64", x.builder), x.shape) if x.ndim else \
        full((), 0, DType.i64, like=x)


# -- the primitive and torch's reductions over it -------------------------------------------

def scatter(target: Tensor, index: Tensor, values, axis: int = 0,
            combine: str = "replace") -> Tensor:
    """``target`` with row ``k`` of ``values`` combined into position ``index[k]`` along
    ``axis`` (every index in range: callers wrap negatives); ``values`` has gather's output
    shape, or broadcasts to it. ``combine``: replace (the last duplicate wins), add, mul,
    max, min.

    >>> import tdag
    >>> p = tdag.trace(lambda z, i, v: scatter(z, i, v, 0, "add"), tdag.TensorSpec((3,)),
    ...                tdag.TensorSpec((4,), "i64"), tdag.TensorSpec((4,)))
    >>> import torch
    >>> tdag.run(p, torch.zeros(3), torch.tensor([0, 2, 0, 1]), torch.ones(4))
    tensor([2., 1., 1.])
    """
    if combine not in COMBINES:
        raise UnsupportedOpError(f"scatter: combine {combine!r} is not one of {COMBINES}")
    axis = norm_axis(axis, target.ndim)
    if index.dtype not in (DType.i64, DType.i32):
        index = cast(index, DType.i64)
    values = broadcast_to(cast(core.as_tensor(values, target.builder, target.dtype),
                               target.dtype), values_shape(target.type, index.type, axis))
    return target.builder.emit(Op.scatter, Scatter(axis, combine), target, index, values)


_COMBINE = {"replace": "replace", "sum": "add", "mean": "add", "prod": "mul", "amax": "max",
            "amin": "min"}


def _identity(x, reduce: str):
    """The value a combine leaves unchanged, for rows written without their own value."""
    if reduce in ("sum", "mean"):
        return False if x.dtype is DType.bool else 0
    if reduce == "prod":
        return True if x.dtype is DType.bool else 1
    if x.dtype is DType.bool:
        return reduce == "amin"
    return fill_value(x, reduce == "amax")


def combine_at(x, axis: int, index, values, reduce: str = "replace", include_self=True):
    """``x`` with ``values`` (gather's output shape along ``axis``) reduced into the rows
    ``index`` names, as torch's ``index_reduce`` (``sum``/``prod``/``mean``/``amax``/
    ``amin``) or ``index_copy`` (``replace``); every index in range."""
    if reduce not in _COMBINE:
        raise UnsupportedOpError(f"scatter reduction {reduce!r}")
    axis = norm_axis(axis, x.ndim)
    if reduce == "replace":
        return scatter(x, index, values, axis)
    count = None
    if reduce == "mean" or not include_self:
        count = writes_per_row(x, axis, index)
    base = x if include_self else where(core.gt(count, 0), _identity(x, reduce), x)
    out = scatter(base, index, values, axis, _COMBINE[reduce])
    if reduce != "mean":
        return out
    total = core.maximum(add(count, 1) if include_self else count, 1)
    total = cast(total, x.dtype)
    return core.div(out, total) if x.dtype.is_float else core.floor_divide(out, total)


def writes_per_row(x, axis: int, index):
    """How many writes each position along ``axis`` takes (i64), shaped to broadcast
    against ``x``: a scatter-add of ones."""
    flat = reshape(index, (-1,))
    count = scatter(zeros((x.shape[axis],), DType.i64, like=x), flat, 1, 0, "add")
    return reshape(count, tuple(x.shape[axis] if a == axis else 1 for a in range(x.ndim)))


def write(x, positions, values, reduce="replace", include_self=True):
    """x with ``values`` (broadcast to ``positions``' shape) reduced into the flat
    ``positions`` of x."""
    flat = reshape(x, (-1,))
    pos = reshape(positions, (-1,))
    vals = reshape(broadcast_to(cast(core.as_tensor(values, x.builder, x.dtype), x.dtype),
                                positions.shape), (-1,))
    return reshape(combine_at(flat, 0, pos, vals, reduce, include_self), x.shape)


def bin_counts(index, length, weights=None, keep=None, dtype=DType.i64):
    """``length`` bins, each the count (or the sum of ``weights``) of the entries of
    ``index`` (in range where ``keep``) that name it: bincount, histograms."""
    index, n = reshape(cast(index, DType.i64), (-1,)), length
    if keep is not None:  # the others go to one more bin, cut off after
        index, n = where(reshape(keep, (-1,)), index, length), length + 1
    mass = 1 if weights is None else reshape(weights, (-1,))
    out = scatter(zeros((n,), dtype, like=index), index, mass, 0, "add")
    return out if keep is None else core.slice(out, 0, 0, length)


def histc(x: Tensor, bins: int = 100, min: float = 0.0, max: float = 0.0) -> Tensor:
    """torch.histc: the counts of x's values in ``bins`` equal bins over [min, max] (the
    data's range where min == max, widened by one each side for a constant tensor), in x's
    dtype; values outside are not counted (nan neither), max goes into the last bin. One
    scatter-add: linear in x."""
    x = reshape(x, (-1,))
    if min == max:
        low, high = core.amin(x), core.amax(x)
        same = core.eq(low, high)
        low = where(same, core.sub(low, 1.0), low)
        high = where(same, add(high, 1.0), high)
    else:
        low, high = float(min), float(max)
    width = core.sub(high, low)
    scaled = core.div(mul(core.sub(x, low), float(bins)), width)
    index = cast(core.floor(scaled), DType.i64)
    index = where(core.eq(x, high), bins - 1, index)
    inside = core.logical_and(core.ge(x, low), core.le(x, high))
    return bin_counts(index, bins, keep=inside, dtype=x.dtype)


def bincount(x, weights=None, minlength: int = 0, length: str | None = None):
    """torch.bincount: the count (or weight sum) of each value 0..max(x), at least
    ``minlength`` of them; a length data decides, refused at run time where x holds a
    negative value (``checked_size``), as torch refuses it. ``length`` names that size (the
    ``bincount_sized`` kernel's decomposition names the symbol its node defines)."""
    x = cast(x, DType.i64)
    top = add(core.amax(x), 1) if not _empty(x) else full((), 0, DType.i64, like=x)
    ok = core.logical_not(core.amax(core.lt(x, 0)))
    size = masking.checked_size(core.maximum(top, minlength), ok, length)
    dtype = DType.i64 if weights is None else weights.dtype
    zeros_ = cast(mul(size, 0), dtype)  # reads the node that binds the length
    return scatter(zeros_, x, 1 if weights is None else weights, 0, "add")


def _empty(x) -> bool:
    return any(isinstance(d, int) and d == 0 for d in x.shape)


# -- torch.scatter's per-element index --------------------------------------------------------

def scatter_elements(x, dim: int, index, src, reduce="replace", include_self=True):
    """``x.scatter_reduce(dim, index, src)``: ``x[..., index[p], ...]`` along ``dim`` takes
    ``src[p]`` for every position p of ``index`` (which may be shorter than x off ``dim``;
    src is read where index has elements); every index in range or negative from the end."""
    if x.ndim == 0:
        x1 = scatter_elements(reshape(x, (1,)), 0, reshape(index, (-1,)),
                              reshape(src, (-1,)) if isinstance(src, Tensor) else src,
                              reduce, include_self)
        return reshape(x1, ())
    dim = dim % x.ndim
    if isinstance(src, Tensor):
        for axis, size in enumerate(index.shape):
            src = core.slice(src, axis, 0, size)
    rows = _one_column(x, dim, index)
    if rows is not None:
        return combine_at(x, dim, wrap(as_index(rows), x, dim), src, reduce, include_self)
    positions = element_positions(x, dim, wrap(as_index(index), x, dim))
    return write(x, positions, src, reduce, include_self)


def element_positions(x, dim: int, index):
    """The flat position in x of ``x[i0, ..., index[i0, ...], ...]`` for every position of
    ``index`` (in range): ``index * stride(dim)`` plus each other coordinate times its
    stride."""
    out = index if dim == x.ndim - 1 else \
        mul(index, size_tensor(x, range(dim + 1, x.ndim), DType.i64))
    for axis in range(x.ndim):
        if axis == dim:
            continue
        along = reshape(iota(index.shape[axis], "i64", x.builder),
                        tuple(index.shape[axis] if a == axis else 1 for a in range(x.ndim)))
        out = add(out, mul(along, size_tensor(x, range(axis + 1, x.ndim), DType.i64)))
    return out


def _one_column(x, dim: int, index) -> Tensor | None:
    """The 1-D index along ``dim`` where ``index`` is one column broadcast over x's whole
    rows (``index.view(-1, 1).expand_as(src)``: a repeat of axes of size 1), else None."""
    rest = [a for a in range(x.ndim) if a != dim]
    if index.ndim != x.ndim or not all(dims_equal(index.shape[a], x.shape[a]) for a in rest):
        return None
    node = _producer(index)
    if node is None or node.op is not Op.repeat or not set(rest) <= set(node.spec.axes):
        return None
    column = index.type.with_shape(1 if a in node.spec.axes else d
                                   for a, d in enumerate(index.shape))
    column = Tensor(index.builder, node.inputs[0], column)
    return broadcast_to(reshape(column, (column.shape[dim],)), (index.shape[dim],))


def _producer(t: Tensor):
    """The node the builder made ``t`` with (None for an input or a weight)."""
    return next((n for n in reversed(t.builder.nodes) if n.name == t.name), None)
