"""The ONNX op table, ai.onnx.ml's numeric featurizers (skl2onnx's StandardScaler,
MinMaxScaler, Normalizer, OneHotEncoder, SimpleImputer, ...) and ZipMap, as onnxruntime
computes them: Scaler (x - offset) * scale; Normalizer by the row's MAX, L1 or L2 (a row whose
norm is 0 is copied; L2 as sign(x) sqrt(x^2 / sum x^2)); OneHotEncoder of integer categories
(the input cast to int64; an unknown category is a row of zeros, where onnxruntime with
zeros=0 fails the run); Imputer (x == replaced, or both NaN, -> the imputed value of its
column); FeatureVectorizer (each input's first ``inputdimensions[i]`` columns, zero-padded,
side by side, as float).

ZipMap's output is a sequence of maps {label: probability}, which no tdag type holds. The
convention: ZipMap keeps the probability tensor [N, C] as it is, its column c being the
probability of ``classlabels_int64s[c]``, and the labels travel with the Program as
``Program.class_labels`` of that output (the importer keeps the file's output names). So
tdag.run, to_torch and to_jax of a scikit-learn classifier converted with ZipMap return the
same [N, C] tensor as one converted with ``options={id(model): {"zipmap": False}}``, while
tdag.to_onnx writes the ZipMap back: the file it writes has the original's
seq(map(int64, float)) output under the original's name, a drop-in replacement. A ZipMap
whose result is not a graph output (read by another node) is refused: its maps would be
data. String keys (``classlabels_strings``) and string inputs are refused.
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.onnx.ops.ml_scores import array
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType
from tdag.ops.ml import NORMS, normalize

FEATURE_OPS = ("FeatureVectorizer", "Imputer", "Normalizer", "OneHotEncoder", "Scaler",
               "ZipMap")
_NUMERIC = (DType.f32, DType.f64, DType.i32, DType.i64)


def _numeric(ctx, x, rank: int = 2):
    x = ctx.tensor(x)
    if x.dtype not in _NUMERIC:
        raise UnsupportedOpError(f"{ctx.node.op_type}: input of type {x.dtype}")
    if not 1 <= x.ndim <= rank:
        raise UnsupportedOpError(f"{ctx.node.op_type}: input of rank {x.ndim} (1 to {rank})")
    return x


def _per_column(x, values: np.ndarray, dtype):
    """A row of per-column values (one value: every column)."""
    values = values.reshape(-1)
    if len(values) == 1:
        return float(values[0]) if dtype.is_float else int(values[0])
    return x.builder.const(values.tolist(), dtype)


@register("Scaler")
def _scaler(ctx, x):
    x = _numeric(ctx, x)
    scale, offset = array(ctx, "scale"), array(ctx, "offset")
    if scale is None or offset is None or len(scale) != len(offset):
        raise InvalidModelError("Scaler: scale and offset must be given, of one length")
    if len(scale) not in (1, x.shape[-1]):
        raise InvalidModelError(f"Scaler: {len(scale)} scales for {x.shape[-1]} columns")
    wide = DType.f64 if x.dtype == DType.f64 else DType.f32  # as onnxruntime's arithmetic
    x = ops.cast(x, wide)
    scaled = ops.mul(ops.sub(x, _per_column(x, offset.astype(np.float32), wide)),
                     _per_column(x, scale.astype(np.float32), wide))
    return ops.cast(scaled, DType.f32)


@register("Normalizer")
def _normalizer(ctx, x):
    """``tdag.ops.ml.normalize``: one composition for the importer and the ML kernels."""
    return normalize(ops.cast(_numeric(ctx, x), DType.f32), ctx.choice("norm", "MAX", NORMS))


@register("OneHotEncoder")
def _one_hot_encoder(ctx, x):
    if ctx.attr("cats_strings"):
        raise UnsupportedOpError("OneHotEncoder over string categories (tdag has no string "
                                 "tensors)")
    categories = list(ctx.attr("cats_int64s") or [])
    if not categories:
        raise InvalidModelError("OneHotEncoder: no categories")
    x = ops.cast(_numeric(ctx, x), DType.i64)
    column = {int(c): k for k, c in enumerate(categories)}  # a repeated one: its last place
    hot = ops.unsqueeze(x, x.ndim)
    codes = [c if column[c] == k else None for k, c in enumerate(categories)]
    columns = [ops.cast(ops.eq(ops.select(hot, -1, 0), c), DType.f32) if c is not None else
               ops.zeros(tuple(x.shape), DType.f32, like=x) for c in codes]
    return ops.stack(columns, x.ndim)


@register("Imputer")
def _imputer(ctx, x):
    x = _numeric(ctx, x)
    if x.dtype == DType.f32:
        values, replaced = array(ctx, "imputed_value_floats"), ctx.attr("replaced_value_float", 0.0)
    elif x.dtype == DType.i64:
        values, replaced = array(ctx, "imputed_value_int64s"), ctx.attr("replaced_value_int64", 0)
    else:
        raise UnsupportedOpError(f"Imputer: input of type {x.dtype} (onnxruntime: f32, i64)")
    if values is None or not len(values):
        raise InvalidModelError(f"Imputer: no imputed values for a {x.dtype} input")
    if len(values) != x.shape[-1]:
        values = values[:1]  # as onnxruntime: the first value for every column
    fill = _per_column(x, values.astype(np.float32 if x.dtype.is_float else np.int64), x.dtype)
    if not isinstance(fill, (int, float)):
        fill = ops.broadcast_to(fill, tuple(x.shape))
    hit = ops.eq(x, replaced)
    if x.dtype.is_float and np.isnan(replaced):
        hit = ops.isnan(x)
    return ops.where(hit, fill, x)


@register("FeatureVectorizer")
def _feature_vectorizer(ctx, *inputs):
    widths = list(ctx.attr("inputdimensions") or [])
    if len(widths) != len(inputs) or not inputs:
        raise InvalidModelError(f"FeatureVectorizer: {len(widths)} inputdimensions for "
                                f"{len(inputs)} inputs")
    parts = []
    for value, width in zip(inputs, widths):
        x = ops.cast(_numeric(ctx, value, rank=8), DType.f32)
        x = ops.unsqueeze(x, 0) if x.ndim == 1 else ops.reshape(x, x.shape[0], -1)
        size = x.shape[1]
        if not is_static(size):
            raise UnsupportedOpError(f"FeatureVectorizer: an input of symbolic width {size}")
        x = ops.slice(x, 1, 0, width) if size > width else x
        parts.append(ops.pad(x, [(0, 0), (0, width - size)]) if size < width else x)
    return ops.concat(parts, 1) if len(parts) > 1 else parts[0]


@register("ZipMap")
def _zip_map(ctx, x):
    """The probability tensor itself (see the module docstring)."""
    if ctx.attr("classlabels_strings"):
        raise UnsupportedOpError("ZipMap with string keys (classlabels_strings): tdag has no "
                                 "string tensors")
    labels = tuple(ctx.attr("classlabels_int64s") or [])
    x = ctx.tensor(x)
    if x.ndim != 2 or x.dtype is not DType.f32 or x.shape[1] != len(labels) or \
            len(set(labels)) != len(labels):
        raise InvalidModelError(f"ZipMap: {len(labels)} labels (each once) for a {x.type} "
                                "input (f32 [N, labels])")
    importer, name = ctx.importer, ctx.node.output[0]
    if importer.prefix != "main" or any(name in n.input for n in importer.graph.node):
        raise UnsupportedOpError("ZipMap in a subgraph or read by another node (tdag keeps "
                                 "its maps only as a graph output's class labels)")
    importer.shared.class_labels[name] = labels
    return x
