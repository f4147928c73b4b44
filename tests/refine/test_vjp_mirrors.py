"""The mirror pairs, as hypothesis properties over random shapes and specs: the gradient rule
of each linear primitive is its mirror (gather -> scatter-add, unfold <-> fold, pad <->
slice, repeat <-> sum, permute -> the inverse permutation, group <-> ungroup, squeeze <->
unsqueeze, an add scan -> the reverse scan), and it is the op's adjoint in float64:

    <f(x), y> == <x, f^T(y)>  for random x and y,

where f^T(y) is ``tdag.grad`` of ``sum(f(x) * y)`` with respect to x. The gather's rule is
checked against torch's ``index_add`` as well (the scatter-add written out).
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdag
from tdag import ops
from tdag.deinops.extent import Pad, Repeat, Slice
from tdag.deinops.indexing import Gather
from tdag.deinops.movement import Group, Permute, Squeeze, Ungroup, Unsqueeze
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.scan import Scan
from tdag.deinops.windows import Fold, Unfold
from tdag.ir.op import Op
from tdag.ir.record import record
from tdag.ir.types import DType, TensorType
from tdag.ops.builder import Builder

MIRRORS = settings(max_examples=8, deadline=None)
sizes = st.integers(1, 4)
shapes = st.lists(sizes, min_size=1, max_size=3).map(tuple)


def _adjoint(op: Op, spec, shape: tuple, index: torch.Tensor | None = None) -> torch.Tensor:
    """f^T(y) for f = op[spec](x, index?) at a random y, after checking the adjoint identity
    and that the backward pass runs the op's mirror (``MIRROR``)."""
    gen = torch.Generator().manual_seed(hash((op, shape)) % 2 ** 31)
    b = Builder()
    x = b.input("x", TensorType(shape, DType.f64))
    operands = [x] if index is None else [x, b.input("i", TensorType(index.shape, DType.i64))]
    out = b.emit(op, spec, *operands)
    y = b.input("y", out.type)
    prog = tdag.Program.from_tdag(b.build([ops.sum(out * y)]))
    grad = tdag.grad(prog, wrt=["x"])
    xv = torch.randn(shape, generator=gen, dtype=torch.float64)
    yv = torch.randn(tuple(out.type.shape), generator=gen, dtype=torch.float64)
    args = (xv, yv) if index is None else (xv, index, yv)
    forward, back = tdag.run(grad, *args)
    assert back.shape == xv.shape
    torch.testing.assert_close(forward, (xv * back).sum(), rtol=1e-12, atol=1e-12)
    if _moves(op, x.type, out.type):
        backward_ops = {n.op for n in grad.graph.nodes if n.origin.op.startswith("vjp:")}
        assert MIRROR[op] in backward_ops, f"{op.value}'s rule runs {backward_ops}"
    return back


def _moves(op: Op, x: TensorType, out: TensorType) -> bool:
    """Whether the op does anything its rule must mirror: a scan always; an op that only
    renames axes when the type changes; any other when the element count does (a pad of
    zeros, a sum over size-1 axes pass the cotangent through as a reshape)."""
    if op is Op.scan:
        return True
    if op in (Op.permute, Op.group, Op.ungroup, Op.squeeze, Op.unsqueeze):
        return not out.same_as(x)
    return int(np.prod(out.shape)) != int(np.prod(x.shape))


MIRROR = {Op.gather: Op.scatter, Op.unfold: Op.fold, Op.fold: Op.unfold, Op.pad: Op.slice,
          Op.slice: Op.pad, Op.repeat: Op.reduce, Op.reduce: Op.repeat, Op.permute: Op.permute,
          Op.group: Op.ungroup, Op.ungroup: Op.group, Op.squeeze: Op.unsqueeze,
          Op.unsqueeze: Op.squeeze, Op.scan: Op.scan}


@MIRRORS
@given(shape=shapes, data=st.data())
def test_gather_vjp_is_scatter_add(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    picks = data.draw(st.lists(st.integers(0, shape[axis] - 1), min_size=1, max_size=6))
    index = torch.tensor(picks, dtype=torch.int64)  # repeats: their cotangents add up
    back = _adjoint(Op.gather, Gather(axis), shape, index)
    gen = torch.Generator().manual_seed(hash((Op.gather, shape)) % 2 ** 31)
    torch.randn(shape, generator=gen, dtype=torch.float64)  # x, as _adjoint drew it
    out_shape = shape[:axis] + (len(picks),) + shape[axis + 1:]
    y = torch.randn(out_shape, generator=gen, dtype=torch.float64)
    want = torch.zeros(shape, dtype=torch.float64).index_add(axis, index, y)
    torch.testing.assert_close(back, want, rtol=1e-12, atol=1e-12)


@MIRRORS
@given(shape=shapes, data=st.data())
def test_unfold_and_fold(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    size, step, dilation = (data.draw(st.integers(1, 3)) for _ in range(3))
    length = shape[axis] + dilation * (size - 1)  # at least one window
    shape = shape[:axis] + (length,) + shape[axis + 1:]
    _adjoint(Op.unfold, Unfold(axis, size, step, dilation), shape)
    windows = (length - dilation * (size - 1) - 1) // step + 1
    folded = shape[:axis] + (windows,) + shape[axis + 1:] + (size,)
    _adjoint(Op.fold, Fold(axis, step, dilation, length + data.draw(st.integers(0, 2))), folded)


@MIRRORS
@given(shape=shapes, data=st.data())
def test_pad_and_slice(shape, data):
    widths = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
    _adjoint(Op.pad, Pad(widths), shape)  # a pad with a nonzero value is affine, not linear
    axis = data.draw(st.integers(0, len(shape) - 1))
    start = data.draw(st.integers(0, shape[axis] - 1))
    stop = data.draw(st.integers(start + 1, shape[axis]))
    _adjoint(Op.slice, Slice((axis,), (start,), (stop,), (data.draw(sizes),)), shape)


@MIRRORS
@given(shape=shapes, data=st.data())
def test_repeat_and_sum(shape, data):
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    ones = tuple(1 if a in axes else n for a, n in enumerate(shape))
    _adjoint(Op.repeat, Repeat(axes, tuple(shape[a] + 1 for a in axes)), ones)
    _adjoint(Op.reduce, Reduce(ReduceKind.sum, axes), shape)


@MIRRORS
@given(shape=shapes, data=st.data())
def test_permute_inverse(shape, data):
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    back = _adjoint(Op.permute, Permute(perm), shape)
    assert back.shape == shape


@MIRRORS
@given(shape=st.lists(sizes, min_size=2, max_size=4).map(tuple), data=st.data())
def test_group_and_ungroup(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 2))
    count = data.draw(st.integers(2, len(shape) - axis))
    _adjoint(Op.group, Group(axis, count), shape)
    merged = shape[:axis] + (int(np.prod(shape[axis:axis + count])),) + shape[axis + count:]
    _adjoint(Op.ungroup, Ungroup(axis, shape[axis:axis + count]), merged)


@MIRRORS
@given(shape=shapes, data=st.data())
def test_squeeze_and_unsqueeze(shape, data):
    rank = len(shape) + 1
    axis = data.draw(st.integers(0, rank - 1))
    _adjoint(Op.unsqueeze, Unsqueeze((axis,)), shape)
    _adjoint(Op.squeeze, Squeeze((axis,)), shape[:axis] + (1,) + shape[axis:])


@MIRRORS
@given(shape=shapes, data=st.data())
def test_add_scan_and_its_reverse(shape, data):
    axis = data.draw(st.integers(0, len(shape) - 1))
    reverse = data.draw(st.booleans())
    back = _adjoint(Op.scan, Scan(axis, "add", reverse), shape)
    assert back.shape == shape


def test_every_mirror_pair_has_rules():
    assert all(record(op).vjp is not None for op in MIRROR)
