"""Consecutive Calls of a block -> one Call of their joined TDAG.

A Program split at control flow (``from_torch`` splits at each recurrent module) keeps its
segments apart even after lowering has turned a loop into a kernel call, so patterns that
span segments (a layer's forward and reverse LSTM joined into one bidirectional kernel, a
permute and its inverse) stay out of the rules' reach, and every segment is one more method
call at run time. Joining neighbours gives the per-TDAG passes the whole straight-line run.
"""
from __future__ import annotations

from tdag.ir.graph import TDAG, Value
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.refine.dataflow import Names, all_names, prune, renamed
from tdag.refine.extract import merge_weights


def join_calls(prog: Program) -> tuple[Program, bool]:
    """The pass: in every block, each run of consecutive Calls becomes one Call."""
    graphs = dict(prog.graphs)
    main, changed = _block(prog.main, graphs, prog)
    if not changed:
        return prog, False
    called = called_graphs(main)
    return Program({k: g for k, g in graphs.items() if k in called}, main, prog.state), True


def _block(block: Block, graphs: dict, prog: Program) -> tuple[Block, bool]:
    steps: list = []
    changed = False
    for k, step in enumerate(block.steps):
        if isinstance(step, If):
            then, a = _block(step.then_branch, graphs, prog)
            other, b = _block(step.else_branch, graphs, prog)
            step, changed = If(step.cond, step.inputs, then, other, step.outputs), \
                changed or a or b
        elif isinstance(step, Loop):
            body, a = _block(step.body, graphs, prog)
            step, changed = Loop(step.inputs, body, step.outputs, step.count, step.cond,
                                 step.scanned), changed or a
        elif steps and isinstance(steps[-1], Call) and _joinable(steps[-1], step, prog):
            steps[-1] = _join(steps[-1], step, graphs, _read_after(block, k, prog))
            changed = True
            continue
        steps.append(step)
    return Block(block.inputs, tuple(steps), block.outputs), changed


def _joinable(a: Call, b: Call, prog: Program) -> bool:
    # a state written by the first call is read by the second from the store, not by name
    return not any(o in prog.state for o in a.outputs)


def _read_after(block: Block, k: int, prog: Program) -> set:
    """The names that steps after ``k``, the block's outputs or the state read."""
    read = set(block.outputs) | set(prog.state)
    for step in block.steps[k + 1:]:
        read.update(step.inputs)
        if isinstance(step, (If, Loop)) and step.cond is not None:
            read.add(step.cond)
    return read


def _join(a: Call, b: Call, graphs: dict, read: set) -> Call:
    """One Call running ``a`` then ``b``; it returns what later steps read of ``a``'s
    outputs, and all of ``b``'s."""
    first, second = graphs[a.graph], graphs[b.graph]
    names = Names(all_names(first))
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
    base = first.split("_joined")[0] + "_joined"
    name, k = base, 1
    while name in graphs:
        name, k = f"{base}_{k}", k + 1
    return name


def called_graphs(block: Block) -> set:
    """The names of the TDAGs some Call in ``block`` (at any depth) runs."""
    called: set = set()
    for step in block.steps:
        if isinstance(step, Call):
            called.add(step.graph)
        elif isinstance(step, If):
            called |= called_graphs(step.then_branch) | called_graphs(step.else_branch)
        else:
            called |= called_graphs(step.body)
    return called


__all__ = ["called_graphs", "join_calls"]
