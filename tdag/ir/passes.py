"""Pass infrastructure shared by refine and lower.

A pass is ``(program) -> (program, changed)``. A PassManager runs a named list of passes,
again and again, until none changes anything; with ``check=True`` it verifies the program
after every pass that changed it, so a broken rewrite is caught by name where it happened.
In explain mode (``tdag.ir.rewrite.explaining``) it tells the trace which pass and round
the rules run in; ``per_graph`` tells it which TDAG.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Callable, Iterator, Sequence

from tdag.errors import TdagError
from tdag.ir.graph import TDAG
from tdag.ir.program import Program
from tdag.ir.rewrite import current_trace
from tdag.ir.verify import verify

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
        trace = current_trace()
        with gc_paused():
            for round_ in range(1, self.max_rounds + 1):
                changed = False
                for name, run in self.passes:
                    if trace is None:
                        prog, did = self._run(name, run, prog)
                    else:
                        with trace.within(name, round_):
                            prog, did = self._run(name, run, prog)
                            trace.after_pass(prog.graphs)
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


def per_graph(fn: Callable[[TDAG], "tuple[TDAG, bool]"]) -> Pass:
    """Lift a TDAG pass to a Program pass (applied to every TDAG)."""
    def run(prog: Program) -> tuple[Program, bool]:
        trace = current_trace()
        graphs, changed = {}, False
        for name, graph in prog.graphs.items():
            if trace is not None:
                trace.graph = name  # the looks of this sweep are at nodes of ``name``
            graphs[name], did = fn(graph)
            changed |= did
        return (prog.replace(graphs=graphs), True) if changed else (prog, False)
    run.__name__ = getattr(fn, "__name__", "pass")
    return run
