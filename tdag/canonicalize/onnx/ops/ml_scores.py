"""What the classic ai.onnx.ml predictors (ml_linear, ml_svm, ml_trees) share, computed as
onnxruntime computes it (its core/providers/cpu/ml/ml_common.h), since scikit-learn's files
are checked against onnxruntime and the spec leaves these details open:

- ``transform``: a post_transform over a row of two or more scores (``tdag.ops.ml``'s
  ``score_transform``, the one meaning the ML kernels decompose to, as ``first_highest``).
- ``two_columns``: the one score of a binary predictor as the two columns onnxruntime writes.
- the attribute readers: float arrays (``_as_tensor`` variants included), int64 class labels
  (string labels are not tensors tdag has), and the [N, F] float rows the predictors read.
"""
from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from tdag import ops
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType
from tdag.ops.ml import TRANSFORMS, logistic, score_transform


def array(ctx, name: str, default=None) -> np.ndarray | None:
    """A floats/ints attribute, or its ``<name>_as_tensor`` variant (ai.onnx.ml 3), as numpy."""
    value = ctx.attr(name)
    if value is None or (isinstance(value, list) and not value):
        value = ctx.attr(name + "_as_tensor")
    if value is None or (isinstance(value, list) and not value):
        return default
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value).reshape(-1)
    return np.asarray(value)


def const(like, values: np.ndarray):
    """A constant tensor of a numpy array (its dtype kept) in ``like``'s graph."""
    return like.builder.const(torch.from_numpy(np.ascontiguousarray(values)))


def int_labels(ctx, name: str = "classlabels_ints") -> np.ndarray:
    """The int64 class labels; string labels are refused (tdag has no string tensors)."""
    strings = name.replace("ints", "strings").replace("int64s", "strings")
    if ctx.attr(strings):
        raise UnsupportedOpError(f"{ctx.node.op_type}: string class labels ({strings}); tdag "
                                 "has no string tensors (labels must be int64)")
    return np.asarray(ctx.attr(name) or [], dtype=np.int64)


def rows(ctx, x):
    """The input as float32 rows [N, F]: a vector is one row (as onnxruntime reads it)."""
    x = ctx.tensor(x)
    if x.dtype not in (DType.f32, DType.f64, DType.i32, DType.i64):
        raise UnsupportedOpError(f"{ctx.node.op_type}: input of type {x.dtype}")
    if x.ndim == 1:
        x = ops.unsqueeze(x, 0)
    if x.ndim != 2:
        raise UnsupportedOpError(f"{ctx.node.op_type}: input of rank {x.ndim} (1 or 2 read)")
    return ops.cast(x, DType.f32)


def transform(ctx, scores, kind: str):
    """A post_transform over [N, C] scores, C >= 2 (``tdag.ops.ml.score_transform``)."""
    return score_transform(scores, kind)


def post_transform(ctx) -> str:
    return ctx.choice("post_transform", "NONE", TRANSFORMS)


def two_columns(ctx, s, mode: str, kind: str):
    """A binary predictor's one score [N] as onnxruntime (1.32) writes two columns:
    ``"complement"`` [1-s, s]; ``"mirror"`` [-s, s]; under LOGISTIC s is logistic(s) first
    (the mirror: [logistic(-s), logistic(s)]), under SOFTMAX or SOFTMAX_ZERO it is not."""
    if kind == "PROBIT":
        raise UnsupportedOpError(f"{ctx.node.op_type}: PROBIT on one binary score (onnxruntime "
                                 "writes one column of the two it declares)")
    if mode == "complement":
        s = logistic(s) if kind == "LOGISTIC" else s
        return ops.stack([ops.sub(1.0, s), s], 1)
    if kind == "LOGISTIC":
        return ops.stack([logistic(ops.neg(s)), logistic(s)], 1)
    return ops.stack([ops.neg(s), s], 1)


def pick_labels(labels: np.ndarray, index, ctx):
    """labels[index] for an i64 index tensor, labels a static int64 array."""
    if len(labels) == 0:
        raise InvalidModelError(f"{ctx.node.op_type}: no class labels")
    table = index.builder.const(labels.tolist(), DType.i64)
    return ops.gather(table, index, 0)
