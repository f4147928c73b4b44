"""ONNX activations: Relu, Sigmoid, Softplus, Mish, HardSwish, LeakyRelu, Elu, Selu, Celu,
Gelu, HardSigmoid, PRelu, Shrink, ThresholdedRelu, Swish, Softsign, and the softmax family:
Softmax, LogSoftmax, Hardmax. (Tanh is with the math functions in onnx/ops/elementwise.py.)
"""
from __future__ import annotations

from tdag import ops
from tdag.errors import InvalidModelError
from tdag.canonicalize.onnx.ops.elementwise import unary
from tdag.canonicalize.onnx.ops.table import OPS, norm_axis, register
from tdag.ir.symbols import product

for _name, _fn in {"Relu": ops.relu, "Sigmoid": ops.sigmoid, "Softplus": ops.softplus,
                   "Mish": ops.mish, "HardSwish": ops.hardswish}.items():
    OPS.add(_name, unary(_fn))


@register("LeakyRelu")
def _leaky_relu(ctx, x):
    return ops.leaky_relu(ctx.tensor(x), ctx.attr("alpha", 0.01))


@register("Elu")
def _elu(ctx, x):
    return ops.elu(ctx.tensor(x), ctx.attr("alpha", 1.0))


@register("Selu")
def _selu(ctx, x):
    alpha = ctx.attr("alpha", 1.67326319217681884765625)
    gamma = ctx.attr("gamma", 1.05070102214813232421875)
    return ops.elu(ctx.tensor(x), alpha, gamma)


@register("Celu")
def _celu(ctx, x):
    alpha = ctx.attr("alpha", 1.0)
    if alpha == 0:
        raise InvalidModelError("Celu: alpha must not be 0 (it divides x)")
    return ops.celu(ctx.tensor(x), alpha)


@register("Gelu")
def _gelu(ctx, x):
    return ops.gelu(ctx.tensor(x), ctx.attr("approximate", "none"))


@register("HardSigmoid")
def _hard_sigmoid(ctx, x):
    # ONNX's defaults (0.2, 0.5) are not torch's (1/6, 1/2)
    alpha, beta = ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)
    return ops.clamp(ops.add(ops.mul(ctx.tensor(x), alpha), beta), 0.0, 1.0)


@register("PRelu")
def _prelu(ctx, x, slope):
    x = ctx.tensor(x)
    return ops.where(ops.lt(x, 0.0), ops.mul(x, ctx.tensor(slope)), x)


@register("Shrink")
def _shrink(ctx, x):
    x = ctx.tensor(x)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    # not torch's hardshrink or softshrink even where bias is 0 or lambd: ONNX's makes nan 0
    zero = ops.zeros((), x.dtype, like=x)
    below = ops.cast(ops.add(x, bias), x.dtype)
    above = ops.cast(ops.sub(x, bias), x.dtype)
    return ops.where(ops.lt(x, -lambd), below, ops.where(ops.gt(x, lambd), above, zero))


@register("ThresholdedRelu")
def _thresholded_relu(ctx, x):
    x = ctx.tensor(x)
    return ops.where(ops.gt(x, ctx.attr("alpha", 1.0)), x, ops.zeros((), x.dtype, like=x))


@register("Swish")
def _swish(ctx, x):
    x = ctx.tensor(x)
    return ops.mul(x, ops.sigmoid(ops.mul(x, ctx.attr("alpha", 1.0))))


@register("Softsign")
def _softsign(ctx, x):
    x = ctx.tensor(x)
    return ops.div(x, ops.add(ops.abs(x), 1.0))


# -- softmax ---------------------------------------------------------------------------------------

def _softmax(fn):
    def convert(ctx, x):
        x = ctx.tensor(x)
        if ctx.opset >= 13:
            return fn(x, norm_axis(ctx.attr("axis", -1), x.ndim))
        # before 13: the input is viewed as 2-D at ``axis`` and normalised over the second part
        axis = norm_axis(ctx.attr("axis", 1), x.ndim)
        if axis == x.ndim - 1:
            return fn(x, axis)
        flat = ops.reshape(x, product(x.shape[:axis]), product(x.shape[axis:]))
        return ops.reshape(fn(flat, 1), *x.shape)
    return convert


register("Softmax")(_softmax(ops.softmax))


register("LogSoftmax")(_softmax(ops.log_softmax))


@register("Hardmax")
def _hardmax(ctx, x):
    x = ctx.tensor(x)
    if ctx.opset >= 13:
        axis = norm_axis(ctx.attr("axis", -1), x.ndim)
        return _one_hot_max(x, axis)
    axis = norm_axis(ctx.attr("axis", 1), x.ndim)  # viewed as 2-D at axis
    flat = ops.reshape(x, product(x.shape[:axis]), product(x.shape[axis:]))
    return ops.reshape(_one_hot_max(flat, 1), *x.shape)


def _one_hot_max(x, axis):
    first = ops.argmax(x, axis, True)
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    positions = ops.reshape(ops.iota(x.shape[axis], "i64", x.builder), tuple(shape))
    return ops.cast(ops.eq(positions, first), x.dtype)
