"""refine: IR -> IR analyses and transformations (cost, batch stripping, simplification,
subgraph extraction). Each pass takes a Program and returns a new one."""
from tdag.refine.cost import CostReport, Figures, Scope, cost
from tdag.refine.strip_batch import BatchError, add_batch, strip_batch

__all__ = ["BatchError", "CostReport", "Figures", "Scope", "add_batch", "cost", "strip_batch"]
