"""refine: IR -> IR analyses and transformations (cost, batch stripping, simplification,
subgraph extraction, generation loops). Each pass takes a Program and returns a new one."""
from tdag.refine.cost.report import CostReport, Figures, Scope, cost
from tdag.refine.extract import compose, extract, replace
from tdag.refine.generate import decode_loop
from tdag.refine.simplify import PIPELINE, PassError, PassManager, simplify
from tdag.refine.batch import BatchError, add_batch, strip_batch

__all__ = ["BatchError", "CostReport", "Figures", "PIPELINE", "PassError", "PassManager", "Scope",
           "add_batch", "compose", "cost", "decode_loop", "extract", "replace", "simplify",
           "strip_batch"]
