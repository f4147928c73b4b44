"""The op enum. Each member is one primitive or kernel; its record (``tdag/ir/record.py``),
defined next to the op in ``tdag/deinops``, holds every rule about it. Op families are
queries on the records' traits: ``ops_with(Trait.VIEW)``.
"""
from __future__ import annotations

import enum


class Op(enum.Enum):
    # movement: the deconstructed einops and their mirrors
    permute = "permute"
    group = "group"
    ungroup = "ungroup"
    squeeze = "squeeze"
    unsqueeze = "unsqueeze"
    slice = "slice"
    pad = "pad"
    select = "select"
    repeat = "repeat"
    unfold = "unfold"
    fold = "fold"
    # reduction
    reduce = "reduce"
    # elementwise unary
    neg = "neg"
    reciprocal = "reciprocal"
    exp = "exp"
    log = "log"
    sin = "sin"
    cos = "cos"
    tan = "tan"
    asin = "asin"
    acos = "acos"
    atan = "atan"
    sinh = "sinh"
    cosh = "cosh"
    tanh = "tanh"
    asinh = "asinh"
    acosh = "acosh"
    atanh = "atanh"
    erf = "erf"
    erfinv = "erfinv"
    sign = "sign"
    # elementwise binary
    add = "add"
    multiply = "multiply"
    divide = "divide"
    pow = "pow"
    # elementwise, beyond exact compositions
    where = "where"
    compare = "compare"
    cast = "cast"
    bitcast = "bitcast"
    # indexing and generators
    gather = "gather"
    scatter = "scatter"  # gather's mirror: rows written at positions, with a combine
    iota = "iota"
    # order and accumulation along an axis, at the framework kernels' complexity
    sort = "sort"  # the stable sorting permutation: n log n, where ranking pairs is n^2
    scan = "scan"  # the cumulative sum/prod/max/min: n, where an unfolded axis is n^2
    fft = "fft"  # a DFT along an axis: n log n, where the cos/sin matrix product is n^2
    # sizes that only data decides: each output has a fresh symbol, bound at run time
    nonzero = "nonzero"
    arange = "arange"
    # kernels (placeholders made by tdag.lower): one fast framework call each; their records
    # live in tdag/lower/kernels
    einsum = "einsum"
    conv = "conv"
    conv_transpose = "conv_transpose"
    conv_weight_grad = "conv_weight_grad"  # a convolution's gradient for its weight
    adamw_update = "adamw_update"  # one parameter's AdamW step, moments stacked after it
    max_pool = "max_pool"
    avg_pool = "avg_pool"
    resize = "resize"
    softmax = "softmax"
    log_softmax = "log_softmax"
    layer_norm = "layer_norm"
    group_norm = "group_norm"
    batch_norm = "batch_norm"
    rms_norm = "rms_norm"
    attention = "attention"
    lstm = "lstm"
    gelu = "gelu"
    softmax_backward = "softmax_backward"  # the input gradient of softmax, as torch's
    gelu_backward = "gelu_backward"  # the input gradient of gelu, as torch's
    layer_norm_backward = "layer_norm_backward"  # the input gradient of layer_norm
    rms_norm_backward = "rms_norm_backward"  # the input gradient of rms_norm
    relu_backward = "relu_backward"  # input gradients of CNN activations, as torch's
    clamp_backward = "clamp_backward"
    silu_backward = "silu_backward"
    max_pool_backward = "max_pool_backward"  # all to the first maximum, as torch's
    batch_norm_backward = "batch_norm_backward"  # inference batch norm's input gradient
    silu = "silu"
    sigmoid = "sigmoid"
    relu = "relu"
    clamp = "clamp"
    maximum = "maximum"  # of two tensors, nan propagating: torch.maximum, ONNX Max
    minimum = "minimum"
    hardswish = "hardswish"
    abs = "abs"  # |x| of a float or signed integer: torch.abs, ONNX Abs
    leaky_relu = "leaky_relu"  # the activations torch.nn.functional runs in one pass
    elu = "elu"  # aten.elu's: scale (x > 0 ? x : alpha (exp(input_scale x) - 1)): selu, celu
    hardsigmoid = "hardsigmoid"
    softplus = "softplus"
    mish = "mish"
    logsigmoid = "logsigmoid"
    shrink = "shrink"  # hardshrink and softshrink: torch.nn.functional's, ONNX Shrink
    rounding = "rounding"  # a float to an integral value: floor, ceil or half to even
    log1p = "log1p"  # log(1 + x) and exp(x) - 1 without cancellation by 0, one pass
    expm1 = "expm1"
    hypot = "hypot"  # sqrt(x^2 + y^2) without overflow or underflow: torch.hypot
    atan2 = "atan2"  # the angle of (x, y), signed zeros and infinities as C's: torch.atan2
    logaddexp = "logaddexp"  # log(exp(a) + exp(b)) of two tensors, one pass: torch.logaddexp
    nan_to_num = "nan_to_num"  # nan, +inf and -inf replaced by numbers, one pass
    logsumexp = "logsumexp"  # log(sum(exp(x))) over axes, its max shifted out, one pass
    var = "var"  # the variance over axes, less ``correction`` in the count: torch.var
    vector_norm = "vector_norm"  # (sum |x|^ord)^(1/ord) over axes: torch.linalg.vector_norm
    reshape = "reshape"
    expand = "expand"
    concat = "concat"
    quantize = "quantize"
    dequantize = "dequantize"
    matmul_integer = "matmul_integer"
    topk = "topk"  # the first k values of a sort (all of them: the sorted values)
    argmax = "argmax"  # one pass, where max + compare + min over positions is three
    argmin = "argmin"
    cum_extreme = "cum_extreme"  # cummax/cummin values or indices, one pass for both
    bincount = "bincount"  # an integer target plus the count of each index: one pass
    bincount_sized = "bincount_sized"  # torch.bincount, its length max + 1: no size pass
    histc = "histc"  # counts of a float tensor's values in equal bins over a range: torch.histc
    write_slice = "write_slice"  # a run of one axis replaced: in place where the old dies
    searchsorted = "searchsorted"  # one call, where the binary search unrolled is ~13 passes
    take_along = "take_along"  # a sort's permutation read row by row: no flat gather
    put_along = "put_along"  # ... written back row by row: no dedupe of the writes
    logcumsumexp = "logcumsumexp"  # one pass, where the f64 shifted form is ~15 passes
    fft_of_real = "fft_of_real"  # torch.fft.fft of a real signal: r2c + mirror in one pass
    embedding_bag = "embedding_bag"  # rows gathered and reduced into bags: one pass
    conv_integer = "conv_integer"
    dynamic_quantize = "dynamic_quantize"  # one output of DynamicQuantizeLinear
    qlinear_conv = "qlinear_conv"  # conv_integer + bias, requantized to 8 bits
    qlinear_matmul = "qlinear_matmul"  # matmul_integer, requantized to 8 bits
    tree_sum = "tree_sum"  # a forest's walk, summed over its trees (ai.onnx.ml trees)
    normalize_rows = "normalize_rows"  # rows by their MAX, L1 or L2 norm (ai.onnx.ml)
    svm_scores = "svm_scores"  # support vector machine scores (ai.onnx.ml SVMs)
    linear_classifier = "linear_classifier"  # a label or scores of ai.onnx.ml LinearClassifier
    svm_label = "svm_label"  # SVMClassifier's label: one-vs-one votes of its pair scores
    grouped_mm = "grouped_mm"  # each expert's rows by its matrix (mixture of experts)
    # torch.linalg's factorizations (LAPACK, any n), where the compositions unroll over n
    linalg_inv = "linalg_inv"
    linalg_solve = "linalg_solve"
    linalg_cholesky = "linalg_cholesky"
    linalg_det = "linalg_det"
    linalg_slogdet = "linalg_slogdet"  # sign and log|det| stacked on a last axis of 2
    linalg_eigh = "linalg_eigh"  # eigenvectors' rows, then the eigenvalues
    linalg_eig = "linalg_eig"  # as eigh, complex (a real input's general eigenproblem)
    linalg_ldl_factor = "linalg_ldl_factor"  # LD's rows, the pivots' row, info's row
    linalg_ldl_solve = "linalg_ldl_solve"
    linalg_svd = "linalg_svd"  # U's rows, S, V's rows (reduced)
    linalg_qr = "linalg_qr"  # Q's rows, then R^T's (reduced)
    linalg_solve_triangular = "linalg_solve_triangular"
