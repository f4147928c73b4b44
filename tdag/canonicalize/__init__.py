"""canonicalize: one pass from a framework graph to a tdag Program."""
from tdag.canonicalize.onnx_import import from_onnx
from tdag.canonicalize.torch_export import from_torch

__all__ = ["from_onnx", "from_torch"]
