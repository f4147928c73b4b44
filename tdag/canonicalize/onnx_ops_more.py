"""Registers the ONNX op-table entries kept beside onnx_ops.py and onnx_ops_nn.py: tensor ops
(onnx_ops_tensor.py), norms and attention (onnx_ops_norm.py), losses (onnx_ops_loss.py).
Imported after onnx_ops_nn, so an entry here is the one in force."""
import tdag.canonicalize.onnx_ops_loss  # noqa: F401
import tdag.canonicalize.onnx_ops_norm  # noqa: F401
import tdag.canonicalize.onnx_ops_tensor  # noqa: F401
import tdag.canonicalize.onnx_ops_quant  # noqa: F401
