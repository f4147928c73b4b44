"""Helpers the generated torch code calls where one torch call does not express an op."""
from __future__ import annotations

from typing import Callable

import torch

from tdag.deinops.extent import clamped_pad  # noqa: F401  (generated code)
from tdag.deinops.scatter import scatter_rows, scatter_rows_  # noqa: F401  (generated code)
from tdag.errors import ShapeError, TdagError
from tdag.ir.carriers import cast_value, divide_u64  # noqa: F401  (generated code calls them)
from tdag.ir.interpreter import bind
from tdag.lower.kernels.backward import rms_norm_backward  # noqa: F401  (generated)
from tdag.lower.kernels.activations import gelu_tanh  # noqa: F401  (generated code)
from tdag.lower.kernels.experts import grouped_mm  # noqa: F401  (generated code)
from tdag.lower.kernels.norms import eval_batch_norm, rms_norm  # noqa: F401  (generated)
from tdag.lower.kernels.onednn import conv1d, conv1x1, conv2d, linear  # noqa: F401  (generated)
from tdag.lower.kernels.sequence import rotary  # noqa: F401  (generated code)
from tdag.lower.kernels.linalg import (  # noqa: F401  (generated)
    linalg_eig, linalg_eigh, linalg_ldl_factor, linalg_qr, linalg_svd,
)
from tdag.lower.kernels.optim import adamw_step, adamw_step_  # noqa: F401  (generated code)
from tdag.lower.kernels.sorting import topk_positions  # noqa: F401  (generated code)
from tdag.lower.kernels.writes import write_slice  # noqa: F401  (generated code)


def fold(x: torch.Tensor, axis: int, step: int, dilation: int, length: int) -> torch.Tensor:
    """Overlap-add the windows on (axis, last) into an axis of ``length`` (tdag's fold)."""
    x = x.movedim(axis, -2)
    n, k = x.shape[-2], x.shape[-1]
    index = (torch.arange(n, device=x.device) * step)[:, None] + \
        (torch.arange(k, device=x.device) * dilation)[None, :]
    out = x.new_zeros(*x.shape[:-2], length)
    out = out.index_add(-1, index.reshape(-1), x.reshape(*x.shape[:-2], n * k))
    return out.movedim(-1, axis)


# A (N, C, H, W) -> channels-last copy reads C rows a plane apart for every pixel it writes;
# where a plane is a multiple of 4 KiB the rows fall in one cache set, and past the cache's
# 8 ways each read misses: a [4, 16, 64, 64] image took 319 us against 164 copied 8 channels
# at a time, a [4, 32, 32, 32] one 331 against 96 (one thread); the UNet block's module 3-6%
# faster. Other planes gain nothing.
_ALIASED_PLANE = 4096  # bytes
_CHANNEL_CHUNK = 8


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """``x.contiguous(memory_format=torch.channels_last)``, copied a few channels at a time
    where the (N, C, H, W) planes would alias in the cache (see above); a 3-d (N, C, W) ``x``
    on (N, W, C) storage."""
    if x.dim() == 3:
        return x.transpose(1, 2).contiguous().transpose(1, 2)
    n, c, h, w = x.shape
    if c <= _CHANNEL_CHUNK or (h * w * x.element_size()) % _ALIASED_PLANE or not x.is_cpu or \
            not x.is_contiguous() or torch.is_grad_enabled() and x.requires_grad:
        return x.contiguous(memory_format=torch.channels_last)
    out = torch.empty_like(x, memory_format=torch.channels_last)
    for start in range(0, c, _CHANNEL_CHUNK):
        out[:, start:start + _CHANNEL_CHUNK].copy_(x[:, start:start + _CHANNEL_CHUNK])
    return out


def set_state(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Write a program state tensor (a buffer, maybe nested by dots); its shape may change."""
    *path, leaf = name.split(".")
    owner = module
    for part in path:  # the submodule tables, not getattr: a training step writes ~100 states
        owner = owner._modules[part]
    owner._buffers[leaf] = value


def stack(values: list, shape: Callable[[], tuple], dtype: torch.dtype,
          device: torch.device) -> torch.Tensor:
    """The scanned output of a loop: its trips stacked, or empty when it ran none."""
    if values:
        return torch.stack(values)
    try:
        return torch.empty((0, *shape()), dtype=dtype, device=device)
    except NameError:  # a size that only a trip binds
        raise TdagError("loop ran zero iterations: a scanned output's shape is decided only "
                        "by a trip") from None


def bad_input(module: torch.nn.Module, *tensors) -> None:
    """Raise the ShapeError that names the input, its type and what was given (the
    generated guard found a mismatch; the interpreter's check words it)."""
    bind(module._tdag_inputs, tensors, {}, "reified module")
    raise ShapeError("reified module: the inputs do not fit the program's input types")
