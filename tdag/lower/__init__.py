"""Lowering: recognise primitive patterns that a framework runs as one kernel.

The kernels it emits are ops like any other, with their records in ``tdag/deinops/kernels``.

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
from tdag.lower import (activations, attention, conv, movement, norms, pool, recurrent, resize,
                        softmax)
from tdag.lower.contraction import contraction_rule, einsum_bias_rule, einsum_permute_rule
from tdag.lower.passes import Pass, PassError, run_passes
from tdag.lower.rewrite import rule_pass
from tdag.refine.simplify import PIPELINE as SIMPLIFY, PassManager

PASSES: dict[str, Pass] = {
    # fold constants (masks, positions), merge common subexpressions, drop dead code: work
    # the source model repeats on every call is done once here
    "simplify": PassManager(SIMPLIFY),
    "contraction": rule_pass(contraction_rule, einsum_permute_rule),
    "activations": rule_pass(*activations.RULES),
    "softmax": rule_pass(*softmax.RULES),
    "norms": rule_pass(*norms.RULES),
    "conv": rule_pass(*conv.RULES),
    "pool": rule_pass(*pool.RULES),
    "resize": rule_pass(*resize.RULES),
    "attention": rule_pass(*attention.RULES),
    "movement": rule_pass(*movement.RULES),
    "recurrent": rule_pass(*recurrent.RULES),
    "fuse": rule_pass(einsum_bias_rule, *conv.FUSE_RULES, *norms.AFFINE_RULES),
}

DEFAULT = ("simplify", "contraction", "activations", "softmax", "norms", "conv", "pool", "resize",
           "attention", "movement", "fuse", "recurrent")


def lower(prog: Program, passes: Sequence[str] = DEFAULT, check: bool = False) -> Program:
    """Replace recognised patterns by kernels, running ``passes`` to a fixed point.

    The result is a valid Program with the same outputs under ``tdag.run``."""
    return run_passes(prog, passes, PASSES, check=check)


__all__ = ["DEFAULT", "PASSES", "PassError", "lower"]
