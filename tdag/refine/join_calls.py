"""Consecutive Calls of a block -> one Call of their joined TDAG.

A Program split at control flow (``from_torch`` splits at each recurrent module) keeps its
segments apart even after lowering has turned a loop into a kernel call, so patterns that
span segments (a layer's forward and reverse LSTM joined into one bidirectional kernel, a
permute and its inverse) stay out of the rules' reach, and every segment is one more method
call at run time. Joining neighbours gives the per-TDAG passes the whole straight-line run.
"""
from __future__ import annotations

from tdag.ir.graph import TDAG, Value
from tdag.ir.program import (
    Block,
    Call,
    Program,
    nested_blocks,
    read_after,
    rewrite_blocks,
    with_blocks,
)
from tdag.ir.names import FreshNames
from tdag.refine.dataflow import all_names, prune, renamed
from tdag.refine.extract import merge_weights


def join_calls(prog: Program) -> tuple[Program, bool]:
    """The pass: in every block, each run of consecutive Calls becomes one Call."""
    return rewrite_blocks(prog, _block)


def _block(block: Block, graphs: dict, prog: Program) -> tuple[Block, bool]:
    steps: list = []
    changed = False
    for k, step in enumerate(block.steps):
        if nested_blocks(step):
            inner = [_block(b, graphs, prog) for b in nested_blocks(step)]
            step = with_blocks(step, [b for b, _ in inner])
            changed = changed or any(c for _, c in inner)
        elif steps and isinstance(steps[-1], Call) and _joinable(steps[-1], step, prog):
            steps[-1] = _join(steps[-1], step, graphs, read_after(block, k, prog.state))
            changed = True
            continue
        steps.append(step)
    return Block(block.inputs, tuple(steps), block.outputs), changed


def _joinable(a: Call, b: Call, prog: Program) -> bool:
    # a state written by the first call is read by the second from the store, not by name
    return not any(o in prog.state for o in a.outputs)


def _join(a: Call, b: Call, graphs: dict, read: set) -> Call:
    """One Call running ``a`` then ``b``; it returns what later steps read of ``a``'s
    outputs, and all of ``b``'s."""
    first, second = graphs[a.graph], graphs[b.graph]
    names = FreshNames(all_names(first))
    weights, env = merge_weights(first.weights, second.weights, names)
    outer = dict(zip(a.inputs, (v.name for v in first.inputs)))  # outer name -> inner
    outer.update(zip(a.outputs, first.outputs))
    inputs, call_inputs = list(first.inputs), list(a.inputs)
    for value, name in zip(second.inputs, b.inputs):
        if name not in outer:
            outer[name] = names.fresh(value.name)
            inputs.append(Value(outer[name], value.type))
            call_inputs.append(name)
        env[value.name] = outer[name]
    nodes = list(first.nodes)
    for node in second.nodes:
        env[node.name] = names.fresh(node.name)
        nodes.append(renamed(node, env).replace(name=env[node.name]))
    kept = [(o, g) for o, g in zip(a.outputs, first.outputs) if o in read]
    kept += [(o, env.get(g, g)) for o, g in zip(b.outputs, second.outputs)]
    graph = prune(TDAG(tuple(inputs), weights, tuple(nodes), tuple(g for _, g in kept)))
    name = _graph_name(graphs, a.graph)
    graphs[name] = graph
    return Call(name, tuple(call_inputs), tuple(o for o, _ in kept))


def _graph_name(graphs: dict, first: str) -> str:
    """The joined TDAG keeps the first one's name (it replaces it) where that is free."""
    return FreshNames().fresh(first.split("_joined")[0] + "_joined", avoid=graphs)


__all__ = ["join_calls"]
