"""``tdag.train_step``: one optimizer step as a Program whose state holds the parameters,
the optimizer's per-parameter slots and its step count; it takes a batch and returns the
loss.

The step is one TDAG: the joint forward and backward graph of ``tdag.grad``, then each
parameter's update (``tdag.optim``). Parameters become inputs of that TDAG, read from and
written back to the program's state by its Call, so every back end runs it as its own
stateful step: to_torch a module that updates its buffers, to_onnx a model taking the state
as inputs and giving ``<name>.next`` outputs, to_jax a pure ``(state, batch)`` function.
Nodes of the update carry the origin ``optimizer:<name>``, so cost reports tell the three
phases apart.
"""
from __future__ import annotations

import torch

from dataclasses import replace

from tdag.ir.graph import TDAG, Value, Weight
from tdag.ir.passes import gc_paused
from tdag.ir.program import Block, Call, Program, nested_blocks, with_blocks
from tdag.ir.types import OPTIMIZER, DType, Origin, TensorKind, TensorType
from tdag.ops.builder import Builder
from tdag.refine.grad.optim import Optimizer
from tdag.refine.grad.program import GRAD_PREFIX, GradProgram, grad, tied_weights
from tdag.refine.dataflow import prune
from tdag.refine.grad.reverse import GradError

STEP = "step"             # the state entry counting the steps taken (float32, as torch's)


def train_step(prog: Program, optimizer: Optimizer, output: int | str = 0,
               loss: int | str | None = None) -> Program:
    """The Program of one training step of ``prog``'s parameters on the scalar output
    ``output`` (``loss`` is the same, by name or index). Its state: every parameter under
    its own name, each slot of the optimizer as ``<optimizer>.<slot>.<parameter>``, and
    ``<optimizer>.step``; its one output is the loss before the update.

    >>> import tdag, torch
    >>> from tdag import ops
    >>> w = torch.tensor([1.0, -2.0])
    >>> p = tdag.trace(lambda x: ops.sum((x * ops.param("w", w)) ** 2), tdag.TensorSpec((2,)))
    >>> step = tdag.train_step(p, tdag.optim.SGD(lr=0.1))
    >>> [round(float(tdag.run(step, torch.ones(2))), 3) for _ in range(1)]
    [5.0]
    """
    with gc_paused():  # a graph of many small nodes: the cyclic GC's scans would cost a third
        g = grad(prog, output=output if loss is None else loss)
    if len(g.main.steps) != 1:
        return _controlled_step(g, optimizer)
    call = g.main.steps[0]
    joint = g.graphs[call.graph]
    params = _parameter_names(g, joint)
    slots = {p: {s: f"{optimizer.name}.{s}.{p}" for s in optimizer.slots()} for p in params}
    step_name = f"{optimizer.name}.{STEP}"
    graph = _step_graph(joint, call, g.output, params, slots, step_name, optimizer)
    state = _state(joint.weights, params, slots, step_name)
    batch = tuple(v.name for v in g.main.inputs)
    updated = tuple(params) + tuple(n for p in params for n in slots[p].values()) + (step_name,)
    reads = batch + updated
    step = Call("train_step", reads, (g.output,) + updated)
    main = Block(g.main.inputs, (step,), (g.output,))
    return Program({"train_step": graph}, main, state)


def _parameter_names(g: GradProgram, joint: TDAG) -> tuple[str, ...]:
    inputs = {v.name for v in joint.inputs}
    names = tuple(n for n in g.wrt if n not in inputs)
    if not names:
        raise GradError("train_step: the program has no parameters to train")
    return names


def _step_graph(joint: TDAG, call: Call, loss: str, params, slots, step_name,
                optimizer) -> TDAG:
    """The joint graph with the parameters as inputs, then each parameter's update."""
    tied = tied_weights(joint.weights)
    alias = {n: group[0] for n, group in tied.items()}
    builder = Builder()
    builder.reserve(n.name for n in joint.nodes)
    values = {v.name: builder.input(v.name, v.type) for v in joint.inputs}
    for p in params:
        values[p] = builder.input(p, joint.weights[p].type)
    slot_values = {p: {s: builder.input(n, joint.weights[p].type) for s, n in slots[p].items()}
                   for p in params}
    step = builder.input(step_name, TensorType((), DType.f32))
    for name, w in joint.weights.items():
        if name in values:
            continue
        if alias.get(name, name) in values:  # a tied weight reads its group's parameter
            values[name] = values[alias[name]]
        else:
            values[name] = builder.weight(name, w.kind, w.value, w.type)
    with builder.active():
        for node in joint.nodes:
            with builder.scope(node.origin):
                values[node.name] = builder.emit(node.op, node.spec,
                                                 *(values[n] for n in node.inputs),
                                                 name=node.name)
        outs = dict(zip(call.outputs, (values[o] for o in joint.outputs)))
        with builder.scope(Origin(OPTIMIZER + optimizer.name, "optimizer")):
            updates = [optimizer.update(values[p], outs[GRAD_PREFIX + p], slot_values[p], step)
                       for p in params]
            next_step = step + 1.0
    new_params = [u[0] for u in updates]
    new_slots = [u[1][s] for u, p in zip(updates, params) for s in slots[p]]
    return prune(builder.build([outs[loss]] + new_params + new_slots + [next_step]))


def _state(weights: dict, params, slots, step_name) -> dict[str, Weight]:
    """The step's state. A parameter without a value (captured on the meta device) gives
    valueless state too: the step can be analysed (``tdag.cost``, ``tdag.memory``), not run."""
    state = {}
    for p in params:
        w = weights[p]
        value = None if w.value is None else w.value.detach().clone()
        state[p] = Weight(TensorKind.parameter, w.type, value)
        for name in slots[p].values():
            state[name] = Weight(TensorKind.buffer, w.type,
                                 None if value is None else torch.zeros_like(value))
    state[step_name] = Weight(TensorKind.buffer, TensorType((), DType.f32),
                              torch.zeros((), dtype=torch.float32))
    return state


# -- programs with loops and branches ----------------------------------------------------------

def _controlled_step(g: GradProgram, optimizer: Optimizer) -> Program:
    """A step over a program with controllers: every TDAG that holds a parameter takes it as
    an input instead, each Call of it (at any depth) reads it from the state, and one update
    Call after the gradient program writes the parameters, slots and step count back."""
    weights = {n: w for graph in g.graphs.values() for n, w in graph.weights.items()}
    params = tuple(n for n in g.wrt if n in weights)
    if not params:
        raise GradError("train_step: the program has no parameters to train")
    tied = tied_weights(weights)
    head = {n: tied.get(n, (n,))[0] for n in weights}
    reads: dict[str, tuple[str, ...]] = {}
    graphs = {}
    for name, graph in g.graphs.items():
        used = [w for w in graph.weights if head[w] in params]
        graphs[name] = _with_inputs(graph, used) if used else graph
        reads[name] = tuple(head[w] for w in used)
    main = _read_state(g.main, reads)
    slots = {p: {s: f"{optimizer.name}.{s}.{p}" for s in optimizer.slots()} for p in params}
    step_name = f"{optimizer.name}.{STEP}"
    update = _update_graph(weights, params, slots, step_name, optimizer)
    graphs["optimizer_update"] = update
    state_names = tuple(params) + tuple(n for p in params for n in slots[p].values()) + \
        (step_name,)
    grads = tuple(GRAD_PREFIX + p for p in params)
    steps = main.steps + (Call("optimizer_update", state_names + grads, state_names),)
    block = Block(g.main.inputs, steps, (g.output,))
    return Program(graphs, block, {**g.state, **_state(weights, params, slots, step_name)})


def _with_inputs(graph: TDAG, used: list[str]) -> TDAG:
    """``graph`` reading the weights ``used`` as inputs (appended, under their names)."""
    inputs = graph.inputs + tuple(Value(w, graph.weights[w].type) for w in used)
    weights = {k: w for k, w in graph.weights.items() if k not in used}
    return graph.replace(inputs=inputs, weights=weights)


def _read_state(block: Block, reads: dict) -> Block:
    steps = []
    for step in block.steps:
        if isinstance(step, Call) and reads.get(step.graph):
            step = replace(step, inputs=step.inputs + reads[step.graph])
        inner = nested_blocks(step)
        if inner:
            step = with_blocks(step, [_read_state(b, reads) for b in inner])
        steps.append(step)
    return Block(block.inputs, tuple(steps), block.outputs)


def _update_graph(weights: dict, params, slots, step_name, optimizer) -> TDAG:
    """(parameters, slots, step, gradients) -> (new parameters, new slots, new step)."""
    builder = Builder()
    values = {p: builder.input(p, weights[p].type) for p in params}
    slot_values = {p: {s: builder.input(n, weights[p].type) for s, n in slots[p].items()}
                   for p in params}
    step = builder.input(step_name, TensorType((), DType.f32))
    grads = {p: builder.input(GRAD_PREFIX + p, weights[p].type) for p in params}
    with builder.active(), builder.scope(Origin(OPTIMIZER + optimizer.name, "optimizer")):
        updates = [optimizer.update(values[p], grads[p], slot_values[p], step) for p in params]
        next_step = step + 1.0
    new_slots = [u[1][s] for u, p in zip(updates, params) for s in slots[p]]
    return builder.build([u[0] for u in updates] + new_slots + [next_step])


__all__ = ["OPTIMIZER", "train_step"]
