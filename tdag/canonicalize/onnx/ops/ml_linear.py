"""The ONNX op table, ai.onnx.ml's linear predictors (what skl2onnx writes for
LogisticRegression, LinearSVC, LinearRegression, Ridge ...), LinearClassifier and
LinearRegressor: scores = X W^T + b, then the label and the post_transform as onnxruntime
computes them (ml_scores.py; LinearRegressor transforms one target only by PROBIT).

LinearClassifier: one score column (and two labels) is binary: label[1] where the score is
> 0, and the probabilities [1-s, s] (s through LOGISTIC, if that is the transform; SOFTMAX
leaves one score as it is). skl2onnx writes two columns, +w and -w, for a binary
LogisticRegression. Otherwise the label of the first highest score, NaN scores skipped as
onnxruntime scans them (tdag.ops.ml.first_highest): the linear_classifier kernel's two
parts, which to_onnx writes back as one LinearClassifier. String labels are refused.
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.onnx.ops.ml_scores import (
    array,
    const,
    int_labels,
    post_transform,
    rows,
    transform,
    two_columns,
)
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType
from tdag.ops.ml import linear_label, linear_scores, probit

LINEAR_OPS = ("LinearClassifier", "LinearRegressor")


def _weight(ctx, x, count: int):
    """``coefficients`` [count, F] as the constant W^T [F, count]."""
    coefficients = array(ctx, "coefficients")
    features = x.shape[1]
    if coefficients is None or count < 1 or len(coefficients) != count * features:
        given = 0 if coefficients is None else len(coefficients)
        raise InvalidModelError(f"{ctx.node.op_type}: {given} coefficients for {count} "
                                f"output(s) of {features} features")
    return const(x, coefficients.astype(np.float32).reshape(count, features).T)


def _bias(x, intercepts):
    return x.builder.const(intercepts.astype("float32").tolist(), DType.f32)


@register("LinearClassifier")
def _linear_classifier(ctx, x):
    labels = int_labels(ctx)
    intercepts = array(ctx, "intercepts")
    if intercepts is None:
        raise UnsupportedOpError("LinearClassifier without intercepts (onnxruntime counts the "
                                 "classes by them)")
    kind, count, x = post_transform(ctx), len(intercepts), rows(ctx, x)
    weight, bias = _weight(ctx, x, count), _bias(x, intercepts)
    if count == 1:
        scores = ops.add(ops.matmul(x, weight), bias)
        if len(labels) != 2:
            raise InvalidModelError(f"LinearClassifier: one score column and {len(labels)} "
                                    "labels (two read, as onnxruntime)")
        s = ops.select(scores, 1, 0)
        label = ops.cast(ops.where(ops.gt(s, 0.0), int(labels[1]), int(labels[0])), DType.i64)
        return label, two_columns(ctx, s, "complement", kind)
    if len(labels) < count:
        raise InvalidModelError(f"LinearClassifier: {len(labels)} labels for {count} classes")
    # the linear_classifier kernel's two parts (tdag.ops.ml): they share X W + b
    return (linear_label(x, weight, bias, tuple(labels.tolist())),
            linear_scores(x, weight, bias, kind))


@register("LinearRegressor")
def _linear_regressor(ctx, x):
    targets = ctx.attr("targets", 1)
    intercepts = array(ctx, "intercepts")
    if intercepts is not None and len(intercepts) != targets:
        intercepts = None  # as onnxruntime: intercepts of another length are ignored
    x = rows(ctx, x)
    scores = ops.matmul(x, _weight(ctx, x, targets))
    if intercepts is not None:
        scores = ops.add(scores, _bias(x, intercepts))
    kind = post_transform(ctx)
    if targets == 1:  # onnxruntime transforms one target only by PROBIT
        return probit(scores) if kind == "PROBIT" else scores
    return transform(ctx, scores, kind)
