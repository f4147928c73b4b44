"""Small helpers shared by the neural-network compositions (nn.py, nn_conv.py, nn_pool.py)."""
from __future__ import annotations

from typing import Sequence

import torch

from tdag.ops import core
from tdag.ops.tensor import Tensor
from tdag.errors import ShapeError
from tdag.ir.symbols import is_static


def ntuple(value, n: int, what: str) -> tuple:
    """Expand an int to an n-tuple, or check a sequence has n entries (torch's _ntuple)."""
    if isinstance(value, int):
        return (value,) * n
    value = tuple(value)
    if len(value) == 1 and n > 1:
        return value * n
    if len(value) != n:
        raise ShapeError(f"{what}: expected {n} values, got {value}")
    return value


def static_dims(x: Tensor, axes: Sequence[int], what: str) -> tuple[int, ...]:
    """The sizes of ``axes``, which an op needs to know when it is traced."""
    dims = tuple(x.shape[a] for a in axes)
    if not all(is_static(d) for d in dims):
        raise ShapeError(f"{what}: needs static sizes on axes {tuple(axes)}, got {x.type}")
    return dims


def spatial_rank(x: Tensor, size, spatial_dims: int | None, what: str) -> int:
    """How many trailing axes an op works on: from the size's length, else x is (N, C, *S)."""
    if spatial_dims is not None:
        d = spatial_dims
    elif isinstance(size, (tuple, list)) and len(size) > 1:
        d = len(size)
    else:
        d = x.ndim - 2
    if not 1 <= d <= 3 or d > x.ndim:
        raise ShapeError(f"{what}: cannot work on {d} spatial axes of {x.type}")
    return d


def trailing(values, rank: int):
    """Append size-1 axes so that ``values`` (a Tensor or a torch tensor; a scalar passes
    through) broadcasts against ``rank`` trailing axes."""
    if not isinstance(values, (Tensor, torch.Tensor)):
        return values
    extra = rank - values.ndim
    if extra <= 0:
        return values
    if isinstance(values, Tensor):
        return core.unsqueeze(values, tuple(range(values.ndim, rank)))
    return values.reshape(*values.shape, *([1] * extra))


def channel_view(t, x: Tensor) -> Tensor:
    """A per-channel (C,) vector shaped to broadcast over x's axis 1 of (N, C, *S)."""
    t = core.as_tensor(t, x.builder)
    return trailing(t, x.ndim - 1)


def fill_value(x: Tensor, low: bool) -> float | int:
    """The identity of max (low) or min: -inf / +inf for floats, the type's extreme for ints."""
    if x.dtype.is_float:
        return float("-inf") if low else float("inf")
    info = torch.iinfo(x.dtype.torch)
    return info.min if low else info.max



def as_float(x: Tensor) -> Tensor:
    """Integers become float32, as torch's float-only ops (softmax, norms, averages) need."""
    return x if x.dtype.is_float else core.cast(x, "f32")
