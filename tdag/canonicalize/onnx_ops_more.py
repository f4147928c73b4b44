"""Registers the ONNX op-table entries kept beside onnx_ops.py, a family a file: movement,
neural-network ops, tensor ops, norms and attention, losses, quantization, ops the standard
defines as functions, ai.onnx.ml, Resize, signal processing, training and vision. The one
import that fills the table (onnx_import.py imports this module)."""
import tdag.canonicalize.onnx_ops_movement  # noqa: F401
import tdag.canonicalize.onnx_ops_nn  # noqa: F401
import tdag.canonicalize.onnx_ops_loss  # noqa: F401
import tdag.canonicalize.onnx_ops_norm  # noqa: F401
import tdag.canonicalize.onnx_ops_tensor  # noqa: F401
import tdag.canonicalize.onnx_ops_quant  # noqa: F401
import tdag.canonicalize.onnx_ops_functions  # noqa: F401
import tdag.canonicalize.onnx_ops_ml  # noqa: F401
import tdag.canonicalize.onnx_ops_resize  # noqa: F401
import tdag.canonicalize.onnx_ops_signal  # noqa: F401
import tdag.canonicalize.onnx_ops_training  # noqa: F401
import tdag.canonicalize.onnx_ops_vision  # noqa: F401
