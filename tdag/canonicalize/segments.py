"""What both front ends share when they split a graph into segments at control flow.

A graph with control flow (torch.cond / while_loop, ONNX If / Loop / Scan) becomes several
TDAGs run by controllers; a value computed by an earlier step is a ``Boundary`` in a later
segment, read as one of its TDAG's inputs.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.ir.types import TensorType


@dataclass(frozen=True)
class Boundary:
    """A value defined outside the current segment: a block input or an earlier step's
    output, read in a segment as one of its TDAG's inputs."""

    name: str
    type: TensorType


__all__ = ["Boundary"]
