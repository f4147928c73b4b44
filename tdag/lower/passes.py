"""Running the lowering passes: the shared PassManager over passes named in a registry.

``lower`` repeats its list to a fixed point (a lowering that stops short is still correct, so
running out of rounds returns the program); ``check=True`` verifies after every pass and names
the pass that broke the program. A pass of rules is one sweep of the rewrite engine
(``tdag.ir.rewrite``) per TDAG: the first rule that fires on a node wins, later nodes see the
rewritten graph, and dead nodes are dropped at the end.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from tdag.ir.graph import TDAG
from tdag.ir.passes import Pass, PassError, PassManager, per_graph
from tdag.ir.program import Program
from tdag.ir.rewrite import Rule, RuleSet, rewrite
from tdag.refine.dataflow import prune


def rule_pass(*rules: Rule) -> Pass:
    """A pass that sweeps ``rules`` over every TDAG, then drops dead nodes."""
    ruleset = RuleSet(rules)

    def sweep(graph: TDAG) -> tuple[TDAG, bool]:
        graph, changed = rewrite(graph, ruleset)
        if changed:
            graph = prune(graph)  # every op is pure: unread nodes and consts go
        return graph, changed
    return per_graph(sweep)


def run_passes(prog: Program, names: Sequence[str], registry: Mapping[str, Pass],
               max_rounds: int = 16, check: bool = False) -> Program:
    """Run ``names`` (looked up in ``registry``) in order, repeatedly, until nothing changes."""
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise PassError(f"unknown lowering passes {unknown}; known: {sorted(registry)}")
    manager = PassManager([(n, registry[n]) for n in names], max_rounds, check, strict=False)
    return manager(prog)[0]


# the default pipeline, registered by tdag.lower.pipeline when it loads: a rule that lowers a
# kernel's composition to build its template (the quant rules) runs it without importing the
# module that holds it
_DEFAULT: dict = {}


def register_default(registry: Mapping[str, Pass], order: Sequence[str]) -> None:
    """Record the default passes and their order (tdag.lower.pipeline, once)."""
    _DEFAULT.update(registry=dict(registry), order=tuple(order))


def default_pipeline() -> tuple[dict, tuple]:
    """The default passes by name and their order."""
    return dict(_DEFAULT["registry"]), _DEFAULT["order"]


__all__ = ["Pass", "PassError", "default_pipeline", "register_default", "rule_pass",
           "run_passes"]
