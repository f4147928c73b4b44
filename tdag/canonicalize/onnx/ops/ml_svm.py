"""The ONNX op table, ai.onnx.ml's support vector machines, SVMClassifier and SVMRegressor
(skl2onnx's SVC, NuSVC, SVR, OneClassSVM ...), as onnxruntime computes them.

The kernel of the rows X [N, F] and the support vectors V [S, F] (``kernel_params`` gamma,
coef0, degree): LINEAR X V^T; POLY (gamma X V^T + coef0)^degree; RBF exp(-gamma |x - v|^2);
SIGMOID tanh(gamma X V^T + coef0). Without support vectors the model is linear (liblinear):
X W^T + rho[0].

SVMClassifier, one-vs-one: the score of each class pair (i < j, in order) is one matmul of
the kernel row with a static [S, pairs] matrix (the dual coefficients of i's vectors for j
and of j's for i) plus rho, summed in float64 as onnxruntime sums, then float32
(``tdag.ops.ml.svm_scores``, the svm_scores kernel's composition); each pair votes for i if
its float32 score is > 0 (a positive float64 score below 1e-45 rounds to 0 and votes for
j), else for j; the label is the first class with the most votes. The scores
output is the pair scores (two columns [-s, s], or [1-s, s] under a post_transform, for two
classes), or, with ``prob_a``/``prob_b``, the class probabilities of libsvm's pairwise
coupling: each pair's Platt probability, clipped to [1e-7, 1 - 1e-7], then onnxruntime's
``multiclass_probability``, its 100 sweeps unrolled with the early stop as a per-row freeze
(exact, however the rows converge, at 100 sweeps of graph whatever the data).
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.onnx.ops.ml_scores import (
    array,
    const,
    int_labels,
    logistic,
    pick_labels,
    post_transform,
    rows,
    transform,
    two_columns,
)
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError
from tdag.ir.types import DType
from tdag.ops.ml import SVM_KERNELS, svm_label, svm_pair_weight, svm_pairs, svm_scores

SVM_OPS = ("SVMClassifier", "SVMRegressor")
_SWEEPS = 100  # multiclass_probability's iteration limit


def _svm(ctx, x, vectors: np.ndarray, weight: np.ndarray, rho: np.ndarray, wide: bool):
    """``svm_scores`` of the rows with the support vectors, the [S, P] weight and rho [P]."""
    params = list(array(ctx, "kernel_params", np.zeros(3))[:3])
    gamma, coef0, degree = (float(np.float32(p)) for p in params + [0] * (3 - len(params)))
    return svm_scores(x, const(x, vectors.astype(np.float32)),
                      const(x, weight.astype(np.float32)), const(x, rho.astype(np.float32)),
                      kernel=ctx.choice("kernel_type", "LINEAR", SVM_KERNELS), gamma=gamma,
                      coef0=coef0, degree=degree, wide=wide)


def _vectors(ctx, count: int, features: int) -> np.ndarray:
    vectors = array(ctx, "support_vectors", np.zeros(0))
    if len(vectors) != count * features:
        raise InvalidModelError(f"{ctx.node.op_type}: {len(vectors)} support vector values for "
                                f"{count} vectors of {features} features")
    return vectors.reshape(count, features)


def _linear(ctx, x, coefficients: np.ndarray, outputs: int, rho: float):
    """liblinear mode: X W^T + rho[0]."""
    features = x.shape[1]
    if len(coefficients) != outputs * features:
        raise InvalidModelError(f"{ctx.node.op_type}: {len(coefficients)} coefficients for "
                                f"{outputs} output(s) of {features} features")
    weight = const(x, coefficients.astype(np.float32).reshape(outputs, features).T)
    return ops.add(ops.matmul(x, weight), rho)


@register("SVMRegressor")
def _svm_regressor(ctx, x):
    """One target: sum of dual coefficients times kernel, + rho[0]; one_class: sign to +-1.
    onnxruntime ignores post_transform here, and so does tdag."""
    x = rows(ctx, x)
    coefficients, rho = array(ctx, "coefficients"), array(ctx, "rho")
    if coefficients is None or rho is None:
        raise InvalidModelError("SVMRegressor: coefficients and rho are required")
    count = ctx.attr("n_supports", 0)
    if count > 0:
        if len(coefficients) != count:
            raise InvalidModelError(f"SVMRegressor: {len(coefficients)} coefficients for "
                                    f"{count} support vectors")
        y = _svm(ctx, x, _vectors(ctx, count, x.shape[1]), coefficients.reshape(count, 1),
                 rho[:1], False)
    else:
        y = _linear(ctx, x, coefficients, 1, float(rho[0]))
    if ctx.attr("one_class", 0):
        y = ops.where(ops.gt(y, 0.0), 1.0, -1.0)
    return y


@register("SVMClassifier")
def _svm_classifier(ctx, x):
    x = rows(ctx, x)
    labels, kind = int_labels(ctx), post_transform(ctx)
    classes = len(labels)
    coefficients, rho = array(ctx, "coefficients"), array(ctx, "rho")
    prob_a, prob_b = array(ctx, "prob_a", np.zeros(0)), array(ctx, "prob_b", np.zeros(0))
    per_class = [int(v) for v in ctx.attr("vectors_per_class") or []]
    if coefficients is None or rho is None or classes < 2:
        raise InvalidModelError("SVMClassifier: coefficients, rho and two or more class "
                                "labels are required")
    if len(prob_a) != len(prob_b):
        raise InvalidModelError("SVMClassifier: prob_a and prob_b differ in length")
    if sum(per_class) == 0:  # liblinear: one score per class
        scores = _linear(ctx, x, coefficients, classes, float(rho[0]))
        label = ops.argmax(scores, 1)
        if classes == 2 and not len(prob_a):
            label = _linear_binary_label(coefficients, scores, label)
        return pick_labels(labels, label, ctx), transform(ctx, scores, kind)
    if len(per_class) != classes:
        raise InvalidModelError(f"SVMClassifier: vectors_per_class names {len(per_class)} "
                                f"classes, the labels {classes}")
    count = sum(per_class)
    pairs = svm_pairs(classes)
    if len(coefficients) < (classes - 1) * count or len(rho) < len(pairs) or \
            (len(prob_a) and len(prob_a) < len(pairs)):
        raise InvalidModelError("SVMClassifier: coefficients, rho or prob_a/prob_b are too "
                                "short for the classes and vectors")
    weight = svm_pair_weight(coefficients.reshape(-1)[:(classes - 1) * count]
                         .reshape(classes - 1, count), per_class)
    scores = _svm(ctx, x, _vectors(ctx, count, x.shape[1]), weight, rho[:len(pairs)], True)
    label = svm_label(scores, tuple(labels.tolist()))
    if len(prob_a):
        probabilities = _coupling(scores, pairs, classes, prob_a, prob_b)
        return label, transform(ctx, probabilities, kind)
    if classes == 2:
        return label, two_columns(ctx, ops.select(scores, 1, 0),
                                  "mirror" if kind == "NONE" else "complement", kind)
    return label, transform(ctx, scores, kind)


def _linear_binary_label(coefficients, scores, label):
    """onnxruntime's ChooseClass for two classes without probabilities: class 1 where the
    top score is >= 0.5 (all weights >= 0) or > 0 (some negative), else the top class."""
    top = ops.amax(scores, 1)
    high = ops.ge(top, 0.5) if (coefficients >= 0).all() else ops.gt(top, 0.0)
    return ops.where(high, 1, label)


def _coupling(scores, pairs, classes: int, prob_a, prob_b):
    """libsvm's pairwise coupling as onnxruntime's multiclass_probability computes it."""
    r = [[None] * classes for _ in range(classes)]
    for p, (i, j) in enumerate(pairs):
        s = ops.select(scores, 1, p)
        value = ops.sub(1.0, logistic(ops.add(ops.mul(s, float(np.float32(prob_a[p]))),
                                              float(np.float32(prob_b[p])))))
        value = ops.minimum(ops.maximum(value, 1e-7), float(np.float32(1) - np.float32(1e-7)))
        r[i][j], r[j][i] = value, ops.sub(1.0, value)
    q = [[None] * classes for _ in range(classes)]  # Q as onnxruntime fills it
    for i in range(classes):
        diagonal = None
        for j in range(classes):
            if j == i:
                continue
            term = ops.mul(r[j][i], r[j][i])
            diagonal = term if diagonal is None else ops.add(diagonal, term)
            if j > i:
                q[i][j] = ops.neg(ops.mul(r[j][i], r[i][j]))
                q[j][i] = q[i][j]
        q[i][i] = diagonal
    # one [N] tensor per class, so no op broadcasts (graph size: 100 sweeps of it)
    rows = scores.shape[0]
    one = ops.full((rows,), 1.0, DType.f32, like=scores)
    eps = ops.full((rows,), float(np.float32(0.005) / np.float32(classes)), DType.f32,
                   like=scores)
    p = [ops.full((rows,), float(np.float32(1) / np.float32(classes)), DType.f32, like=scores)
         for _ in range(classes)]
    done = ops.full((rows,), False, "bool", like=scores)
    for _ in range(_SWEEPS):
        qp = [_sum([ops.mul(q[i][j], p[j]) for j in range(classes)]) for i in range(classes)]
        pqp = _sum([ops.mul(p[i], qp[i]) for i in range(classes)])
        errors = [ops.abs(ops.sub(qp[i], pqp)) for i in range(classes)]
        error = errors[0]
        for other in errors[1:]:
            error = ops.where(ops.gt(other, error), other, error)
        done = ops.logical_or(done, ops.lt(error, eps))  # onnxruntime breaks here
        swept = list(p)
        for i in range(classes):
            diff = ops.div(ops.sub(pqp, qp[i]), q[i][i])
            grow = ops.add(diff, one)
            swept[i] = ops.add(swept[i], diff)
            step = ops.add(ops.mul(diff, q[i][i]), ops.add(qp[i], qp[i]))
            pqp = ops.div(ops.div(ops.add(pqp, ops.mul(diff, step)), grow), grow)
            qp = [ops.div(ops.add(qp[j], ops.mul(diff, q[i][j])), grow) for j in range(classes)]
            swept = [ops.div(value, grow) for value in swept]
        p = [ops.where(done, old, new) for old, new in zip(p, swept)]
    return ops.stack(p, 1)


def _sum(terms: list):
    """Left to right, as onnxruntime's loops add."""
    total = terms[0]
    for term in terms[1:]:
        total = ops.add(total, term)
    return total
