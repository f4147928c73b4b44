"""Classic machine-learning kernels: the tree ensemble's walk, written back as ai.onnx.ml's
TreeEnsembleRegressor, which onnxruntime runs as its native tree kernel, and rows scaled by
their norm, written back as ai.onnx.ml's Normalizer (one op where its composition is ten),
and an SVM's scores, written back as SVMClassifier (its scores output) or SVMRegressor.

``tree_sum`` (``tdag.ops.ml.tree_sum``) reads its forest from operands, flat tables over the
M nodes: the ONNX emitter writes them as the op's attributes, so it needs them constant (as
the importer makes them); tdag.run, to_torch and to_jax walk the tables as given, O(depth)
gathers per row and tree.

Cost convention: per row and tree, each level is four gathers, a compare and a select
(6 operations), then C weights summed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import torch

from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import dims_equal
from tdag.ir.types import DType, TensorType
from tdag.ops.ml import (
    COMPARE,
    NORMS,
    SVM_KERNELS,
    normalize,
    svm_pair_weight,
    svm_pairs,
    svm_scores,
    tree_sum,
)

_TORCH_COMPARE = {"BRANCH_LEQ": "<=", "BRANCH_LT": "<", "BRANCH_GTE": ">=", "BRANCH_GT": ">",
                  "BRANCH_EQ": "==", "BRANCH_NEQ": "!="}
_TORCH_OPS = {"<=": torch.le, "<": torch.lt, ">=": torch.ge, ">": torch.gt, "==": torch.eq,
              "!=": torch.ne}


@dataclass(frozen=True, slots=True)
class TreeSum:
    """``depth`` steps of the walk; ``modes``, the comparisons the branches make (more than
    one: a bool mask operand per mode); ``missing``, whether a bool operand says where a NaN
    takes the true branch."""

    depth: int
    modes: tuple[str, ...] = ("BRANCH_LEQ",)
    missing: bool = False


def _parts(spec: TreeSum, xs):
    """(x, features, thresholds, true, false, roots, leaves, tracks or None, masks)."""
    tracks = xs[7] if spec.missing else None
    masks = list(xs[7 + spec.missing:]) if len(spec.modes) > 1 else []
    return (*xs[:7], tracks, masks)


def _arity(spec: TreeSum) -> int:
    return 7 + spec.missing + (len(spec.modes) if len(spec.modes) > 1 else 0)


def _tree_shape(spec: TreeSum, ins):
    if len(ins) != _arity(spec) or not set(spec.modes) <= set(COMPARE) or spec.depth < 0:
        raise ShapeError(f"tree_sum: {len(ins)} operands for {spec}")
    x, features, thresholds, true, false, roots, leaves, tracks, masks = _parts(spec, ins)
    nodes = features.shape[0] if features.rank == 1 else None
    if x.rank != 2 or x.dtype not in (DType.f32, DType.f64) or thresholds.dtype is not x.dtype \
            or leaves.rank != 2 or leaves.dtype is not DType.f32 or nodes is None:
        raise ShapeError(f"tree_sum: rows {x}, thresholds {thresholds}, leaves {leaves}")
    for t, dtype in [(features, DType.i64), (thresholds, x.dtype), (true, DType.i64),
                     (false, DType.i64)] + [(m, DType.bool) for m in masks + [tracks] if m]:
        if t.rank != 1 or t.dtype is not dtype or not dims_equal(t.shape[0], nodes):
            raise ShapeError(f"tree_sum: a node table {t} should be {dtype.value}[{nodes}]")
    if roots.rank != 1 or roots.dtype is not DType.i64 or not dims_equal(leaves.shape[0], nodes):
        raise ShapeError(f"tree_sum: roots {roots} (i64[T]) and leaves {leaves} ([M, C])")
    return TensorType((x.shape[0], leaves.shape[1]), DType.f32)


def _tree_eval(spec: TreeSum, xs, resolve):
    x, features, thresholds, true, false, roots, leaves, tracks, masks = _parts(spec, xs)
    at = roots.expand(x.shape[0], -1)
    for _ in range(spec.depth):
        value, limit = x.gather(1, features[at]), thresholds[at]
        compare = [_TORCH_OPS[_TORCH_COMPARE[m]](value, limit) for m in spec.modes]
        go = compare[0] if not masks else \
            torch.stack([m[at] & c for m, c in zip(masks, compare)]).any(0)
        if tracks is not None:
            go = go | (value.isnan() & tracks[at])
        at = torch.where(go, true[at], false[at])
    return leaves[at].sum(1)


def _tree_cost(spec: TreeSum, ins, out: TensorType) -> Cost:
    rows, trees, classes = ins[0].shape[0], ins[5].shape[0], ins[6].shape[1]
    return traffic(ins, out, rows * trees * (6 * spec.depth + classes))


def _tree_torch(node, a, code):
    """The walk as one expression: ``at`` stepped ``depth`` times in a comprehension."""
    s = node.spec
    x, features, thresholds, true, false, roots, leaves, tracks, masks = _parts(s, a)
    compare = [f"(v {_TORCH_COMPARE[m]} {thresholds}[at])" for m in s.modes]
    go = compare[0] if not masks else \
        " | ".join(f"({m}[at] & {c})" for m, c in zip(masks, compare))
    if tracks is not None:
        go = f"({go}) | (v.isnan() & {tracks}[at])"
    step = f"torch.where({go}, {true}[at], {false}[at])"
    return (f"(lambda at: ([at := {step} for _ in range({s.depth}) "
            f"if (v := {x}.gather(1, {features}[at])) is not None], {leaves}[at].sum(1))[-1])"
            f"({roots}.expand({x}.shape[0], -1))")


def _tree_jax(node, a, cx):
    s, jnp = node.spec, cx.jnp
    x, features, thresholds, true, false, roots, leaves, tracks, masks = _parts(s, a)
    at = jnp.broadcast_to(roots[None, :], (x.shape[0], roots.shape[0]))
    compare = {"BRANCH_LEQ": jnp.less_equal, "BRANCH_LT": jnp.less,
               "BRANCH_GTE": jnp.greater_equal, "BRANCH_GT": jnp.greater,
               "BRANCH_EQ": jnp.equal, "BRANCH_NEQ": jnp.not_equal}
    for _ in range(s.depth):
        value = jnp.take_along_axis(x, features[at], axis=1)
        hits = [compare[m](value, thresholds[at]) for m in s.modes]
        go = hits[0] if not masks else jnp.any(jnp.stack([m[at] & h for m, h in
                                                          zip(masks, hits)]), 0)
        if tracks is not None:
            go = go | (jnp.isnan(value) & tracks[at])
        at = jnp.where(go, true[at], false[at])
    return leaves[at].sum(1)


def constant_table(node, k: int, cx) -> np.ndarray:
    weight = cx.ctx.weight(node.inputs[k])
    if weight is None or weight.value is None:
        raise UnsupportedOpError(f"{node.op.value}: its ai.onnx.ml op takes these tables as "
                                 "attributes; this one reads them from a computed tensor",
                                 node=node.name, origin=node.origin)
    return weight.value.numpy()


def _forest_attrs(spec: TreeSum, tables, leaves: np.ndarray) -> dict:
    """TreeEnsembleRegressor's attributes: each tree unfolded from its root to ``depth``
    levels (a self-loop, or the last level, is a leaf weighted by its row of ``leaves``)."""
    features, thresholds, true, false, roots, tracks, masks = tables
    attrs: dict = {k: [] for k in ("nodes_treeids", "nodes_nodeids", "nodes_featureids",
                                   "nodes_values", "nodes_modes", "nodes_truenodeids",
                                   "nodes_falsenodeids", "nodes_missing_value_tracks_true",
                                   "target_treeids", "target_nodeids", "target_ids",
                                   "target_weights")}
    for tree, root in enumerate(roots.tolist()):
        order = [(root, 0)]  # (node, level) in local id order
        for local, (k, level) in enumerate(order):
            leaf = level == spec.depth or (true[k] == k and false[k] == k)
            mode = "LEAF" if leaf else _mode(spec, masks, k)
            if not leaf:
                order += [(int(true[k]), level + 1), (int(false[k]), level + 1)]
            for name, value in (("treeids", tree), ("nodeids", local), ("modes", mode),
                                ("featureids", 0 if leaf else int(features[k])),
                                ("values", 0.0 if leaf else thresholds[k]),
                                ("truenodeids", 0 if leaf else len(order) - 2),
                                ("falsenodeids", 0 if leaf else len(order) - 1),
                                ("missing_value_tracks_true",
                                 int(not leaf and tracks is not None and bool(tracks[k])))):
                attrs[f"nodes_{name}"].append(value)
            for c in np.flatnonzero(leaves[k]) if leaf else ():
                for name, value in (("treeids", tree), ("nodeids", local), ("ids", int(c)),
                                    ("weights", float(leaves[k, c]))):
                    attrs[f"target_{name}"].append(value)
    return attrs


def _mode(spec: TreeSum, masks, k: int) -> str:
    if not masks:
        return spec.modes[0]
    named = [m for m, mask in zip(spec.modes, masks) if mask[k]]
    if len(named) != 1:
        raise UnsupportedOpError(f"tree_sum: node {k} compares {len(named)} ways (ONNX: one)")
    return named[0]


def _tree_onnx(node, ins, g, cx):
    s = node.spec
    tables = [constant_table(node, k, cx) for k in range(1, len(node.inputs))]
    features, thresholds, true, false, roots, leaves = tables[:6]
    tracks = tables[6] if s.missing else None
    masks = tables[6 + s.missing:]
    attrs = _forest_attrs(s, (features, thresholds, true, false, roots, tracks, masks), leaves)
    values = np.asarray(attrs.pop("nodes_values"), thresholds.dtype)
    x, rows = ins[0], _unwidened(node.inputs[0], cx)
    if rows is not None and np.array_equal(values.astype(np.float32), values):
        # f32 rows the importer widened, against thresholds f32 holds: compared in f32 alike,
        # without the Cast's pass
        x, values = rows, values.astype(np.float32)
    if values.dtype == np.float64:  # ai.onnx.ml 3: double thresholds as a tensor
        attrs["nodes_values_as_tensor"] = onnx.numpy_helper.from_array(values)
    else:
        attrs["nodes_values"] = values.tolist()
    return g.node("TreeEnsembleRegressor", [x], domain="ai.onnx.ml",
                  n_targets=int(leaves.shape[1]), aggregate_function="SUM",
                  post_transform="NONE", **attrs)


def _unwidened(name: str, cx) -> str | None:
    """The ONNX value of the f32 rows that ``name`` widens to f64 (as the importer reads a
    float forest), else None."""
    cast = cx.ctx.made(name, Op.cast)
    if cast is None or cx.type(cast.inputs[0]).dtype is not DType.f32:
        return None
    return cx.env.get(cast.inputs[0])


primitive(Op.tree_sum, TreeSum, range(7, 16), _tree_shape, _tree_eval, _tree_cost,
          "a where() per leaf is O(leaves) per row; the walk is O(depth) gathers per row and "
          "tree, and onnxruntime runs a forest as one native tree kernel",
          traits=Trait.KERNEL,
          batch=Refuse("walks rows [N, F] against node tables: strip the batch before lowering"),
          torch=_tree_torch, onnx=_tree_onnx, jax=_tree_jax,
          decompose=lambda s, *xs: tree_sum(*xs[:7], *xs[7:], depth=s.depth, modes=s.modes,
                                            missing=s.missing))


# -- normalize_rows -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Normalize:
    """``norm``: MAX, L1 or L2 (``tdag.ops.ml.normalize``)."""

    norm: str


def _norm_shape(spec: Normalize, ins):
    (x,) = ins
    if spec.norm not in NORMS or x.rank != 2 or x.dtype is not DType.f32:
        raise ShapeError(f"normalize_rows: {spec.norm} over {x} (f32 [N, C] read, as "
                         "ai.onnx.ml's Normalizer)")
    return x


def _norm_eval(spec: Normalize, xs, resolve):
    x = xs[0]
    if spec.norm == "L2":
        square = x * x
        scale = square.sum(-1, keepdim=True)
        root = (square / scale).sqrt()
        out = torch.where(x < 0, -root, root)
    else:
        scale = x.amax(-1, keepdim=True) if spec.norm == "MAX" else x.abs().sum(-1, keepdim=True)
        out = x / scale
    return torch.where(scale != 0, out, x)


_TORCH_SCALE = {"MAX": "x.amax(-1, keepdim=True)", "L1": "x.abs().sum(-1, keepdim=True)",
                "L2": "(x * x).sum(-1, keepdim=True)"}
_TORCH_OUT = {"MAX": "x / s", "L1": "x / s",
              "L2": "torch.where(x < 0, -(x * x / s).sqrt(), (x * x / s).sqrt())"}


def _norm_torch(node, a, code):
    n = node.spec.norm
    return (f"(lambda x: (lambda s: torch.where(s != 0, {_TORCH_OUT[n]}, x))"
            f"({_TORCH_SCALE[n]}))({a[0]})")


def _norm_jax(node, a, cx):
    jnp, x, n = cx.jnp, a[0], node.spec.norm
    if n == "L2":
        square = x * x
        scale = square.sum(-1, keepdims=True)
        root = jnp.sqrt(square / scale)
        out = jnp.where(x < 0, -root, root)
    else:
        scale = x.max(-1, keepdims=True) if n == "MAX" else jnp.abs(x).sum(-1, keepdims=True)
        out = x / scale
    return jnp.where(scale != 0, out, x)


primitive(Op.normalize_rows, Normalize, 1, _norm_shape, _norm_eval,
          lambda s, ins, out: traffic(ins, out, 4 * ins[0].numel),
          "the norm, the division and the zero-norm guard are ten ops over the rows; "
          "ai.onnx.ml's Normalizer is one",
          traits=Trait.KERNEL,
          batch=Refuse("scales [N, C] rows as ai.onnx.ml's Normalizer: strip the batch first"),
          torch=_norm_torch, jax=_norm_jax,
          onnx=lambda node, ins, g, cx: g.node("Normalizer", [ins[0]], domain="ai.onnx.ml",
                                               norm=node.spec.norm),
          decompose=lambda s, x: normalize(x, s.norm))


# -- svm_scores ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SvmScores:
    """``tdag.ops.ml.svm_scores``'s kernel (LINEAR, POLY, RBF, SIGMOID) and its parameters;
    ``wide``: SVMClassifier's pair scores (float64 sums), else SVMRegressor's."""

    kernel: str
    gamma: float
    coef0: float
    degree: float
    wide: bool


def _svm_shape(spec: SvmScores, ins):
    x, vectors, weight, rho = ins
    if spec.kernel not in SVM_KERNELS or any(t.dtype is not DType.f32 for t in ins) or \
            x.rank != 2 or vectors.rank != 2 or weight.rank != 2 or rho.rank != 1 or \
            not dims_equal(x.shape[1], vectors.shape[1]) or \
            not dims_equal(vectors.shape[0], weight.shape[0]) or \
            not dims_equal(weight.shape[1], rho.shape[0]) or \
            not spec.wide and not dims_equal(weight.shape[1], 1):
        raise ShapeError(f"svm_scores: rows {x}, vectors {vectors}, weight {weight}, rho {rho} "
                         "(f32 [N, F], [S, F], [S, P], [P]; SVMRegressor's P is 1)")
    return TensorType((x.shape[0], weight.shape[1]), DType.f32)


def _svm_row(spec: SvmScores, x, vectors, exp, tanh):
    """The kernel row [N, S], in torch or jax.numpy (``exp``, ``tanh`` of the library)."""
    if spec.kernel == "RBF":
        diff = x[:, None, :] - vectors[None]
        return exp((diff * diff).sum(2) * -spec.gamma)
    dot = x @ vectors.T
    if spec.kernel == "LINEAR":
        return dot
    dot = dot * spec.gamma + spec.coef0
    if spec.kernel == "SIGMOID":
        return tanh(dot)
    if spec.degree in (2, 3):
        return dot * dot if spec.degree == 2 else dot * dot * dot
    return dot ** spec.degree


def _svm_eval(spec: SvmScores, xs, resolve):
    x, vectors, weight, rho = xs
    row = _svm_row(spec, x, vectors, torch.exp, torch.tanh)
    if not spec.wide:
        return row @ weight + rho
    products = (row[:, :, None].double() * weight.double()).float().double()
    return (products.sum(1) + rho.double()).float()


def _svm_torch(node, a, code):
    s = node.spec
    x, vectors, weight, rho = a
    if s.kernel == "RBF":
        row = (f"(lambda d: torch.exp((d * d).sum(2) * {-s.gamma!r}))"
               f"({x}[:, None, :] - {vectors}[None])")
    else:
        row = f"({x} @ {vectors}.T)"
        power = "d * d" if s.degree == 2 else "d * d * d" if s.degree == 3 else \
            f"d ** {s.degree!r}"
        outer = {"LINEAR": None, "SIGMOID": "torch.tanh(d)", "POLY": power}[s.kernel]
        if outer:
            row = f"(lambda d: {outer})({row} * {s.gamma!r} + {s.coef0!r})"
    if not s.wide:
        return f"({row} @ {weight} + {rho})"
    return (f"(({row}[:, :, None].double() * {weight}.double()).float().double().sum(1) "
            f"+ {rho}.double()).float()")


def _svm_jax(node, a, cx):
    s, jnp = node.spec, cx.jnp
    x, vectors, weight, rho = a
    row = _svm_row(s, x, vectors, jnp.exp, jnp.tanh)
    if not s.wide:
        return row @ weight + rho
    f32, f64 = jnp.float32, jnp.float64
    products = (row[:, :, None].astype(f64) * weight.astype(f64)).astype(f32).astype(f64)
    return (products.sum(1) + rho.astype(f64)).astype(f32)


def _svm_cost(spec: SvmScores, ins, out: TensorType) -> Cost:
    rows, features = ins[0].shape
    count, pairs = ins[2].shape
    return traffic(ins, out, rows * count * (3 * features + 2 * pairs))


def one_vs_one(weight: np.ndarray) -> tuple[list[int], np.ndarray] | None:
    """SVMClassifier's (vectors_per_class, coefficients [C-1, S]) whose pair weight is
    ``weight`` [S, pairs], or None. Each vector's class is the first one, at or after the
    previous vector's, in every pair its nonzero coefficients name."""
    count, pairs = weight.shape
    classes = int(round((1 + (1 + 8 * pairs) ** 0.5) / 2))
    order = svm_pairs(classes)
    if len(order) != pairs:
        return None
    owners, at = [], 0
    for s in range(count):
        options = set(range(classes))
        for p in np.flatnonzero(weight[s]):
            options &= set(order[p])
        later = [c for c in sorted(options) if c >= at]
        if not later:
            return None
        at = later[0]
        owners.append(at)
    per_class = [owners.count(c) for c in range(classes)]
    coefficients = np.zeros((classes - 1, count))
    for s, k in enumerate(owners):
        for m in range(classes):
            if m != k:
                coefficients[m - 1 if m > k else m, s] = weight[s, order.index((min(k, m),
                                                                                max(k, m)))]
    if not np.array_equal(svm_pair_weight(coefficients, per_class), weight):
        return None
    return per_class, coefficients


def _svm_constant(node, k: int, cx) -> np.ndarray:
    """Operand ``k``'s constant; a reshape of one (the rule's support vectors) reshaped."""
    name = node.inputs[k]
    view = cx.ctx.producer(name)
    if view is not None and view.op in (Op.reshape, Op.squeeze):
        name = view.inputs[0]
    weight = cx.ctx.weight(name)
    if weight is None or weight.value is None:
        raise UnsupportedOpError("svm_scores: ONNX's SVM ops take their vectors, weights and "
                                 "rho as attributes; this one reads them from a computed tensor",
                                 node=node.name, origin=node.origin)
    return weight.value.numpy().astype(np.float64).reshape(cx.ctx.type(node.inputs[k]).shape)


def svm_classifier(node, x: str, g, cx) -> list[str]:
    """The [label, scores] outputs of the SVMClassifier that svm_scores ``node`` (its pair
    scores of ONNX rows ``x``) stands for: one node for the scores and an svm_label reading
    them (``node_once``), labelled as that svm_label says (else 0..C-1)."""
    s = node.spec
    vectors, weight, rho = (_svm_constant(node, k, cx) for k in (1, 2, 3))
    layout = one_vs_one(weight)
    if layout is None:
        raise UnsupportedOpError("svm_scores: the pair weight is no one-vs-one layout of "
                                 "SVMClassifier's coefficients", node=node.name,
                                 origin=node.origin)
    per_class, coefficients = layout
    labels = next((r.spec.labels for r in cx.ctx.readers(node.name) if r.op is Op.svm_label),
                  tuple(range(len(per_class))))
    return g.node_once("SVMClassifier", [x], outputs=2, domain="ai.onnx.ml",
                       kernel_type=s.kernel, kernel_params=(s.gamma, s.coef0, float(s.degree)),
                       support_vectors=tuple(vectors.ravel().tolist()), rho=tuple(rho.tolist()),
                       classlabels_ints=labels, vectors_per_class=tuple(per_class),
                       coefficients=tuple(coefficients.ravel().tolist()))


def _svm_onnx(node, ins, g, cx):
    """SVMClassifier's scores (two classes: column 1 of [-s, s]) or SVMRegressor."""
    s = node.spec
    if not s.wide:
        vectors, weight, rho = (_svm_constant(node, k, cx) for k in (1, 2, 3))
        return g.node("SVMRegressor", [ins[0]], domain="ai.onnx.ml", kernel_type=s.kernel,
                      kernel_params=[s.gamma, s.coef0, float(s.degree)],
                      support_vectors=vectors.ravel().tolist(), rho=rho.tolist(),
                      n_supports=int(weight.shape[0]), coefficients=weight[:, 0].tolist())
    scores = svm_classifier(node, ins[0], g, cx)[1]
    if node.type.shape[1] > 1:  # more than two classes
        return scores
    one = g.initializer("one", torch.tensor([1]))
    two = g.initializer("two", torch.tensor([2]))
    return g.node("Slice", [scores, one, two, one])


primitive(Op.svm_scores, SvmScores, 4, _svm_shape, _svm_eval, _svm_cost,
          "the kernel row, its float64 pair sums and their casts are a dozen ops over [N, S, P]; "
          "onnxruntime runs an SVM as one native op",
          traits=Trait.KERNEL,
          batch=Refuse("scores [N, F] rows as ai.onnx.ml's SVMs: strip the batch first"),
          torch=_svm_torch, jax=_svm_jax, onnx=_svm_onnx,
          decompose=lambda s, *xs: svm_scores(*xs, kernel=s.kernel, gamma=s.gamma,
                                              coef0=s.coef0, degree=s.degree, wide=s.wide))

