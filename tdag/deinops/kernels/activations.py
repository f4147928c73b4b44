"""Softmax and activation kernels: one fused elementwise pass each."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tdag.deinops.kernels.common import float_input, per_element
from tdag.deinops.primitive import NoSpec, primitive
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.record import Trait

# -- softmax ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Softmax:
    axis: int


def _softmax_shape(spec: Softmax, ins):
    (x,) = ins
    float_input("softmax", x)
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"softmax: axis {spec.axis} out of range for {x}")
    return x


# max, subtract, exp, sum, divide: five per element, as the decomposition
primitive(Op.softmax, Softmax, 1, _softmax_shape,
          lambda s, xs, r: torch.softmax(xs[0], s.axis), per_element(5),
          "exp/reduce/reciprocal chain makes five passes over memory; softmax makes one",
          traits=Trait.KERNEL)
primitive(Op.log_softmax, Softmax, 1, _softmax_shape,
          lambda s, xs, r: torch.log_softmax(xs[0], s.axis), per_element(5),
          "x - max - log(sum(exp)) makes five passes over memory; log_softmax makes one",
          traits=Trait.KERNEL)



# -- activations ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Gelu:
    approximate: str = "none"  # or "tanh"


def _float_unary(op: str):
    def rule(spec, ins):
        float_input(op, ins[0])
        if op == "gelu" and spec.approximate not in ("none", "tanh"):
            raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', not {spec.approximate!r}")
        return ins[0]
    return rule


primitive(Op.gelu, Gelu, 1, _float_unary("gelu"),
          lambda s, xs, r: F.gelu(xs[0], approximate=s.approximate), per_element(5),
          "x * (1 + erf(x/sqrt 2)) / 2 is five elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE)
primitive(Op.silu, NoSpec, 1, _float_unary("silu"), lambda s, xs, r: F.silu(xs[0]),
          per_element(5), "x / (1 + exp(-x)) is five elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE)
primitive(Op.sigmoid, NoSpec, 1, _float_unary("sigmoid"), lambda s, xs, r: torch.sigmoid(xs[0]),
          per_element(4), "1 / (1 + exp(-x)) is four elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE)
primitive(Op.relu, NoSpec, 1, lambda s, ins: ins[0], lambda s, xs, r: torch.relu(xs[0]),
          per_element(1), "(x + |x|) / 2 or where(x > 0, x, 0) is several passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE)



@dataclass(frozen=True, slots=True)
class Clamp:
    """``min(max(x, lo), hi)`` propagating nan (torch.clamp); None leaves a side open."""

    lo: float | None = None
    hi: float | None = None


def _clamp_eval(spec: Clamp, xs, resolve):
    return torch.clamp(xs[0], spec.lo, spec.hi)


primitive(Op.clamp, Clamp, 1, lambda s, ins: ins[0], _clamp_eval, per_element(2),
          "max/min with nan checks are two compares and two selects per bound",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE)
primitive(Op.hardswish, NoSpec, 1, _float_unary("hardswish"),
          lambda s, xs, r: F.hardswish(xs[0]), per_element(4),
          "x * clamp(x + 3, 0, 6) / 6 is four elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE)
