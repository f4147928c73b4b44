"""The strides of a view, as torch computes them: the records' ``view`` rules share these.

A record's ``view`` rule says what strides torch gives the output of an op the torch
emitter runs as a view (``x.permute``, ``x[..., ::2]``, ``x.expand``), or None where the
call copies instead (a reshape of a permuted tensor). ``tdag.memory`` reads it: a view
shares its input's storage and costs no bytes.
"""
from __future__ import annotations

Strides = tuple  # tuple[int, ...]: concrete sizes only (a symbol is probed first)


def contiguous(shape: tuple) -> Strides:
    """Row-major strides of ``shape`` (a size-0 axis strides as a size-1 one, as torch)."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def reshape_strides(old: tuple, strides: Strides, new: tuple) -> Strides | None:
    """torch's strides for viewing ``old`` (with ``strides``) as ``new``; None where the
    reshape must copy (ATen ``computeStride_impl``, ported)."""
    if not old or 0 in old:
        return contiguous(new)
    out = [0] * len(new)
    view_d, chunk = len(new) - 1, strides[-1]
    tensor_n = view_n = 1
    for d in range(len(old) - 1, -1, -1):
        tensor_n *= old[d]
        if d == 0 or (old[d - 1] != 1 and strides[d - 1] != tensor_n * chunk):
            while view_d >= 0 and (view_n < tensor_n or new[view_d] == 1):
                out[view_d] = view_n * chunk
                view_n *= new[view_d]
                view_d -= 1
            if view_n != tensor_n:
                return None
            if d > 0:
                chunk, tensor_n, view_n = strides[d - 1], 1, 1
    return tuple(out) if view_d == -1 else None


def reshape_view(spec, shape: tuple, strides: Strides, out: tuple) -> Strides | None:
    """The ``view`` rule of flatten, unflatten and reshape: a view where strides exist."""
    return reshape_strides(shape, strides, out)


def expand_view(spec, shape: tuple, strides: Strides, out: tuple) -> Strides:
    """The ``view`` rule of ``x.expand``: a broadcast axis strides 0, new leading axes too."""
    lead = len(out) - len(shape)
    return (0,) * lead + tuple(0 if d == 1 and o != 1 else s
                               for d, o, s in zip(shape, out[lead:], strides))


__all__ = ["Strides", "contiguous", "expand_view", "reshape_strides", "reshape_view"]
