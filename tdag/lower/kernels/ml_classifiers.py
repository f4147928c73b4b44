"""A classifier's label beside its scores: two outputs of one ai.onnx.ml op, two kernels.

``linear_classifier`` is LinearClassifier's label or its (transformed) scores; ``svm_label``
is SVMClassifier's label, read off the pair scores of an ``svm_scores`` kernel by one-vs-one
votes. to_onnx writes each pair (a label and the scores of the same operands) as one node
(``GraphBuilder.node_once``), so a re-emitted classifier is the op the file held; torch and
JAX compute the label as its composition says.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import dims_equal
from tdag.ir.types import DType, TensorKind, TensorType
from tdag.lower.kernels.ml import constant_table, svm_classifier
from tdag.ops.ml import linear_label, linear_scores, svm_label, svm_pairs

# -- linear_classifier -----------------------------------------------------------------------------

LINEAR_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX")  # the kernel's (torch and JAX write them)


@dataclass(frozen=True, slots=True)
class LinearClassify:
    """One output of ai.onnx.ml's LinearClassifier over x [N, F], W [F, C], b [C] (C >= 2):
    with ``labels``, the label of the first highest score (``tdag.ops.ml.linear_label``);
    without, the scores through ``transform`` (``linear_scores``). to_onnx writes a label and
    scores of the same operands as one node."""

    transform: str = "NONE"
    labels: tuple[int, ...] = ()


def _linear_shape(spec: LinearClassify, ins):
    x, weight, bias = ins
    classes = weight.shape[1] if weight.rank == 2 else None
    if spec.transform not in LINEAR_TRANSFORMS or any(t.dtype is not DType.f32 for t in ins) \
            or x.rank != 2 or weight.rank != 2 or bias.rank != 1 or \
            not isinstance(classes, int) or classes < 2 or \
            not dims_equal(x.shape[1], weight.shape[0]) or not dims_equal(bias.shape[0], classes) \
            or spec.labels and len(spec.labels) < classes:
        raise ShapeError(f"linear_classifier: rows {x}, weight {weight}, bias {bias} (f32 [N, F], "
                         f"[F, C], [C], C >= 2) with {spec}")
    if spec.labels:
        return TensorType((x.shape[0],), DType.i64)
    return TensorType((x.shape[0], classes), DType.f32)


def _linear_eval(spec: LinearClassify, xs, resolve):
    x, weight, bias = xs
    scores = x @ weight + bias
    if not spec.labels:
        v = 1 / (torch.exp(-scores.abs()) + 1)
        return {"NONE": scores, "SOFTMAX": torch.softmax(scores, 1),
                "LOGISTIC": torch.where(scores < 0, 1 - v, v)}[spec.transform]
    nan = scores.isnan()  # first_highest: a NaN is skipped, and one in column 0 keeps it
    index = torch.where(nan[:, 0], 0, torch.where(nan, -torch.inf, scores).argmax(1))
    return torch.tensor(spec.labels, device=x.device)[index]


_TORCH_TRANSFORM = {
    "NONE": "{s}", "SOFTMAX": "torch.softmax({s}, 1)",
    "LOGISTIC": "(lambda s: (lambda v: torch.where(s < 0, 1 - v, v))"
                "(1 / (torch.exp(-s.abs()) + 1)))({s})"}


def _linear_torch(node, a, code):
    s, scores = node.spec, f"({a[0]} @ {a[1]} + {a[2]})"
    if not s.labels:
        return _TORCH_TRANSFORM[s.transform].format(s=scores)
    return (f"(lambda s: (lambda n: torch.tensor({s.labels!r}, device=s.device)["
            f"torch.where(n[:, 0], 0, torch.where(n, -torch.inf, s).argmax(1))])(s.isnan()))"
            f"({scores})")


def _linear_jax(node, a, cx):
    s, jnp = node.spec, cx.jnp
    scores = a[0] @ a[1] + a[2]
    if s.labels:
        nan = jnp.isnan(scores)
        index = jnp.where(nan[:, 0], 0, jnp.argmax(jnp.where(nan, -jnp.inf, scores), 1))
        return jnp.asarray(s.labels, jnp.int64 if index.dtype == jnp.int64 else jnp.int32)[index]
    if s.transform == "SOFTMAX":
        return cx.nn.softmax(scores, axis=1)
    if s.transform == "LOGISTIC":
        v = 1 / (jnp.exp(-jnp.abs(scores)) + 1)
        return jnp.where(scores < 0, 1 - v, v)
    return scores


def _partner(node, cx):
    """The other part over the same operands (a label's scores, the scores' label), if any."""
    for other in cx.ctx.readers(node.inputs[0]):
        if other.op is Op.linear_classifier and other.inputs == node.inputs and \
                bool(other.spec.labels) != bool(node.spec.labels):
            return other
    return None


def _linear_onnx(node, ins, g, cx):
    """Both parts of one operand triple share one LinearClassifier (``node_once``); with a
    weight or bias that is not a constant (a parameter stays an initializer), ONNX ops."""
    if not all(_constant(cx, name) for name in node.inputs[1:]):
        return _linear_ops(node, ins, g)
    weight, bias = (constant_table(node, k, cx) for k in (1, 2))
    partner = _partner(node, cx)
    label, scores = (node, partner) if node.spec.labels else (partner, node)
    labels = label.spec.labels if label else tuple(range(weight.shape[1]))
    transform = scores.spec.transform if scores else "NONE"
    outs = g.node_once("LinearClassifier", [ins[0]], outputs=2, domain="ai.onnx.ml",
                       coefficients=tuple(weight.T.ravel().tolist()),
                       intercepts=tuple(bias.tolist()), classlabels_ints=labels,
                       post_transform=transform)
    return outs[0] if node.spec.labels else outs[1]


def _constant(cx, name: str) -> bool:
    weight = cx.ctx.weight(name)
    return weight is not None and weight.kind is TensorKind.const and weight.value is not None


def _linear_ops(node, ins, g) -> str:
    """The label (first_highest: a NaN skipped, one in column 0 keeps it) or the scores."""
    scores = g.node("Add", [g.node("MatMul", ins[:2]), ins[2]])
    if node.spec.labels:
        nan = g.node("IsNaN", [scores])
        masked = g.node("Where", [nan, g.const(-math.inf, DType.f32), scores])
        index = g.node("ArgMax", [masked], axis=1, keepdims=0)
        first = g.node("Gather", [nan, g.const(0)], axis=1)
        index = g.node("Where", [first, g.const(0), index])
        return g.node("Gather", [g.const(list(node.spec.labels)), index])
    if node.spec.transform == "SOFTMAX":
        return g.node("Softmax", [scores], axis=1)
    if node.spec.transform == "LOGISTIC":
        v = g.node("Reciprocal", [g.node("Add", [g.node("Exp", [g.node("Neg", [
            g.node("Abs", [scores])])]), g.const(1.0, DType.f32)])])
        return g.node("Where", [g.node("Less", [scores, g.const(0.0, DType.f32)]),
                                g.node("Sub", [g.const(1.0, DType.f32), v]), v])
    return scores


def _linear_cost(spec: LinearClassify, ins, out: TensorType) -> Cost:
    rows, features = ins[0].shape
    classes = ins[1].shape[1]
    return traffic(ins, out, rows * classes * (2 * features + 4))


primitive(Op.linear_classifier, LinearClassify, 3, _linear_shape, _linear_eval, _linear_cost,
          "the matmul, the NaN-skipping argmax, the label gather and the transform are twenty "
          "ops; onnxruntime runs a linear classifier, label and scores, as one native op",
          traits=Trait.KERNEL,
          batch=Refuse("scores [N, F] rows as ai.onnx.ml's LinearClassifier: strip the batch "
                       "first"),
          torch=_linear_torch, jax=_linear_jax, onnx=_linear_onnx,
          decompose=lambda s, x, w, b: linear_label(x, w, b, s.labels) if s.labels else
          linear_scores(x, w, b, s.transform))


# -- svm_label ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SvmLabel:
    """SVMClassifier's label from the pair scores [N, C(C-1)/2] (``tdag.ops.ml.svm_label``):
    ``labels``[the first class with the most one-vs-one votes]."""

    labels: tuple[int, ...]


def _votes_shape(spec: SvmLabel, ins):
    (scores,) = ins
    if scores.rank != 2 or scores.dtype is not DType.f32 or len(spec.labels) < 2 or \
            not dims_equal(scores.shape[1], len(svm_pairs(len(spec.labels)))):
        raise ShapeError(f"svm_label: pair scores {scores} for {len(spec.labels)} classes")
    return TensorType((scores.shape[0],), DType.i64)


def _votes_table(spec: SvmLabel):
    """(win, lose) [pairs, C]: pair (i, j) votes i where its score > 0, else j."""
    pairs = svm_pairs(len(spec.labels))
    win, lose = torch.zeros(len(pairs), len(spec.labels)), torch.zeros(len(pairs),
                                                                        len(spec.labels))
    for p, (i, j) in enumerate(pairs):
        win[p, i], lose[p, j] = 1.0, 1.0
    return win, lose


def _votes_eval(spec: SvmLabel, xs, resolve):
    positive = (xs[0] > 0).float()
    win, lose = (t.to(positive.device) for t in _votes_table(spec))
    votes = positive @ win + (1 - positive) @ lose
    return torch.tensor(spec.labels, device=positive.device)[votes.argmax(1)]


def _votes_torch(node, a, code):
    win, lose = (t.tolist() for t in _votes_table(node.spec))
    return (f"(lambda p: torch.tensor({node.spec.labels!r}, device=p.device)[(p @ "
            f"torch.tensor({win!r}, device=p.device) + (1 - p) @ torch.tensor({lose!r}, "
            f"device=p.device)).argmax(1)])(({a[0]} > 0).float())")


def _votes_jax(node, a, cx):
    jnp = cx.jnp
    win, lose = (jnp.asarray(t.numpy()) for t in _votes_table(node.spec))
    positive = (a[0] > 0).astype(jnp.float32)
    index = jnp.argmax(positive @ win + (1 - positive) @ lose, 1)
    return jnp.asarray(node.spec.labels, index.dtype)[index]


def _votes_onnx(node, ins, g, cx):
    """SVMClassifier's label output where the scores are an svm_scores kernel's, else the
    votes as ONNX ops (ArgMax picks the first of equal votes, as torch's)."""
    scores = cx.ctx.producer(node.inputs[0])
    if scores is not None and scores.op is Op.svm_scores and scores.spec.wide:
        return svm_classifier(scores, cx.env[scores.inputs[0]], g, cx)[0]
    win, lose = (g.initializer(name, t) for name, t in zip(("win", "lose"),
                                                           _votes_table(node.spec)))
    positive = g.cast(g.node("Greater", [ins[0], g.const(0.0, DType.f32)]), DType.f32)
    negative = g.node("Sub", [g.const(1.0, DType.f32), positive])
    votes = g.node("Add", [g.node("MatMul", [positive, win]), g.node("MatMul", [negative, lose])])
    index = g.node("ArgMax", [votes], axis=1, keepdims=0)
    return g.node("Gather", [g.const(list(node.spec.labels)), index])


def _votes_cost(spec: SvmLabel, ins, out: TensorType) -> Cost:
    rows, pairs = ins[0].shape
    return traffic(ins, out, rows * pairs * (2 + 2 * len(spec.labels)))


primitive(Op.svm_label, SvmLabel, 1, _votes_shape, _votes_eval, _votes_cost,
          "the votes are a compare, two matmuls and an argmax of three ops; onnxruntime's "
          "SVMClassifier answers the label beside its scores",
          traits=Trait.KERNEL,
          batch=Refuse("labels [N, P] pair scores as ai.onnx.ml's SVMClassifier: strip the "
                       "batch first"),
          torch=_votes_torch, jax=_votes_jax, onnx=_votes_onnx,
          decompose=lambda s, scores: svm_label(scores, s.labels))
