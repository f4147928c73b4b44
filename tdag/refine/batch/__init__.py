"""The batch dimension: strip_batch gives the per-sample Program, add_batch its inverse.

- ``rewriter.py``: the walk both share over one TDAG (a batch state per value, dispatch by
  the kind of each op's batch rule) and ``BatchError``;
- ``strip.py``: strip_batch; ``affine.py``: what it knows of integer values (bounds, and a
  stride in the sample index);
- ``add.py``: add_batch;
- ``program.py``: both at the program level (blocks, calls, ifs, loops).
"""
from tdag.refine.batch.add import add_batch
from tdag.refine.batch.rewriter import BatchError
from tdag.refine.batch.strip import strip_batch

__all__ = ["BatchError", "add_batch", "strip_batch"]
