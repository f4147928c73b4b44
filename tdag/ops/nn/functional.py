"""Neural-network ops (torch.nn.functional) as compositions of primitives: no new primitives.

This module holds the activations, softmax family, norms, embedding, attention and dropout;
convolutions and padding modes live in nn_conv.py, pooling and resampling in nn_pool.py, and
all of them are exported from here (and so from ``tdag.ops``).
"""
from __future__ import annotations

import math

import torch

from tdag.ops import arrays
from tdag.ops import core, creation, scans, writes
from tdag.ops.tensor import Tensor
from tdag.ops.nn.conv import conv, conv_transpose, torch_pad
from tdag.ops.nn.pool import (
    adaptive_avg_pool,
    adaptive_max_pool,
    avg_pool,
    interpolate,
    max_pool,
)
from tdag.ops.nn.util import as_float, channel_view
from tdag.ops.special.series import log1p
from tdag.errors import ShapeError, UnsupportedOpError
from tdag.ir.symbols import as_dim, dims_equal, is_static
from tdag.ir.types import DType

__all__ = [
    # nn_conv / nn_pool
    "conv", "conv_transpose", "torch_pad", "max_pool", "avg_pool", "adaptive_avg_pool",
    "adaptive_max_pool", "interpolate",
    # activations
    "relu", "relu6", "leaky_relu", "sigmoid", "silu", "gelu", "softplus", "elu", "selu", "celu",
    "hardtanh", "hardsigmoid", "hardswish", "mish", "hardshrink", "softshrink",
    # softmax family
    "softmax", "safe_softmax", "log_softmax", "logsumexp",
    # norms
    "layer_norm", "group_norm", "batch_norm", "instance_norm", "rms_norm",
    "local_response_norm",
    # the rest
    "embedding", "embedding_bag", "scaled_dot_product_attention", "dropout",
]

_INF = float("inf")


# -- activations ------------------------------------------------------------------------------


def relu(x: Tensor) -> Tensor:
    """``torch.relu`` as where(x < 0, 0, x): relu(-inf) = 0, relu(nan) = nan."""
    return core.where(core.lt(x, 0), 0, x)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``torch.nn.functional.leaky_relu``: x > 0 ? x : x * slope (nan stays nan)."""
    return core.where(core.gt(x, 0), x, core.mul(x, negative_slope))


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """``torch.nn.functional.hardtanh``: clamp, propagating nan."""
    return core.clamp(x, min_val, max_val)


def relu6(x: Tensor) -> Tensor:
    """``torch.nn.functional.relu6`` = hardtanh(x, 0, 6)."""
    return hardtanh(x, 0.0, 6.0)


def sigmoid(x: Tensor) -> Tensor:
    """``torch.sigmoid`` = 1 / (1 + exp(-x)); exp overflow gives 1/inf = 0, the right limit."""
    return core.reciprocal(core.add(core.exp(core.neg(as_float(x))), 1.0))


def silu(x: Tensor) -> Tensor:
    """``torch.nn.functional.silu`` = x / (1 + exp(-x)), torch's form (silu(-inf) = nan)."""
    x = as_float(x)
    return core.div(x, core.add(core.exp(core.neg(x)), 1.0))


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """``torch.nn.functional.gelu``: x/2 (1 + erf(x/sqrt 2)), or with ``approximate='tanh'``
    x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = as_float(x)
    if approximate == "none":
        inner = core.erf(core.mul(x, math.sqrt(0.5)))
    elif approximate == "tanh":
        cube = core.mul(core.mul(x, x), x)
        inner = core.tanh(core.mul(core.add(x, core.mul(cube, 0.044715)), math.sqrt(2 / math.pi)))
    else:
        raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return core.mul(core.mul(x, 0.5), core.add(inner, 1.0))


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``torch.nn.functional.softplus``: log(1 + exp(beta x)) / beta, or x once beta x passes
    ``threshold`` (where exp would overflow; where() keeps the unused inf out)."""
    x = as_float(x)
    scaled = core.mul(x, beta)
    soft = core.log(core.add(core.exp(scaled), 1.0))
    return core.where(core.gt(scaled, threshold), x, soft if beta == 1 else core.div(soft, beta))


def logsigmoid(x: Tensor) -> Tensor:
    """``torch.nn.functional.logsigmoid`` = min(x, 0) - log1p(exp(-|x|)), as torch computes
    it (no overflow either side; nan stays nan)."""
    x = as_float(x)
    return core.sub(core.where(core.gt(x, 0.0), 0.0, x),
                    log1p(core.exp(core.neg(core.abs(x)))))


def elu(x: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Tensor:
    """``torch.nn.functional.elu``: x > 0 ? x : alpha (exp(x) - 1); with aten.elu's ``scale``
    and ``input_scale`` (which selu and celu call it with), that times ``scale`` and the
    exponent's argument ``input_scale`` x."""
    x = as_float(x)
    argument = x if input_scale == 1 else core.mul(x, input_scale)
    y = core.where(core.gt(x, 0), x, core.mul(core.sub(core.exp(argument), 1.0), alpha))
    return y if scale == 1 else core.mul(y, scale)


# torch's (and ONNX's Selu defaults, rounded to float32 there)
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def selu(x: Tensor) -> Tensor:
    """``torch.nn.functional.selu`` = SELU_SCALE elu(x, SELU_ALPHA)."""
    return elu(x, SELU_ALPHA, SELU_SCALE)


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """``torch.nn.functional.celu`` = x > 0 ? x : alpha (exp(x / alpha) - 1), as torch
    computes it: elu with input_scale 1 / alpha."""
    if alpha == 0:
        raise ShapeError("celu: alpha must not be 0 (it divides x)")
    return elu(x, alpha, 1.0, 1.0 / alpha)


def hardshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """``torch.nn.functional.hardshrink``: 0 where -lambd <= x <= lambd, else x (nan stays)."""
    x = as_float(x)
    return core.where(core.ge(x, -lambd), core.where(core.le(x, lambd), 0.0, x), x)


def softshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """``torch.nn.functional.softshrink``: x - lambd above lambd, x + lambd below -lambd, else
    x * 0 (torch's: -0.0 and nan stay)."""
    x = as_float(x)
    if lambd < 0:
        raise ShapeError(f"softshrink: lambd must be at least 0, got {lambd}")
    inside = core.where(core.lt(x, -lambd), core.add(x, lambd), core.mul(x, 0.0))
    return core.where(core.gt(x, lambd), core.sub(x, lambd), inside)


def hardsigmoid(x: Tensor) -> Tensor:
    """``torch.nn.functional.hardsigmoid`` = relu6(x + 3) / 6."""
    return core.div(relu6(core.add(x, 3.0)), 6.0)


def hardswish(x: Tensor) -> Tensor:
    """``torch.nn.functional.hardswish`` = x relu6(x + 3) / 6."""
    return core.div(core.mul(x, relu6(core.add(x, 3.0))), 6.0)


def mish(x: Tensor) -> Tensor:
    """``torch.nn.functional.mish`` = x tanh(softplus(x))."""
    return core.mul(x, core.tanh(softplus(x)))


# -- softmax family ---------------------------------------------------------------------------


def _shift(x: Tensor, axis: int) -> tuple[Tensor, Tensor]:
    """x - max(x) along ``axis`` (kept), so exp never overflows; a row of -inf gives nan."""
    top = core.amax(x, axis, keepdim=True)
    return core.sub(x, top), top


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``torch.softmax(x, dim=axis)``: exp(x - max) / sum(exp(x - max)); an all -inf row is
    nan, as in torch.

    >>> import tdag, torch
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.softmax(x, -1), tdag.TensorSpec(("b", 3)))
    >>> tdag.run(prog, torch.tensor([[0.0, 0.0, float("-inf")]]))
    tensor([[0.5000, 0.5000, 0.0000]])
    """
    shifted, _ = _shift(as_float(x), axis)
    return _normalized_exp(shifted, axis)


def _normalized_exp(shifted: Tensor, axis: int) -> Tensor:
    e = core.exp(shifted)
    return core.div(e, core.sum(e, axis, keepdim=True))


def safe_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """softmax along ``axis`` where a row that is entirely -inf gives zeros, not nan: torch's
    ``_safe_softmax``, what attention runs (a query that may see no key attends to nothing).
    Otherwise as ``softmax``: a -inf entry weighs 0; a nan, or a +inf, makes its row nan.

    >>> import tdag, torch
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.safe_softmax(x, -1), tdag.TensorSpec((2, 2)))
    >>> tdag.run(prog, torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")]]))
    tensor([[1., 0.],
            [0., 0.]])
    """
    shifted, top = _shift(as_float(x), axis)
    weights = _normalized_exp(shifted, axis)  # before the mask: the node order of the capture
    return core.where(core.eq(top, -_INF), 0.0, weights)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``torch.log_softmax(x, dim=axis)`` = (x - max) - log(sum(exp(x - max)))."""
    shifted, _ = _shift(as_float(x), axis)
    return core.sub(shifted, core.log(core.sum(core.exp(shifted), axis, keepdim=True)))


def logsumexp(x: Tensor, axis=-1, keepdim: bool = False) -> Tensor:
    """``torch.logsumexp``: an infinite max is not subtracted (torch masks it to 0), so an
    all -inf row gives -inf and a row holding +inf gives +inf."""
    x = as_float(x)
    top = core.amax(x, axis, keepdim=True)
    top = core.where(core.eq(core.abs(top), _INF), 0.0, top)
    out = core.add(core.log(core.sum(core.exp(core.sub(x, top)), axis, keepdim=True)), top)
    return out if keepdim else core.squeeze(out, core.norm_axes(axis, x.ndim))


# -- norms ------------------------------------------------------------------------------------


def _normalize(x: Tensor, axes: tuple, eps: float) -> Tensor:
    """(x - mean) / sqrt(var + eps) over ``axes``, with the biased variance as torch uses."""
    centered = core.sub(x, arrays.mean(x, axes, keepdim=True))
    variance = arrays.mean(core.mul(centered, centered), axes, keepdim=True)
    return core.mul(centered, core.rsqrt(core.add(variance, eps)))


def _affine(y: Tensor, weight, bias) -> Tensor:
    if weight is not None:
        y = core.mul(y, weight)
    return core.add(y, bias) if bias is not None else y


def _trailing_axes(x: Tensor, normalized_shape, what: str) -> tuple:
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    n = len(shape)
    if n > x.ndim or not all(dims_equal(a, b) for a, b in zip(x.shape[x.ndim - n:], shape)):
        raise ShapeError(f"{what}: normalized_shape {shape} does not end {x.type}")
    return tuple(range(x.ndim - n, x.ndim))


def layer_norm(x: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.layer_norm`` over the trailing ``normalized_shape`` axes."""
    x = as_float(x)
    return _affine(_normalize(x, _trailing_axes(x, normalized_shape, "layer_norm"), eps),
                   weight, bias)


def rms_norm(x: Tensor, normalized_shape, weight=None, eps: float | None = None) -> Tensor:
    """``torch.nn.functional.rms_norm`` = x / sqrt(mean(x^2) + eps) * weight; eps None is
    the dtype's machine epsilon, as in torch."""
    x = as_float(x)
    axes = _trailing_axes(x, normalized_shape, "rms_norm")
    eps = torch.finfo(x.dtype.torch).eps if eps is None else eps
    scale = core.rsqrt(core.add(arrays.mean(core.mul(x, x), axes, keepdim=True), eps))
    return _affine(core.mul(x, scale), weight, None)


def group_norm(x: Tensor, num_groups: int, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.group_norm``: x (N, C, *S) normalised per (sample, group of
    C / num_groups channels), then a per-channel affine."""
    x = as_float(x)
    if x.ndim < 2:
        raise ShapeError(f"group_norm: needs (N, C, *S), got {x.type}")
    channels = x.shape[1]
    if not isinstance(channels, int) or channels % num_groups:
        raise ShapeError(f"group_norm: {channels} channels do not split into {num_groups} groups")
    grouped = core.ungroup(x, 1, (num_groups, channels // num_groups))
    y = core.group(_normalize(grouped, tuple(range(2, grouped.ndim)), eps), 1, 2)
    return _per_channel(y, weight, bias)


def _per_channel(y: Tensor, weight, bias) -> Tensor:
    return _affine(y, None if weight is None else channel_view(weight, y),
                   None if bias is None else channel_view(bias, y))


def batch_norm(x: Tensor, running_mean, running_var, weight=None, bias=None, eps: float = 1e-5,
               *, training: bool = False) -> Tensor:
    """``torch.nn.functional.batch_norm`` in inference form: (x - running_mean) /
    sqrt(running_var + eps) per channel of x (N, C, *S). With ``training=True`` (or no
    running statistics) it normalises with the batch's statistics instead; the running
    statistics are not updated (a TDAG has no side effects)."""
    x = as_float(x)
    if training or running_mean is None or running_var is None:
        axes = (0,) + tuple(range(2, x.ndim))
        return _per_channel(_normalize(x, axes, eps), weight, bias)
    mean, var = channel_view(running_mean, x), channel_view(running_var, x)
    y = core.mul(core.sub(x, mean), core.rsqrt(core.add(var, eps)))
    return _per_channel(y, weight, bias)


def local_response_norm(x: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0, before: int | None = None) -> Tensor:
    """``x / (k + alpha/size * sum of x^2 over a window of channels)^beta`` (AlexNet's LRN).

    The window around channel c starts ``before`` channels earlier: torch's ``size // 2``
    by default; ONNX's LRN takes ``(size - 1) // 2`` (they differ for an even size). As pad +
    unfold + reduce-sum over the squares, so the channels past either end count as zero.
    """
    if x.ndim < 2 or size < 1:
        raise ShapeError(f"local_response_norm: needs channels on axis 1 and a size of at "
                         f"least 1, got {x.type} and {size}")
    before = size // 2 if before is None else before
    square = core.mul(x, x)
    widths = [(0, 0)] * x.ndim
    widths[1] = (before, size - 1 - before)
    windows = core.unfold(core.pad(square, widths), 1, size)     # [N, C, ..., size]
    total = core.sum(windows, x.ndim)
    scale = core.add(core.mul(total, alpha / size), k)
    return core.div(x, core.pow(scale, beta))


def instance_norm(x: Tensor, running_mean=None, running_var=None, weight=None, bias=None,
                  use_input_stats: bool = True, momentum: float = 0.1,
                  eps: float = 1e-5) -> Tensor:
    """``torch.nn.functional.instance_norm``: each (sample, channel) of x (N, C, *S) over
    its spatial axes; with ``use_input_stats=False`` the running statistics instead."""
    x = as_float(x)
    if not use_input_stats:
        return batch_norm(x, running_mean, running_var, weight, bias, eps)
    return _per_channel(_normalize(x, tuple(range(2, x.ndim)), eps), weight, bias)


# -- embedding, attention, dropout ------------------------------------------------------------


def embedding(index: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """``torch.nn.functional.embedding``: rows of ``weight`` at ``index`` (a gather).
    ``padding_idx`` only changes gradients in torch, so the forward ignores it."""
    return core.gather(weight, index, 0)


BAG_MODES = ("sum", "mean", "max")


def embedding_bag(weight: Tensor, indices: Tensor, offsets: Tensor, mode: str = "sum",
                  per_sample_weights: Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int | None = None) -> Tensor:
    """``torch.nn.functional.embedding_bag`` of 1-D ``indices``: the sums, means or maxima
    of the rows of ``weight`` in each bag, bag b holding ``indices[offsets[b]:offsets[b +
    1]]`` (every index in range, as torch checks). Each position's bag is a running count of
    the bag starts at or before it, less one; the gathered rows are scattered into their
    bags (a ``padding_idx`` entry, or a position outside every bag, goes to one more bag,
    cut off last). An empty bag gives 0. Linear in the indices: the ``embedding_bag``
    kernel's decomposition (tdag/lower/kernels/writes.py)."""
    if mode not in BAG_MODES or per_sample_weights is not None and mode != "sum":
        raise UnsupportedOpError(f"embedding_bag: mode {mode!r} with per_sample_weights "
                                 f"{per_sample_weights is not None}; torch takes sum, mean "
                                 "or max, and per-sample weights in sum only")
    n, bags = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    indices, offsets = writes.as_index(indices), writes.as_index(offsets)
    starts = writes.bin_counts(offsets, as_dim(n + 1))  # n + 1: empty bags at the end
    bag = core.sub(scans.cumsum(core.slice(starts, 0, 0, n), 0), 1)
    last = bags if is_static(bags) else creation.dim_tensor(bags)  # the cut-off bag
    keep = core.logical_and(core.ge(bag, 0), core.lt(bag, last))  # past the last: no bag
    if padding_idx is not None and padding_idx >= 0:
        keep = core.logical_and(keep, core.ne(indices, padding_idx))
    bag = core.where(keep, bag, last)
    rows = core.gather(weight, indices, 0, wrap=False)  # [n, dim]
    if per_sample_weights is not None:
        rows = core.mul(rows, core.unsqueeze(per_sample_weights, 1))
    shape = (as_dim(bags + 1), weight.shape[1])
    start = creation.full(shape, -_INF if mode == "max" else 0.0, weight.dtype, like=weight)
    out = writes.scatter(start, bag, rows, 0, "max" if mode == "max" else "add")
    if mode != "sum":  # the extra bag is counted too: it is cut off with the rest
        count = core.unsqueeze(writes.bin_counts(bag, as_dim(bags + 1)), 1)
        out = core.where(core.gt(count, 0), out, 0.0) if mode == "max" else \
            core.div(out, core.cast(core.maximum(count, 1), weight.dtype))
    return core.slice(out, 0, 0, bags)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask=None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: float | None = None, enable_gqa: bool = False) -> Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``: softmax(q k^T * scale + bias) v
    for q (..., L, E), k (..., S, E), v (..., S, Ev). A bool mask keeps True; a float mask
    is added (-inf allowed); ``is_causal`` keeps key j <= query i and is built from iota, so
    L and S may be symbolic; ``enable_gqa`` repeats each k/v head for its query heads.
    A fully masked row gives 0, as torch's safe softmax does."""
    if dropout_p:
        raise UnsupportedOpError("scaled_dot_product_attention: dropout_p > 0 is random; "
                                 "tdag traces inference graphs")
    if enable_gqa and not dims_equal(q.shape[-3], k.shape[-3]):
        k, v = _repeat_heads(q, k), _repeat_heads(q, v)
    if scale is None:
        if not isinstance(q.shape[-1], int):
            raise ShapeError(f"scaled_dot_product_attention: a symbolic head size {q.type} "
                             "needs an explicit scale")
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = core.mul(arrays.matmul(q, core.transpose(k, -2, -1)), scale)   # (..., L, S)
    if is_causal:
        scores = core.where(_causal_keep(q.shape[-2], k.shape[-2], q), scores, -_INF)
    if attn_mask is not None:
        mask = core.as_tensor(attn_mask, q.builder)
        scores = core.where(mask, scores, -_INF) if mask.dtype is DType.bool else \
            core.add(scores, mask)
    return arrays.matmul(safe_softmax(scores), v)


def _repeat_heads(q: Tensor, kv: Tensor) -> Tensor:
    """GQA: each of the Hk key/value heads serves Hq / Hk consecutive query heads."""
    hq, hk = q.shape[-3], kv.shape[-3]
    if not (isinstance(hq, int) and isinstance(hk, int)) or hq % hk:
        raise ShapeError(f"scaled_dot_product_attention: {hq} query heads do not divide "
                         f"into {hk} key/value heads")
    return arrays.repeat_interleave(kv, hq // hk, -3)


def _causal_keep(queries, keys, like: Tensor) -> Tensor:
    """(L, S) bool: key j is visible to query i when j <= i (torch's top-left tril)."""
    rows = core.unsqueeze(creation.arange(0, queries, like=like), 1)
    cols = core.unsqueeze(creation.arange(0, keys, like=like), 0)
    return core.le(cols, rows)


def dropout(x: Tensor, p: float = 0.5, training: bool = False) -> Tensor:
    """``torch.nn.functional.dropout`` in inference: the identity. Training-mode dropout
    is random, which a traced inference graph cannot express."""
    if training and p > 0:
        raise UnsupportedOpError("dropout: training=True is random; tdag traces inference "
                                 "graphs (pass training=False)")
    return x
