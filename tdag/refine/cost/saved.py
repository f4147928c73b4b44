"""The activations a training program keeps for its backward pass, for ``tdag.cost``.

A forward value that a backward node reads (``Origin.phase``: tdag.grad's ``vjp:`` nodes) must
stay in memory from the moment the forward computes it until the backward is done with it:
the activation memory of training, what ``torch.autograd.graph.saved_tensors_hooks`` sees torch
save. **saved_bytes** counts each such value once, as the bytes of the tensor the forward
computed: a backward read through a view (reshape, permute, expand) keeps the viewed tensor,
which the view does not copy. Inputs and weights are not counted: they are in memory anyway.
"""
from __future__ import annotations

from tdag.ir.graph import TDAG
from tdag.ir.record import Trait, ops_with
from tdag.ir.symbols import Dim
from tdag.refine.cost.fusion import Sizes


def saved_for_backward(graph: TDAG, sizes: Sizes) -> dict[str, Dim]:
    """Forward node -> the bytes of its value that backward nodes read (once each)."""
    phase = {node.name: node.origin.phase for node in graph.nodes}
    if "backward" not in phase.values():
        return {}
    views = ops_with(Trait.VIEW)
    stored: dict[str, str] = {}  # a view's name -> the tensor it shows without a copy
    types = {}
    saved: dict[str, Dim] = {}
    for node in graph.nodes:
        types[node.name] = node.type
        if node.op in views:
            stored[node.name] = stored.get(node.inputs[0], node.inputs[0])
        if phase[node.name] != "backward":
            continue
        for name in node.inputs:
            source = stored.get(name, name)
            if phase.get(source) == "forward" and source not in saved:
                saved[source] = sizes[types[source]]
    return saved


__all__ = ["saved_for_backward"]
