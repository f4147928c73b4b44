"""tdag as an einops backend: ``einops.rearrange``, ``reduce``, ``repeat``, ``einsum`` (and
``pack``/``unpack``) called on tdag tensors inside ``tdag.trace`` record tdag ops.

einops looks for a backend among the subclasses of ``einops._backends.AbstractBackend``
whose ``framework_name`` names an imported module, so defining ``TdagBackend`` registers it:
``tdag.trace`` imports this module when einops is installed (tdag itself does not need
einops). einops' recipe arrives as reshape / transpose / reduce / add axes, each one tdag op
or a few (symbolic sizes stay symbolic).

>>> import einops, tdag
>>> prog = tdag.trace(lambda x: einops.rearrange(x, "b c h w -> b h w c"),
...                   tdag.TensorSpec(("b", 3, 4, 5)))
>>> [(n.op.value, str(n.type)) for n in prog.graph.nodes]
[('permute', 'f32[b,4,5,3]')]
"""
from __future__ import annotations

from einops._backends import AbstractBackend  # private, and the only way einops offers

from tdag.ops import arrays
from tdag.ops import core
from tdag.ops.tensor import Tensor
from tdag.ops.contraction import einsum
from tdag.ops.einops import REDUCERS
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType

# einops' reduction names -> tdag's: the patterns' own, and any / all as max / min of a bool
_REDUCTIONS = {**REDUCERS, "any": core.amax, "all": core.amin}


class TdagBackend(AbstractBackend):
    framework_name = "tdag"

    def is_appropriate_type(self, tensor) -> bool:
        return isinstance(tensor, Tensor)

    def shape(self, x: Tensor) -> tuple:
        return x.shape  # ints and sympy expressions: einops divides and multiplies them

    def reshape(self, x: Tensor, shape) -> Tensor:
        return core.reshape(x, tuple(shape))

    def transpose(self, x: Tensor, axes) -> Tensor:
        return core.permute(x, *axes)

    def reduce(self, x: Tensor, operation: str, axes) -> Tensor:
        if operation not in _REDUCTIONS:
            raise UnsupportedOpError(f"einops reduction {operation!r} on {x.type}: tdag has "
                                     f"{', '.join(_REDUCTIONS)}", origin=x.builder.origin)
        if operation in ("any", "all") and x.dtype is not DType.bool:
            x = core.ne(x, 0)
        return _REDUCTIONS[operation](x, tuple(axes))

    def add_axis(self, x: Tensor, new_position: int) -> Tensor:
        return core.unsqueeze(x, new_position)

    def add_axes(self, x: Tensor, n_axes: int, pos2len: dict) -> Tensor:
        """New axes of size 1, broadcast to their lengths (one repeat, no copy of x)."""
        x = core.unsqueeze(x, tuple(sorted(pos2len)))
        shape = list(x.shape)
        for position, length in pos2len.items():
            shape[position] = length
        return core.broadcast_to(x, shape)

    def tile(self, x: Tensor, repeats) -> Tensor:
        return arrays.tile(x, tuple(repeats))

    def stack_on_zeroth_dimension(self, tensors: list) -> Tensor:
        return arrays.stack(tensors, 0)

    def concat(self, tensors: list, axis: int) -> Tensor:
        return arrays.concat(tensors, axis)

    def is_float_type(self, x: Tensor) -> bool:
        return x.dtype.is_float

    def einsum(self, pattern: str, *tensors: Tensor) -> Tensor:
        return einsum(pattern, *tensors)


__all__ = ["TdagBackend"]
