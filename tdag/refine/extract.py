"""Subgraphs as Programs: ``extract`` one, ``replace`` one by another, ``compose`` two.

A region of a TDAG is named by its boundary, input names and output names, or by a module
scope (``encoder.layer.1``: the nodes whose provenance lies in it). An extracted region is a
standalone Program that holds only the weights it reads; nodes outside the scope that depend
on weights alone (a transposed weight) come along, so it runs without them.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.exp(ops.neg(x)) + 1.0, tdag.TensorSpec((4,)))
>>> g = prog.graph
>>> sub = tdag.extract(prog, inputs=[g.nodes[0].name], outputs=[g.nodes[1].name])
>>> [n.op.value for n in sub.graph.nodes]
['exp']
"""
from __future__ import annotations

from typing import Sequence

import torch

from tdag.errors import InvalidModelError, ShapeError, TdagError
from tdag.ir.graph import TDAG, Value, Weight
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.verify import block_types
from tdag.ir.names import FreshNames
from tdag.refine.dataflow import all_names, live_names, prune, renamed, toposort


def extract(prog: Program | TDAG, inputs: Sequence[str] | None = None,
            outputs: Sequence[str] | None = None, scope: str | None = None,
            graph: str | None = None) -> Program:
    """The standalone Program computing ``outputs`` from ``inputs``, or a module ``scope``.

    ``graph`` names the TDAG when the program has several (by default the one holding the
    scope, or the only one).
    """
    gname, g = _pick_graph(prog, graph, scope)
    if scope is not None:
        if inputs is not None or outputs is not None:
            raise TdagError("extract: give a scope, or inputs and outputs, not both")
        inputs, outputs = scope_boundary(g, scope)
    if inputs is None or outputs is None:
        raise TdagError("extract: needs inputs and outputs, or a scope")
    return Program.from_tdag(_slice(g, list(inputs), list(outputs)), gname)


def _pick_graph(prog, name: str | None, scope: str | None) -> tuple[str, TDAG]:
    if isinstance(prog, TDAG):
        return "main", prog
    if name is not None:
        if name not in prog.graphs:
            raise TdagError(f"no TDAG named {name!r}; the program has {sorted(prog.graphs)}")
        return name, prog.graphs[name]
    if len(prog.graphs) == 1:
        return next(iter(prog.graphs.items()))
    holding = [k for k, g in prog.graphs.items()
               if scope is not None and any(_in_scope(n.origin.scope, scope) for n in g.nodes)]
    if len(holding) == 1:
        return holding[0], prog.graphs[holding[0]]
    raise TdagError(f"the program has {len(prog.graphs)} TDAGs: name one with graph=")


def _in_scope(path: str, scope: str) -> bool:
    return path == scope or path.startswith(scope + ".")


def scope_boundary(graph: TDAG, scope: str) -> tuple[list[str], list[str]]:
    """The input and output names of the nodes in ``scope``: inputs in order of first use,
    outputs in order of definition. Raises if the scope is empty or not convex."""
    region = {n.name for n in graph.nodes if _in_scope(n.origin.scope, scope)}
    if not region:
        scopes = sorted({n.origin.scope.split(".")[0] for n in graph.nodes if n.origin.scope})
        raise TdagError(f"no node in scope {scope!r}; top-level scopes: {scopes[:20]}")
    weight_only = _weight_only(graph)
    inputs, outputs, seen = [], [], set()
    used_outside = set(graph.outputs)
    for node in graph.nodes:
        if node.name in region:
            for name in node.inputs:
                if name not in region and name not in graph.weights and \
                        name not in weight_only and name not in seen:
                    seen.add(name)
                    inputs.append(name)
        else:
            used_outside.update(node.inputs)
    outputs = [n.name for n in graph.nodes if n.name in region and n.name in used_outside]
    _check_convex(graph, region, scope)
    return inputs, outputs


def _weight_only(graph: TDAG) -> set[str]:
    """Nodes that depend on weights alone (computed the same on every run)."""
    inputs = {v.name for v in graph.inputs}
    result = set()
    for node in graph.nodes:
        if all(n in graph.weights or n in result for n in node.inputs) and \
                not any(n in inputs for n in node.inputs):
            result.add(node.name)
    return result


def _check_convex(graph: TDAG, region: set[str], scope: str) -> None:
    """A value leaving the scope must not come back into it: the scope would have to run
    in two parts."""
    after: set[str] = set()  # outside nodes that depend on the region
    for node in graph.nodes:
        if node.name in region:
            back = [n for n in node.inputs if n in after]
            if back:
                raise InvalidModelError(f"scope {scope!r} is not convex: %{back[0]} is computed "
                                        "outside it from its own values and read back in",
                                        node=node.name, origin=node.origin)
        elif any(n in region or n in after for n in node.inputs):
            after.add(node.name)


def _slice(graph: TDAG, inputs: list[str], outputs: list[str]) -> TDAG:
    types = graph.types()
    for name in inputs + outputs:
        if name not in types:
            raise TdagError(f"extract: no tensor %{name} in the graph")
    live = live_names(graph, outputs, stop=inputs)
    cut = set(inputs)
    graph_inputs = {v.name for v in graph.inputs}
    missing = sorted(n for n in live if n in graph_inputs and n not in cut)
    if missing:
        raise TdagError(f"extract: the outputs also depend on %{missing[0]}, which is not "
                        "among the inputs")
    nodes = tuple(n for n in graph.nodes if n.name in live and n.name not in cut)
    weights = {k: w for k, w in graph.weights.items() if k in live and k not in cut}
    values = tuple(Value(name, types[name]) for name in inputs)
    return TDAG(values, weights, nodes, tuple(outputs))


# -- replace ----------------------------------------------------------------------------------

def replace(prog: Program, scope_or_sub, new: Program | TDAG, graph: str | None = None) -> Program:
    """``prog`` with a region replaced by ``new``: the region is a scope name, or a Program
    / TDAG extracted from ``prog`` (its input and output names mark the boundary). The new
    program's input and output types must match the region's."""
    scope = scope_or_sub if isinstance(scope_or_sub, str) else None
    gname, g = _pick_graph(prog, graph, scope)
    if scope is not None:
        inputs, outputs = scope_boundary(g, scope)
    else:
        sub = scope_or_sub.graph if isinstance(scope_or_sub, Program) else scope_or_sub
        inputs, outputs = [v.name for v in sub.inputs], list(sub.outputs)
    body = new.graph if isinstance(new, Program) else new
    _check_signature(g, inputs, outputs, body)
    return prog.with_graph(gname, splice(g, inputs, outputs, body))


def _check_signature(g: TDAG, inputs, outputs, body: TDAG) -> None:
    types = g.types()
    for what, names, new_types in (("inputs", inputs, [v.type for v in body.inputs]),
                                   ("outputs", outputs, list(body.output_types))):
        old = [types[n] for n in names]
        if len(old) != len(new_types) or not all(a.same_as(b) for a, b in zip(old, new_types)):
            raise ShapeError(f"replace: the region's {what} are "
                             f"({', '.join(f'%{n}: {t}' for n, t in zip(names, old))}) but the "
                             f"new program's are ({', '.join(map(str, new_types))})")


def splice(g: TDAG, inputs: list[str], outputs: list[str], body: TDAG) -> TDAG:
    """``g`` with ``body`` computing ``outputs`` from ``inputs`` in place of the old nodes."""
    names = FreshNames(all_names(g))
    weights, env = merge_weights(g.weights, body.weights, names)
    env.update((v.name, name) for v, name in zip(body.inputs, inputs))
    new_nodes = []
    for node in body.nodes:
        env[node.name] = names.fresh(node.name)
        new_nodes.append(renamed(node, env).replace(name=env[node.name]))
    subst = {old: env.get(new, new) for old, new in zip(outputs, body.outputs)}
    outs = set(outputs)
    first = next((i for i, n in enumerate(g.nodes) if outs & set(n.inputs)), len(g.nodes))
    kept = [renamed(n, subst) for n in g.nodes]
    order = toposort(kept[:first] + new_nodes + kept[first:],
                     [v.name for v in g.inputs] + list(weights))
    graph_outputs = tuple(subst.get(n, n) for n in g.outputs)
    spliced = prune(TDAG(g.inputs, weights, order, graph_outputs), keep_weights=False)
    # weights the old region alone read go; weights the program never read stay
    unread = {k: w for k, w in g.weights.items() if k not in live_names(g)}
    return spliced.replace(weights={**unread, **spliced.weights})


def merge_weights(ours: dict[str, Weight], theirs: dict[str, Weight], names: FreshNames):
    """Our weights plus theirs; a weight of theirs with our name is shared when it holds the
    same tensor, and renamed otherwise. Returns (weights, their name -> merged name)."""
    weights = dict(ours)
    env = {}
    for name, w in theirs.items():
        mine = ours.get(name)
        if mine is not None and _same_weight(mine, w):
            env[name] = name
            continue
        new = names.fresh(name, avoid=weights)
        weights[new] = w
        env[name] = new
    return weights, env


def _same_weight(a: Weight, b: Weight) -> bool:
    if a.kind is not b.kind or a.type != b.type:
        return False
    if a.value is None or b.value is None:
        return a.value is b.value
    return a.value is b.value or torch.equal(a.value, b.value)


# -- compose ----------------------------------------------------------------------------------

def compose(a: Program, b: Program) -> Program:
    """The Program that runs ``a`` and feeds its outputs to ``b``."""
    a_types, b_types = _block_output_types(a), b.input_types
    if len(a_types) != len(b_types) or not all(x.same_as(y) for x, y in zip(a_types, b_types)):
        raise ShapeError(f"compose: the first program returns ({', '.join(map(str, a_types))}) "
                         f"but the second takes ({', '.join(map(str, b_types))})")
    if _single_call(a) and _single_call(b):
        return Program.from_tdag(_chain_tdags(a.graph, b.graph), next(iter(a.graphs)))
    return _chain_programs(a, b)


def _block_output_types(prog: Program):
    return block_types(prog, prog.main)


def _single_call(prog: Program) -> bool:
    steps = prog.main.steps
    if len(steps) != 1 or not isinstance(steps[0], Call) or prog.state:
        return False
    call = steps[0]
    return call.inputs == tuple(v.name for v in prog.main.inputs) and \
        call.outputs == prog.main.outputs


def _chain_tdags(first: TDAG, second: TDAG) -> TDAG:
    names = FreshNames(all_names(first))
    weights, env = merge_weights(first.weights, second.weights, names)
    env.update((v.name, out) for v, out in zip(second.inputs, first.outputs))
    nodes = list(first.nodes)
    for node in second.nodes:
        env[node.name] = names.fresh(node.name)
        nodes.append(renamed(node, env).replace(name=env[node.name]))
    outputs = tuple(env.get(n, n) for n in second.outputs)
    return TDAG(first.inputs, weights, tuple(nodes), outputs)


def _chain_programs(a: Program, b: Program) -> Program:
    graphs = dict(a.graphs)
    graph_names = {}
    minted = FreshNames(graphs, variant=lambda base, k: base + "_b" * k)  # g, g_b, g_b_b ...
    for name, g in b.graphs.items():
        graph_names[name] = new = minted.fresh(name)
        graphs[new] = g
    for name, w in b.state.items():
        if name in a.state and not _same_weight(a.state[name], w):
            raise TdagError(f"compose: both programs have a different state %{name}")
    taken = {v.name for v in a.main.inputs} | _block_names(a.main) | set(a.state)
    names = FreshNames(taken)
    env = {v.name: out for v, out in zip(b.main.inputs, a.main.outputs)}
    steps = list(a.main.steps)
    for step in b.main.steps:
        for out in step.outputs:
            env[out] = out if out in b.state else names.fresh(out)
        steps.append(_renamed_step(step, env, graph_names))
    outputs = tuple(env.get(n, n) for n in b.main.outputs)
    return Program(graphs, Block(a.main.inputs, tuple(steps), outputs), {**a.state, **b.state})


def _block_names(block: Block) -> set[str]:
    return {name for step in block.steps for name in step.outputs}


def _renamed_step(step, env: dict, graph_names: dict):
    """A top-level step of the second program reading and writing the chained names."""
    inputs = tuple(env.get(n, n) for n in step.inputs)
    outputs = tuple(env[n] for n in step.outputs)
    if isinstance(step, Call):
        return Call(graph_names[step.graph], inputs, outputs)
    blocks = {"If": ("then_branch", "else_branch"), "Loop": ("body",)}[type(step).__name__]
    fields = {k: _renamed_block(getattr(step, k), graph_names) for k in blocks}
    if isinstance(step, If):
        return If(env.get(step.cond, step.cond), inputs, fields["then_branch"],
                  fields["else_branch"], outputs)
    return Loop(inputs, fields["body"], outputs, step.count,
                env.get(step.cond, step.cond) if step.cond else None, step.scanned)


def _renamed_block(block: Block, graph_names: dict) -> Block:
    """A nested block is closed: only the TDAGs it calls may need new names."""
    env = {n: n for n in _block_names(block) | {v.name for v in block.inputs}}
    steps = tuple(_renamed_step(s, env, graph_names) for s in block.steps)
    return Block(block.inputs, steps, block.outputs)


__all__ = ["compose", "extract", "merge_weights", "replace", "scope_boundary", "splice"]
