"""tdag: a portable tensor-DAG IR. Capture a model, reduce it to a few primitive ops,
analyse and transform it as data, and turn it back into torch or ONNX.

>>> import tdag
>>> from tdag import ops
from tdag.canonicalize import from_torch
>>> prog = tdag.trace(lambda x: ops.sum(x * x, axis=1), tdag.TensorSpec(("b", 8)))
>>> tdag.verify(prog)
"""
from tdag import ops
from tdag.canonicalize import from_onnx, from_torch
from tdag.deinops import PRIMITIVES
from tdag.deinops.trace import TensorSpec, trace
from tdag.errors import (FileFormatError, InvalidModelError, PatternError, ShapeError,
                         TdagError, UnsupportedOpError)
from tdag.ir.graph import TDAG, Node, Value, Weight
from tdag.ir.interpreter import run
from tdag.ir.parser import parse
from tdag.ir.serialize import load, save
from tdag.reify import to_onnx, to_torch
from tdag.refine import (BatchError, CostReport, add_batch, compose, cost, extract, replace,
                         simplify, strip_batch)
from tdag.ir.op import Family, Op
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.types import DType, Origin, TensorKind, TensorType
from tdag.ir.verify import verify

__version__ = "0.1.0"

__all__ = [
    "PRIMITIVES", "TDAG", "Block", "Call", "DType", "Family", "FileFormatError", "If",
    "InvalidModelError", "Loop", "Node", "Op", "Origin", "PatternError", "Program", "ShapeError",
    "TdagError", "TensorKind", "TensorSpec", "TensorType", "UnsupportedOpError", "Value",
    "Weight", "BatchError", "add_batch", "compose", "extract", "replace", "simplify",
    "strip_batch", "CostReport", "from_onnx", "from_torch", "to_onnx", "to_torch", "cost", "load", "ops", "parse", "run", "save", "trace", "verify",
]
