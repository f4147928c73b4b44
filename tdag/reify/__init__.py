"""Reification: turn a (lowered) Program back into framework code.

``to_torch(prog)`` gives a ``torch.nn.Module``; ``to_onnx(prog)`` an ``onnx.ModelProto``.
Both lower the program first (``lower=True``) and handle every primitive and kernel.
"""
from tdag.reify.onnx.model import to_onnx, write_onnx
from tdag.reify.torch.module import TdagModule, to_torch

__all__ = ["TdagModule", "to_onnx", "to_torch", "write_onnx"]
