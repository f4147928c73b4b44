"""Optimizer updates as compositions: what ``tdag.optim`` writes per parameter, held in one
function so the kernel that stands for it (``tdag/lower/kernels/optim.py``) decomposes to
exactly the nodes a training step holds, as ``softmax`` holds softmax's."""
from __future__ import annotations

from tdag.ops.arrays import stack
from tdag.ops.core import pow, sqrt
from tdag.ops.creation import full
from tdag.ops.tensor import Tensor


def adamw_update(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor,
                 step: Tensor, lr: float, beta1: float, beta2: float, eps: float,
                 weight_decay: float) -> Tensor:
    """torch.optim.AdamW's single-tensor update, operation for operation (the same roundings
    in float32); ``step`` counts the steps before this one. The new parameter, first and
    second moments stacked on a new leading axis: one value, so one kernel computes all
    three in one pass and the three outputs are views of it."""
    count = step + 1.0
    param = param * (1.0 - lr * weight_decay)
    exp_avg = exp_avg + (grad - exp_avg) * (1.0 - beta1)  # lerp
    exp_avg_sq = exp_avg_sq * beta2 + grad * grad * (1.0 - beta2)
    correction1 = 1.0 - pow(full((), beta1, step.dtype, like=step), count)
    correction2 = 1.0 - pow(full((), beta2, step.dtype, like=step), count)
    # -(lr / c1) is exactly (-lr) / c1: the sign goes on the scalar, not on every element
    negative_step = -lr / correction1
    denom = sqrt(exp_avg_sq) / sqrt(correction2) + eps
    param = param + exp_avg / denom * negative_step
    return stack([param, exp_avg, exp_avg_sq], 0)
