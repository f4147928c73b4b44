"""Classic machine-learning predictors as compositions: the one meaning of a tree ensemble's
walk and of ai.onnx.ml's Normalizer that the ONNX importer writes
(``canonicalize/onnx/ops/ml_*.py``) and the ML kernels (``tdag/lower/kernels/ml.py``)
decompose to, so that lowering recognises one as the other.

A forest is flat tables over its M nodes (every tree's nodes, numbered globally): the
feature and threshold a branch compares, the node each outcome goes to, and per node a row of
leaf weights [M, C]. A leaf goes to itself on either outcome, so ``depth`` steps from the
roots (the deepest leaf's depth) put every row at its leaf in every tree. Each step is a
handful of gathers over [N, T]: O(depth) work per row and tree, as a tree kernel walks it,
where a where() per leaf would be O(leaves).

A linear classifier's scores X W + b pass through a post_transform and its label is the
first highest score's, both as onnxruntime computes them (its ml_common.h, since the spec
leaves these details open): ``score_transform`` and ``first_highest``.
"""
from __future__ import annotations

import math

import numpy as np

from tdag.ir.types import DType
from tdag.ops import arrays, core, creation
from tdag.ops.nn.functional import softmax
from tdag.ops.tensor import Tensor

# a branch node's comparison of the row's value with its threshold (ai.onnx.ml's modes)
COMPARE = {"BRANCH_LEQ": core.le, "BRANCH_LT": core.lt, "BRANCH_GTE": core.ge,
           "BRANCH_GT": core.gt, "BRANCH_EQ": core.eq, "BRANCH_NEQ": core.ne}
NORMS = ("MAX", "L1", "L2")
TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")

# onnxruntime's ErfInv (ml_common.h), a closed form good to about 1e-3, in float32
_A = np.float32(0.147)
_TWO_OVER_PI_A = np.float32(2) / (np.float32(math.pi) * _A)
_ONE_OVER_A = np.float32(1) / _A
_SQRT2 = float(np.float32(math.sqrt(2)))


def tree_sum(x: Tensor, features: Tensor, thresholds: Tensor, true_ids: Tensor,
             false_ids: Tensor, roots: Tensor, leaves: Tensor, *tables: Tensor, depth: int,
             modes: tuple[str, ...], missing: bool = False) -> Tensor:
    """The sum over the trees of the leaf weights each row of ``x`` [N, F] reaches: [N, C].

    ``features``, ``true_ids``, ``false_ids`` [M] i64, ``thresholds`` [M] of x's dtype,
    ``roots`` [T] i64, ``leaves`` [M, C] f32. ``tables``: with ``missing``, first a bool [M]
    (a NaN value takes the true branch there); then, where ``modes`` names more than one
    comparison, a bool [M] per mode saying which nodes compare that way."""
    rows, width = x.shape[0], x.shape[1]
    flat = core.reshape(x, (rows * width,))
    start = core.mul(core.unsqueeze(creation.arange(0, rows, like=x), 1), width)  # [N, 1]
    at = core.broadcast_to(core.unsqueeze(roots, 0), (rows, roots.shape[0]))  # [N, T]
    tracks = tables[0] if missing else None
    masks = tables[1:] if missing else tables
    for _ in range(depth):
        value = core.gather(flat, core.add(core.gather(features, at, 0, wrap=False), start), 0,
                            wrap=False)
        limit = core.gather(thresholds, at, 0, wrap=False)
        if len(modes) == 1:
            go = COMPARE[modes[0]](value, limit)
        else:
            go = None
            for mode, mask in zip(modes, masks):
                hit = core.logical_and(core.gather(mask, at, 0, wrap=False),
                                       COMPARE[mode](value, limit))
                go = hit if go is None else core.logical_or(go, hit)
        if tracks is not None:
            go = core.logical_or(go, core.logical_and(core.isnan(value),
                                                      core.gather(tracks, at, 0, wrap=False)))
        at = core.where(go, core.gather(true_ids, at, 0, wrap=False),
                        core.gather(false_ids, at, 0, wrap=False))
    return core.sum(core.gather(leaves, at, 0, wrap=False), 1)


def normalize(x: Tensor, norm: str) -> Tensor:
    """ai.onnx.ml's Normalizer over the last axis of f32 ``x``, as onnxruntime computes it:
    by the row's MAX, L1 or L2 norm (L2 as sign(x) sqrt(x^2 / sum x^2)); a row whose norm
    is 0 is copied."""
    if norm == "MAX":
        scale = core.amax(x, -1, keepdim=True)
        out = core.div(x, scale)
    elif norm == "L1":
        scale = core.sum(core.abs(x), -1, keepdim=True)
        out = core.div(x, scale)
    else:
        square = core.mul(x, x)
        scale = core.sum(square, -1, keepdim=True)
        root = core.sqrt(core.div(square, scale))
        out = core.where(core.lt(x, 0.0), core.neg(root), root)
    return core.where(core.ne(scale, 0.0), out, x)



SVM_KERNELS = ("LINEAR", "POLY", "RBF", "SIGMOID")


def svm_kernel(x: Tensor, vectors: Tensor, kernel: str, gamma: float, coef0: float,
               degree: float) -> Tensor:
    """ai.onnx.ml's kernel of the rows ``x`` [N, F] with the support ``vectors`` [S, F]:
    [N, S]. LINEAR X V^T; POLY (gamma X V^T + coef0)^degree; RBF exp(-gamma |x - v|^2);
    SIGMOID tanh(gamma X V^T + coef0)."""
    if kernel == "RBF":
        diff = core.sub(core.unsqueeze(x, 1), core.unsqueeze(vectors, 0))
        return core.exp(core.mul(core.sum(core.mul(diff, diff), 2), -gamma))
    dot = arrays.matmul(x, core.transpose(vectors, 0, 1))
    if kernel == "LINEAR":
        return dot
    dot = core.add(core.mul(dot, gamma), coef0)
    if kernel == "SIGMOID":
        return core.tanh(dot)
    if degree == 2:
        return core.mul(dot, dot)
    if degree == 3:
        return core.mul(core.mul(dot, dot), dot)
    return core.pow(dot, degree)


def svm_scores(x: Tensor, vectors: Tensor, weight: Tensor, rho: Tensor, *, kernel: str,
               gamma: float, coef0: float, degree: float, wide: bool) -> Tensor:
    """The kernel row [N, S] of ``x`` times ``weight`` [S, P] plus ``rho`` [P]: [N, P] f32.
    ``wide`` (SVMClassifier's pair scores): each product in float32, summed in float64 with
    rho, as onnxruntime sums; else (SVMRegressor) one float32 matmul."""
    row = svm_kernel(x, vectors, kernel, gamma, coef0, degree)
    if not wide:
        return core.add(arrays.matmul(row, weight), rho)
    terms = core.cast(core.unsqueeze(row, 2), DType.f64)
    products = core.cast(core.cast(core.mul(terms, core.cast(weight, DType.f64)), DType.f32),
                         DType.f64)
    return core.cast(core.add(core.sum(products, 1), core.cast(rho, DType.f64)), DType.f32)


def svm_pairs(classes: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(classes) for j in range(i + 1, classes)]


def svm_votes(scores: Tensor, classes: int) -> Tensor:
    """[N, classes] f32: the votes each class won from the pair scores [N, pairs], pair
    (i, j) voting i where its score > 0, else j (onnxruntime's one-vs-one)."""
    pairs = svm_pairs(classes)
    win = np.zeros((len(pairs), classes), np.float32)
    lose = np.zeros((len(pairs), classes), np.float32)
    for p, (i, j) in enumerate(pairs):
        win[p, i], lose[p, j] = 1.0, 1.0
    positive = core.cast(core.gt(scores, 0.0), DType.f32)
    negative = core.sub(1.0, positive)
    return core.add(arrays.matmul(positive, scores.builder.const(win.tolist(), DType.f32)),
                    arrays.matmul(negative, scores.builder.const(lose.tolist(), DType.f32)))


def svm_label(scores: Tensor, labels: tuple[int, ...]) -> Tensor:
    """SVMClassifier's label from its pair scores: ``labels``[the first class with the most
    votes]."""
    table = scores.builder.const(list(labels), DType.i64)
    return core.gather(table, arrays.argmax(svm_votes(scores, len(labels)), 1), 0)


def svm_pair_weight(coefficients: np.ndarray, per_class) -> np.ndarray:
    """SVMClassifier's [S, pairs] weight from its dual ``coefficients`` [C-1, S]: for pair
    (i, j), i's vectors weighted by their coefficients for j (row j-1), j's by theirs for i
    (row i)."""
    starts = np.cumsum([0] + list(per_class))
    pairs = svm_pairs(len(per_class))
    weight = np.zeros((int(starts[-1]), len(pairs)))
    for p, (i, j) in enumerate(pairs):
        weight[starts[i]:starts[i + 1], p] = coefficients[j - 1, starts[i]:starts[i + 1]]
        weight[starts[j]:starts[j + 1], p] = coefficients[i, starts[j]:starts[j + 1]]
    return weight


# -- scores, labels and linear classifiers ------------------------------------------------------


def logistic(s: Tensor) -> Tensor:
    """onnxruntime's ComputeLogistic: 1/(1+exp(-|s|)), mirrored for s < 0."""
    v = core.reciprocal(core.add(core.exp(core.neg(core.abs(s))), 1.0))
    return core.where(core.lt(s, 0.0), core.sub(1.0, v), v)


def probit(s: Tensor) -> Tensor:
    """sqrt(2) * erfinv(2s - 1), erfinv as onnxruntime approximates it."""
    x = core.sub(core.mul(s, 2.0), 1.0)
    sign = core.where(core.lt(x, 0.0), -1.0, 1.0)
    log = core.log(core.mul(core.sub(1.0, x), core.add(x, 1.0)))
    v = core.add(core.mul(log, 0.5), float(_TWO_OVER_PI_A))
    v2 = core.mul(log, float(_ONE_OVER_A))
    v3 = core.sub(core.sqrt(core.sub(core.mul(v, v), v2)), v)
    return core.mul(core.mul(sign, core.sqrt(v3)), _SQRT2)


def _softmax_zero(s: Tensor) -> Tensor:
    """Softmax over the scores not within 1e-7 of 0; those become s * exp(-max)."""
    top = core.amax(s, 1, keepdim=True)
    live = core.gt(core.abs(s), 1e-7)
    e = core.where(live, core.exp(core.sub(s, top)), core.mul(s, core.exp(core.neg(top))))
    return core.div(e, core.sum(core.where(live, e, 0.0), 1, keepdim=True))


def score_transform(scores: Tensor, kind: str) -> Tensor:
    """A post_transform (TRANSFORMS) over [N, C] scores, C >= 2 (onnxruntime's
    write_scores): LOGISTIC, SOFTMAX, SOFTMAX_ZERO (a score within 1e-7 of 0 stays about 0
    and is left out of the sum), PROBIT (onnxruntime's closed-form erfinv, not the exact
    one: that is what it answers)."""
    if kind == "LOGISTIC":
        return logistic(scores)
    if kind == "SOFTMAX":
        return softmax(scores, 1)
    if kind == "SOFTMAX_ZERO":
        return _softmax_zero(scores)
    if kind == "PROBIT":
        return probit(scores)
    return scores


def first_highest(scores: Tensor) -> Tensor:
    """The column of each row's first highest score as onnxruntime's classifiers pick it:
    scanning left to right for a strictly higher score, so a NaN is never picked after the
    first column, and a NaN in the first column keeps column 0 (torch's argmax picks the
    first NaN instead)."""
    nan = core.isnan(scores)
    index = arrays.argmax(core.where(nan, -math.inf, scores), 1)
    first_nan = core.select(nan, 1, 0)
    return core.where(first_nan, creation.zeros((), index.dtype, like=index), index)


def linear_scores(x: Tensor, weight: Tensor, bias: Tensor, transform: str) -> Tensor:
    """ai.onnx.ml LinearClassifier's scores: ``transform`` of x [N, F] @ weight [F, C] +
    bias [C] (C >= 2)."""
    return score_transform(core.add(arrays.matmul(x, weight), bias), transform)


def linear_label(x: Tensor, weight: Tensor, bias: Tensor, labels: tuple[int, ...]) -> Tensor:
    """LinearClassifier's label (C >= 2 scores): ``labels``[the first highest raw score]."""
    table = x.builder.const(list(labels), DType.i64)
    return core.gather(table, first_highest(core.add(arrays.matmul(x, weight), bias)), 0)
