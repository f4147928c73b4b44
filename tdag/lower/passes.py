"""Running the lowering passes: the shared PassManager over passes named in a registry.

``lower`` repeats its list to a fixed point (a lowering that stops short is still correct, so
running out of rounds returns the program); ``check=True`` verifies after every pass and names
the pass that broke the program.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from tdag.ir.passes import Pass, PassError, PassManager
from tdag.ir.program import Program


def run_passes(prog: Program, names: Sequence[str], registry: Mapping[str, Pass],
               max_rounds: int = 16, check: bool = False) -> Program:
    """Run ``names`` (looked up in ``registry``) in order, repeatedly, until nothing changes."""
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise PassError(f"unknown lowering passes {unknown}; known: {sorted(registry)}")
    manager = PassManager([(n, registry[n]) for n in names], max_rounds, check, strict=False)
    return manager(prog)[0]


__all__ = ["Pass", "PassError", "run_passes"]
