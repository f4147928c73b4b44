"""Lowering: recognise primitive patterns that a framework runs as one kernel.

The kernels it emits are ops like any other, with their records in ``tdag/deinops/kernels``.
Each pass sweeps its rules (``Rule(op, fn)``, one tuple per module) with the rewrite engine of
``tdag.ir.rewrite``; ``explain(prog, "%42")`` says why a node was or was not lowered.

>>> import tdag, tdag.lower
>>> from tdag import ops
>>> prog = tdag.trace(lambda a, b: ops.matmul(a, b), tdag.TensorSpec(("b", 4, 8)),
...                   tdag.TensorSpec((8, 3)))
>>> [n.op.value for n in tdag.lower.lower(prog).graph.nodes]
['einsum']
"""
from __future__ import annotations

from typing import Sequence

from tdag.ir.program import Program
from tdag.lower import (activations, attention, contraction, conv, movement, norms, pool,
                        recurrent, resize, softmax)
from tdag.lower.explain import Explanation, explain
from tdag.lower.passes import Pass, PassError, rule_pass, run_passes
from tdag.refine.simplify import PIPELINE as SIMPLIFY, PassManager

PASSES: dict[str, Pass] = {
    # fold constants (masks, positions), merge common subexpressions, drop dead code: work
    # the source model repeats on every call is done once here
    "simplify": PassManager(SIMPLIFY),
    "contraction": rule_pass(*contraction.RULES),
    "activations": rule_pass(*activations.RULES),
    "softmax": rule_pass(*softmax.RULES),
    "norms": rule_pass(*norms.RULES),
    "conv": rule_pass(*conv.RULES),
    "pool": rule_pass(*pool.RULES),
    "resize": rule_pass(*resize.RULES),
    "attention": rule_pass(*attention.RULES),
    "movement": rule_pass(*movement.RULES),
    "recurrent": rule_pass(*recurrent.RULES),
    "fuse": rule_pass(*contraction.FUSE_RULES, *conv.FUSE_RULES, *norms.AFFINE_RULES),
}

DEFAULT = ("simplify", "contraction", "activations", "softmax", "norms", "conv", "pool", "resize",
           "attention", "movement", "fuse", "recurrent")


def lower(prog: Program, passes: Sequence[str] = DEFAULT, check: bool = False) -> Program:
    """Replace recognised patterns by kernels, running ``passes`` to a fixed point.

    The result is a valid Program with the same outputs under ``tdag.run``."""
    return run_passes(prog, passes, PASSES, check=check)


__all__ = ["DEFAULT", "Explanation", "PASSES", "PassError", "explain", "lower"]
