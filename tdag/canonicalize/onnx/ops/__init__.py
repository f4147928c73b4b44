"""Registers the ONNX op-table entries kept beside onnx/ops/table.py, a family a file: movement,
neural-network ops, tensor ops, norms and attention, losses, quantization, ops the standard
defines as functions, ai.onnx.ml, Resize, signal processing, training and vision. The one
import that fills the table (onnx/importer.py imports this module)."""
import tdag.canonicalize.onnx.ops.movement  # noqa: F401
import tdag.canonicalize.onnx.ops.nn  # noqa: F401
import tdag.canonicalize.onnx.ops.loss  # noqa: F401
import tdag.canonicalize.onnx.ops.norm  # noqa: F401
import tdag.canonicalize.onnx.ops.tensor  # noqa: F401
import tdag.canonicalize.onnx.ops.quant  # noqa: F401
import tdag.canonicalize.onnx.ops.functions  # noqa: F401
import tdag.canonicalize.onnx.ops.ml  # noqa: F401
import tdag.canonicalize.onnx.ops.resize  # noqa: F401
import tdag.canonicalize.onnx.ops.signal  # noqa: F401
import tdag.canonicalize.onnx.ops.training  # noqa: F401
import tdag.canonicalize.onnx.ops.vision  # noqa: F401
