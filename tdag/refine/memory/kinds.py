"""What each tensor a program holds is, for the memory report's split.

weights     parameters and consts (a training step's parameters, which live in its state)
state       the program's other state: a KV cache, BatchNorm running statistics
optimizer   the optimizer's state entries (``<opt>.<slot>.<param>`` and its step count) and
            the values its update computes
inputs      the program's inputs
activations the values the forward computes (and a controller's backward recomputes)
saved       forward values a backward node reads: kept from the forward to the backward
            (``tdag.refine.cost.saved``)
gradients   the values the backward computes: cotangents and the parameters' gradients
workspace   scratch a torch call allocates and frees inside itself (``workspace``)
"""
from __future__ import annotations

from tdag.ir.graph import TDAG, Node
from tdag.ir.program import Program
from tdag.ir.types import TensorKind
from tdag.refine.cost.fusion import Sizes
from tdag.refine.cost.saved import saved_for_backward

KINDS = ("weights", "state", "optimizer", "inputs", "activations", "saved", "gradients",
         "workspace")
_PHASE_KIND = {"forward": "activations", "recompute": "activations", "backward": "gradients",
               "optimizer": "optimizer"}


def state_kinds(prog: Program) -> dict[str, str]:
    """State entry -> its kind: parameters are weights; an entry named ``<opt>.<slot>.<p>``
    for a parameter ``p``, and any other entry under that ``<opt>.`` prefix, the optimizer's."""
    params = {n for n, w in prog.state.items() if w.kind is TensorKind.parameter}
    prefixes = {name.split(".", 1)[0] for name in prog.state
                if name.count(".") >= 2 and name.split(".", 2)[2] in params}
    kinds = {}
    for name, weight in prog.state.items():
        if name in params:
            kinds[name] = "weights"
        else:
            kinds[name] = "optimizer" if name.split(".", 1)[0] in prefixes else "state"
    return kinds


class NodeKinds:
    """The kind of each node's value in one TDAG."""

    def __init__(self, graph: TDAG):
        self.saved = set(saved_for_backward(graph, Sizes()))

    def __call__(self, node: Node) -> str:
        if node.name in self.saved:
            return "saved"
        return _PHASE_KIND.get(node.origin.phase, "activations")


__all__ = ["KINDS", "NodeKinds", "state_kinds"]
