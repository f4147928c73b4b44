"""The ONNX op table, ai.onnx.ml's linear predictors (what skl2onnx writes for
LogisticRegression, LinearSVC, LinearRegression, Ridge ...), LinearClassifier and
LinearRegressor: scores = X W^T + b, then the label and the post_transform as onnxruntime
computes them (ml_scores.py; LinearRegressor transforms one target only by PROBIT).

LinearClassifier: one score column (and two labels) is binary: label[1] where the score is
> 0, and the probabilities [1-s, s] (s through LOGISTIC, if that is the transform; SOFTMAX
leaves one score as it is). skl2onnx writes two columns, +w and -w, for a binary
LogisticRegression. Otherwise the label of the first highest score, NaN scores skipped as
onnxruntime scans them (ml_scores.first_highest). String labels are refused.
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.onnx.ops.ml_scores import (
    array,
    const,
    first_highest,
    int_labels,
    pick_labels,
    post_transform,
    probit,
    rows,
    transform,
    two_columns,
)
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType

LINEAR_OPS = ("LinearClassifier", "LinearRegressor")


def _affine(ctx, x, count: int, intercepts):
    """X W^T (+ b): W is ``coefficients`` as [count, F]."""
    coefficients = array(ctx, "coefficients")
    features = x.shape[1]
    if coefficients is None or count < 1 or len(coefficients) != count * features:
        given = 0 if coefficients is None else len(coefficients)
        raise InvalidModelError(f"{ctx.node.op_type}: {given} coefficients for {count} "
                                f"output(s) of {features} features")
    weight = const(x, coefficients.astype(np.float32).reshape(count, features).T)
    scores = ops.matmul(x, weight)
    if intercepts is not None:
        scores = ops.add(scores, x.builder.const(intercepts.astype("float32").tolist(),
                                                 DType.f32))
    return scores


@register("LinearClassifier")
def _linear_classifier(ctx, x):
    labels = int_labels(ctx)
    intercepts = array(ctx, "intercepts")
    if intercepts is None:
        raise UnsupportedOpError("LinearClassifier without intercepts (onnxruntime counts the "
                                 "classes by them)")
    kind, count = post_transform(ctx), len(intercepts)
    scores = _affine(ctx, rows(ctx, x), count, intercepts)
    if count == 1:
        if len(labels) != 2:
            raise InvalidModelError(f"LinearClassifier: one score column and {len(labels)} "
                                    "labels (two read, as onnxruntime)")
        s = ops.select(scores, 1, 0)
        label = ops.cast(ops.where(ops.gt(s, 0.0), int(labels[1]), int(labels[0])), DType.i64)
        return label, two_columns(ctx, s, "complement", kind)
    if len(labels) < count:
        raise InvalidModelError(f"LinearClassifier: {len(labels)} labels for {count} classes")
    return pick_labels(labels, first_highest(scores), ctx), transform(ctx, scores, kind)


@register("LinearRegressor")
def _linear_regressor(ctx, x):
    targets = ctx.attr("targets", 1)
    intercepts = array(ctx, "intercepts")
    if intercepts is not None and len(intercepts) != targets:
        intercepts = None  # as onnxruntime: intercepts of another length are ignored
    scores = _affine(ctx, rows(ctx, x), targets, intercepts)
    kind = post_transform(ctx)
    if targets == 1:  # onnxruntime transforms one target only by PROBIT
        return probit(scores) if kind == "PROBIT" else scores
    return transform(ctx, scores, kind)
