"""The ONNX op table, ai.onnx.ml's classic tree ensembles: TreeEnsembleClassifier /
TreeEnsembleRegressor that skl2onnx writes for every
scikit-learn tree, forest and gradient boosting model (ai.onnx.ml 1 and 3: the
``*_as_tensor`` attributes read as the plain ones).

Every tree op is ``tdag.ops.ml.tree_sum``'s walk over flat node tables (x[feature] <= value
..., or NaN where missing values track true, one gather step per level: O(depth) per row and
tree), the weights of the leaves reached summed over the trees; lowering makes it the tree
kernel that to_onnx writes back as a TreeEnsembleRegressor. TreeEnsemble's leaves are rows
after its nodes; under MIN or MAX each tree's weights take columns of their own, reduced
after the walk. Only a TreeEnsemble that tests set membership (BRANCH_MEMBER, which the walk
does not compare) is a ``where(path holds, weight, ...)`` per leaf instead.

What comes after the sum is onnxruntime's (tree_ensemble_aggregator.h), quirks included: a
class or target that no reached leaf scores reads 0 in the output; SUM/AVERAGE/MIN/MAX, and
one target transformed only by PROBIT; base_values added per class (under SUM, or more
than two classes, inside the walk: on the first tree's leaves); for two classes the
binary rules (one scored class: label[1] where its score > 0, or > 0.5 when every weight is
>= 0; the scores [1-s, s] or [-s, s], s through LOGISTIC first: ml_scores.two_columns).
String labels and a binary model whose classes are scored on some leaves only are refused.
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.ops.ml import tree_sum
from tdag.canonicalize.onnx.ops.ml_scores import (
    array,
    const,
    int_labels,
    pick_labels,
    post_transform,
    transform,
    two_columns,
)
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType
from tdag.ops.ml import probit

TREE_OPS = ("TreeEnsemble", "TreeEnsembleClassifier", "TreeEnsembleRegressor")


# -- TreeEnsembleClassifier, TreeEnsembleRegressor --------------------------------------------

_BRANCHES = {"BRANCH_LEQ": ops.le, "BRANCH_LT": ops.lt, "BRANCH_GTE": ops.ge,
             "BRANCH_GT": ops.gt, "BRANCH_EQ": ops.eq, "BRANCH_NEQ": ops.ne}


class _Forest:
    """The static trees of a classic tree op as ``tdag.ops.ml.tree_sum``'s flat tables over
    the file's nodes (a node's index is its place in the nodes_* attributes)."""

    def __init__(self, ctx, x):
        x = ctx.tensor(x)
        if x.dtype not in (DType.f32, DType.f64, DType.i32, DType.i64):
            raise UnsupportedOpError(f"{ctx.node.op_type}: input of type {x.dtype}")
        x = ops.unsqueeze(x, 0) if x.ndim == 1 else x
        if x.ndim != 2:
            raise UnsupportedOpError(f"{ctx.node.op_type}: input of rank {x.ndim} (1 or 2 read)")
        values = array(ctx, "nodes_values", np.zeros(0))
        wide = values.dtype == np.float64 or x.dtype == DType.f64  # thresholds compared in f64
        self.x, self.ctx = ops.cast(x, DType.f64 if wide else DType.f32), ctx
        trees, ids = _ints(ctx, "nodes_treeids"), _ints(ctx, "nodes_nodeids")
        modes = [m.decode() if isinstance(m, bytes) else m for m in ctx.attr("nodes_modes") or []]
        count = len(ids)
        if not (len(trees) == len(modes) == count):
            raise InvalidModelError(f"{ctx.node.op_type}: nodes_treeids, nodes_nodeids and "
                                    "nodes_modes differ in length")
        self.node = {(int(t), int(n)): k for k, (t, n) in enumerate(zip(trees, ids))}
        for mode in set(modes) - set(_BRANCHES) - {"LEAF"}:
            raise InvalidModelError(f"{ctx.node.op_type}: node mode {mode!r}")
        branches = [k for k in range(count) if modes[k] != "LEAF"]
        features, true, false = (_ints(ctx, f"nodes_{a}") for a in
                                 ("featureids", "truenodeids", "falsenodeids"))
        if any(len(a) < count for a in (values, features, true, false)) and branches:
            raise InvalidModelError(f"{ctx.node.op_type}: a nodes_* attribute is too short")
        missing = _ints(ctx, "nodes_missing_value_tracks_true", count)
        self.trees, self.modes = trees, modes
        children = {(int(trees[k]), int(c)) for k in branches for c in (true[k], false[k])}
        self.roots = [k for k in range(count) if (int(trees[k]), int(ids[k])) not in children]
        self.depth = max((self._depth(k, true, false) for k in self.roots), default=0)
        leaf = np.array([m == "LEAF" for m in modes], bool)
        here = np.arange(count)
        tables = {"features": np.where(leaf, 0, features[:count]),
                  "thresholds": np.where(leaf, 0, values[:count]).astype(
                      np.float64 if wide else np.float32),
                  "true": np.where(leaf, here, self._global(true[:count])),
                  "false": np.where(leaf, here, self._global(false[:count]))}
        self.arrays, self.tables = tables, {k: const(self.x, v) for k, v in tables.items()}
        self.used = tuple(m for m in _BRANCHES if m in modes) or ("BRANCH_LEQ",)
        self.missing = bool(missing[branches].any())
        self.extra = [const(self.x, (missing[:count] != 0) & ~leaf)] if self.missing else []
        if len(self.used) > 1:
            self.extra += [const(self.x, np.array([m == mode for m in modes]))
                           for mode in self.used]

    def _global(self, local: np.ndarray) -> np.ndarray:
        """Each node's child (a node id in its tree) as a node index; a leaf's own index."""
        return np.array([self.node.get((int(t), int(c)), k) for k, (t, c) in
                         enumerate(zip(self.trees, local))], np.int64)

    def _depth(self, root: int, true, false) -> int:
        """The depth of the deepest leaf under ``root``, checking the tree is one."""
        deepest, stack, seen = 0, [(root, 0)], set()
        while stack:
            k, depth = stack.pop()
            tree = int(self.trees[k])
            if k in seen:
                raise InvalidModelError(f"{self.ctx.node.op_type}: tree {tree} reaches a node "
                                        "twice")
            seen.add(k)
            if self.modes[k] == "LEAF":
                deepest = max(deepest, depth)
                continue
            for child in (true[k], false[k]):
                if (tree, int(child)) not in self.node:
                    raise InvalidModelError(f"{self.ctx.node.op_type}: tree {tree} has no "
                                            f"node {int(child)}")
                stack.append((self.node[(tree, int(child))], depth + 1))
        return deepest

    def weights(self, prefix: str, classes: int, reduce=np.add):
        """Per leaf (by node index) the weight of each class [C] and whether it has one."""
        tree_ids = _ints(self.ctx, f"{prefix}_treeids")
        node_ids, ids = _ints(self.ctx, f"{prefix}_nodeids"), _ints(self.ctx, f"{prefix}_ids")
        weights = array(self.ctx, f"{prefix}_weights", np.zeros(0))
        if not (len(tree_ids) == len(node_ids) == len(ids) == len(weights)):
            raise InvalidModelError(f"{self.ctx.node.op_type}: the {prefix}_* attributes differ "
                                    "in length")
        table: dict = {}
        for t, n, c, w in zip(tree_ids, node_ids, ids, weights):
            if not 0 <= c < classes or (int(t), int(n)) not in self.node:
                raise InvalidModelError(f"{self.ctx.node.op_type}: a weight for class {int(c)} "
                                        f"of {classes}, or of no node (tree {t}, node {n})")
            value, has = table.setdefault(self.node[(int(t), int(n))],
                                          (np.zeros(classes), np.zeros(classes, bool)))
            value[c] = reduce(value[c], np.float32(w)) if has[c] else np.float32(w)
            has[c] = True
        return table

    def walk(self, table: dict, classes: int, what: int = 0, roots=None, base=None):
        """The sum over the trees (``roots``: all) of the [N, C] rows of their reached leaves
        (what=0: the leaf's weights; 1: whether it has one). ``base`` [C] is added to every
        leaf of the first tree: each row reaches one of them, so it is added once per row,
        inside the tree kernel (as TreeEnsembleRegressor's base_values) and not after it."""
        rows = np.zeros((len(self.modes), classes), np.float32)
        for k, entry in table.items():
            if self.modes[k] == "LEAF":
                rows[k] = entry[what]
        if base is not None and self.roots:
            first = self._leaves(self.roots[0])
            rows[first] = rows[first] + base.astype(np.float32)
        t = self.tables
        return tree_sum(self.x, t["features"], t["thresholds"], t["true"], t["false"],
                        const(self.x, np.array(self.roots if roots is None else roots,
                                               np.int64)),
                        const(self.x, rows), *self.extra, depth=self.depth, modes=self.used,
                        missing=self.missing)

    def per_tree(self, table: dict, classes: int, what: int = 0) -> list:
        """Each tree's [N, C] (what=0: its reached leaf's weights; 1: whether it has one)."""
        return [self.walk(table, classes, what, [root]) for root in self.roots]

    def has(self, table: dict, classes: int) -> list:
        """Per class whether a reached leaf scores it: True, False or a bool [N] tensor."""
        out, counts = [], None
        for c in range(classes):
            scored = [[k in table and table[k][1][c] for k in self._leaves(root)]
                      for root in self.roots]
            if any(all(s) for s in scored):
                out.append(True)
            elif not any(any(s) for s in scored):
                out.append(False)
            else:
                if counts is None:
                    counts = self.walk(table, classes, what=1)
                out.append(ops.gt(ops.select(counts, 1, c), 0.0))
        return out

    def _leaves(self, root: int) -> list:
        """The node indices of the leaves under ``root``."""
        true, false = self.arrays["true"], self.arrays["false"]
        out, stack = [], [root]
        while stack:
            k = stack.pop()
            if self.modes[k] == "LEAF":
                out.append(k)
            else:
                stack += [int(true[k]), int(false[k])]
        return out


def _ints(ctx, name: str, default_length: int | None = None) -> np.ndarray:
    value = ctx.attr(name)
    if not value:
        return np.zeros(default_length or 0, np.int64)
    return np.asarray(value, np.int64)


def _masked(score, has, fill: float = 0.0):
    """The score where a reached leaf scored it, else ``fill``."""
    if has is True:
        return score
    if has is False:
        return ops.full(tuple(score.shape), fill, DType.f32, like=score)
    return ops.where(has, score, fill)


def _scores(forest: _Forest, table: dict, classes: int, base=None):
    scores = forest.walk(table, classes, base=base)
    return ops.cast(scores, DType.f32), forest.has(table, classes)


def _columns(total, has, fill: float = 0.0):
    """[N, C] scores with ``fill`` where no reached leaf scored the class (``total`` itself
    where every class is scored)."""
    if all(h is True for h in has):
        return total
    return ops.stack([_masked(ops.select(total, 1, c), h, fill) for c, h in enumerate(has)], 1)


@register("TreeEnsembleRegressor")
def _tree_regressor(ctx, x):
    targets, kind = ctx.attr("n_targets", 1), post_transform(ctx)
    aggregate = ctx.choice("aggregate_function", "SUM", ("AVERAGE", "SUM", "MIN", "MAX"))
    forest = _Forest(ctx, x)
    base = array(ctx, "base_values", np.zeros(0)).astype(np.float32)
    if aggregate in ("SUM", "AVERAGE"):
        table = forest.weights("target", targets)
        origin = base if targets > 1 and len(base) == targets else base[:1] \
            if targets == 1 and len(base) == 1 else None
        folded = aggregate == "SUM" and origin is not None
        total, has = _scores(forest, table, targets, origin if folded else None)
        base = np.zeros(0, np.float32) if folded else base
        if aggregate == "AVERAGE":
            total = ops.div(total, float(len(forest.roots)))
    else:
        smallest = aggregate == "MIN"
        table = forest.weights("target", targets, np.minimum if smallest else np.maximum)
        fill = float("inf") if smallest else float("-inf")
        trees = [ops.where(ops.gt(count, 0.0), value, fill) for value, count in
                 zip(forest.per_tree(table, targets), forest.per_tree(table, targets, 1))]
        total = (ops.amin if smallest else ops.amax)(ops.stack(trees, 0), 0)
        has = forest.has(table, targets)
        total = ops.stack([_masked(ops.select(total, 1, c), has[c]) for c in range(targets)], 1)
    if targets == 1:  # onnxruntime's one-target path: base_values[0] if one, PROBIT only
        total = ops.add(total, float(base[0])) if len(base) == 1 else total
        return probit(total) if kind == "PROBIT" else total
    if len(base) == targets:
        total = ops.add(total, _const(total, base))
    return transform(ctx, _columns(total, has), kind)


def _const(like, values: np.ndarray):
    return like.builder.const(values.astype(np.float32).tolist(), DType.f32)


@register("TreeEnsembleClassifier")
def _tree_classifier(ctx, x):
    labels, kind = int_labels(ctx, "classlabels_int64s"), post_transform(ctx)
    classes = len(labels)
    if classes < 2:
        raise UnsupportedOpError(f"TreeEnsembleClassifier with {classes} class label(s)")
    forest = _Forest(ctx, x)
    table = forest.weights("class", classes)
    base = array(ctx, "base_values", np.zeros(0)).astype(np.float32)
    if classes > 2:  # base_values[k] added to class k's score, which then counts as scored
        origin = np.zeros(classes, np.float32)
        origin[:len(base)] = base[:classes]
        total, has = _scores(forest, table, classes, origin if len(base) else None)
        has[:len(base)] = [True] * min(len(base), classes)
        label = pick_labels(labels, ops.argmax(_columns(total, has, float("-inf")), 1), ctx)
        return label, transform(ctx, _columns(total, has), kind)
    total, has = _scores(forest, table, classes)
    columns = [ops.select(total, 1, c) for c in range(classes)]
    return _binary(ctx, labels, columns, has, base, kind)


def _binary(ctx, labels, columns, has, base, kind):
    """onnxruntime's two-class rules (TreeAggregatorClassifier::FinalizeScores)."""
    if not all(isinstance(h, bool) for h in has):
        raise UnsupportedOpError("TreeEnsembleClassifier: two classes, one scored on some "
                                 "leaves only (onnxruntime's output layout depends on the row)")
    (s0, s1), (h0, h1) = columns, has
    ids = {int(c) for c in _ints(ctx, "class_ids")}
    weights = array(ctx, "class_weights", np.zeros(0))
    binary, positive = len(ids) == 1, bool((weights >= 0).all())
    extra, two = None, True  # onnxruntime's write_additional_scores; two scores kept
    if len(base) == 2:
        if h1:  # onnxruntime reads base[1] + the class 0 score here, as written
            s1 = ops.add(s0, float(base[1]))
            s0 = ops.neg(s1)
        else:
            s0, s1 = ops.add(s0, float(base[0])), ops.add(s1, float(base[1]))
    elif len(base) == 1:
        s0 = ops.add(s0, float(base[0]))
        two = h1
    elif len(base) == 0:
        extra, two = "mirror", h1
    weight = s1 if two and h1 else _masked(s0, h0)
    if binary:
        threshold = 0.5 if positive else 0.0
        label = ops.where(ops.gt(weight, threshold), int(labels[1]), int(labels[0]))
        extra = "complement" if positive else "mirror"
    else:
        label = ops.where(ops.gt(weight, 0.0), 1, 0)
    label = ops.cast(label, DType.i64)
    if two:
        return label, transform(ctx, ops.stack([_masked(s0, h0), _masked(s1, h1)], 1), kind)
    if extra is None:
        raise UnsupportedOpError("TreeEnsembleClassifier: one scored class of two, no binary "
                                 "rule (onnxruntime writes one column of the two it declares)")
    return label, two_columns(ctx, _masked(s0, h0), extra, kind)
