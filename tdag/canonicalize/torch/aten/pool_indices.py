"""Max pooling with indices: the flat spatial position of each window's maximum.

Indices feed max-unpooling. The windows are built as ``ops.max_pool`` builds them
(tdag/ops/nn/pool.py), over a tensor of positions as well as over the values.
"""
from __future__ import annotations

import math

import torch

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.ops.nn.pool import pool_args, pool_windows
from tdag.ops.nn.util import fill_value
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static, product

_NEVER = 2 ** 62  # a position that never wins the min below


def _positions(x, d):
    """Flat index of every spatial position, broadcast to x's shape."""
    spatial = x.shape[x.ndim - d:]
    flat = ops.iota(product(spatial), "i64", x.builder)
    return ops.broadcast_to(ops.reshape(flat, spatial), x.shape)


def _max_and_first(values, places, d):
    """The max of each window (the last d axes) and the position of its first occurrence."""
    window_axes = tuple(range(values.ndim - d, values.ndim))
    peak = ops.amax(values, window_axes, keepdim=True)
    hit = ops.logical_or(ops.eq(values, peak), ops.isnan(values))  # nan wins, as in torch
    first = ops.amin(ops.where(hit, places, _NEVER), window_axes)
    return ops.squeeze(peak, window_axes), first


@aten("max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices")
def max_pool_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    d, kernel, stride, padding, dilation = pool_args(x, kernel_size, stride or None, padding,
                                                     dilation, None, "max_pool")
    geometry = (d, kernel, stride, padding, dilation, ceil_mode)
    values = pool_windows(x, *geometry, fill_value(x, True))
    places = pool_windows(_positions(x, d), *geometry, _NEVER)
    return _max_and_first(values, places, d)


def _adaptive_windows(x, axis, out):
    """Output cell i pools [floor(i*L/out), ceil((i+1)*L/out)); cells are padded to the
    widest by repeating their last element, which changes neither max nor first argmax."""
    length = x.shape[axis]
    if not is_static(length):
        raise UnsupportedOpError("adaptive pooling over a symbolic axis")
    bounds = [(i * length // out, math.ceil((i + 1) * length / out)) for i in range(out)]
    width = max(end - start for start, end in bounds)
    index = [[min(start + k, end - 1) for k in range(width)] for start, end in bounds]
    table = x.builder.const(torch.tensor(index))
    return ops.movedim(ops.gather(x, table, axis), axis + 1, -1)


@aten("adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d")
def adaptive_max_pool(x, output_size):
    d = len(output_size)
    values, places = x, _positions(x, d)
    for i, out in enumerate(output_size):
        axis = x.ndim - d + i
        values, places = _adaptive_windows(values, axis, out), _adaptive_windows(places, axis, out)
    return _max_and_first(values, places, d)
