"""The state a call consumes: the TDAG inputs whose storage its code may write over.

A Call that reads a state entry and writes it back (a KV-cache step: ``key_cache`` in and
out) replaces the buffer the caller holds; once it returns nothing reads the old value, so
the call may write the new one into it, as torch's own static cache does (``index_copy_``).
An input the caller passed, a weight, or state some other part of the program still
reads is never written over. The decision is the program's, so that the reified module
and ``tdag.memory``'s replay of it take the same one.

State ``s`` is consumed by a Call that reads it once and writes it, where nothing can hold
the old storage past the call:
- no controller but a Call reads ``s`` (a Loop's carried value or an If's input could hold
  it), no block returns it, and no TDAG reads it as a weight;
- no Call reading ``s`` returns the input ``s`` feeds, or a view of it (the caller would
  keep a local sharing the buffer);
- every Call writing ``s`` writes a value of its own: not an input, not a view of one, and
  not shared with another of its outputs (two buffers set to one tensor: writing one in
  place would write the other; disjoint selects of one stack are apart).
"""
from __future__ import annotations

from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.program import Block, Call, Program, all_steps, nested_blocks, step_reads
from tdag.ir.record import record


def consumed_inputs(prog: Program) -> dict[str, frozenset[str]]:
    """Per TDAG name, the input names that every Call running it consumes (their storage
    is the caller's state, free to write over). One pass over the calls (a training step
    has some 500 state entries)."""
    calls = [s for s in all_steps(prog.main) if isinstance(s, Call)]
    held = _read_outside_calls(prog.main) | {w for g in prog.graphs.values() for w in g.weights}
    kept: dict[str, set[str]] = {}  # per TDAG: its inputs an output shows, its state outputs
    for name, graph in prog.graphs.items():  # whose storage is not its own
        if any(c.graph == name for c in calls):
            kept[name] = _kept(graph)
    for call in calls:
        graph, kept_here = prog.graphs[call.graph], kept[call.graph]
        held |= {arg for v, arg in zip(graph.inputs, call.inputs) if v.name in kept_here}
        held |= {name for name, out in zip(call.outputs, graph.outputs) if out in kept_here}
    states = set(prog.state) - held
    owned: dict[str, frozenset[str]] = {}
    for call in calls:
        graph = prog.graphs[call.graph]
        here = frozenset(v.name for v, arg in zip(graph.inputs, call.inputs)
                         if arg in states and arg in call.outputs
                         and call.inputs.count(arg) == 1)
        owned[call.graph] = owned.get(call.graph, here) & here
    return owned


def view_roots(graph: TDAG) -> dict[str, str]:
    """Each node made by a view op (its record's ``view``: torch may run it as a view)
    -> the input, weight or node whose storage it may share."""
    roots: dict[str, str] = {}
    for node in graph.nodes:
        if record(node.op).view is not None and node.inputs:
            roots[node.name] = roots.get(node.inputs[0], node.inputs[0])
    return roots


def _kept(graph: TDAG) -> set[str]:
    """The inputs whose storage an output may show (the input itself or a view of it), and
    the outputs whose storage is not their own: an input's, a weight's, or one another
    output may share (disjoint selects of one stack are apart: an optimizer update's new
    parameter and moments)."""
    roots = view_roots(graph)
    outs = [roots.get(o, o) for o in graph.outputs]
    inputs = {v.name for v in graph.inputs} | set(graph.weights)
    kept = {r for r in outs if r in inputs} | {o for o, r in zip(graph.outputs, outs)
                                               if r in inputs}
    producer = {n.name: n for n in graph.nodes}
    by_root: dict[str, list[str]] = {}
    for out, root in zip(graph.outputs, outs):
        by_root.setdefault(root, []).append(out)
    for names in by_root.values():
        for i, a in enumerate(names):
            if any(j != i and (a == b or not _apart(producer.get(a), producer.get(b)))
                   for j, b in enumerate(names)):
                kept.add(a)
    return kept


def _apart(a, b) -> bool:
    """Whether two nodes are selects of one value at different indices (disjoint slices)."""
    return a is not None and b is not None and a.op is Op.select and b.op is Op.select and \
        a.inputs == b.inputs and a.spec.axis == b.spec.axis and a.spec.index != b.spec.index


def _read_outside_calls(block: Block) -> set[str]:
    """The names a controller other than a Call reads, or a block returns, at any depth."""
    names = set(block.outputs)
    for step in block.steps:
        if not isinstance(step, Call):
            names |= step_reads(step)
        for inner in nested_blocks(step):
            names |= _read_outside_calls(inner)
    return names


__all__ = ["consumed_inputs", "view_roots"]
