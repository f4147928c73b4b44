"""Movement ATen ops: views, reshapes, slicing, concatenation, padding, flips."""
from __future__ import annotations

import torch

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.deinops.bitcast import bitcast
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import as_dim, is_static
from tdag.ir.types import DType

_END = 2 ** 62  # ATen writes an open slice end as INT64_MAX


@aten("view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias")
def view(x, size, *strides):
    if isinstance(size, torch.dtype):  # view.dtype: the same bits read as another type
        dtype = DType.of(size)
        if dtype.itemsize != x.dtype.itemsize:
            raise UnsupportedOpError(f"view of {x.dtype.value} as {dtype.value}, a type of "
                                     "another width (the last axis would change)")
        return bitcast(x, dtype)
    return ops.reshape(x, tuple(size))


@aten("view_as", "reshape_as")
def view_as(x, other):
    return ops.reshape(x, other.shape)


@aten("permute", "permute_copy")
def permute(x, dims):
    return ops.permute(x, tuple(dims))


@aten("transpose", "swapaxes", "swapdims")
def transpose(x, dim0, dim1):
    return ops.transpose(x, dim0, dim1)


@aten("t", "numpy_T")
def t(x):
    return ops.permute(x, *reversed(range(x.ndim)))


@aten("movedim")
def movedim(x, source, destination):
    if isinstance(source, int):
        return ops.movedim(x, source, destination)
    rest = [a for a in range(x.ndim) if a not in [s % x.ndim for s in source]]
    order = [None] * x.ndim
    for s, d in zip(source, destination):
        order[d % x.ndim] = s % x.ndim
    it = iter(rest)
    return ops.permute(x, tuple(o if o is not None else next(it) for o in order))


@aten("expand", "expand_copy", "broadcast_to")
def expand(x, size, implicit=False):
    size = tuple(size)
    lead = len(size) - x.ndim
    target = [x.shape[i - lead] if is_static(s) and s == -1 else s for i, s in enumerate(size)]
    return ops.broadcast_to(x, target)


@aten("expand_as")
def expand_as(x, other):
    return ops.broadcast_to(x, other.shape)


@aten("squeeze", "squeeze_copy")
def squeeze(x, dim=None):
    if dim is None:
        return ops.squeeze(x)
    axes = (dim,) if isinstance(dim, int) else tuple(dim)
    # ATen ignores axes whose size is not 1
    axes = tuple(a for a in axes if x.ndim and is_static(x.shape[a]) and x.shape[a] == 1)
    return ops.squeeze(x, axes) if x.ndim else x


@aten("unsqueeze", "unsqueeze_copy")
def unsqueeze(x, dim):
    return ops.unsqueeze(x, dim % (x.ndim + 1))


@aten("flatten")
def flatten(x, start_dim=0, end_dim=-1):
    return ops.flatten(x, start_dim, end_dim)


@aten("unflatten")
def unflatten(x, dim, sizes):
    return ops.ungroup(x, dim, tuple(sizes))


@aten("slice", "slice_copy")
def slice_(x, dim=0, start=None, end=None, step=1):
    if isinstance(end, int) and end >= _END:
        end = None
    if isinstance(start, int) and start <= -_END:
        start = None
    return ops.slice(x, dim, start, end, step)


@aten("narrow")
def narrow(x, dim, start, length):
    return ops.slice(x, dim, start, as_dim(start + length))


@aten("select", "select_copy")
def select(x, dim, index):
    return ops.select(x, dim, index)


@aten("unbind", "unbind_copy")
def unbind(x, dim=0):
    n = x.shape[dim]
    if not is_static(n):
        raise UnsupportedOpError(f"unbind along a symbolic axis of size {n}")
    return tuple(ops.select(x, dim, i) for i in range(n))


@aten("cat", "concat", "concatenate")
def cat(tensors, dim=0):
    rank = max(t.ndim for t in tensors)
    # ATen skips legacy empty 1-d tensors next to tensors of higher rank
    kept = [t for t in tensors if not (t.ndim == 1 and rank > 1 and t.shape[0] == 0)]
    return ops.concat(kept, dim % rank)


@aten("stack")
def stack(tensors, dim=0):
    return ops.stack(list(tensors), dim)


@aten("hstack")
def hstack(tensors):
    return ops.concat(list(tensors), 0 if tensors[0].ndim == 1 else 1)


@aten("split", "split_copy")
def split(x, split_size, dim=0):
    return tuple(ops.split(x, split_size, dim))


@aten("split_with_sizes", "split_with_sizes_copy")
def split_with_sizes(x, split_sizes, dim=0):
    return tuple(ops.split(x, list(split_sizes), dim))


@aten("chunk")
def chunk(x, chunks, dim=0):
    return tuple(ops.chunk(x, chunks, dim))


@aten("repeat")
def repeat(x, repeats):
    return ops.tile(x, tuple(repeats))


@aten("repeat_interleave.self_int")
def repeat_interleave(x, repeats, dim=None, output_size=None):
    return ops.repeat_interleave(x, repeats, dim)


@aten("constant_pad_nd")
def constant_pad_nd(x, pad, value=0):
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    return ops.pad(x, widths, value)


@aten("flip")
def flip(x, dims):
    """Reverse axes with gather at n-1, n-2, ..., 0 (no primitive reverses)."""
    for axis in dims:
        n = x.shape[axis]
        reverse = ops.sub(as_dim(n - 1), ops.iota(n, "i64", x.builder)) if is_static(n) else \
            ops.sub(ops.sub(_length(x, axis), 1), ops.iota(n, "i64", x.builder))
        x = ops.gather(x, reverse, axis)
    return x


def _length(x, axis):
    return ops.size_tensor(x, (axis,), "i64")


@aten("roll")
def roll(x, shifts, dims=()):
    if not dims:
        return ops.reshape(roll(ops.flatten(x), shifts, (0,)), x.shape)
    for shift, axis in zip(shifts, dims):
        n = x.shape[axis]
        if not is_static(n):
            raise UnsupportedOpError("roll along a symbolic axis")
        shift = shift % n if n else 0
        if shift:
            x = ops.concat([ops.slice(x, axis, n - shift, n), ops.slice(x, axis, 0, n - shift)],
                           axis)
    return x


@aten("unfold")
def unfold(x, dimension, size, step):
    if x.ndim == 0:
        return ops.unsqueeze(x, 0)
    return ops.unfold(x, dimension, size, step)


@aten("diagonal", "diagonal_copy")
def diagonal(x, offset=0, dim1=0, dim2=1):
    """The diagonal as a gather over the flattened pair of axes, moved last as in ATen."""
    dim1, dim2 = dim1 % x.ndim, dim2 % x.ndim
    x = ops.permute(x, tuple(a for a in range(x.ndim) if a not in (dim1, dim2)) + (dim1, dim2))
    rows, cols = x.shape[-2], x.shape[-1]
    start_row, start_col = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(rows - start_row, cols - start_col))
    flat = ops.flatten(x, x.ndim - 2, x.ndim - 1)
    positions = ops.add(ops.mul(ops.iota(length, "i64", x.builder), cols + 1),
                        start_row * cols + start_col)
    return ops.gather(flat, positions, flat.ndim - 1)
