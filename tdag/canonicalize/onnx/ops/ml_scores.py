"""What the classic ai.onnx.ml predictors (ml_linear, ml_svm, ml_trees) share, computed as
onnxruntime computes it (its core/providers/cpu/ml/ml_common.h), since scikit-learn's files
are checked against onnxruntime and the spec leaves these details open:

- ``transform``: a post_transform over a row of two or more scores: NONE, LOGISTIC
  (1/(1+exp(-|s|)), mirrored for s < 0), SOFTMAX, SOFTMAX_ZERO (a score within 1e-7 of 0
  stays about 0 and is left out of the sum) and PROBIT (sqrt(2) erfinv(2s-1) with
  onnxruntime's closed-form erfinv approximation, not the exact one: that is what it answers).
- ``two_columns``: the one score of a binary predictor as the two columns onnxruntime writes.
- the attribute readers: float arrays (``_as_tensor`` variants included), int64 class labels
  (string labels are not tensors tdag has), and the [N, F] float rows the predictors read.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from tdag import ops
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType

TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")

# onnxruntime's ErfInv (ml_common.h), a closed form good to about 1e-3, in float32
_A = np.float32(0.147)
_TWO_OVER_PI_A = np.float32(2) / (np.float32(math.pi) * _A)
_ONE_OVER_A = np.float32(1) / _A
_SQRT2 = float(np.float32(math.sqrt(2)))


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


def logistic(s):
    """onnxruntime's ComputeLogistic: 1/(1+exp(-|s|)), mirrored for s < 0."""
    v = ops.reciprocal(ops.add(ops.exp(ops.neg(ops.abs(s))), 1.0))
    return ops.where(ops.lt(s, 0.0), ops.sub(1.0, v), v)


def probit(s):
    """sqrt(2) * erfinv(2s - 1), erfinv as onnxruntime approximates it."""
    x = ops.sub(ops.mul(s, 2.0), 1.0)
    sign = ops.where(ops.lt(x, 0.0), -1.0, 1.0)
    log = ops.log(ops.mul(ops.sub(1.0, x), ops.add(x, 1.0)))
    v = ops.add(ops.mul(log, 0.5), float(_TWO_OVER_PI_A))
    v2 = ops.mul(log, float(_ONE_OVER_A))
    v3 = ops.sub(ops.sqrt(ops.sub(ops.mul(v, v), v2)), v)
    return ops.mul(ops.mul(sign, ops.sqrt(v3)), _SQRT2)


def _softmax_zero(s):
    """Softmax over the scores not within 1e-7 of 0; those become s * exp(-max)."""
    top = ops.amax(s, 1, keepdim=True)
    live = ops.gt(ops.abs(s), 1e-7)
    e = ops.where(live, ops.exp(ops.sub(s, top)), ops.mul(s, ops.exp(ops.neg(top))))
    return ops.div(e, ops.sum(ops.where(live, e, 0.0), 1, keepdim=True))


def transform(ctx, scores, kind: str):
    """A post_transform over [N, C] scores, C >= 2 (onnxruntime's write_scores)."""
    if kind == "LOGISTIC":
        return logistic(scores)
    if kind == "SOFTMAX":
        return ops.softmax(scores, 1)
    if kind == "SOFTMAX_ZERO":
        return _softmax_zero(scores)
    if kind == "PROBIT":
        return probit(scores)
    return scores


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


def first_highest(scores):
    """The column of each row's first highest score as onnxruntime's classifiers pick it:
    scanning left to right for a strictly higher score, so a NaN is never picked after the
    first column, and a NaN in the first column keeps column 0 (torch's argmax picks the
    first NaN instead)."""
    nan = ops.isnan(scores)
    index = ops.argmax(ops.where(nan, -math.inf, scores), 1)
    first_nan = ops.select(nan, 1, 0)
    return ops.where(first_nan, ops.zeros((), index.dtype, like=index), index)


def pick_labels(labels: np.ndarray, index, ctx):
    """labels[index] for an i64 index tensor, labels a static int64 array."""
    if len(labels) == 0:
        raise InvalidModelError(f"{ctx.node.op_type}: no class labels")
    table = index.builder.const(labels.tolist(), DType.i64)
    return ops.gather(table, index, 0)
