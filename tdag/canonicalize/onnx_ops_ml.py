"""The ONNX op table, ops of the ai.onnx.ml domain that are tensor arithmetic: Binarizer
(1 above the threshold, else 0) and ArrayFeatureExtractor (a gather along the last axis).
The string ops and the tree ensembles are not mapped."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx_ops import register
from tdag.ir.types import DType

ML_OPS = ("ArrayFeatureExtractor", "Binarizer")


@register("Binarizer")
def _binarizer(ctx, x):
    x = ctx.tensor(x)
    return ops.cast(ops.gt(x, float(ctx.attr("threshold", 0.0))), x.dtype)


@register("ArrayFeatureExtractor")
def _array_feature_extractor(ctx, x, index):
    """The elements of the last axis at ``index`` (flattened, negative counted from the end)."""
    x = ctx.tensor(x)
    index = ops.reshape(ops.cast(ctx.tensor(index), DType.i64), (-1,))
    return ops.gather(x, index, x.ndim - 1)
