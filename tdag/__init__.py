"""tdag: a portable tensor-DAG IR. Capture a model, reduce it to a few primitive ops,
analyse and transform it as data, and turn it back into torch, ONNX or JAX.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.sum(x * x, axis=1), tdag.TensorSpec(("b", 8)))
>>> tdag.verify(prog)
>>> [str(t) for t in prog.graph.output_types]
['f32[b]']
"""
from tdag import ops
from tdag.canonicalize import from_onnx, from_torch, from_torch_stacked
from tdag.canonicalize.jax.importer import from_jax  # imports jax on its first call
from tdag.deinops import PRIMITIVES
from tdag.ops.trace import TensorSpec, trace
from tdag.errors import (
                         CaptureError,
                         ConversionError,
                         FileFormatError,
                         InvalidModelError,
                         MemoryBudgetError,
                         PatternError,
                         ShapeError,
                         TdagError,
                         UnsupportedOpError,
)
from tdag.ir.graph import TDAG, Node, Value, Weight
from tdag.ir.interpreter import run
from tdag.ir.op import Op
from tdag.ir.parser import parse
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.record import OpRecord, Trait, ops_with, record
from tdag.ir.serialize import load, save
from tdag.ir.types import DType, Origin, TensorKind, TensorType
from tdag.ir.verify import verify
from tdag.refine import (
                         BatchError,
                         CostReport,
                         add_batch,
                         compose,
                         GradError,
                         decode_loop,
                         extract,
                         grad,
                         optim,
                         replace,
                         simplify,
                         strip_batch,
                         train_step,
)
from tdag.reify import to_onnx, to_torch
from tdag.lower.cost import cost  # tdag.refine.cost.report on the program and its lowered kernels
from tdag.reify.torch.memory import memory  # peak bytes as to_torch's module runs it
from tdag.reify.torch.remat import remat  # recompute activations to fit a budget
from tdag.view import to_networkx

__version__ = "0.1.0"


def __getattr__(name: str):
    """``tdag.to_jax`` imports jax on first use: ``import tdag`` works without jax."""
    if name == "to_jax":
        from tdag.reify.jax.function import to_jax  # noqa: PLC0415 (lazy on purpose)
        return to_jax
    raise AttributeError(f"module 'tdag' has no attribute {name!r}")


__all__ = [
    # capture and build
    "from_jax", "from_onnx", "from_torch", "from_torch_stacked", "ops", "trace", "TensorSpec",
    # the data model
    "PRIMITIVES", "TDAG", "Block", "Call", "DType", "If", "Loop", "Node", "Op", "OpRecord",
    "Origin", "Program", "TensorKind", "TensorType", "Trait", "Value", "Weight", "ops_with",
    "record",
    # run, check, read and write
    "load", "parse", "run", "save", "verify",
    # refine
    "BatchError", "CostReport", "GradError", "add_batch", "compose", "cost", "decode_loop",
    "extract", "grad", "optim", "replace", "simplify", "strip_batch", "train_step",
    # reify
    "memory", "remat", "to_jax", "to_onnx", "to_torch",
    # view
    "to_networkx",
    # errors
    "CaptureError", "ConversionError", "FileFormatError", "InvalidModelError",
    "MemoryBudgetError", "PatternError",
    "ShapeError", "TdagError", "UnsupportedOpError",
]
