"""canonicalize: one pass from a framework graph to a tdag Program."""
from tdag.canonicalize.onnx.importer import from_onnx
from tdag.canonicalize.torch.export import from_torch
from tdag.canonicalize.torch.stacked import from_torch_stacked

__all__ = ["from_onnx", "from_torch", "from_torch_stacked"]
