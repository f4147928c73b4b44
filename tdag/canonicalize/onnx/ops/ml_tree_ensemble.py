"""The ONNX op table, ai.onnx.ml's TreeEnsemble (ai.onnx.ml 5): its nodes, leaves and
weights as flat tables (``*_as_tensor`` attributes read as the plain ones).

Walked as ``tdag.ops.ml.tree_sum`` walks the classic ops (ml_trees.py): one gather step per
level, O(depth) per row and tree; its leaves are rows after its nodes, and under MIN or MAX
each tree's weights take columns of their own, reduced after the walk. Only a TreeEnsemble
that tests set membership (BRANCH_MEMBER, which the walk does not compare) is a
``where(path holds, weight, ...)`` per leaf instead. A target no reached leaf scores reads 0,
as onnxruntime answers.
"""
from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from tdag import ops
from tdag.ops.ml import tree_sum
from tdag.canonicalize.onnx.ops.ml_scores import (
    const,
)
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError


_COMPARE = {0: ops.le, 1: ops.lt, 2: ops.ge, 3: ops.gt, 4: ops.eq, 5: ops.ne}
_MEMBER = 6


def _array(ctx, name: str, default=None):
    value = ctx.attr(name)
    if value is None:
        return default
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else \
        np.asarray(value)


def _paths(roots, true_ids, false_ids, true_leaf, false_leaf):
    """For each tree, its leaves and the (node, branch taken) conditions on the way there,
    read off the static node tables."""
    trees = []
    for root in roots:
        if true_leaf[root] and false_leaf[root] and true_ids[root] == false_ids[root]:
            trees.append([(int(true_ids[root]), [])])  # a tree that is one leaf
            continue
        leaves, stack = [], [(int(root), [])]
        while stack:
            node, path = stack.pop()
            for taken, child, is_leaf in ((True, true_ids[node], true_leaf[node]),
                                          (False, false_ids[node], false_leaf[node])):
                step = path + [(node, taken)]
                (leaves.append((int(child), step)) if is_leaf else
                 stack.append((int(child), step)))
        trees.append(leaves)
    return trees


@register("TreeEnsemble")
def _tree_ensemble(ctx, x):
    """Per tree, per target, the weight of the leaf reached (or the aggregate's identity),
    aggregated over the trees: ``tree_sum``'s O(depth) walk, or, where a node tests set
    membership (which the walk does not compare), a where() per leaf."""
    x = ctx.tensor(x)
    if ctx.attr("post_transform", 0) != 0:
        raise UnsupportedOpError("TreeEnsemble: a post_transform other than NONE")
    aggregate, count = ctx.attr("aggregate_function", 1), ctx.attr("n_targets")
    if aggregate not in (0, 1, 2, 3):
        raise InvalidModelError(f"TreeEnsemble: aggregate_function {aggregate}")
    finfo = torch.finfo(x.dtype.torch)
    identity = {0: 0.0, 1: 0.0, 2: finfo.max, 3: finfo.min}[aggregate]  # a tree not scoring
    modes = _array(ctx, "nodes_modes").astype(np.int64)
    trees = len(_array(ctx, "tree_roots"))
    reduce = ops.amin if aggregate == 2 else ops.amax
    if (modes == _MEMBER).any():
        per_tree, scored = _by_paths(ctx, x, modes, count, identity)
        total = ops.sum(ops.stack(per_tree, 0), 0) if aggregate in (0, 1) else \
            reduce(ops.stack(per_tree, 1), 1)
    elif aggregate in (0, 1):
        total = _walk(ctx, x, modes, count)
    else:  # one walk: each tree's [N, count] side by side, then the counts that scored
        walk = _walk(ctx, x, modes, count, identity)
        total = reduce(ops.reshape(ops.slice(walk, 1, 0, trees * count),
                                   (x.shape[0], trees, count)), 1)
        scored = ops.gt(ops.slice(walk, 1, trees * count), 0.0)
    if aggregate in (0, 1):
        return ops.div(total, float(trees)) if aggregate == 0 else total
    return ops.where(scored, total, 0.0)  # onnxruntime: a target no tree scored reads 0


_MODE_NAMES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ")


def _walk(ctx, x, modes, count: int, identity: float | None = None):
    """``tree_sum`` over TreeEnsemble's M nodes then L leaves as one flat table (a leaf loops
    to itself): the sum over the trees of each reached leaf's weight at its target, [N,
    count]; or, given ``identity`` (MIN, MAX), [N, (T + 1) count]: tree t's leaf in columns
    t count .. (its weight at its target, ``identity`` at the others; the other trees add 0
    there), then a 1 at its target in the last ``count`` (how many trees scored it)."""
    nodes, weights = len(modes), _array(ctx, "leaf_weights")
    targets, roots = _array(ctx, "leaf_targetids"), _array(ctx, "tree_roots").astype(np.int64)
    features = _array(ctx, "nodes_featureids").astype(np.int64)
    leaves = len(weights)
    if len(targets) != leaves or len(features) != nodes or ((targets < 0) | (targets >= count)
                                                            ).any():
        raise InvalidModelError("TreeEnsemble: leaf_targetids, leaf_weights and the nodes_* "
                                "attributes disagree in length or target count")

    def child(side: str) -> np.ndarray:
        ids = _array(ctx, f"nodes_{side}nodeids").astype(np.int64)
        leaf = _array(ctx, f"nodes_{side}leafs").astype(bool)
        out = np.where(leaf, nodes + ids, ids)
        if ((out < 0) | (out >= np.where(leaf, nodes + leaves, nodes))).any():
            raise InvalidModelError(f"TreeEnsemble: a nodes_{side}nodeids entry out of range")
        return np.concatenate([out, np.arange(nodes, nodes + leaves)])

    true, false = child("true"), child("false")
    depth, owner = _trees(roots, true, false, nodes)
    at = nodes + np.arange(leaves)
    reached = owner[at] != -2  # the leaves some tree reaches
    at, target, weight = at[reached], targets[reached], weights[reached]
    if identity is None:
        rows = np.zeros((nodes + leaves, count))
        rows[at, target] = weight
    elif (owner[at] == -1).any():
        raise UnsupportedOpError("TreeEnsemble: trees that share a leaf, under MIN or MAX "
                                 "(each tree's leaf weights are written apart)")
    else:
        rows = np.zeros((nodes + leaves, (len(roots) + 1) * count))
        for k in range(count):
            rows[at, owner[at] * count + k] = identity
        rows[at, owner[at] * count + target] = weight
        rows[at, len(roots) * count + target] = 1.0
    pad = np.zeros(leaves, np.int64)
    used = tuple(m for k, m in enumerate(_MODE_NAMES) if (modes == k).any()) or _MODE_NAMES[:1]
    missing = np.concatenate([_array(ctx, "nodes_missing_value_tracks_true",
                                     np.zeros(nodes)) != 0, pad.astype(bool)])
    extra = [missing] if missing.any() else []
    if len(used) > 1:
        extra += [np.concatenate([modes == _MODE_NAMES.index(m), pad.astype(bool)])
                  for m in used]
    dtype = torch.empty(0, dtype=x.dtype.torch).numpy().dtype  # splits and weights: x's
    splits = np.concatenate([_array(ctx, "nodes_splits"), pad]).astype(dtype)
    tables = [np.concatenate([features, pad]), splits, true, false, roots, rows.astype(dtype),
              *extra]
    return tree_sum(x, *(const(x, t) for t in tables), depth=depth, modes=used,
                    missing=bool(missing.any()))


def _trees(roots, true, false, nodes: int) -> tuple[int, np.ndarray]:
    """The most branch nodes on a path from a root to a leaf, and each flat index's tree
    (-1: more than one's), checking each tree is one."""
    deepest, owner = 0, np.full(len(true), -2, np.int64)
    for tree, root in enumerate(roots):
        stack, seen = [(int(root), 0)], set()
        while stack:
            k, depth = stack.pop()
            owner[k] = tree if owner[k] in (-2, tree) else -1
            if k >= nodes:
                deepest = max(deepest, depth)
                continue
            if k in seen:
                raise InvalidModelError(f"TreeEnsemble: the tree at root {root} reaches node "
                                        f"{k} twice")
            seen.add(k)
            stack += [(int(true[k]), depth + 1), (int(false[k]), depth + 1)]
    return deepest, owner


def _by_paths(ctx, x, modes, count: int, identity: float):
    """Each tree's [N, count], a where(path holds, weight, ...) per leaf, and whether any
    tree's reached leaf scores each target (bool [N, count])."""
    splits, features = _array(ctx, "nodes_splits"), _array(ctx, "nodes_featureids")
    missing_true = _array(ctx, "nodes_missing_value_tracks_true", np.zeros(len(modes)))
    weights, targets = _array(ctx, "leaf_weights"), _array(ctx, "leaf_targetids")
    members = iter(_array(ctx, "membership_values", np.zeros(0)).tolist())
    member_sets = {}
    for node, mode in enumerate(modes):  # the sets, NaN-separated, in node order
        if mode == _MEMBER:
            member_sets[node] = _next_set(members)
    conditions = {}

    def holds(node: int):
        if node not in conditions:
            column = ops.select(x, 1, int(features[node]))
            if modes[node] == _MEMBER:
                hit = None
                for member in member_sets[node]:
                    eq = ops.eq(column, float(member))
                    hit = eq if hit is None else ops.logical_or(hit, eq)
                hit = hit if hit is not None else ops.full(tuple(column.shape), False,
                                                            "bool", like=x)
            else:
                hit = _COMPARE[int(modes[node])](column, float(splits[node]))
            if missing_true[node]:
                hit = ops.logical_or(hit, ops.isnan(column))
            conditions[node] = hit
        return conditions[node]

    per_tree, scored = [], []
    for leaves in _paths(_array(ctx, "tree_roots"), _array(ctx, "nodes_truenodeids"),
                         _array(ctx, "nodes_falsenodeids"), _array(ctx, "nodes_trueleafs"),
                         _array(ctx, "nodes_falseleafs")):
        columns, hits = [], []
        for target in range(count):
            value = ops.full((x.shape[0],), identity, x.dtype, like=x)
            hit = ops.full((x.shape[0],), False, "bool", like=x)
            for leaf, path in leaves:
                if targets[leaf] != target:
                    continue
                reached = ops.full((x.shape[0],), True, "bool", like=x)
                for node, taken in path:
                    c = holds(node) if taken else ops.logical_not(holds(node))
                    reached = ops.logical_and(reached, c)
                value = ops.where(reached, float(weights[leaf]), value)
                hit = ops.logical_or(hit, reached)
            columns.append(value)
            hits.append(hit)
        per_tree.append(ops.stack(columns, 1))
        scored.append(ops.stack(hits, 1))
    return per_tree, ops.amax(ops.stack(scored, 0), 0)


def _next_set(members) -> list:
    """The values up to the next NaN."""
    out = []
    for value in members:
        if np.isnan(value):
            break
        out.append(value)
    return out
