"""What the front ends share when they split a graph into segments at control flow.

A graph with control flow (torch.cond / while_loop, ONNX If / Loop / Scan, JAX cond / while /
scan) becomes several TDAGs run by controllers; a value computed by an earlier step is a
``Boundary`` in a later segment, read as one of its TDAG's inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.errors import InvalidModelError, TdagError
from tdag.ir.program import Block, Call, Program
from tdag.ir.types import TensorType
from tdag.ir.verify import verify


@dataclass(frozen=True)
class Boundary:
    """A value defined outside the current segment: a block input or an earlier step's
    output, read in a segment as one of its TDAG's inputs."""

    name: str
    type: TensorType


class SegmentEnv(dict):
    """Source names -> values, remembering the names bound since the current segment began:
    closing a segment looks at those alone (looking at every value would make import time
    grow with the square of the number of controllers)."""

    def __init__(self, *args):
        super().__init__(*args)
        self.recent: dict = {}  # an ordered set

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self.recent[key] = None

    def take_recent(self) -> list:
        recent, self.recent = list(self.recent), {}
        return recent


def finished_program(graphs: dict, block: Block, source: str) -> Program:
    """The Program of a front end's main block: a lone Call of a TDAG that returns its outputs
    (no control flow, the common case) is that TDAG's program. Every Program a front end
    returns verifies; one that does not is never handed on (verifying costs about a tenth of
    an import)."""
    step = block.steps[0] if len(block.steps) == 1 else None
    if isinstance(step, Call) and step.outputs == block.outputs:
        prog = Program.from_tdag(graphs[step.graph])
    else:
        prog = Program(graphs, block)
    try:
        verify(prog)
    except TdagError as exc:
        raise InvalidModelError(f"the program read from {source} does not verify: "
                                f"{exc}") from exc
    return prog


__all__ = ["Boundary", "SegmentEnv", "finished_program"]
