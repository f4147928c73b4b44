"""JAX gather, scatter and sorting.

XLA's gather and scatter are general (any start map, windows, batching dims); both become
the flat position of every element they read or write in the operand: a start per index
vector (clamped, or out of bounds filled / dropped by the mode) plus a window offset, times
the operand's strides. A gather is then one gather on the flattened operand, a scatter one
``writes.write`` (tdag/ops/writes.py, shared with the other front ends): the scatter
primitive, linear in what it touches. Duplicates under ``scatter`` (XLA leaves their order
undefined) resolve as torch's CPU kernels: the last in the index's order wins.
"""
from __future__ import annotations

import torch

from tdag import ops
from tdag.canonicalize.jax.ops.table import op
from tdag.ops import sorting
from tdag.ops import writes
from tdag.ir.types import DType


def _stride(x, d: int):
    return ops.size_tensor(x, range(d + 1, x.ndim), DType.i64)


def _positions(x, idx, start_map, batching, window: dict, windowed: list, out_rank: int,
               window_positions) -> tuple:
    """(flat positions shaped [out_rank], in-bounds mask or None) of the elements read or
    written. ``start_map`` names the operand axis of each index component; ``batching``
    pairs (operand axis, index batch axis); ``window`` maps each operand axis to its window
    size (1 for collapsed axes); ``windowed`` are the operand axes with a window axis in
    the result, at the result axes ``window_positions``."""
    idx = ops.cast(idx, DType.i64)
    batch_shape = idx.shape[:-1]
    nb = len(batch_shape)
    batch_positions = [a for a in range(out_rank) if a not in window_positions]
    start, ok = ops.full(batch_shape, 0, DType.i64, like=x), None
    for k, d in enumerate(start_map):
        s = ops.squeeze(ops.slice(idx, nb, k, k + 1), nb)
        high = x.shape[d] - window[d]
        inside = ops.logical_and(ops.ge(s, 0), ops.le(s, high))
        ok = inside if ok is None else ops.logical_and(ok, inside)
        start = ops.add(start, ops.mul(ops.clamp(s, 0, high), _stride(x, d)))
    for d, b in batching:
        line = ops.reshape(ops.iota(batch_shape[b], "i64", x.builder),
                           tuple(n if a == b else 1 for a, n in enumerate(batch_shape)))
        start = ops.add(start, ops.mul(line, _stride(x, d)))
    full_shape = [1] * out_rank
    for a, n in zip(batch_positions, batch_shape):
        full_shape[a] = n
    pos = ops.reshape(start, tuple(full_shape))
    if ok is not None:
        ok = ops.reshape(ok, tuple(full_shape))
    for d, a in zip(windowed, window_positions):
        shape = [1] * out_rank
        shape[a] = window[d]
        step = ops.mul(ops.iota(window[d], "i64", x.builder), _stride(x, d))
        pos = ops.add(pos, ops.reshape(step, tuple(shape)))
    return pos, ok


def _windowed(x, collapsed, batching) -> list:
    return [d for d in range(x.ndim) if d not in collapsed and d not in batching]


def _mode(ctx) -> str:
    return str(ctx.params.get("mode", "")).upper()


@op("gather")
def _gather(ctx, x, idx):
    dn = ctx.params["dimension_numbers"]
    sizes = ctx.params["slice_sizes"]
    axis = _take_axis(x, idx, dn, sizes)
    if axis is not None:
        return _take(ctx, x, idx, axis)
    batching = list(zip(dn.operand_batching_dims, dn.start_indices_batching_dims))
    window = {d: int(s) for d, s in enumerate(sizes)}
    windowed = _windowed(x, dn.collapsed_slice_dims, dn.operand_batching_dims)
    pos, ok = _positions(x, idx, dn.start_index_map, batching, window, windowed,
                         ctx.out_type().rank, tuple(dn.offset_dims))
    out = ops.gather(ops.reshape(x, (-1,)), pos, 0, wrap=False)
    if "FILL" not in _mode(ctx) or ok is None:
        return out
    return ops.where(ok, out, _gather_fill(ctx, x))


def _take_axis(x, idx, dn, sizes) -> int | None:
    """The axis of a gather that is ``jnp.take(x, idx[..., 0], axis)`` (whole rows of one
    axis, the index axes in its place): the common form, made tdag's own gather."""
    if len(dn.start_index_map) != 1 or dn.operand_batching_dims or idx.shape[-1] != 1:
        return None
    (axis,) = dn.start_index_map
    nb = idx.ndim - 1
    rest = tuple(range(axis)) + tuple(range(axis + nb, x.ndim - 1 + nb))
    whole = all(int(s) == x.shape[d] for d, s in enumerate(sizes) if d != axis)
    if tuple(dn.collapsed_slice_dims) != (axis,) or tuple(dn.offset_dims) != rest or not whole:
        return None
    return axis


def _take(ctx, x, idx, axis: int):
    index = ops.squeeze(ops.cast(idx, DType.i64), idx.ndim - 1)
    high = x.shape[axis] - 1
    out = ops.gather(x, ops.clamp(index, 0, high), axis, wrap=False)
    if "FILL" not in _mode(ctx):
        return out
    ok = ops.logical_and(ops.ge(index, 0), ops.le(index, high))
    ok = ops.reshape(ok, (1,) * axis + tuple(index.shape) + (1,) * (x.ndim - axis - 1))
    return ops.where(ok, out, _gather_fill(ctx, x))


def _gather_fill(ctx, x):
    """What a gather reads out of bounds in fill mode: jax's defaults (nan, the extreme)."""
    given = ctx.params.get("fill_value")
    if given is not None:
        return given
    if x.dtype.is_float:
        return float("nan")
    if x.dtype is DType.bool:
        return True
    info = torch.iinfo(x.dtype.torch)
    return info.max if x.dtype.is_unsigned else info.min


_SCATTER = {"scatter": "replace", "scatter-add": "sum", "scatter_add": "sum",
            "scatter-mul": "prod", "scatter_mul": "prod", "scatter-min": "amin",
            "scatter_min": "amin", "scatter-max": "amax", "scatter_max": "amax"}


@op(*_SCATTER)
def _scatter(ctx, x, idx, updates):
    """Each update element goes to its flat position; out of bounds (fill-or-drop mode)
    it is dropped (written to a spare element past the end)."""
    dn = ctx.params["dimension_numbers"]
    batching = list(zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims))
    window_positions = tuple(dn.update_window_dims)
    windowed = _windowed(x, dn.inserted_window_dims, dn.operand_batching_dims)
    window = {d: 1 for d in range(x.ndim)}
    for d, a in zip(windowed, window_positions):
        window[d] = updates.shape[a]
    pos, ok = _positions(x, idx, dn.scatter_dims_to_operand_dims, batching, window,
                         windowed, updates.ndim, window_positions)
    pos = ops.broadcast_to(pos, updates.shape)
    if ok is None or "CLIP" in _mode(ctx):
        return writes.write(x, pos, updates, _SCATTER[ctx.prim])
    flat = ops.reshape(x, (-1,))  # a dropped write goes to one more element, cut off after
    spare = ops.concat([flat, ops.zeros((1,), x.dtype, like=x)], 0)
    pos = ops.where(ok, pos, flat.shape[0])
    out = writes.write(spare, pos, updates, _SCATTER[ctx.prim])
    return ops.reshape(ops.slice(out, 0, 0, flat.shape[0]), x.shape)


# -- sorting --------------------------------------------------------------------------------------

@op("sort")
def _sort(ctx, *xs):
    """Stable (JAX's sort is, and NaN last), lexicographic by the first ``num_keys``
    operands; every operand follows that order."""
    dim = ctx.params["dimension"] % xs[0].ndim
    order = sorting.lexsort(list(xs[:ctx.params.get("num_keys", 1)]), dim)
    return [writes.take_along(x, dim, order) for x in xs]


@op("top_k")
def _top_k(ctx, x):
    axis = ctx.params.get("axis", -1) % x.ndim
    values, index = sorting.topk(x, int(ctx.params["k"]), axis, True)
    return [values, ops.cast(index, ctx.out_type(1).dtype)]
