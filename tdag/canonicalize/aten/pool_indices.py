"""Max pooling with indices: the flat spatial position of each window's maximum.

Indices feed max-unpooling; the windows are built exactly as ``ops.max_pool`` builds them
(tdag/deinops/nn_pool.py), over a tensor of positions instead of values.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.aten.registry import aten
from tdag.deinops.nn_pool import _pool_args, _windows
from tdag.deinops.nn_util import fill_value
from tdag.ir.symbols import product


def _positions(x, d):
    """Flat index of every spatial position, broadcast to x's shape."""
    spatial = x.shape[x.ndim - d:]
    flat = ops.iota(product(spatial), "i64", x.builder)
    return ops.broadcast_to(ops.reshape(flat, spatial), x.shape)


@aten("max_pool1d_with_indices", "max_pool2d_with_indices", "max_pool3d_with_indices",
      needs=("max_pool",))
def max_pool_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    d, kernel, stride, padding, dilation = _pool_args(x, kernel_size, stride or None, padding,
                                                      dilation, None, "max_pool")
    never = 2 ** 62  # padding positions never win the min below
    values = _windows(x, d, kernel, stride, padding, dilation, ceil_mode, fill_value(x, True))
    where_ = _windows(_positions(x, d), d, kernel, stride, padding, dilation, ceil_mode, never)
    window_axes = tuple(range(values.ndim - d, values.ndim))
    peak = ops.amax(values, window_axes, keepdim=True)
    hit = ops.logical_or(ops.eq(values, peak), ops.isnan(values))  # nan wins, as in torch
    first = ops.amin(ops.where(hit, where_, never), window_axes)  # the first maximum
    return ops.squeeze(peak, window_axes), first
