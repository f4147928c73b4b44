"""The ONNX op table, ops of the ai.onnx.ml domain that are tensor arithmetic: Binarizer
(1 above the threshold, else 0) and ArrayFeatureExtractor (a gather along the last axis)
here; the predictors and featurizers scikit-learn's converter writes in their own files
(ml_linear, ml_svm, ml_trees, ml_features; what they share in ml_scores). ``ML_OPS`` names
every ai.onnx.ml op tdag maps: the importer admits that domain for these alone. The string
ops (LabelEncoder, CategoryMapper, DictVectorizer, ...) are not mapped. Also TfIdfVectorizer
(of the default domain: integer n-gram counts), the one other featurizer."""
from __future__ import annotations


from tdag import ops
from tdag.canonicalize.onnx.ops.ml_features import FEATURE_OPS
from tdag.canonicalize.onnx.ops.ml_linear import LINEAR_OPS
from tdag.canonicalize.onnx.ops.ml_svm import SVM_OPS
from tdag.canonicalize.onnx.ops.ml_trees import TREE_OPS
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

ML_OPS = ("ArrayFeatureExtractor", "Binarizer") + LINEAR_OPS + SVM_OPS + TREE_OPS + FEATURE_OPS


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
