"""The pass manager: a named list of passes run in order until none changes the program.

A pass is ``(program) -> (program, changed)``. ``lower`` repeats the list to a fixed point;
with ``check=True`` it verifies the program after every pass and names the pass that broke it.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

from tdag.errors import TdagError
from tdag.ir.program import Program
from tdag.ir.verify import verify

Pass = Callable[[Program], "tuple[Program, bool]"]


class PassError(TdagError):
    """A lowering pass raised or produced a program that does not verify."""


def run_passes(prog: Program, names: Sequence[str], registry: Mapping[str, Pass],
               max_rounds: int = 16, check: bool = False) -> Program:
    """Run ``names`` (looked up in ``registry``) in order, repeatedly, until nothing changes."""
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise PassError(f"unknown lowering passes {unknown}; known: {sorted(registry)}")
    for _ in range(max_rounds):
        changed_any = False
        for name in names:
            try:
                prog, changed = registry[name](prog)
                if check and changed:
                    verify(prog)
            except TdagError as exc:
                raise PassError(f"lowering pass {name!r} failed: {exc}") from exc
            changed_any |= changed
        if not changed_any:
            return prog
    return prog
