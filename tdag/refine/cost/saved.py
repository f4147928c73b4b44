"""The activations a training program keeps for its backward pass, for ``tdag.cost``.

A forward value that a backward node reads (``Origin.phase``: tdag.grad's ``vjp:`` nodes) must
stay in memory from the moment the forward computes it until the backward is done with it:
the activation memory of training, what ``torch.autograd.graph.saved_tensors_hooks`` sees torch
save. **saved_bytes** counts each such value once, as the bytes of the tensor the forward
computed: a backward read through a view (reshape, permute, expand) keeps the viewed tensor,
which the view does not copy. Inputs and weights are not counted: they are in memory anyway.

A program with control flow (an LSTM's Loop, a model split at an If) is differentiated step
by step (``tdag.refine.grad.controllers``): its backward steps recompute inside themselves
the forward values of their own step (origin ``recompute:``, not counted here), and what the
program keeps are the values its forward steps hand to its backward steps, a counted Loop's
stacks of carried values among them (``saved_between_steps``).
"""
from __future__ import annotations

from tdag.ir.graph import TDAG
from tdag.ir.program import Block, Call, Program, all_steps, step_reads
from tdag.ir.record import Trait, ops_with
from tdag.ir.symbols import Dim, as_dim
from tdag.ir.verify import block_types
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


def saved_between_steps(prog: Program) -> Dim:
    """The bytes of the top-level values that a forward step computes and a backward step
    reads (each once): what a gradient program with control flow keeps between its passes.
    Values inside a loop's trip live for that trip only and are not kept."""
    block = prog.main
    backward = {id(step) for step in block.steps if _runs_backward(prog, step)}
    if not backward:
        return 0
    named = tuple(n for step in block.steps for n in step.outputs)
    types = dict(zip(named, block_types(prog, Block(block.inputs, block.steps, named))))
    made_forward = {n for step in block.steps if id(step) not in backward for n in step.outputs}
    read_back = set().union(*(step_reads(s) for s in block.steps if id(s) in backward))
    sizes = Sizes()
    return as_dim(sum((sizes[types[n]] for n in made_forward & read_back), 0))


def _runs_backward(prog: Program, step) -> bool:
    """Whether a step (or a step inside it) calls a TDAG holding backward nodes."""
    return any(isinstance(s, Call) and any(n.origin.phase == "backward"
                                           for n in prog.graphs[s.graph].nodes)
               for s in all_steps(Block((), (step,), ())))


__all__ = ["saved_between_steps", "saved_for_backward"]
