"""In-place ATen ops in torch's training IR (``masked_fill_`` on a fresh mask, ``add_``).

tdag values are immutable, so ``y = x.op_(...)`` is converted as ``y = op(x, ...)`` and
later readers of ``x`` are pointed at ``y``. That is exact unless another tensor shares x's
memory: a view of x (taken before or after) would see the write in torch but not in tdag,
and a mutated placeholder (an input or buffer) is state. Those cases are left to torch's
functionalization (``run_decompositions``), which rewrites them without mutation.
"""
from __future__ import annotations

import torch

from tdag.canonicalize.torch.aten.registry import is_inplace


def is_view(target) -> bool:
    """An op whose result aliases its input (its schema's return has a non-write alias)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in target._schema.returns)


def inplace_safe(node) -> bool:
    """Whether node, an in-place op, may be converted as its functional op plus a rebind."""
    if not isinstance(node.target, torch._ops.OpOverload) or not is_inplace(node.target):
        return True
    mutated = node.args[0] if node.args else None
    if not isinstance(mutated, torch.fx.Node) or mutated.op != "call_function":
        return False
    if is_view(mutated.target):
        return False
    return not any(is_view(user.target) for user in mutated.users if user is not node)
