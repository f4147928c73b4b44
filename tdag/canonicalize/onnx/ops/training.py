"""The ONNX op table, optimizer steps of the ai.onnx.preview.training domain: Adagrad, Adam
and Momentum (standard and Nesterov), each updating one or more (X, G, state...) groups with
the ONNX reference's formulas, elementwise (the learning rate R and update count T scalars
are read at run time, T > 0 choosing Adam's bias correction and Momentum's first step).

Inputs are R, T, then the n tensors of each kind in turn (X_1..X_n, G_1..G_n, ...); outputs
are the new tensors of each kind in turn.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.onnx.ops.table import register
from tdag.errors import InvalidModelError

TRAINING_OPS = ("Adagrad", "Adam", "Momentum")


def _groups(ctx, inputs, kinds: int) -> tuple:
    """(R, T, [[X_i, G_i, ...] for each i]) with R and T as 0-d tensors."""
    if len(inputs) < 2 or (len(inputs) - 2) % kinds:
        raise InvalidModelError(f"{ctx.node.op_type}: {len(inputs)} inputs is not R, T and "
                                f"{kinds} tensors per group")
    r, t = (ops.reshape(ctx.tensor(v), ()) for v in inputs[:2])
    n = (len(inputs) - 2) // kinds
    tensors = [ctx.tensor(v) for v in inputs[2:]]
    return r, t, [[tensors[k * n + i] for k in range(kinds)] for i in range(n)]


def _outputs(per_group: list) -> tuple:
    """The new tensors of each kind in turn, from one list per group."""
    return tuple(out for kind in zip(*per_group) for out in kind)


@register("Adagrad")
def _adagrad(ctx, *inputs):
    r, t, groups = _groups(ctx, inputs, 3)
    decay, eps = float(ctx.attr("decay_factor", 0.0)), float(ctx.attr("epsilon", 0.0))
    norm = float(ctx.attr("norm_coefficient", 0.0))
    rate = ops.div(r, ops.add(ops.mul(ops.cast(t, r.dtype), decay), 1.0))
    updated = []
    for x, g, h in groups:
        g = ops.add(ops.mul(x, norm), g)
        h = ops.add(h, ops.mul(g, g))
        step = ops.div(ops.mul(ops.cast(rate, x.dtype), g), ops.add(ops.sqrt(h), eps))
        updated.append((ops.sub(x, step), h))
    return _outputs(updated)


@register("Adam")
def _adam(ctx, *inputs):
    r, t, groups = _groups(ctx, inputs, 4)
    alpha, beta = float(ctx.attr("alpha", 0.9)), float(ctx.attr("beta", 0.999))
    eps, norm = float(ctx.attr("epsilon", 0.0)), float(ctx.attr("norm_coefficient", 0.0))
    post = float(ctx.attr("norm_coefficient_post", 0.0))
    steps = ops.cast(t, r.dtype)
    corrected = ops.div(ops.mul(r, ops.sqrt(ops.sub(1.0, ops.pow(beta, steps)))),
                        ops.sub(1.0, ops.pow(alpha, steps)))
    rate = ops.where(ops.gt(t, 0), corrected, r)  # no bias correction before the first step
    updated = []
    for x, g, v, h in groups:
        g = ops.add(ops.mul(x, norm), g)
        v = ops.add(ops.mul(v, alpha), ops.mul(g, 1.0 - alpha))
        h = ops.add(ops.mul(h, beta), ops.mul(ops.mul(g, g), 1.0 - beta))
        step = ops.mul(ops.cast(rate, x.dtype), ops.div(v, ops.add(ops.sqrt(h), eps)))
        updated.append((ops.mul(ops.sub(x, step), 1.0 - post), v, h))
    return _outputs(updated)


@register("Momentum")
def _momentum(ctx, *inputs):
    r, t, groups = _groups(ctx, inputs, 3)
    alpha, beta = float(ctx.attr("alpha")), float(ctx.attr("beta"))
    norm = float(ctx.attr("norm_coefficient"))
    nesterov = ctx.choice("mode", "standard", ("standard", "nesterov")) == "nesterov"
    gain = ops.where(ops.gt(t, 0), beta, 1.0)  # the gradient's full weight on the first step
    updated = []
    for x, g, v in groups:
        g = ops.add(ops.mul(x, norm), g)
        v = ops.add(ops.mul(v, alpha), ops.mul(ops.cast(gain, g.dtype), g))
        direction = ops.add(g, ops.mul(v, alpha)) if nesterov else v
        updated.append((ops.sub(x, ops.mul(ops.cast(r, x.dtype), direction)), v))
    return _outputs(updated)

