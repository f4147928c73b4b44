"""refine: IR -> IR analyses and transformations (cost, batch stripping, simplification,
subgraph extraction, generation loops, gradients). Each pass takes a Program and returns a
new one."""
from tdag.refine.cost.report import CostReport, Figures, Scope, cost
from tdag.refine.extract import compose, extract, replace
from tdag.refine.generate import decode_loop
from tdag.refine.grad import GradError, GradProgram, grad, optim, train_step
from tdag.refine.simplify import PIPELINE, PassError, PassManager, simplify
from tdag.refine.batch import BatchError, add_batch, strip_batch

__all__ = ["BatchError", "CostReport", "Figures", "GradError", "GradProgram", "PIPELINE",
           "PassError", "PassManager", "Scope", "add_batch", "compose", "cost", "decode_loop",
           "extract", "grad", "optim", "replace", "simplify", "strip_batch", "train_step"]
