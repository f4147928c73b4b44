"""The ONNX op table, onnxruntime's own operator domain ``com.microsoft`` (its "contrib ops"),
which files optimised by ``onnxruntime.transformers.optimizer`` or saved by a session with
graph optimisation use: SkipLayerNormalization and SkipSimplifiedLayerNormalization (residual
add then LayerNorm / RMS norm), BiasGelu, FastGelu (tanh approximation), Gelu (erf form: the
default domain's entry serves it), QuickGelu (x sigmoid(alpha x)), FusedMatMul (MatMul with
transposes and a scale), BiasAdd and FusedConv (Conv, an optional sum, then an activation).
Each is a composition of tdag ops, written after onnxruntime's CPU kernels and checked
against them. ``CONTRIB_OPS`` names every com.microsoft op tdag maps: the importer admits that
domain for these alone (any other com.microsoft op is refused by name); the attention ops
are in contrib_attention.py and contrib_gqa.py, the quantized ones in contrib_quant.py.

SimplifiedLayerNormalization (RMS norm) is here too, but onnxruntime registers it in the
default domain (a com.microsoft one is not an op it runs), so it is not in ``CONTRIB_OPS``:
the loader's ``ORT_DEFAULT_OPS`` (canonicalize/onnx/load.py) names it, for onnx's checker,
which does not know it, to pass.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.contrib_attention import ATTENTION_OPS
from tdag.canonicalize.onnx.ops.contrib_quant import QUANT_OPS
from tdag.canonicalize.onnx.ops.table import OPS, norm_axis, register
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.types import DType

FUSED_OPS = ("SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "BiasGelu",
             "FastGelu", "Gelu", "QuickGelu", "FusedMatMul", "BiasAdd", "FusedConv")
CONTRIB_OPS = FUSED_OPS + ATTENTION_OPS + QUANT_OPS

_SKIP_EPSILON = 1e-12  # onnxruntime's default for the Skip*LayerNormalization ops


# -- normalisations --------------------------------------------------------------------------------

def _f32(x):
    return ops.cast(x, DType.f32) if x.dtype is not DType.f32 else x


def _normalised(ctx, x, axes, scale, bias, simplified: bool, epsilon: float):
    """(y, mean, inv_std_var) of a LayerNorm (RMS norm where ``simplified``) over ``axes``,
    the statistics in float32 and kept as size-1 axes, as onnxruntime's kernels return them;
    the statistics only where the node asks for them (the mean of an RMS norm is None)."""
    xs, shape = _f32(x), [x.shape[a] for a in axes]
    if simplified:
        y = ops.rms_norm(xs, shape, None, epsilon)
    else:
        y = ops.layer_norm(xs, shape, None, None, epsilon)
    y = ops.mul(ops.cast(y, x.dtype), ctx.tensor(scale))
    if bias is not None:
        y = ops.add(y, ctx.tensor(bias))
    if ctx.num_outputs < 2:
        return y, None, None
    mean = None if simplified else ops.mean(xs, axes, True)
    centred = xs if simplified else ops.sub(xs, mean)
    variance = ops.mean(ops.mul(centred, centred), axes, True)
    inv_std = ops.rsqrt(ops.add(variance, epsilon))
    return y, None if mean is None else ops.cast(mean, x.dtype), ops.cast(inv_std, x.dtype)


def _skip_norm(simplified: bool):
    def convert(ctx, x, skip, gamma, *rest):
        """input + skip (+ bias), normalised over the last axis; outputs output, mean,
        inv_std_var and input_skip_bias_sum (the sum, as the next residual reads it)."""
        rest = ((None,) if simplified else ()) + tuple(rest) + (None, None)
        beta, bias = rest[:2]  # the simplified form has no beta: its 4th input is the bias
        total = ops.add(ctx.tensor(x), ctx.tensor(skip))
        if bias is not None:
            total = ops.add(total, ctx.tensor(bias))
        epsilon = ctx.attr("epsilon", _SKIP_EPSILON)
        y, mean, inv_std = _normalised(ctx, total, (total.ndim - 1,), gamma, beta, simplified,
                                       epsilon)
        return (y, mean, inv_std, total)[:max(ctx.num_outputs, 1)]
    return convert


register("SkipLayerNormalization")(_skip_norm(simplified=False))
register("SkipSimplifiedLayerNormalization")(_skip_norm(simplified=True))


@register("SimplifiedLayerNormalization")
def _simplified_layer_norm(ctx, x, scale):
    """RMS norm over the axes from ``axis`` on; outputs Y and inv_std_var."""
    x = ctx.tensor(x)
    stash = ctx.attr("stash_type", 1)
    if stash != 1:
        raise UnsupportedOpError(f"SimplifiedLayerNormalization: stash_type={stash} "
                                 f"(only float32)")
    axes = tuple(range(norm_axis(ctx.attr("axis", -1), x.ndim), x.ndim))
    y, _, inv_std = _normalised(ctx, x, axes, scale, None, True, ctx.attr("epsilon", 1e-5))
    return (y, inv_std)[:max(ctx.num_outputs, 1)]


# -- activations -----------------------------------------------------------------------------------

@register("BiasGelu")
def _bias_gelu(ctx, x, bias):
    return ops.gelu(ops.add(ctx.tensor(x), ctx.tensor(bias)))


@register("FastGelu")
def _fast_gelu(ctx, x, bias=None):
    x = ctx.tensor(x)
    return ops.gelu(x if bias is None else ops.add(x, ctx.tensor(bias)), "tanh")


@register("QuickGelu")
def _quick_gelu(ctx, x):
    x = ctx.tensor(x)
    return ops.mul(x, ops.sigmoid(ops.mul(x, ctx.attr("alpha", 1.702))))


@register("BiasAdd")
def _bias_add(ctx, x, bias, skip):
    return ops.add(ops.add(ctx.tensor(x), ctx.tensor(bias)), ctx.tensor(skip))


# -- products --------------------------------------------------------------------------------------

def _fused_operand(ctx, x, trans: str, trans_batch: str):
    """An operand as MatMul reads it: transBatch* stores the row axis first (it moves to the
    second last place, before the batch axes' end), trans* swaps the last two."""
    x = ctx.tensor(x)
    if x.ndim >= 3 and ctx.flag(trans_batch, 0):
        x = ops.permute(x, *range(1, x.ndim - 1), 0, x.ndim - 1)
    if x.ndim >= 2 and ctx.flag(trans, 0):
        x = ops.permute(x, *range(x.ndim - 2), x.ndim - 1, x.ndim - 2)
    return x


@register("FusedMatMul")
def _fused_matmul(ctx, a, b):
    """alpha * (A' @ B'), each operand transposed as its trans* and transBatch* say."""
    a = _fused_operand(ctx, a, "transA", "transBatchA")
    b = _fused_operand(ctx, b, "transB", "transBatchB")
    y = ops.matmul(a, b)
    alpha = ctx.attr("alpha", 1.0)
    return y if alpha == 1.0 else ops.mul(y, alpha)


# FusedConv's activation and the count of its activation_params (MLAS's fused activations)
_ACTIVATIONS = {
    "Identity": (0, lambda y, p: y),
    "Relu": (0, lambda y, p: ops.relu(y)),
    "Tanh": (0, lambda y, p: ops.tanh(y)),
    "Sigmoid": (0, lambda y, p: ops.sigmoid(y)),
    "LeakyRelu": (1, lambda y, p: ops.leaky_relu(y, p[0])),
    "Clip": (2, lambda y, p: ops.clamp(y, p[0], p[1])),
    "HardSigmoid": (2, lambda y, p: ops.clamp(ops.add(ops.mul(y, p[0]), p[1]), 0.0, 1.0)),
}


@register("FusedConv")
def _fused_conv(ctx, x, w, b=None, z=None):
    """activation(Conv(X, W, B) + Z), Conv read with the default domain's attributes."""
    activation = ctx.attr("activation", "Identity")
    if activation not in _ACTIVATIONS:
        raise UnsupportedOpError(f"FusedConv: activation {activation!r} (tdag maps "
                                 f"{', '.join(_ACTIVATIONS)})")
    count, apply = _ACTIVATIONS[activation]
    params = [float(p) for p in ctx.attr("activation_params") or []]
    if len(params) < count:
        raise InvalidModelError(f"FusedConv: activation {activation} takes {count} "
                                f"activation_params, got {params}")
    y = OPS["Conv"](ctx, x, w, b)
    if z is not None:
        y = ops.add(y, ctx.tensor(z))
    return apply(y, params)
