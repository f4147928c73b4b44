"""Programs: TDAGs joined at the top level by controller nodes.

A controller takes a list of tensors (and may read and write the program's state dict) and
returns a list of tensors. Controllers are the only place for control flow:

- ``Call``: run a TDAG;
- ``If``: run one of two blocks on a bool scalar;
- ``Loop``: run a block a fixed (possibly symbolic) number of times, or while a condition
  holds, carrying values from one iteration to the next and stacking per-iteration outputs.

A ``Block`` is a closed list of controllers: it names its inputs, and everything it reads is
an input, the state, or the output of an earlier step.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping, Union

from tdag.ir.graph import TDAG, Weight
from tdag.ir.names import FreshNames
from tdag.ir.symbols import Dim


@dataclass(frozen=True, slots=True)
class Call:
    graph: str
    inputs: tuple
    outputs: tuple


@dataclass(frozen=True, slots=True)
class Block:
    inputs: tuple  # tuple[Value, ...]
    steps: tuple  # tuple[Controller, ...]
    outputs: tuple  # tuple[str, ...]


@dataclass(frozen=True, slots=True)
class If:
    """``outputs = then_branch(inputs) if cond else else_branch(inputs)``."""

    cond: str
    inputs: tuple
    then_branch: Block
    else_branch: Block
    outputs: tuple


@dataclass(frozen=True, slots=True)
class Loop:
    """A counted and/or conditional loop.

    The body's inputs are ``(i, *carried)`` with ``i`` an i64 scalar iteration number; its
    outputs are ``([keep_going], *carried, *scanned)``: ``keep_going`` (a bool scalar) only
    when ``cond`` names the initial condition, and ``scanned`` values are stacked along a new
    leading axis. The loop runs while ``i < count`` (if a count is given) and ``keep_going``.
    ``outputs`` are the final carried values followed by the stacked scanned ones.
    """

    inputs: tuple  # initial carried values
    body: Block
    outputs: tuple
    count: Dim | None = None
    cond: str | None = None
    scanned: int = 0


Controller = Union[Call, If, Loop]


# -- walking blocks ------------------------------------------------------------------------------

def nested_blocks(step: Controller) -> tuple[Block, ...]:
    """The blocks inside a controller: an If's two branches, a Loop's body, none for a Call."""
    if isinstance(step, If):
        return step.then_branch, step.else_branch
    if isinstance(step, Loop):
        return (step.body,)
    return ()


def with_blocks(step: Controller, blocks) -> Controller:
    """``step`` with its nested blocks (in ``nested_blocks`` order) replaced."""
    if isinstance(step, If):
        then, other = blocks
        return replace(step, then_branch=then, else_branch=other)
    if isinstance(step, Loop):
        (body,) = blocks
        return replace(step, body=body)
    return step


def all_steps(block: Block):
    """Every controller of ``block`` and of the blocks nested in it, depth first."""
    for step in block.steps:
        yield step
        for inner in nested_blocks(step):
            yield from all_steps(inner)


def step_reads(step: Controller) -> set[str]:
    """The names a controller reads from its block: its inputs and its condition."""
    cond = getattr(step, "cond", None)
    return set(step.inputs) | ({cond} if cond is not None else set())


def read_after(block: Block, k: int, state) -> set[str]:
    """The names that the steps after step ``k``, the block's outputs or the state read."""
    read = set(block.outputs) | set(state)
    for step in block.steps[k + 1:]:
        read |= step_reads(step)
    return read


def called_graphs(block: Block) -> set[str]:
    """The names of the TDAGs that some Call in ``block`` (at any depth) runs."""
    return {s.graph for s in all_steps(block) if isinstance(s, Call)}


def rewrite_blocks(prog: Program, block_pass) -> tuple[Program, bool]:
    """A Program-level pass: ``block_pass(block, graphs, prog) -> (block, changed)`` on the
    main block (it recurses into nested ones, adding TDAGs to ``graphs``); TDAGs no Call runs
    any more are dropped."""
    graphs = dict(prog.graphs)
    main, changed = block_pass(prog.main, graphs, prog)
    if not changed:
        return prog, False
    called = called_graphs(main)
    return Program({k: g for k, g in graphs.items() if k in called}, main, prog.state,
                   prog.class_labels), True


def state_writes(block: Block, state) -> set[str]:
    """The names of ``state`` that ``block`` writes, in any step, branch or body within it."""
    return {n for s in all_steps(block) for n in s.outputs if n in state}


@dataclass(frozen=True)
class Program:
    """A whole model: named TDAGs, a top-level block of controllers and a state dict.

    ``state`` holds tensors that persist across steps and runs (a KV cache, running stats a
    controller updates); a step writes one by naming it among its outputs.

    ``class_labels`` maps an output of ``main`` whose [N, C] columns are class probabilities
    to the C integer labels of those columns: what an ONNX ``ZipMap`` (ai.onnx.ml) makes a
    sequence of {label: probability} maps of, a type no tdag tensor holds. tdag.run, to_torch
    and to_jax return the [N, C] tensor; to_onnx writes the ZipMap back, so the file it
    writes has the original's seq(map(int64, float)) output.
    """

    graphs: Mapping[str, TDAG]
    main: Block
    state: Mapping[str, Weight] = field(default_factory=dict)
    class_labels: Mapping[str, tuple] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "graphs", dict(self.graphs))
        object.__setattr__(self, "state", dict(self.state))
        object.__setattr__(self, "class_labels",
                           {k: tuple(v) for k, v in self.class_labels.items()})

    def __hash__(self):
        return id(self)

    @staticmethod
    def from_tdag(graph: TDAG, name: str = "main") -> "Program":
        """The program that calls one TDAG on its inputs and returns its outputs."""
        names = FreshNames((v.name for v in graph.inputs),
                           variant=lambda base, k: "_" * k + base)  # out0, else _out0 ...
        outs = tuple(names.fresh(f"out{i}") for i in range(len(graph.outputs)))
        call = Call(name, tuple(v.name for v in graph.inputs), outs)
        return Program({name: graph}, Block(tuple(graph.inputs), (call,), outs))

    @property
    def graph(self) -> TDAG:
        """The TDAG of a program that is a single call (the common case)."""
        if len(self.graphs) != 1:
            raise ValueError(f"program has {len(self.graphs)} TDAGs; use .graphs[name]")
        return next(iter(self.graphs.values()))

    @property
    def inputs(self) -> tuple:
        return self.main.inputs

    @property
    def input_types(self) -> tuple:
        return tuple(v.type for v in self.main.inputs)

    def replace(self, **changes) -> "Program":
        return replace(self, **changes)

    def with_graph(self, name: str, graph: TDAG) -> "Program":
        return replace(self, graphs={**self.graphs, name: graph})

    @property
    def num_nodes(self) -> int:
        return sum(len(g.nodes) for g in self.graphs.values())

    # str(prog) is its text form: tdag.ir.printer installs __str__ (it imports this module)

    def __repr__(self) -> str:
        return f"<tdag.Program: {len(self.graphs)} TDAGs, {self.num_nodes} nodes>"
