"""Property tests of the mirror pairs: each movement primitive composed with its mirror.

The reversible pairs give back the input exactly; the irreversible ones recover it where the
design says they do (slice of pad, select of repeat, fold of a non-overlapping unfold) and
otherwise fold of unfold multiplies by how many windows cover each position.
Each composite is emitted as primitives (no helper may skip a node), verified, run by
``tdag.run`` and compared bitwise with the input.
"""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdag
from tdag.ops.builder import Builder
from tdag.deinops.extent import Pad, Repeat, Select, Slice
from tdag.deinops.movement import Group, Permute, Squeeze, Ungroup, Unsqueeze
from tdag.deinops.windows import Fold, Unfold
from tdag.ir.op import Op
from tdag.ir.symbols import as_dim
from tdag.ir.types import DType, TensorType

SETTINGS = settings(max_examples=40, deadline=None)

dims = st.integers(0, 3)
shapes = st.lists(dims, min_size=0, max_size=4).map(tuple)
dtypes = st.sampled_from([DType.f32, DType.i64, DType.bool])


def make(shape, dtype: DType, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype is DType.bool:
        return torch.rand(shape, generator=gen) < 0.5
    if dtype.is_float:
        return torch.randn(shape, generator=gen, dtype=dtype.torch)
    return torch.randint(-100, 100, shape, generator=gen, dtype=dtype.torch)


def roundtrip(in_shape, dtype, steps, x: torch.Tensor):
    """Emit ``steps`` (a list of (op, spec)) on one input, verify, run on ``x``."""
    b = Builder()
    y = b.input("x", TensorType(in_shape, dtype))
    for op, spec in steps:
        y = b.emit(op, spec, y)
    prog = tdag.Program.from_tdag(b.build([y]))
    tdag.verify(prog)
    return prog, tdag.run(prog, x)


def assert_same(got: torch.Tensor, want: torch.Tensor):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want), (got, want)


# -- reversible pairs -------------------------------------------------------------------------

@st.composite
def shape_and_perm(draw):
    shape = draw(shapes)
    perm = tuple(draw(st.permutations(range(len(shape)))))
    return shape, perm


@SETTINGS
@given(shape_and_perm(), dtypes, st.booleans())
def test_permute_then_inverse_is_identity(sp, dtype, symbolic):
    shape, perm = sp
    inverse = tuple(int(i) for i in np.argsort(perm))
    x = make(shape, dtype)
    traced = (("b",) + shape[1:]) if symbolic and shape else shape
    prog, y = roundtrip(traced, dtype, [(Op.permute, Permute(perm)),
                                        (Op.permute, Permute(inverse))], x)
    assert prog.graph.nodes[0].type.shape == tuple(as_dim(traced[p]) for p in perm)
    assert_same(y, x)


@st.composite
def group_case(draw):
    shape = draw(st.lists(dims, min_size=1, max_size=5).map(tuple))
    axis = draw(st.integers(0, len(shape) - 1))
    count = draw(st.integers(1, len(shape) - axis))
    return shape, axis, count


@SETTINGS
@given(group_case(), dtypes, st.booleans())
def test_ungroup_after_group_is_identity(case, dtype, symbolic):
    shape, axis, count = case
    traced = (("b",) + shape[1:]) if symbolic else shape
    sizes = tuple(as_dim(d) for d in traced[axis:axis + count])
    x = make(shape, dtype)
    prog, y = roundtrip(traced, dtype, [(Op.group, Group(axis, count)),
                                        (Op.ungroup, Ungroup(axis, sizes))], x)
    assert_same(y, x)


@st.composite
def ungroup_case(draw):
    shape = list(draw(st.lists(dims, min_size=1, max_size=3)))
    axis = draw(st.integers(0, len(shape) - 1))
    sizes = draw(st.lists(st.integers(0, 3), min_size=1, max_size=3))
    shape[axis] = int(np.prod(sizes))
    spec_sizes = list(sizes)
    if 0 not in sizes and draw(st.booleans()):  # one wildcard, inferred from the axis
        spec_sizes[draw(st.integers(0, len(sizes) - 1))] = -1
    return tuple(shape), axis, tuple(spec_sizes)


@SETTINGS
@given(ungroup_case(), dtypes)
def test_group_after_ungroup_is_identity(case, dtype):
    shape, axis, sizes = case
    x = make(shape, dtype)
    prog, y = roundtrip(shape, dtype, [(Op.ungroup, Ungroup(axis, sizes)),
                                       (Op.group, Group(axis, len(sizes)))], x)
    assert_same(y, x)


@st.composite
def squeeze_case(draw):
    shape = draw(st.lists(st.integers(0, 3), min_size=0, max_size=5).map(tuple))
    ones = [i for i, d in enumerate(shape) if d == 1]
    axes = tuple(sorted(draw(st.sets(st.sampled_from(ones)) if ones else st.just(set()))))
    return shape, axes


@SETTINGS
@given(squeeze_case(), dtypes)
def test_unsqueeze_after_squeeze_is_identity(case, dtype):
    shape, axes = case
    x = make(shape, dtype)
    prog, y = roundtrip(shape, dtype, [(Op.squeeze, Squeeze(axes)),
                                       (Op.unsqueeze, Unsqueeze(axes))], x)
    assert_same(y, x)


@SETTINGS
@given(shapes, st.data(), dtypes)
def test_squeeze_after_unsqueeze_is_identity(shape, data, dtype):
    rank = len(shape) + data.draw(st.integers(0, 3))
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, rank - 1), min_size=rank - len(shape),
                                          max_size=rank - len(shape))))) if rank else ()
    x = make(shape, dtype)
    prog, y = roundtrip(shape, dtype, [(Op.unsqueeze, Unsqueeze(axes)),
                                       (Op.squeeze, Squeeze(axes))], x)
    assert_same(y, x)


# -- irreversible pairs -----------------------------------------------------------------------

@SETTINGS
@given(shapes, st.data(), dtypes, st.floats(-5, 5, allow_nan=False))
def test_slice_after_pad_recovers_input(shape, data, dtype, value):
    widths = tuple((data.draw(st.integers(0, 3)), data.draw(st.integers(0, 3))) for _ in shape)
    axes = tuple(range(len(shape)))
    starts = tuple(lo for lo, _ in widths)
    stops = tuple(lo + d for (lo, _), d in zip(widths, shape))
    x = make(shape, dtype)
    prog, y = roundtrip(shape, dtype, [(Op.pad, Pad(widths, value)),
                                       (Op.slice, Slice(axes, starts, stops, (1,) * len(shape)))],
                        x)
    assert_same(y, x)


@SETTINGS
@given(shapes, st.data(), dtypes)
def test_select_after_repeat_recovers_input(shape, data, dtype):
    axis = data.draw(st.integers(0, len(shape)))
    shape1 = shape[:axis] + (1,) + shape[axis:]  # a size-1 axis to broadcast
    n = data.draw(st.integers(1, 4))
    index = data.draw(st.integers(0, n - 1))
    x = make(shape1, dtype)
    prog, y = roundtrip(shape1, dtype, [(Op.repeat, Repeat((axis,), (n,))),
                                        (Op.select, Select(axis, index))], x)
    assert_same(y, x.squeeze(axis))


@SETTINGS
@given(st.integers(1, 8), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2),
       st.sampled_from([DType.f32, DType.i64]))
def test_fold_after_unfold_is_coverage_times_input(length, size, step, dilation_minus_1, dtype):
    dilation = dilation_minus_1 + 1
    span = dilation * (size - 1) + 1
    if span > length:
        size, dilation, span = 1, 1, 1
    shape = (2, length, 3)
    x = make(shape, DType.i64, seed=length).to(dtype.torch)  # integer values: sums are exact
    prog, y = roundtrip(shape, dtype, [(Op.unfold, Unfold(1, size, step, dilation)),
                                       (Op.fold, Fold(1, step, dilation, length))], x)
    coverage = torch.zeros(length, dtype=dtype.torch)
    for i in range((length - span) // step + 1):
        for t in range(size):
            coverage[i * step + t * dilation] += 1
    assert_same(y, x * coverage[:, None])


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 3), dtypes)
def test_fold_after_unfold_with_step_equal_size_recovers_input(size, windows, tail, dtype):
    length = size * windows + (tail if dtype is not DType.bool else 0)
    shape = (length, 2)
    x = make(shape, dtype)
    if dtype is DType.bool:  # fold adds, which bool lacks: go through i64 and back
        x64 = x.to(torch.int64)
        prog, y = roundtrip(shape, DType.i64, [(Op.unfold, Unfold(0, size, size)),
                                               (Op.fold, Fold(0, size, 1, length))], x64)
        assert_same(y.to(torch.bool), x)
        return
    prog, y = roundtrip(shape, dtype, [(Op.unfold, Unfold(0, size, size)),
                                       (Op.fold, Fold(0, size, 1, length))], x)
    covered = size * ((length - size) // size + 1)  # whole windows; a shorter tail is dropped
    assert_same(y[:covered], x[:covered])
    assert not y[covered:].any()  # the tail no window reached comes back as zeros
    if length == covered:
        assert_same(y, x)
