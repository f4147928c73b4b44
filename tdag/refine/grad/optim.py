"""Optimizers as graph code: each gives the state it keeps per parameter and the update of
one parameter, written with ``tdag.ops`` so a training step is one Program in every
framework (``tdag.optim.SGD``, ``tdag.optim.AdamW``).

The updates follow torch.optim's single-tensor formulas operation for operation (the same
roundings in float32), so a reified step tracks torch's own loop to float precision.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag import ops
from tdag.ops.tensor import Tensor


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD: ``lr``, ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``."""

    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    name = "sgd"

    def slots(self) -> tuple[str, ...]:
        """The per-parameter state: the momentum buffer, where there is momentum."""
        return ("momentum_buffer",) if self.momentum else ()

    def update(self, param: Tensor, grad: Tensor, slots: dict, step: Tensor):
        """(new parameter, new slots); ``step`` counts the steps before this one."""
        d = grad + param * self.weight_decay if self.weight_decay else grad
        if not self.momentum:
            return param - d * self.lr, {}
        old = slots["momentum_buffer"]
        # torch starts the buffer at the first gradient, undamped
        buf = ops.where(step == 0.0, d, old * self.momentum + d * (1.0 - self.dampening))
        if self.nesterov:
            d = d + buf * self.momentum
        else:
            d = buf
        return param - d * self.lr, {"momentum_buffer": buf}


@dataclass(frozen=True)
class AdamW:
    """torch.optim.AdamW: ``lr``, ``betas``, ``eps``, ``weight_decay`` (decoupled)."""

    lr: float = 1e-3
    betas: tuple = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 1e-2
    name = "adamw"

    def slots(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def update(self, param: Tensor, grad: Tensor, slots: dict, step: Tensor):
        beta1, beta2 = self.betas
        stacked = ops.adamw_update(param, grad, slots["exp_avg"], slots["exp_avg_sq"], step,
                                   self.lr, beta1, beta2, self.eps, self.weight_decay)
        param, exp_avg, exp_avg_sq = (ops.select(stacked, 0, i) for i in range(3))
        return param, {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}


Optimizer = SGD | AdamW

__all__ = ["AdamW", "Optimizer", "SGD"]
