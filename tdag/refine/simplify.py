"""Simplification: a pass manager that runs named passes to a fixed point.

A pass takes a Program and returns ``(program, changed)``. The default pipeline:

    rewrite          peephole rules (tdag/refine/rules.py): permute∘permute, group∘ungroup,
                     squeeze∘unsqueeze, slice of pad, x*1, x+0, -(-x), identity movement
    fold_constants   nodes whose inputs are all consts become consts (small results only)
    cse              common subexpressions: one node per (op, spec, inputs), one copy of
                     each small const value
    dead_code        nodes no output needs, unused consts, TDAGs no controller calls

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.permute(ops.permute(x, 1, 0), 1, 0) * 1.0,
...                   tdag.TensorSpec((2, 3)))
>>> tdag.simplify(prog).num_nodes
0
"""
from __future__ import annotations

from typing import Sequence

import torch

from tdag.ir.graph import TDAG, Weight
from tdag.ir.passes import Pass, PassError, PassManager, per_graph  # noqa: F401  (re-exported)
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.record import Trait, ops_with
from tdag.ir.types import REMAT, TensorKind
from tdag.refine.constants import FOLD_LIMIT, fold_constants
from tdag.refine.dataflow import prune, renamed
from tdag.refine.rules import rewrite

# -- common subexpressions --------------------------------------------------------------------

def cse(graph: TDAG, limit: int = FOLD_LIMIT) -> tuple[TDAG, bool]:
    """Merge nodes with the same op, spec and inputs, and consts with the same small value."""
    env = _same_consts(graph.weights, limit)
    commutative = ops_with(Trait.COMMUTATIVE)  # op(a, b) and op(b, a) are one value
    seen: dict = {}
    nodes = []
    for node in graph.nodes:
        node = renamed(node, env)
        inputs = tuple(sorted(node.inputs)) if node.op in commutative else node.inputs
        # a copy tdag.remat made is never merged: that would keep a value it recomputes
        key = node.name if node.origin.op.startswith(REMAT) else (node.op, node.spec, inputs)
        if key in seen:
            env[node.name] = seen[key]
        else:
            seen[key] = node.name
            nodes.append(node)
    if not env:
        return graph, False
    outputs = tuple(env.get(n, n) for n in graph.outputs)
    return graph.replace(nodes=tuple(nodes), outputs=outputs), True


def _same_consts(weights: dict[str, Weight], limit: int) -> dict[str, str]:
    """Const name -> the first const holding the same small value."""
    first: dict = {}
    env = {}
    for name, w in weights.items():
        if w.kind is not TensorKind.const or w.value is None or w.value.numel() > limit:
            continue
        # the bytes, not the numbers: -0.0 is not 0.0, and bf16 has no numpy type
        key = (w.type, w.value.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        if key in first:
            env[name] = first[key]
        else:
            first[key] = name
    return env


# -- dead code --------------------------------------------------------------------------------

def dead_code(prog: Program) -> tuple[Program, bool]:
    """Drop nodes no output needs, unused consts and TDAGs that no controller calls."""
    called = set()
    _called(prog.main, called)
    graphs = {name: prune(g) for name, g in prog.graphs.items() if name in called}
    changed = len(graphs) != len(prog.graphs) or any(
        graphs[name] is not prog.graphs[name] for name in graphs)
    return (prog.replace(graphs=graphs), True) if changed else (prog, False)


def _called(block: Block, names: set) -> None:
    for step in block.steps:
        if isinstance(step, Call):
            names.add(step.graph)
        elif isinstance(step, If):
            _called(step.then_branch, names)
            _called(step.else_branch, names)
        elif isinstance(step, Loop):
            _called(step.body, names)


# -- the pipeline -----------------------------------------------------------------------------

PIPELINE: list[tuple[str, Pass]] = [
    ("rewrite", per_graph(rewrite)),
    ("fold_constants", per_graph(fold_constants)),
    ("cse", per_graph(cse)),
    ("dead_code", dead_code),
]


def simplify(prog: Program | TDAG, passes: Sequence[tuple[str, Pass]] = PIPELINE,
             check: bool = False) -> Program:
    """``prog`` simplified to a fixed point of ``passes`` (the default PIPELINE)."""
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    return PassManager(passes, check=check)(prog)[0]


__all__ = ["PIPELINE", "PassError", "PassManager", "cse", "dead_code", "per_graph", "simplify"]
