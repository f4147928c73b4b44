"""ONNX ops that hand their input on: Identity, Dropout (inference, or training at a rate of
0), OptionalHasElement and OptionalGetElement (tdag values are never an empty optional).
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType


@register("Identity")
def _identity(ctx, x):
    return x


@register("Dropout")
def _dropout(ctx, x, ratio=None, training_mode=None):
    """Inference is the identity, every element kept (the mask output all true); so is
    training with a constant ratio of 0. Any other training drops at random, which tdag
    does not model."""
    rate = 0.5 if ratio is None else _constant_or_none(ctx, ratio)
    training = False if training_mode is None else _constant_or_none(ctx, training_mode)
    if training is None:
        raise UnsupportedOpError("Dropout: training_mode given at run time (a random mask "
                                 "where it is true)")
    if training and rate != 0:
        raise UnsupportedOpError("Dropout: training mode is not supported")
    if ctx.num_outputs < 2 or not ctx.node.output[1]:
        return x
    x = ctx.tensor(x)
    return x, ops.full(tuple(x.shape), True, DType.bool, like=x)


def _constant_or_none(ctx, value):
    """A scalar input's value where it is a constant, else None."""
    try:
        return ctx.scalar(value)
    except UnsupportedOpError:
        return None


@register("OptionalHasElement")
def _optional_has_element(ctx, x=None):
    """tdag values are tensors, never an empty optional: present exactly where the input is
    given."""
    return ops.full((), x is not None, DType.bool)


@register("OptionalGetElement")
def _optional_get_element(ctx, x):
    return ctx.tensor(x)
