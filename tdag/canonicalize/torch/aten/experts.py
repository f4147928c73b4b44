"""Mixture-of-experts ops: the grouped matmul of routed tokens, as ``ops.grouped_matmul``.

transformers' ``grouped_mm`` experts call ``torch._grouped_mm`` (bf16) or, where that kernel
does not serve (float32 under torch.export, older torch on CPU), its own custom op
``transformers::grouped_mm_fallback``, a Python loop over experts that torch.export keeps
as one opaque node. Both multiply each expert's rows (sorted by expert, ``offs`` the
cumulative counts) by that expert's matrix; the sort, the counts and the combine around
them are ATen ops the table already maps.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.errors import UnsupportedOpError


@aten("transformers::grouped_mm_fallback")
def grouped_mm_fallback(x, weight, offs):
    return ops.grouped_matmul(x, weight, offs)


@aten("_grouped_mm")
def grouped_mm(x, weight, offs=None, bias=None, out_dtype=None):
    """Only the routed form, a 2-d x [S, K] by a 3-d weight [E, K, N] with offsets; the
    other forms (3-d by 3-d, 2-d by 2-d grouped over K) are refused by name."""
    if offs is None or x.ndim != 2 or weight.ndim != 3:
        raise UnsupportedOpError(f"_grouped_mm of a {x.ndim}-d by a {weight.ndim}-d operand"
                                 f"{'' if offs is not None else ' without offs'}: tdag maps "
                                 "only the routed form, a 2-d input by 3-d experts with offs")
    return ops.grouped_matmul(x, weight, offs, bias)
