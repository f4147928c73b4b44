"""``tdag.ops``: the functions a traced program is written with.

Primitives (``permute``, ``group``, ``reduce``, ``exp``, ...), array-API helpers with torch's
broadcasting and promotion (``add``, ``matmul``, ``reshape``, ``concat``, ...), neural-network
ops as compositions (``conv``, ``softmax``, ``layer_norm``, ``attention``, ...) and einops
patterns (``rearrange``, ``einops_reduce``, ``repeat``, ``einsum``). ``reduce`` takes the
primitive's call ``reduce(x, "sum", axes)`` and einops' ``reduce(x, "a b -> a", "sum")``.

The facade holds functions only (``__all__``); the classes live where they are defined
(``tdag.ops.tensor.Tensor``, ``tdag.ops.builder.Builder``, the specs in ``tdag.deinops``).
Importing it installs the Tensor's operators (``tensor_methods``).
"""
from tdag.ops.arrays import (
    argmax, argmin, cat, chunk, concat, index, linear, matmul, mean, repeat_interleave,
    split, stack, tile, var, vector_norm,
)
from tdag.ops.complex import (
    angle, atan2, complex, conj, fft, fftn, full_spectrum, imag, polar, real, real_to_complex,
    sgn, signbit, view_as_complex, view_as_real,
)
from tdag.ops.contraction import einsum
from tdag.ops.core import (
    abs, acos, acosh, add, amax, amin, as_tensor, asin, asinh, atan, atanh, broadcast_to, cast,
    ceil, clamp, cos, cosh, div, eq, erf, erfinv, exp, expand, flatten, floor, floor_divide,
    fmod, fold, gather, ge, group, gt, hypot, isnan, le, log, logical_and, logical_not,
    logical_or, lt, maximum, minimum, movedim, mul, multiply, ne, neg, pad, permute, pow, prod,
    reciprocal, remainder, repeat_axes, reshape, round, rsqrt, select, sign, sin, sinh, slice,
    sqrt, square, squeeze, sub, sum, tan, tanh, transpose, trunc, trunc_divide, unfold, ungroup,
    unsqueeze, where,
)
from tdag.ops.creation import arange, dim_tensor, full, iota, ones, size_tensor, zeros
from tdag.ops.einops import rearrange, repeat
from tdag.ops.experts import grouped_matmul
from tdag.ops.einops import reduce as einops_reduce
from tdag.ops.einops import reduce_or_pattern as reduce  # the one ``reduce``: both calls
from tdag.ops.masking import (
    arange_of, broadcast_index, checked_size, checked_zero, flat_nonzero, mask_index,
    masked_select, nonzero, size_of,
)
from tdag.ops.nn.conv import (
    conv, conv_transpose, torch_pad,
)
from tdag.ops.nn.functional import (
    batch_norm, celu, dropout, elu, embedding, embedding_bag, gelu, group_norm, hardshrink,
    hardsigmoid, hardswish, hardtanh, instance_norm, layer_norm, leaky_relu, local_response_norm,
    log_softmax, logsigmoid, logsumexp, mish,
    relu, relu6, rms_norm, safe_softmax, scaled_dot_product_attention, selu, sigmoid, silu,
    softmax, softplus, softshrink,
)
from tdag.ops.nn.pool import (
    adaptive_avg_pool, adaptive_max_pool, avg_pool, interpolate, max_pool,
)
from tdag.ops.optim import adamw_update
from tdag.ops.promotion import broadcast_shapes, result_dtype
from tdag.ops.scans import cummax, cummin, cumprod, cumsum, logcumsumexp, scan
from tdag.ops.special.series import expm1, log1p, logaddexp, nan_to_num
from tdag.ops.sorting import (
    argsort, searchsorted, sort, topk, unique, unique_all, unique_consecutive, unique_slices,
)
from tdag.ops import tensor_methods
from tdag.ops.trace import buffer, const, param
from tdag.ops.writes import scatter, scatter_elements, take_along

tensor_methods.install()

__all__ = [
    "abs", "acos", "acosh", "adamw_update", "adaptive_avg_pool", "adaptive_max_pool", "add",
    "amax", "amin", "angle", "atan2", "arange", "arange_of", "argmax", "argmin", "argsort",
    "as_tensor", "asin", "asinh", "atan", "atanh", "avg_pool", "batch_norm", "broadcast_index",
    "broadcast_shapes", "broadcast_to", "buffer", "complex", "conj", "fft", "fftn",
    "full_spectrum", "imag", "polar", "real", "real_to_complex", "view_as_complex", "view_as_real",
    "cast", "cat", "ceil", "celu", "checked_size", "checked_zero", "chunk", "clamp", "concat",
    "const", "conv", "conv_transpose", "cos", "cosh", "cummax", "cummin", "cumprod", "cumsum",
    "dim_tensor", "div", "dropout", "einops_reduce", "einsum", "elu", "embedding", "embedding_bag",
    "eq", "erf", "erfinv", "exp", "expand", "expm1", "flat_nonzero", "flatten", "floor",
    "floor_divide", "fmod", "fold", "full", "gather", "ge", "gelu", "group", "group_norm",
    "grouped_matmul", "gt", "hardsigmoid", "hardswish", "hardshrink", "hardtanh", "hypot", "index",
    "instance_norm", "interpolate", "iota", "isnan", "layer_norm", "le", "leaky_relu", "linear",
    "local_response_norm", "log", "log1p", "log_softmax", "logcumsumexp", "logical_and",
    "logaddexp", "logical_not", "logical_or", "logsigmoid", "logsumexp", "lt", "mask_index",
    "masked_select", "matmul", "max_pool", "maximum", "mean", "minimum", "mish", "movedim", "mul",
    "multiply", "nan_to_num", "ne", "neg", "nonzero", "ones", "pad", "param", "permute", "pow",
    "prod", "rearrange", "reciprocal", "reduce", "relu", "relu6", "remainder", "repeat",
    "repeat_axes", "repeat_interleave", "reshape", "result_dtype", "rms_norm", "round", "rsqrt",
    "safe_softmax", "scan", "scaled_dot_product_attention", "scatter", "scatter_elements",
    "searchsorted", "select", "selu", "sgn", "sigmoid", "signbit", "sign", "silu", "sin", "sinh",
    "size_of", "size_tensor", "slice", "softmax", "softplus", "softshrink", "sort", "split",
    "sqrt", "square", "squeeze", "stack", "sub", "sum", "take_along", "tan", "tanh", "tile",
    "topk", "torch_pad", "transpose", "trunc", "trunc_divide", "unfold", "ungroup", "unique",
    "unique_all", "unique_consecutive", "unique_slices", "unsqueeze", "var", "vector_norm",
    "where", "zeros",
]
