"""strip_batch and add_batch at the program level: blocks and their controllers.

Each TDAG is rewritten once per distinct set of states its callers give its arguments (a
second batch layout is a second copy, ``name_1``); the blocks' values are retyped; an ``If``
must put the batch on the same axis in both branches, a ``Loop`` must keep it where its
carried values hold it, and a value a loop scans holds it one axis further in. A pass may
handle loops itself (add_batch widens carried values): ``rewrite_program``'s ``loop`` hook.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from tdag.ir.emit import typed_node
from tdag.ir.graph import TDAG, Value
from tdag.ir.names import FreshNames
from tdag.ir.program import Block, Call, If, Loop, Program, all_steps, called_graphs
from tdag.ir.types import TensorType
from tdag.refine.batch.rewriter import BatchError, layout

# rewrite one TDAG for its arguments' states: (the new TDAG, its outputs' states)
GraphRewrite = Callable[[TDAG, list], "tuple[TDAG, list]"]
# a value's type in a state
Retype = Callable[[TensorType, object], TensorType]


class ProgramRewrite:
    """One pass over a program: its TDAGs, as rewritten per argument states, and the fresh
    names of the values and TDAGs it adds."""

    def __init__(self, prog: Program, rewrite_graph: GraphRewrite, retype: Retype, what: str,
                 loop: Callable | None = None):
        self.prog, self.rewrite_graph, self.retype, self.what = prog, rewrite_graph, retype, what
        self.loop = loop  # (self, step, argument states) -> (before, loop, after, out states)
        self.graphs: dict[str, TDAG] = {}
        self.made: dict = {}
        taken = {name for step in all_steps(prog.main) for name in step.outputs}
        taken |= {v.name for v in prog.main.inputs} | set(prog.graphs) | set(prog.state)
        self.names = FreshNames(taken)  # new block values, adapter TDAGs and copies

    def run(self, states) -> Program:
        main, _ = self.block(self.prog.main, states)
        used = called_graphs(main)  # a loop rewritten twice leaves its first try's copies
        return Program({k: g for k, g in self.graphs.items() if k in used}, main,
                       self.prog.state)

    def call(self, name: str, arg_states) -> tuple:
        """The TDAG ``name`` rewritten for ``arg_states``: (its name, its outputs' states)."""
        key = (name, tuple(arg_states))
        if key not in self.made:
            graph, outs = self.rewrite_graph(self.prog.graphs[name], arg_states)
            # a second batch layout: a second copy
            new_name = name if name not in self.graphs else self.names.fresh(name)
            self.graphs[new_name] = graph
            self.made[key] = (new_name, outs)
        return self.made[key]

    def adapter(self, hint: str, in_type: TensorType, steps) -> str:
        """A new TDAG that applies ``steps`` (``(op, spec)`` pairs) to one value."""
        name = self.names.fresh(hint)
        self.graphs[name] = steps_graph(in_type, steps)
        return name

    def block(self, blk: Block, arg_states) -> tuple:
        """``blk`` rewritten for its inputs' states: (the block, its outputs' states)."""
        prog, what = self.prog, self.what
        env = {name: None for name in prog.state}
        env.update((v.name, s) for v, s in zip(blk.inputs, arg_states))
        steps = []
        for step in blk.steps:
            args = [env[n] for n in step.inputs]
            if isinstance(step, Loop) and self.loop is not None:
                before, step, after, outs = self.loop(self, step, args)
                steps += before
            else:
                step, outs = self.step(step, args)
                after = []
            for name, s in zip(step.outputs, outs):
                if name in prog.state and s is not None:
                    raise BatchError(f"{what}: writes state %{name} with a batch-dependent "
                                     "value; state is shared by every sample")
                env[name] = s
            steps.append(step)
            for extra in after:  # a permute of a stacked value: batch at axis 0 again
                env[extra.outputs[0]] = env[extra.inputs[0]]
                steps.append(extra)
        inputs = tuple(Value(v.name, self.retype(v.type, s))
                       for v, s in zip(blk.inputs, arg_states))
        return Block(inputs, tuple(steps), blk.outputs), [env[n] for n in blk.outputs]

    def step(self, step, args) -> tuple:
        """A controller rewritten for its arguments' states: (the step, its outputs' states)."""
        what = self.what
        if isinstance(step, Call):
            name, outs = self.call(step.graph, args)
            return Call(name, step.inputs, step.outputs), outs
        if isinstance(step, If):
            then_branch, outs = self.block(step.then_branch, args)
            else_branch, else_outs = self.block(step.else_branch, args)
            if list(map(layout, outs)) != list(map(layout, else_outs)):
                raise BatchError(f"{what}: the branches of an if put the batch on different "
                                 "axes")
            return If(step.cond, step.inputs, then_branch, else_branch, step.outputs), outs
        if isinstance(step, Loop):
            body, outs = self.block(step.body, [None, *args])
            offset = 1 if step.cond is not None else 0
            if list(map(layout, outs[offset:offset + len(args)])) != list(map(layout, args)):
                raise BatchError(f"{what}: a loop changes where its carried values hold the "
                                 "batch")
            scanned = [None if s is None else replace(s, axis=s.axis + 1)
                       for s in outs[offset + len(args):]]
            return Loop(step.inputs, body, step.outputs, step.count, step.cond,
                        step.scanned), list(args) + scanned
        raise BatchError(f"{what}: unknown controller {type(step).__name__}")


def rewrite_program(prog: Program, states, rewrite_graph: GraphRewrite, retype: Retype,
                    what: str, loop: Callable | None = None) -> Program:
    """Rewrite every TDAG for the states its callers give it (one copy per distinct set of
    argument states) and retype the blocks' values; ``states`` are the main inputs'."""
    return ProgramRewrite(prog, rewrite_graph, retype, what, loop).run(states)


def steps_graph(in_type: TensorType, steps) -> TDAG:
    """A TDAG of one input ``x`` and one output: ``steps`` applied in turn."""
    nodes, x, t = [], "x", in_type
    for k, (op, spec) in enumerate(steps):
        node = typed_node(op, spec, (x,), (t,), name=f"y{k}")
        nodes.append(node)
        x, t = node.name, node.type
    return TDAG((Value("x", in_type),), {}, nodes, (x,))


__all__ = ["ProgramRewrite", "rewrite_program", "steps_graph"]
