"""Type promotion and broadcasting as torch does them, and the axis conventions.

Which dtype the operands of an elementwise op meet at (``result_dtype``, torch's
``result_type``), which shape they broadcast to (``broadcast_shapes``), negative axes
(``norm_axis``), and the builder a mix of traced tensors and Python scalars belongs to.
Nothing here emits a node: ``core`` casts and broadcasts with what this module decides.
"""
from __future__ import annotations

import torch

from tdag.errors import ShapeError
from tdag.ir.symbols import Dim, dims_equal, is_static
from tdag.ir.types import DType
from tdag.ops.builder import Builder, active_builder
from tdag.ops.tensor import Tensor


def norm_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"axis {axis} out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def norm_axes(axes, ndim: int) -> tuple:
    if axes is None:
        return tuple(range(ndim))
    if isinstance(axes, int):
        axes = (axes,)
    return tuple(sorted({norm_axis(a, ndim) for a in axes}))


def builder_of(*values) -> Builder:
    """The builder of the first traced tensor among ``values``, else the active one."""
    for v in values:
        if isinstance(v, Tensor):
            return v.builder
    return active_builder()


def _probe(value):
    """A stand-in for ``torch.result_type``: an empty tensor of the same dtype and category
    (rank-0 tensors rank below dimensioned ones, Python scalars below both, as in torch)."""
    if isinstance(value, Tensor):
        return torch.empty((0,) if value.ndim else (), dtype=value.dtype.torch)
    return value


def result_dtype(*values) -> DType:
    """torch's type promotion among tensors (traced or torch) and Python scalars."""
    acc = _probe(values[0])
    for value in values[1:]:
        other = _probe(value)
        if not isinstance(acc, torch.Tensor) and not isinstance(other, torch.Tensor):
            acc = torch.tensor(acc)  # two Python scalars: as torch.tensor(a) op b
        dtype = torch.result_type(acc, other)
        dimensioned = any(isinstance(v, torch.Tensor) and v.dim() for v in (acc, other))
        acc = torch.empty((0,) if dimensioned else (), dtype=dtype)
    if not isinstance(acc, torch.Tensor):
        acc = torch.tensor(acc)
    return DType.of(acc.dtype)


def broadcasts_to(shapes, target) -> bool:
    """Whether numpy broadcasting of ``shapes`` gives exactly ``target``."""
    rank = len(target)
    for axis in range(rank):
        covered = False
        for shape in shapes:
            j = axis - (rank - len(shape))
            if j < 0:
                continue
            d = shape[j]
            if dims_equal(d, target[axis]):
                covered = True
            elif not (is_static(d) and d == 1):
                return False
        if not covered and not (is_static(target[axis]) and target[axis] == 1):
            return False
    return True


def broadcast_shapes(*shapes) -> tuple:
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = [s[i - rank + len(s)] for s in shapes if i - rank + len(s) >= 0]
        dim: Dim = 1
        for d in dims:
            if is_static(d) and d == 1:
                continue
            if is_static(dim) and dim == 1:
                dim = d
            elif not dims_equal(dim, d):
                raise ShapeError(f"shapes {' and '.join(str(list(s)) for s in shapes)} "
                                 "do not broadcast")
        out.append(dim)
    return tuple(out)


def describe_operands(values) -> str:
    """Operands as an error message names them: ``%x: f32[2,3], 2.5``."""
    return ", ".join(f"%{v.name}: {v.type}" if isinstance(v, Tensor) else repr(v)
                     for v in values)
