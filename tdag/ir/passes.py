"""Pass infrastructure shared by refine and lower.

A pass is ``(program) -> (program, changed)``. A PassManager runs a named list of passes,
again and again, until none changes anything; with ``check=True`` it verifies the program
after every pass that changed it, so a broken rewrite is caught by name where it happened.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterator, Sequence

from tdag.ir.verify import verify
from tdag.errors import TdagError
from tdag.ir.program import Program

Pass = Callable[[Program], "tuple[Program, bool]"]


class PassError(TdagError):
    """A pass that raised, or left a malformed Program (named in the message)."""


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic GC while a pass builds many small objects: passes make no
    reference cycles worth collecting, and on 100k-node programs the collector's repeated
    scans of the surviving nodes would double the time per node."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class PassManager:
    """Runs ``passes`` (name, pass) in order to a fixed point.

    ``strict`` decides what ``max_rounds`` without a fixed point means: an error (a rewrite
    system that oscillates), or the program as it stands (good-enough lowering).
    """

    def __init__(self, passes: Sequence[tuple[str, Pass]], max_rounds: int = 32,
                 check: bool = False, strict: bool = True):
        self.passes = list(passes)
        self.max_rounds = max_rounds
        self.check = check
        self.strict = strict

    def __call__(self, prog: Program) -> tuple[Program, bool]:
        changed_any = False
        with gc_paused():
            for _ in range(self.max_rounds):
                changed = False
                for name, run in self.passes:
                    prog, did = self._run(name, run, prog)
                    changed |= did
                if not changed:
                    return prog, changed_any
                changed_any = True
        if not self.strict:
            return prog, changed_any
        raise PassError(f"no fixed point after {self.max_rounds} rounds of "
                        f"{', '.join(name for name, _ in self.passes)}")

    def _run(self, name: str, run: Pass, prog: Program) -> tuple[Program, bool]:
        try:
            prog, changed = run(prog)
        except TdagError as exc:
            raise PassError(f"pass {name} failed: {exc}") from exc
        if changed and self.check:
            try:
                verify(prog)
            except TdagError as exc:
                raise PassError(f"pass {name} left a malformed program: {exc}") from exc
        return prog, changed
