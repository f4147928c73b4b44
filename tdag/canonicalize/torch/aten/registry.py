"""The ATen op table: one entry per ATen op, a short function over tdag.ops.

An entry receives the node's arguments as ATen's schema orders them, with tensors already
tdag Tensors and symbolic sizes already tdag dims, and returns a Tensor (or a tuple for ops
with several results). Keys are an op name (``"add"``: every overload) or an overload
(``"div.Tensor_mode"``), which wins over the name. The converter casts each result to the
dtype torch recorded, so entries need not repeat torch's type promotion rules exactly.
``TABLE`` is a Registry (canonicalize/common/registry.py): ``TABLE.where("add")`` names the
family file that maps an op.
"""
from __future__ import annotations

from typing import Callable

import sympy
import torch

from tdag.canonicalize.common.registry import Registry
from tdag.ops.creation import dim_tensor
from tdag.ir.symbols import is_static

TABLE = Registry("the ATen op table")
aten = TABLE.register  # ``@aten("add", "sub.Tensor")``: the decorated function maps those ops


# custom-op namespaces that models call: torch's own (F.linear_cross_entropy with chunking
# options calls torch_nn ops) and transformers' (its experts' grouped matmul); their keys
# carry the namespace: ``torch_nn::op.default``
TORCH_NAMESPACES = frozenset({"torch_nn", "transformers"})


def key(target) -> str | None:
    """``add.Tensor`` for ``torch.ops.aten.add.Tensor``; None outside aten and
    TORCH_NAMESPACES."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = f"{target.overloadpacket.__name__}.{target._overloadname}"
    if target.namespace == "aten":
        return name
    return f"{target.namespace}::{name}" if target.namespace in TORCH_NAMESPACES else None


def entry_for(target) -> Callable | None:
    """The entry for an op, usable or not; an in-place op (``add_``) gets its functional
    op's entry, and the converter decides whether rebinding the written value is safe."""
    name = key(target)
    if name is None:
        return None
    packet, overload = name.split(".", 1)
    if is_inplace(target):
        packet = packet[:-1]
    return TABLE.get(f"{packet}.{overload}") or TABLE.get(packet)


def is_inplace(target) -> bool:
    """``add_`` mutates its first argument; ``__and__`` is a dunder, not in-place."""
    name = target.overloadpacket.__name__
    return name.endswith("_") and not name.endswith("__")


def supports(target) -> bool:
    return entry_for(target) is not None


# -- helpers shared by the families ----------------------------------------------------------


def scalar(value):
    """A Python scalar or a Tensor for an ATen Scalar argument; a symbolic size becomes a
    scalar tensor computed from the shapes (``batch * 4``)."""
    if isinstance(value, sympy.Expr) and not is_static(value):
        return dim_tensor(value)
    if isinstance(value, sympy.Expr):
        return int(value)
    return value


def axes_or_all(dim, ndim: int):
    """ATen's ``dim`` list for reductions: None or [] means every axis; a scalar (rank 0)
    accepts dim 0 or -1 and has no axis to reduce."""
    if ndim == 0:
        return ()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(ndim))
    return (dim,) if isinstance(dim, int) else tuple(dim)
