"""Helpers the generated torch code calls where one torch call does not express an op."""
from __future__ import annotations

import torch


def fold(x: torch.Tensor, axis: int, step: int, dilation: int, length: int) -> torch.Tensor:
    """Overlap-add the windows on (axis, last) into an axis of ``length`` (tdag's fold)."""
    x = x.movedim(axis, -2)
    n, k = x.shape[-2], x.shape[-1]
    index = (torch.arange(n, device=x.device) * step)[:, None] + \
        (torch.arange(k, device=x.device) * dilation)[None, :]
    out = x.new_zeros(*x.shape[:-2], length)
    out = out.index_add(-1, index.reshape(-1), x.reshape(*x.shape[:-2], n * k))
    return out.movedim(-1, axis)


def set_state(module: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Write a program state tensor (a buffer, maybe nested by dots); its shape may change."""
    *path, leaf = name.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part)
    owner._buffers[leaf] = value
