"""The ONNX op table, ops of the ai.onnx.ml domain that are tensor arithmetic: Binarizer
(1 above the threshold, else 0), ArrayFeatureExtractor (a gather along the last axis) and
TreeEnsemble (static trees: each leaf is where the conditions on its path hold). The string
ops are not mapped. Also TfIdfVectorizer (of the default domain: integer n-gram counts), the
one other featurizer."""
from __future__ import annotations

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from tdag import ops
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

ML_OPS = ("ArrayFeatureExtractor", "Binarizer", "TreeEnsemble")


@register("Binarizer")
def _binarizer(ctx, x):
    x = ctx.tensor(x)
    return ops.cast(ops.gt(x, float(ctx.attr("threshold", 0.0))), x.dtype)


@register("ArrayFeatureExtractor")
def _array_feature_extractor(ctx, x, index):
    """The elements of the last axis at ``index`` (flattened, negative counted from the end)."""
    x = ctx.tensor(x)
    index = ops.reshape(ops.cast(ctx.tensor(index), DType.i64), (-1,))
    return ops.gather(x, index, x.ndim - 1)


# -- TreeEnsemble -------------------------------------------------------------------------------

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
    """The trees are static (attributes), so each leaf is reached exactly where the
    conditions on its path hold: per tree, per target, the weight of the leaf reached
    (a sum of where(path holds, weight, 0)); then aggregated over the trees."""
    x = ctx.tensor(x)
    if ctx.attr("post_transform", 0) != 0:
        raise UnsupportedOpError("TreeEnsemble: a post_transform other than NONE")
    aggregate = ctx.attr("aggregate_function", 1)
    modes = _array(ctx, "nodes_modes").astype(np.int64)
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

    count = ctx.attr("n_targets")
    if aggregate not in (0, 1, 2, 3):
        raise InvalidModelError(f"TreeEnsemble: aggregate_function {aggregate}")
    finfo = torch.finfo(x.dtype.torch)
    identity = {0: 0.0, 1: 0.0, 2: finfo.max, 3: finfo.min}[aggregate]  # as the reference
    per_tree = []
    for leaves in _paths(_array(ctx, "tree_roots"), _array(ctx, "nodes_truenodeids"),
                         _array(ctx, "nodes_falsenodeids"), _array(ctx, "nodes_trueleafs"),
                         _array(ctx, "nodes_falseleafs")):
        columns = []
        for target in range(count):
            value = ops.full((x.shape[0],), identity if aggregate in (2, 3) else 0.0,
                             x.dtype, like=x)
            for leaf, path in leaves:
                if targets[leaf] != target:
                    continue
                reached = None
                for node, taken in path:
                    c = holds(node) if taken else ops.logical_not(holds(node))
                    reached = c if reached is None else ops.logical_and(reached, c)
                if reached is None:
                    value = ops.full((x.shape[0],), float(weights[leaf]), x.dtype, like=x)
                else:
                    value = ops.where(reached, float(weights[leaf]), value)
            columns.append(value)
        per_tree.append(ops.stack(columns, 1))
    stacked = ops.stack(per_tree, 0)
    if aggregate in (0, 1):
        total = ops.sum(stacked, 0)
        return ops.div(total, float(len(per_tree))) if aggregate == 0 else total
    init = ops.full((x.shape[0], count), identity, x.dtype, like=x)
    reduce = ops.amin if aggregate == 2 else ops.amax
    return reduce(ops.concat([ops.unsqueeze(init, 0), stacked], 0), 0)


def _next_set(members) -> list:
    """The values up to the next NaN."""
    out = []
    for value in members:
        if np.isnan(value):
            break
        out.append(value)
    return out


@register("TfIdfVectorizer")
def _tfidf_vectorizer(ctx, x):
    """Counts of the pool's integer n-grams in each row, as the ONNX reference: an n-gram of
    n >= 2 tokens is counted at every skip distance d (1 to max_skip_count + 1: tokens d
    apart), a unigram once; then TF (the counts), IDF (the weight where counted) or TFIDF
    (weight times count). Each (n-gram, d) is an AND of n shifted comparisons, summed.
    A weight belongs to its pool n-gram as the spec and onnxruntime read it (the reference
    indexes the weights by output position: the same where ngram_indexes is 0, 1, ...)."""
    if ctx.attr("pool_strings"):
        raise UnsupportedOpError("TfIdfVectorizer over strings (tdag has no string type)")
    x = ctx.tensor(x)
    rows = ops.cast(ops.unsqueeze(x, 0) if x.ndim == 1 else x, DType.i64)
    length = rows.shape[1]
    if not is_static(length):
        raise UnsupportedOpError(f"TfIdfVectorizer over a symbolic row length {length}")
    pool, starts = list(ctx.attr("pool_int64s") or []), list(ctx.attr("ngram_counts"))
    indexes, weights = list(ctx.attr("ngram_indexes")), list(ctx.attr("weights") or [])
    lowest, highest = ctx.attr("min_gram_length"), ctx.attr("max_gram_length")
    skips = ctx.attr("max_skip_count")
    grams = []  # every pool n-gram in pool order: its tokens
    for n, begin in enumerate(starts, 1):
        end = starts[n] if n < len(starts) else len(pool)
        grams += [pool[i:i + n] for i in range(begin, end, n)]
    size = max(indexes) + 1
    counts = [None] * size
    for gram, out in zip(grams, indexes):
        n = len(gram)
        if not lowest <= n <= highest:
            continue
        for distance in range(1, (skips + 2) if n > 1 else 2):
            span = distance * (n - 1)
            if span >= length:
                break
            hit = None
            for k, token in enumerate(gram):
                shifted = ops.slice(rows, 1, k * distance, length - span + k * distance)
                eq = ops.eq(shifted, int(token))
                hit = eq if hit is None else ops.logical_and(hit, eq)
            found = ops.sum(ops.cast(hit, DType.f32), 1)
            counts[out] = found if counts[out] is None else ops.add(counts[out], found)
    zero = ops.zeros((rows.shape[0],), DType.f32, like=rows)
    freq = ops.stack([c if c is not None else zero for c in counts], 1)
    mode = ctx.choice("mode", "TF", ("TF", "IDF", "TFIDF"))
    if weights:  # one per pool n-gram (the spec, onnxruntime), placed at its output
        per_output = [1.0] * size
        for out, weight in zip(indexes, weights):
            per_output[out] = float(weight)
        w = rows.builder.const(per_output, DType.f32)
    else:
        w = 1.0
    if mode == "IDF":
        freq = ops.where(ops.gt(freq, 0.0), ops.mul(ops.full((1, size), 1.0, DType.f32,
                                                             like=rows), w), 0.0)
    elif mode == "TFIDF" and weights:
        freq = ops.mul(freq, w)
    return ops.squeeze(freq, 0) if x.ndim == 1 else freq
