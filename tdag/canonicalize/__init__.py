"""canonicalize: one pass from a framework graph to a tdag Program."""
from tdag.canonicalize.torch_export import from_torch

__all__ = ["from_torch"]
