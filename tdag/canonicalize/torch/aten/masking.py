"""Ops whose output size data decides: each gets a fresh tdag symbol for torch's unbacked
one (u0, u1, ...), which the converter maps to it (``Converter._adopt``)."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten


@aten("nonzero")
def nonzero(x):
    return ops.nonzero(x)


@aten("masked_select")
def masked_select(x, mask):
    return ops.masked_select(x, mask)


@aten("_unique2")
def unique2(x, sorted=True, return_inverse=False, return_counts=False):
    # torch sorts whatever ``sorted`` says on CPU; values, inverse and counts, the last two
    # only when asked (torch returns empty tensors otherwise, which nothing reads)
    return ops.unique(x, return_inverse, return_counts)
