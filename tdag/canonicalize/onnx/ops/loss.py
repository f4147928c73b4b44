"""The ONNX op table, losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, as the
reference implementation (onnx/reference/ops) computes them: the picked log-probabilities
weighted (``weight[target]``, 0 at ``ignore_index``), and a mean that divides by the total
weight. Entries follow onnx/ops/table.py's convention ``(ctx, *inputs) -> value(s)``.
"""
from __future__ import annotations

from tdag import ops
from tdag.ops.writes import take_along as gather_along
from tdag.errors import InvalidModelError
from tdag.canonicalize.onnx.ops.table import register
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

_REDUCTIONS = ("none", "sum", "mean")


def _nll(ctx, logp, target, weight):
    """The loss over log-probabilities ``logp`` (N, C, d1, ...) at classes ``target``."""
    if logp.ndim < 2:
        raise InvalidModelError(f"{ctx.node.op_type}: the input must have a class axis, got "
                                f"{logp.type}")
    reduction = ctx.choice("reduction", "mean", _REDUCTIONS)
    ignore = ctx.attr("ignore_index")
    target = ops.cast(ctx.tensor(target), DType.i64)
    classes = logp.shape[1]
    last = classes - 1 if is_static(classes) else ops.sub(
        ops.size_tensor(logp, (1,), DType.i64), 1)
    safe = ops.clamp(target, 0, last)  # an ignored target may lie outside the classes
    picked = ops.squeeze(gather_along(logp, 1, ops.unsqueeze(safe, 1)), 1)
    loss = ops.neg(picked)
    zero = ops.zeros((), logp.dtype, like=logp)
    w = ops.gather(ctx.tensor(weight), safe, 0) if weight is not None else None
    if ignore is not None:
        kept = ops.ne(target, int(ignore))
        loss = ops.where(kept, loss, zero)
        if w is None:
            w = ops.cast(kept, logp.dtype)
        else:
            w = ops.where(kept, w, zero)
    if w is not None:
        loss = ops.mul(loss, w)
    if reduction == "none":
        return loss
    total = ops.sum(loss, tuple(range(loss.ndim)))
    if reduction == "sum":
        return total
    if w is None:
        return ops.mean(loss, tuple(range(loss.ndim)))
    return ops.div(total, ops.sum(w, tuple(range(w.ndim))))


@register("NegativeLogLikelihoodLoss")
def _nll_loss(ctx, x, target, weight=None):
    return _nll(ctx, ctx.tensor(x), target, weight)


@register("SoftmaxCrossEntropyLoss")
def _softmax_cross_entropy(ctx, x, target, weight=None):
    logp = ops.log_softmax(ctx.tensor(x), 1)
    loss = _nll(ctx, logp, target, weight)
    return (loss, logp)[:ctx.num_outputs]
