"""Neural-network ATen ops, mapped to the derived NN ops of ``tdag.ops``."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

# -- convolution and pooling ---------------------------------------------------------------------

@aten("convolution", "_convolution")
def convolution(x, weight, bias, stride, padding, dilation, transposed, output_padding, groups,
                *flags):
    if transposed:
        return ops.conv_transpose(x, weight, bias, tuple(stride), tuple(padding),
                                  tuple(output_padding), groups, tuple(dilation))
    return ops.conv(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups)


@aten("conv1d", "conv2d", "conv3d")
def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    return ops.conv(x, weight, bias, stride, padding, dilation, groups)


@aten("conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input")
def conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                   dilation=1):
    return ops.conv_transpose(x, weight, bias, stride, padding, output_padding, groups,
                              dilation)


@aten("max_pool1d", "max_pool2d", "max_pool3d")
def max_pool(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return ops.max_pool(x, kernel_size, stride or None, padding, dilation, ceil_mode)


@aten("avg_pool1d", "avg_pool2d", "avg_pool3d")
def avg_pool(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    return ops.avg_pool(x, kernel_size, stride or None, padding, ceil_mode,
                           count_include_pad, divisor_override)


@aten("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
      "_adaptive_avg_pool2d", "_adaptive_avg_pool3d")
def adaptive_avg_pool(x, output_size):
    return ops.adaptive_avg_pool(x, tuple(output_size))


# -- softmax and norms ---------------------------------------------------------------------------

@aten("_softmax", "softmax.int")
def softmax(x, dim, half_to_float_or_dtype=None):
    return ops.softmax(_float(x), dim)


@aten("_log_softmax", "log_softmax.int")
def log_softmax(x, dim, half_to_float_or_dtype=None):
    return ops.log_softmax(_float(x), dim)


@aten("_safe_softmax")
def safe_softmax(x, dim, dtype=None):
    """softmax, with rows that are all -inf giving 0 instead of nan (masked attention)."""
    return ops.safe_softmax(_float(x), dim)


def _float(x):
    return x if x.dtype.is_float else ops.cast(x, DType.f32)


@aten("layer_norm")
def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return ops.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def _stats(x, axes, eps):
    """mean and 1/std (biased) over ``axes``, kept as size-1 axes: what the native norms save
    for the backward pass; unused, they are pruned with the rest of the dead code."""
    x = _float(x)
    return ops.mean(x, axes, keepdim=True), ops.rsqrt(ops.add(ops.var(x, axes, True, 0), eps))


@aten("native_layer_norm")
def native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    return (layer_norm(x, normalized_shape, weight, bias, eps), *_stats(x, axes, eps))


@aten("group_norm")
def group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return ops.group_norm(x, num_groups, weight, bias, eps)


@aten("native_group_norm")
def native_group_norm(x, weight, bias, n, c, hxw, group, eps):
    grouped = ops.reshape(x, (n, group, -1))
    mean, rstd = _stats(grouped, (2,), eps)
    return ops.group_norm(x, group, weight, bias, eps), ops.squeeze(mean, 2), \
        ops.squeeze(rstd, 2)


@aten("_native_batch_norm_legit_no_training")
def batch_norm_inference(x, weight, bias, running_mean, running_var, momentum, eps):
    empty = ops.full((0,), 0.0, x.dtype, like=x)  # ATen returns empty saved statistics
    return ops.batch_norm(x, running_mean, running_var, weight, bias, eps), empty, empty


@aten("batch_norm")
def batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps,
               cudnn_enabled=True):
    if running_mean is None and running_var is None:
        # the batch's statistics with none to update: a pure normalisation over every axis
        # but the channels (BiT's weight standardisation calls it on an eval-mode model)
        return ops.batch_norm(x, None, None, weight, bias, eps, training=True)
    if training:
        raise UnsupportedOpError("batch norm updating its running statistics (training "
                                 "mode): call module.eval()")
    return ops.batch_norm(x, running_mean, running_var, weight, bias, eps)


@aten("rms_norm")
def rms_norm(x, normalized_shape, weight=None, eps=None):
    return ops.rms_norm(x, tuple(normalized_shape), weight, eps)


# -- activations ---------------------------------------------------------------------------------

def _activation(name: str, *ops_names):
    aten(*ops_names)(lambda x, *args: getattr(ops, name)(x, *args))


_activation("relu", "relu")
_activation("sigmoid", "sigmoid")
_activation("silu", "silu")
_activation("mish", "mish")
_activation("hardsigmoid", "hardsigmoid")
_activation("hardswish", "hardswish")


@aten("gelu")
def gelu(x, approximate="none"):
    return ops.gelu(x, approximate)


@aten("leaky_relu")
def leaky_relu(x, negative_slope=0.01):
    return ops.leaky_relu(x, negative_slope)


@aten("hardtanh")
def hardtanh(x, min_val=-1.0, max_val=1.0):
    return ops.hardtanh(x, min_val, max_val)


@aten("relu6")
def relu6(x):
    return ops.hardtanh(x, 0.0, 6.0)


@aten("softplus")
def softplus(x, beta=1, threshold=20):
    return ops.softplus(x, beta, threshold)


@aten("elu")
def elu(x, alpha=1, scale=1, input_scale=1):
    return ops.elu(x, alpha, scale, input_scale)


aten("selu")(ops.selu)
aten("celu")(ops.celu)
aten("hardshrink")(ops.hardshrink)
aten("softshrink")(ops.softshrink)


# -- attention, resampling, padding --------------------------------------------------------------

@aten("scaled_dot_product_attention")
def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False):
    return ops.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale,
                                            enable_gqa)


def _interpolate(mode: str, names, align=False):
    def entry(x, output_size, *args):
        align_corners = args[0] if align and args else False
        scales = args[-1] if args else None
        if output_size:
            return ops.interpolate(x, size=tuple(output_size), mode=mode,
                                   align_corners=align_corners)
        return ops.interpolate(x, scale_factor=tuple(scales), mode=mode,
                               align_corners=align_corners)
    aten(*names)(entry)


_interpolate("nearest", ("upsample_nearest1d.vec", "upsample_nearest2d.vec",
                         "upsample_nearest3d.vec"))
_interpolate("linear", ("upsample_linear1d.vec",), align=True)
_interpolate("bilinear", ("upsample_bilinear2d.vec",), align=True)
_interpolate("bicubic", ("upsample_bicubic2d.vec",), align=True)
_interpolate("trilinear", ("upsample_trilinear3d.vec",), align=True)


@aten("pad")
def pad(x, pad, mode="constant", value=None):
    if mode != "constant":
        return _padded(x, tuple(pad), mode)
    return ops.torch_pad(x, tuple(pad), mode, 0.0 if value is None else value)


def _mode_pad(mode: str, names):
    aten(*names)(lambda x, padding: _padded(x, tuple(padding), mode))


def _padded(x, pad, mode):
    """Negative widths crop, in every mode: crop first, then pad by the positive widths."""
    if all(not isinstance(p, int) or p >= 0 for p in pad):
        return ops.torch_pad(x, pad, mode)
    if mode == "replicate":
        return _replicate_cropped(x, pad)
    crop = [min(p, 0) if isinstance(p, int) else 0 for p in pad]
    x = ops.torch_pad(x, tuple(crop), "constant")
    return ops.torch_pad(x, tuple(p - c for p, c in zip(pad, crop)), mode)


def _replicate_cropped(x, pad):
    """Replicate with a crop: output i reads input clamp(i - before, 0, n - 1), so a crop to
    nothing still repeats the edge ATen clamps to (crop-then-pad would have no edge)."""
    for i in range(len(pad) // 2):
        axis, (lo, hi) = x.ndim - 1 - i, pad[2 * i:2 * i + 2]
        n = x.shape[axis]
        if not is_static(n):
            raise UnsupportedOpError("replicate padding with a crop on a symbolic axis")
        if lo or hi:
            x = ops.gather(x, [min(max(j - lo, 0), n - 1) for j in range(n + lo + hi)], axis,
                           wrap=False)
    return x


_mode_pad("reflect", ("reflection_pad1d", "reflection_pad2d", "reflection_pad3d"))
_mode_pad("replicate", ("replication_pad1d", "replication_pad2d", "replication_pad3d"))
_mode_pad("circular", ("_pad_circular",))
