"""Lowering: recognise primitive patterns that a framework runs as one kernel.

The kernels it emits are ops like any other, with their records in ``tdag/lower/kernels``.
Each pass sweeps its rules (``Rule(op, fn)``, one tuple per module) with the rewrite engine of
``tdag.ir.rewrite``; ``explain(prog, "%42")`` says why a node was or was not lowered.

>>> import tdag, tdag.lower
>>> from tdag import ops
>>> prog = tdag.trace(lambda a, b: ops.matmul(a, b), tdag.TensorSpec(("b", 4, 8)),
...                   tdag.TensorSpec((8, 3)))
>>> [n.op.value for n in tdag.lower.lower(prog).graph.nodes]
['einsum']
"""
from tdag.lower.explain import Explanation, explain
from tdag.lower.passes import PassError
from tdag.lower.pipeline import DEFAULT, PASSES, lower

__all__ = ["DEFAULT", "Explanation", "PASSES", "PassError", "explain", "lower"]
