"""The torch-like helpers of ``tdag.ops`` (core and arrays) against torch itself, from a table.

Each row traces a function written with the helpers, verifies the Program, runs it with
``tdag.run`` and compares with the same computation in torch: the dtype and shape must be
torch's, the values bitwise equal (nan equal to nan) unless the row gives a tolerance (float
sums in another order) or asks for ulp-level agreement. Rows with ``sym`` trace the first axis
of those inputs as the symbol ``b`` and run at two batch sizes.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import tdag
from tdag import ops as C  # core, arrays and the rest, as users see them
from tdag.ir.op import Op

NAN, INF = float("nan"), float("inf")
ULP, ULP2 = ("ulp", 1), ("ulp", 2)  # within one (two) units in the last place of torch's value


@dataclass
class Row:
    id: str
    fn: Callable  # on traced tensors
    ref: Callable  # the same in torch
    make: Callable  # make(n) -> input tensors; n is the batch size of symbolic inputs
    sym: tuple = ()  # indices of inputs whose first axis is traced as "b"
    tol: object = None  # None: bitwise; ULP: within one ulp; (rtol, atol): allclose


ROWS: list[Row] = []


def row(id, fn, ref, make, sym=(), tol=None):
    ROWS.append(Row(id, fn, ref, make, tuple(sym), tol))


def randn(*shape, dtype=torch.float32):
    return lambda n=3: [torch.randn([n if d == "b" else d for d in shape]).to(dtype)]


def ints(lo, hi, *shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, dtype=dtype)


def const(*tensors):
    return lambda n=3: [t.clone() for t in tensors]


def small_ints(*shapes, dtype=torch.float32):
    """Integer-valued floats: sums and products in any order are exact."""
    return lambda n=3: [torch.randint(-3, 4, [n if d == "b" else d for d in s]).to(dtype)
                        for s in shapes]


SPECIAL = torch.tensor([1.0, NAN, INF, -INF, 2.0, NAN, 0.0, -0.0, -3.5, 1e30])
SPECIAL2 = torch.tensor([NAN, 1.0, -INF, INF, 2.0, NAN, -0.0, 0.0, 7.0, -1e30])

# -- broadcasting arithmetic, scalars and type promotion --------------------------------------

x34 = lambda n=3: [torch.randn(3, 4)]  # noqa: E731
i34 = lambda n=3: [ints(-5, 6, 3, 4)]  # noqa: E731
row("add-float-scalar", lambda x: x + 2.5, lambda x: x + 2.5, x34)
row("radd-int-scalar", lambda x: 3 + x, lambda x: 3 + x, x34)
row("sub-scalar", lambda x: x - 1.25, lambda x: x - 1.25, x34)
row("rsub-scalar", lambda x: 2 - x, lambda x: 2 - x, x34)
row("mul-scalar", lambda x: x * -0.5, lambda x: x * -0.5, x34)
row("div-scalar", lambda x: x / 3.0, lambda x: x / 3.0, x34)
row("rdiv-scalar", lambda x: 2 / x, lambda x: 2 / x, x34)
row("int*float-scalar", lambda x: x * 2.5, lambda x: x * 2.5, i34)
row("int+int-scalar", lambda x: x + 3, lambda x: x + 3, i34)
row("int-float-scalar", lambda x: x - 0.5, lambda x: x - 0.5, i34)
row("int/int-scalar", lambda x: x / 3, lambda x: x / 3, i34)
row("int/int", lambda x, y: x / y, lambda x, y: x / y,
    lambda n=3: [ints(-9, 10, 5), torch.tensor([1, -2, 3, 4, -5])])
row("i32*int-scalar", lambda x: x * 3, lambda x: x * 3,
    lambda n=3: [ints(-5, 6, 4, dtype=torch.int32)])
row("i32*i64", lambda x, y: x * y, lambda x, y: x * y,
    lambda n=3: [ints(-5, 6, 4, dtype=torch.int32), ints(-5, 6, 4)])
row("u8+i8", lambda x, y: x + y, lambda x, y: x + y,
    lambda n=3: [ints(0, 100, 4, dtype=torch.uint8), ints(-100, 100, 4, dtype=torch.int8)])
row("bool+int-scalar", lambda x: C.add(x, 1), lambda x: x + 1, lambda n=3: [torch.rand(5) < 0.5])
row("bool*float-scalar", lambda x: x * 1.5, lambda x: x * 1.5, lambda n=3: [torch.rand(5) < 0.5])
row("f16+f32", lambda x, y: x + y, lambda x, y: x + y,
    lambda n=3: [torch.randn(4).half(), torch.randn(4)])
row("f16*float-scalar", lambda x: x * 1.5, lambda x: x * 1.5, lambda n=3: [torch.randn(4).half()])
row("f64-int", lambda x, y: x - y, lambda x, y: x - y,
    lambda n=3: [torch.randn(4).double(), ints(-5, 6, 4)])
# a rank-0 tensor takes part in promotion below dimensioned tensors, as in torch
row("f32*rank0-f64", lambda x, y: x * y, lambda x, y: x * y,
    lambda n=3: [torch.randn(2, 3), torch.tensor(2.0, dtype=torch.float64)])
row("i64*rank0-f32", lambda x, y: x * y, lambda x, y: x * y,
    lambda n=3: [ints(-5, 6, 2, 3), torch.tensor(1.5)])
row("rank0-f32+i64", lambda x, y: x + y, lambda x, y: x + y,
    lambda n=3: [torch.tensor(1.5), ints(-5, 6, 3)])
row("rank0-f64*rank0-f32", lambda x, y: x * y, lambda x, y: x * y,
    lambda n=3: [torch.tensor(2.0, dtype=torch.float64), torch.tensor(1.5)])
row("f16+rank0-f32", lambda x, y: x + y, lambda x, y: x + y,
    lambda n=3: [torch.randn(3).half(), torch.tensor(0.25)])
row("bcast-3x1+1x4", lambda x, y: x + y, lambda x, y: x + y,
    lambda n=3: [torch.randn(3, 1), torch.randn(1, 4)])
row("bcast-rank", lambda x, y: x * y, lambda x, y: x * y,
    lambda n=3: [torch.randn(2, 3, 4), torch.randn(4)])
row("bcast-rank0", lambda x, y: x - y, lambda x, y: x - y,
    lambda n=3: [torch.randn(5), torch.randn(())])
row("bcast-empty", lambda x, y: x + y, lambda x, y: x + y,
    lambda n=3: [torch.randn(0, 3), torch.randn(1, 3)])
row("bcast-sym", lambda x, y: x + y, lambda x, y: x + y,
    lambda n=3: [torch.randn(n, 3), torch.randn(n, 1)], sym=(0, 1))
row("bcast-sym-rank", lambda x, y: x * y / 2, lambda x, y: x * y / 2,
    lambda n=3: [torch.randn(n, 3), torch.randn(3)], sym=(0,))
row("special-values", lambda x, y: (x + y, x - y, x * y, x / y),
    lambda x, y: (x + y, x - y, x * y, x / y), const(SPECIAL, SPECIAL2))
row("pow-int-exp", lambda x: x ** 2, lambda x: x ** 2, x34)
row("pow-int-tensor", lambda x: x ** 2, lambda x: x ** 2, i34)
row("rpow", lambda x: 2 ** x, lambda x: 2 ** x, x34)
row("int**float", lambda x: x ** 0.5, lambda x: x ** 0.5, lambda n=3: [ints(0, 9, 6)], tol=ULP)
row("pow-tensor", lambda x, y: x ** y, lambda x, y: x ** y,
    lambda n=3: [torch.rand(5) + 0.5, torch.randn(5)])
row("neg", lambda x: -x, lambda x: -x, const(SPECIAL))
row("neg-int", lambda x: -x, lambda x: -x, i34)

# -- floor_divide / remainder / fmod ----------------------------------------------------------

IA = torch.tensor([-7, 7, -7, 7, 0, 5, -5, 6, -6, 9])
IB = torch.tensor([2, -2, -2, 2, 3, 3, -3, 3, -3, -4])
FA = torch.tensor([-7.5, 7.0, -7.0, 7.25, 0.0, -0.0, 5.5, -5.0, 1e10, -1e10, 0.3, -2.0, INF, 3.0])
FB = torch.tensor([2.0, -2.0, -2.5, 2.0, 3.0, 3.0, 3.0, -3.0, 3.0, 3.0, 0.1, -0.7, 2.0, INF])
for name, fn, ref in (("floor_divide", C.floor_divide, torch.floor_divide),
                      ("remainder", C.remainder, torch.remainder), ("fmod", C.fmod, torch.fmod)):
    row(f"{name}-int", fn, ref, const(IA, IB))
    row(f"{name}-i32", fn, ref, const(IA.int(), IB.int()))
    row(f"{name}-float", fn, ref, const(FA, FB))
    row(f"{name}-f64", fn, ref, const(FA.double(), FB.double()))
    row(f"{name}-f16", fn, ref, const(FA[:8].half(), FB[:8].half()))
    row(f"{name}-random", fn, ref, lambda n=3: [torch.randn(200) * 10, torch.randn(200)])
    row(f"{name}-int-scalar", lambda x, f=fn: f(x, 3), lambda x, r=ref: r(x, 3), const(IA))
    row(f"{name}-int-neg-scalar", lambda x, f=fn: f(x, -4), lambda x, r=ref: r(x, -4), const(IA))
    row(f"{name}-int-float-scalar", lambda x, f=fn: f(x, 2.5), lambda x, r=ref: r(x, 2.5),
        const(IA))
    row(f"{name}-float-scalar", lambda x, f=fn: f(x, -2.5), lambda x, r=ref: r(x, -2.5),
        const(FA))
    row(f"{name}-sym", fn, ref, lambda n=3: [ints(-9, 10, n, 2), ints(1, 4, n, 2)], sym=(0, 1))
row("floordiv-operator", lambda x: x // 2, lambda x: x // 2, const(IA))

# -- matmul -----------------------------------------------------------------------------------

for sa, sb in [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)),
               ((5, 2, 3), (3, 4)), ((2, 3), (5, 3, 4)), ((5, 1, 2, 3), (4, 3, 2)),
               ((0, 3), (3, 2)), ((2, 0), (0, 3)), ((1, 3), (3, 1)), ((2, 1, 3), (1, 3, 2))]:
    row(f"matmul-{sa}x{sb}", lambda a, b: a @ b, lambda a, b: a @ b, small_ints(sa, sb))
    row(f"matmul-random-{sa}x{sb}", C.matmul, torch.matmul,
        lambda n=3, sa=sa, sb=sb: [torch.randn(sa), torch.randn(sb)], tol=(1e-5, 1e-5))
row("matmul-f64", C.matmul, torch.matmul, small_ints((4, 3), (3, 2), dtype=torch.float64))
row("matmul-int", C.matmul, torch.matmul, lambda n=3: [ints(-3, 4, 2, 3), ints(-3, 4, 3, 2)])
row("matmul-sym-batch", C.matmul, torch.matmul, small_ints(("b", 2, 3), (3, 4)), sym=(0,))
row("matmul-sym-rows", C.matmul, torch.matmul, small_ints(("b", 3), (3, 4)), sym=(0,))
row("matmul-sym-both", C.matmul, torch.matmul, small_ints(("b", 2, 3), ("b", 3, 1)),
    sym=(0, 1))
row("linear", C.linear, F.linear, small_ints((2, 3), (4, 3), (4,)))

# -- reshape and friends ----------------------------------------------------------------------

for shape in [(6, 4), (-1,), (4, -1), (2, 1, 3, 4), (1, 24), (24, 1, 1), (2, 12), (3, 8),
              (8, 3), (2, 3, 2, 2), (-1, 2, 2), (1, 2, 3, 1, 4, 1), (4, 3, 2)]:
    row(f"reshape-{shape}", lambda x, s=shape: C.reshape(x, s), lambda x, s=shape: x.reshape(s),
        randn(2, 3, 4))
row("reshape-to-rank0", lambda x: C.reshape(x, ()), lambda x: x.reshape(()), randn(1, 1))
row("reshape-from-rank0", lambda x: C.reshape(x, (1, 1)), lambda x: x.reshape(1, 1), randn())
row("reshape-rank0-wildcard", lambda x: C.reshape(x, -1), lambda x: x.reshape(-1), randn())
row("reshape-empty", lambda x: C.reshape(x, (3, 0)), lambda x: x.reshape(3, 0), randn(0, 3))
row("reshape-empty-wildcard", lambda x: x.reshape(-1, 3), lambda x: x.reshape(-1, 3),
    randn(0, 3))
row("reshape-method", lambda x: x.reshape(4, 6), lambda x: x.reshape(4, 6), randn(2, 3, 4))
row("reshape-sym-wildcard", lambda x: C.reshape(x, (-1, 12)), lambda x: x.reshape(-1, 12),
    randn("b", 3, 4), sym=(0,))
row("reshape-sym-split", lambda x: C.reshape(x, (x.shape[0], 3, 2, 2)),
    lambda x: x.reshape(x.shape[0], 3, 2, 2), randn("b", 3, 4), sym=(0,))
row("reshape-sym-flat", lambda x: C.reshape(x, (-1,)), lambda x: x.reshape(-1),
    randn("b", 3, 4), sym=(0,))
row("reshape-sym-merge", lambda x: C.reshape(x, (x.shape[0] * 3, 4)),
    lambda x: x.reshape(-1, 4), randn("b", 3, 4), sym=(0,))
row("reshape-sym-ones", lambda x: C.reshape(x, (1, x.shape[0], 12, 1)),
    lambda x: x.reshape(1, -1, 12, 1), randn("b", 3, 4), sym=(0,))
row("flatten", lambda x: C.flatten(x, 1), lambda x: torch.flatten(x, 1), randn(2, 3, 4))
row("flatten-rank0", C.flatten, torch.flatten, randn())
row("squeeze-all", C.squeeze, torch.squeeze, randn(1, 3, 1))
row("squeeze-neg", lambda x: C.squeeze(x, -1), lambda x: torch.squeeze(x, -1), randn(1, 3, 1))
row("unsqueeze-neg", lambda x: C.unsqueeze(x, -1), lambda x: x.unsqueeze(-1), randn(2, 3))
row("transpose", lambda x: C.transpose(x, 0, -1), lambda x: x.transpose(0, -1), randn(2, 3, 4))
row("T", lambda x: x.T, lambda x: x.permute(1, 0), randn(2, 3))
row("movedim", lambda x: C.movedim(x, 0, -1), lambda x: torch.movedim(x, 0, -1), randn(2, 3, 4))
row("expand", lambda x: C.expand(x, (4, 2, 3)), lambda x: x.expand(4, 2, 3), randn(2, 1))
row("pad-crop", lambda x: C.pad(x, [(1, -1), (-1, 2)], 0.5),
    lambda x: F.pad(x, (-1, 2, 1, -1), value=0.5), randn(3, 4))

# -- concat / stack / split / chunk / tile / repeat_interleave --------------------------------

row("concat", lambda a, b: C.concat([a, b], 1), lambda a, b: torch.cat([a, b], 1),
    lambda n=3: [torch.randn(2, 3), torch.randn(2, 5)])
row("concat-neg-axis", lambda a, b, c: C.concat([a, b, c], -1),
    lambda a, b, c: torch.cat([a, b, c], -1),
    lambda n=3: [torch.randn(2, 3), torch.randn(2, 1), torch.randn(2, 2)])
row("concat-int", lambda a, b: C.concat([a, b]), lambda a, b: torch.cat([a, b]),
    lambda n=3: [ints(0, 5, 2, 3), ints(0, 5, 1, 3)])
row("concat-promote", lambda a, b: C.concat([a, b]), lambda a, b: torch.cat([a, b]),
    lambda n=3: [ints(0, 5, 2, 3), torch.randn(1, 3)])
row("concat-bool", lambda a, b: C.concat([a, b]), lambda a, b: torch.cat([a, b]),
    lambda n=3: [torch.rand(2, 3) < 0.5, torch.rand(1, 3) < 0.5])
row("concat-special", lambda a, b: C.concat([a, b]), lambda a, b: torch.cat([a, b]),
    const(SPECIAL, SPECIAL2))
row("concat-empty", lambda a, b: C.concat([a, b]), lambda a, b: torch.cat([a, b]),
    lambda n=3: [torch.randn(0, 2), torch.randn(3, 2)])
row("concat-sym", lambda a, b: C.concat([a, b]), lambda a, b: torch.cat([a, b]),
    lambda n=3: [torch.randn(n, 2), torch.randn(n, 2)], sym=(0, 1))
row("concat-sym-inner", lambda a, b: C.concat([a, b], 1), lambda a, b: torch.cat([a, b], 1),
    lambda n=3: [torch.randn(n, 2), torch.randn(n, 3)], sym=(0, 1))
row("stack", lambda a, b: C.stack([a, b], 1), lambda a, b: torch.stack([a, b], 1),
    lambda n=3: [torch.randn(2, 3), torch.randn(2, 3)])
row("stack-neg", lambda a, b: C.stack([a, b], -1), lambda a, b: torch.stack([a, b], -1),
    lambda n=3: [torch.randn(2, 3), torch.randn(2, 3)])
row("stack-rank0", lambda a, b: C.stack([a, b]), lambda a, b: torch.stack([a, b]),
    lambda n=3: [torch.randn(()), torch.randn(())])
row("split-int", lambda x: C.split(x, 2, 1), lambda x: torch.split(x, 2, 1), randn(2, 5))
row("split-list", lambda x: C.split(x, [1, 4], 1), lambda x: torch.split(x, [1, 4], 1),
    randn(2, 5))
row("split-sym", lambda x: C.split(x, [1, 3], 1), lambda x: torch.split(x, [1, 3], 1),
    randn("b", 4), sym=(0,))
for n_chunks, length in ((2, 5), (3, 6), (4, 6), (3, 2)):
    row(f"chunk-{n_chunks}-of-{length}", lambda x, c=n_chunks: C.chunk(x, c, 1),
        lambda x, c=n_chunks: torch.chunk(x, c, 1), randn(2, length))
for reps in ((2, 3), (2, 1, 3), (1, 1), (0, 2), (1, 3, 1, 2)):
    row(f"tile-{reps}", lambda x, r=reps: C.tile(x, *r), lambda x, r=reps: x.repeat(*r),
        randn(2, 3))
row("tile-sym", lambda x: C.tile(x, 1, 2), lambda x: x.repeat(1, 2), randn("b", 3), sym=(0,))
row("repeat_interleave", lambda x: C.repeat_interleave(x, 2, 1),
    lambda x: x.repeat_interleave(2, 1), randn(2, 3))
row("repeat_interleave-flat", lambda x: C.repeat_interleave(x, 3),
    lambda x: x.repeat_interleave(3), randn(2, 3))
row("repeat_interleave-neg", lambda x: C.repeat_interleave(x, 2, -2),
    lambda x: x.repeat_interleave(2, -2), randn(2, 3))
row("repeat_interleave-sym", lambda x: C.repeat_interleave(x, 2, 0),
    lambda x: x.repeat_interleave(2, 0), randn("b", 3), sym=(0,))

# -- indexing ---------------------------------------------------------------------------------

KEYS = {
    "ellipsis-slice-none-neg": (Ellipsis, slice(1, 3), None, -1),
    "int": 0,
    "step": (slice(None), slice(None, None, 2)),
    "neg-int-slice-none": (-1, slice(1, -1), None),
    "none": None,
    "trailing-none": (Ellipsis, None),
    "int-ellipsis-int": (1, Ellipsis, 2),
    "past-the-end": (slice(None), slice(5, 10)),
    "clipped": (slice(None), slice(-10, 2)),
    "empty": (slice(None), slice(2, 1)),
    "tensor": (slice(None), torch.tensor([2, 0, -1])),
    "tensor-2d": torch.tensor([[1, 0], [0, 1]]),
    "tensor-then-slice": (slice(None), torch.tensor([1, 2]), slice(1, None)),
}
for name, key in KEYS.items():
    row(f"index-{name}", lambda x, k=key: x[k], lambda x, k=key: x[k], randn(2, 3, 4, 5))
row("index-sym", lambda x: x[1:, ..., -1], lambda x: x[1:, ..., -1], randn("b", 3, 4), sym=(0,))
row("index-sym-last", lambda x: x[-1], lambda x: x[-1], randn("b", 3), sym=(0,))
row("index-sym-drop-last", lambda x: x[:-1], lambda x: x[:-1], randn("b", 3), sym=(0,))
row("index-sym-tail", lambda x: x[-2:], lambda x: x[-2:], randn("b", 3), sym=(0,))
row("index-traced-i64", lambda x, i: x[:, i], lambda x, i: x[:, i],
    lambda n=3: [torch.randn(2, 3, 4), torch.tensor([2, 0, -1, -3])])
row("index-traced-i32", lambda x, i: x[:, i], lambda x, i: x[:, i],
    lambda n=3: [torch.randn(2, 3, 4), torch.tensor([[2], [-2]], dtype=torch.int32)])
row("index-rank0", lambda x: x[()], lambda x: x[()], randn())
row("index-rank0-none", lambda x: x[None], lambda x: x[None], randn())
row("gather-neg", lambda t, i: C.gather(t, i, 1), lambda t, i: t.index_select(1, i % 3),
    lambda n=3: [torch.randn(2, 3, 4), torch.tensor([2, 0, -1, -3])])

# -- where / maximum / minimum / clamp / abs / relu with nan and inf -------------------------

MASK = torch.tensor([True, False, True, False, True, True, False, True, False, True])
row("where", C.where, torch.where, const(MASK, SPECIAL, SPECIAL2))
row("where-neg-inf-scalar", lambda c, a: C.where(c, a, -INF),
    lambda c, a: torch.where(c, a, -INF), const(MASK, SPECIAL))
row("where-zero-scalar", lambda c, a: C.where(c, 0.0, a),
    lambda c, a: torch.where(c, 0.0, a), const(MASK, SPECIAL))
row("where-int-float", lambda c, a: C.where(c, a, 1.5), lambda c, a: torch.where(c, a, 1.5),
    const(MASK, torch.arange(10)))
row("where-int-int", lambda c, a: C.where(c, a, -1), lambda c, a: torch.where(c, a, -1),
    const(MASK, torch.arange(10)))
row("where-bcast", lambda c, a: C.where(c, a, 0.0), lambda c, a: torch.where(c, a, 0.0),
    lambda n=3: [torch.rand(3, 1) < 0.5, torch.randn(1, 4)])
row("where-sym", lambda c, a, b: C.where(c, a, b), torch.where,
    lambda n=3: [torch.rand(n, 1) < 0.5, torch.randn(n, 3), torch.randn(3)], sym=(0, 1))
row("where-mask-op", lambda x: C.where(x == 0.0, 1.0, x), lambda x: torch.where(x == 0.0, 1.0, x),
    const(SPECIAL))
row("eq-ne-operators", lambda a, b: (a == b, a != b, a == 1.0, a != 2),
    lambda a, b: (a == b, a != b, a == 1.0, a != 2), const(SPECIAL, SPECIAL2))
row("comparisons", lambda a, b: (a < b, a <= b, a > b, a >= b, C.lt(a, 1), C.ge(a, -INF)),
    lambda a, b: (a < b, a <= b, a > b, a >= b, a < 1, a >= -INF), const(SPECIAL, SPECIAL2))
row("int-lt-float-scalar", lambda a: a < 1.5, lambda a: a < 1.5, const(IA))
row("maximum", C.maximum, torch.maximum, const(SPECIAL, SPECIAL2))
row("minimum", C.minimum, torch.minimum, const(SPECIAL, SPECIAL2))
row("maximum-int", C.maximum, torch.maximum, const(IA, IB))
row("maximum-bcast", C.maximum, torch.maximum, lambda n=3: [torch.randn(3, 1), torch.randn(4)])
row("maximum-scalar", lambda a: C.maximum(a, 0.0), lambda a: torch.clamp_min(a, 0.0),
    const(SPECIAL))
row("clamp", lambda a: C.clamp(a, -1.0, 1.0), lambda a: torch.clamp(a, -1.0, 1.0), const(SPECIAL))
row("clamp-min", lambda a: C.clamp(a, min=0.0), lambda a: torch.clamp(a, min=0.0), const(SPECIAL))
row("clamp-max", lambda a: C.clamp(a, max=0.0), lambda a: torch.clamp(a, max=0.0), const(SPECIAL))
row("clamp-inf", lambda a: C.clamp(a, -INF, INF), lambda a: torch.clamp(a, -INF, INF),
    const(SPECIAL))
row("clamp-int", lambda a: C.clamp(a, -1, 3), lambda a: torch.clamp(a, -1, 3), const(IA))
row("clamp-int-float-bounds", lambda a: C.clamp(a, -1.5, 3.5),
    lambda a: torch.clamp(a, -1.5, 3.5), const(IA))
row("clamp-tensors", C.clamp, torch.clamp,
    lambda n=3: [SPECIAL.clone(), torch.full((10,), -1.0), torch.full((10,), 1.0)])
row("abs", abs, torch.abs, const(SPECIAL))
row("abs-int", abs, torch.abs, const(IA))
row("abs-f16", abs, torch.abs, const(SPECIAL.half()))
row("relu-maximum", lambda a: C.maximum(a, 0.0), torch.relu, const(SPECIAL))
row("relu-where", lambda a: C.where(a < 0, 0.0, a), torch.relu, const(SPECIAL))
row("relu-half-abs", lambda a: (a + abs(a)) / 2, torch.relu,  # exact on finite, moderate x
    lambda n=3: [torch.randn(50)])
row("sign", C.sign, torch.sign, const(SPECIAL))
row("isnan", C.isnan, torch.isnan, const(SPECIAL))
row("logical", lambda a, b: (C.logical_not(a), C.logical_and(a, b), C.logical_or(a, b)),
    lambda a, b: (torch.logical_not(a), torch.logical_and(a, b), torch.logical_or(a, b)),
    const(SPECIAL, SPECIAL2))

# -- sqrt / rounding --------------------------------------------------------------------------

POS = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.25, 1e-30, 1e30, INF, NAN, 7.1, 123.456, -1.0])
row("sqrt-f32", C.sqrt, torch.sqrt, lambda n=3: [torch.cat([POS, torch.rand(200) * 100])],
    tol=ULP)
row("sqrt-f64", C.sqrt, torch.sqrt, lambda n=3: [torch.cat([POS, torch.rand(200) * 100]).double()],
    tol=ULP)
row("sqrt-f16", C.sqrt, torch.sqrt, lambda n=3: [(torch.rand(200) * 100).half()], tol=ULP)
row("sqrt-int", C.sqrt, torch.sqrt, lambda n=3: [torch.arange(50)], tol=ULP)
row("rsqrt", C.rsqrt, torch.rsqrt, lambda n=3: [torch.rand(100) * 10 + 0.1], tol=(2e-7, 0))
ROUND = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 1.2, -1.7, 2.5000002,
                      8388607.5, 8388609.0, 1e8 + 1, NAN, INF, -INF, -0.0, 0.0, -0.3, 3.5])
for name, fn, ref in (("round", C.round, torch.round), ("floor", C.floor, torch.floor),
                      ("ceil", C.ceil, torch.ceil), ("trunc", C.trunc, torch.trunc)):
    row(f"{name}-f32", fn, ref, const(ROUND))
    row(f"{name}-f64", fn, ref,
        const(torch.cat([ROUND.double(),
                         torch.tensor([0.49999999999999994, 4503599627370497.0, 1e300,
                                       4503599627370495.5], dtype=torch.float64)])))
    row(f"{name}-f16", fn, ref,
        const(torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, 2049.0, 1000.5, 65504.0, -INF, NAN],
                           dtype=torch.float16)))
    row(f"{name}-random", fn, ref, lambda n=3: [torch.randn(200) * 5])
    row(f"{name}-int", fn, ref, const(IA))

# -- reductions: argmax / argmin / cumsum / mean / var / sum / prod ---------------------------

TIES = torch.tensor([[1.0, 3.0, 3.0, -1.0], [2.0, 2.0, 2.0, 2.0], [-INF, -INF, -5.0, INF]])
for name, fn, ref in (("argmax", C.argmax, torch.argmax), ("argmin", C.argmin, torch.argmin)):
    row(f"{name}-ties", lambda x, f=fn: f(x, 1), lambda x, r=ref: r(x, 1), const(TIES))
    row(f"{name}-axis0-keepdim", lambda x, f=fn: f(x, 0, keepdim=True),
        lambda x, r=ref: r(x, 0, keepdim=True), const(TIES))
    row(f"{name}-nan", lambda x, f=fn: f(x, 0), lambda x, r=ref: r(x, 0),
        const(torch.tensor([1.0, NAN, 3.0, NAN])))
    row(f"{name}-nan-rows", lambda x, f=fn: f(x, -1), lambda x, r=ref: r(x, -1),
        const(torch.tensor([[1.0, NAN, 3.0], [NAN, INF, -INF], [0.0, -0.0, 0.0]])))
    row(f"{name}-int", lambda x, f=fn: f(x, 1), lambda x, r=ref: r(x, 1),
        lambda n=3: [ints(0, 3, 4, 6)])
    row(f"{name}-random", lambda x, f=fn: f(x, 1), lambda x, r=ref: r(x, 1), randn(5, 7))
    row(f"{name}-sym-inner", lambda x, f=fn: f(x, 1), lambda x, r=ref: r(x, 1),
        small_ints(("b", 5)), sym=(0,))
    row(f"{name}-sym-axis", lambda x, f=fn: f(x, 0), lambda x, r=ref: r(x, 0),
        small_ints(("b", 5)), sym=(0,))
for dtype in (torch.int64, torch.int32, torch.bool):
    row(f"cumsum-{dtype}", lambda x: C.cumsum(x, -1), lambda x: torch.cumsum(x, -1),
        lambda n=3, d=dtype: [ints(-3, 4, 3, 5).to(d)])
row("cumsum-int-axis0", lambda x: C.cumsum(x, 0), lambda x: torch.cumsum(x, 0),
    lambda n=3: [ints(-3, 4, 4, 3)])
row("cumsum-float-exact", lambda x: C.cumsum(x, 1), lambda x: torch.cumsum(x, 1),
    small_ints((3, 6)))
row("cumsum-float", lambda x: C.cumsum(x, 1), lambda x: torch.cumsum(x, 1), randn(3, 6),
    tol=(1e-6, 1e-6))
row("cumsum-inf", lambda x: C.cumsum(x, 0), lambda x: torch.cumsum(x, 0),
    const(torch.tensor([1.0, INF, 2.0, -INF, 3.0])))
row("cumsum-sym-batch", lambda x: C.cumsum(x, 1), lambda x: torch.cumsum(x, 1),
    small_ints(("b", 4)), sym=(0,))
row("cumsum-empty", lambda x: C.cumsum(x, 1), lambda x: torch.cumsum(x, 1), randn(2, 0))
for dtype in (torch.float32, torch.int32, torch.int64, torch.bool):
    row(f"sum-{dtype}", lambda x: (C.sum(x), C.sum(x, 1), x.sum(0, keepdim=True)),
        lambda x: (torch.sum(x), torch.sum(x, 1), x.sum(0, keepdim=True)),
        lambda n=3, d=dtype: [ints(-3, 4, 3, 4).to(d)])
    row(f"prod-{dtype}", lambda x: (C.prod(x, 1), C.prod(x, (0, 1))),
        lambda x: (torch.prod(x, 1), torch.prod(x)),
        lambda n=3, d=dtype: [ints(-3, 4, 3, 4).to(d)])
row("amax-amin", lambda x: (C.amax(x, 1), C.amin(x, 0), x.max(1), x.min()),
    lambda x: (torch.amax(x, 1), torch.amin(x, 0), torch.amax(x, 1), torch.amin(x)),
    const(torch.tensor([[1.0, NAN, -INF], [2.0, 0.0, INF]])))
MEAN_TOL = (2e-6, 1e-6)
row("mean-axis", lambda x: C.mean(x, 1), lambda x: torch.mean(x, 1), randn(3, 5), tol=MEAN_TOL)
row("mean-all", lambda x: C.mean(x), lambda x: torch.mean(x), randn(3, 5), tol=MEAN_TOL)
row("mean-method", lambda x: x.mean(-1, keepdim=True), lambda x: x.mean(-1, keepdim=True),
    randn(3, 5), tol=MEAN_TOL)
row("mean-int", lambda x: C.mean(x, 1), lambda x: torch.mean(x.float(), 1),
    lambda n=3: [ints(0, 5, 3, 4)], tol=MEAN_TOL)
row("mean-f64", lambda x: C.mean(x, 1), lambda x: torch.mean(x, 1),
    randn(3, 5, dtype=torch.float64), tol=(1e-14, 1e-15))
row("mean-f16", lambda x: C.mean(x, 1), lambda x: torch.mean(x, 1),
    randn(3, 5, dtype=torch.float16), tol=(2e-3, 2e-3))
row("mean-sym-axis", lambda x: C.mean(x, 0), lambda x: torch.mean(x, 0), randn("b", 4),
    sym=(0,), tol=MEAN_TOL)
row("mean-sym-all", lambda x: C.mean(x), lambda x: torch.mean(x), randn("b", 4), sym=(0,),
    tol=MEAN_TOL)
row("mean-sym-keepdim", lambda x: C.mean(x, (0, 2), keepdim=True),
    lambda x: torch.mean(x, (0, 2), keepdim=True), randn("b", 2, 3), sym=(0,), tol=MEAN_TOL)
for correction in (0, 1):
    row(f"var-axis-c{correction}", lambda x, c=correction: C.var(x, 1, correction=c),
        lambda x, c=correction: torch.var(x, 1, correction=c), randn(3, 5), tol=MEAN_TOL)
    row(f"var-sym-axis-c{correction}", lambda x, c=correction: C.var(x, 0, correction=c),
        lambda x, c=correction: torch.var(x, 0, correction=c), randn("b", 4), sym=(0,),
        tol=MEAN_TOL)
    row(f"var-sym-all-c{correction}", lambda x, c=correction: C.var(x, correction=c),
        lambda x, c=correction: torch.var(x, correction=c), randn("b", 4), sym=(0,),
        tol=MEAN_TOL)
row("var-keepdim", lambda x: C.var(x, -1, keepdim=True),
    lambda x: torch.var(x, -1, keepdim=True), randn(3, 5), tol=MEAN_TOL)
row("var-f64", lambda x: C.var(x, 1), lambda x: torch.var(x, 1), randn(3, 5, dtype=torch.float64),
    tol=(1e-14, 1e-15))
row("var-f16", lambda x: C.var(x, 1), lambda x: torch.var(x, 1), randn(3, 5, dtype=torch.float16),
    tol=(5e-3, 2e-3))

# -- generators: arange / full / zeros / ones -------------------------------------------------

for args in ((5,), (2, 11, 3), (5, -4, -2), (3, 3), (0, 10, 3), (-7, 0)):
    row(f"arange-{args}", lambda x, a=args: C.arange(*a), lambda x, a=args: torch.arange(*a),
        randn(1))
# float aranges are start + i*step rounded once; torch's SIMD path may differ by an ulp or two
for args in ((0.0, 1.0, 0.25), (0.1, 1.0, 0.3), (1, 2.5), (-1.5, 2.0, 0.7), (0.1, 10.0, 0.01)):
    for dtype in (torch.float32, torch.float64):
        row(f"arange-{args}-{dtype}", lambda x, a=args, d=dtype: C.arange(*a, dtype=d),
            lambda x, a=args, d=dtype: torch.arange(*a, dtype=d), randn(1), tol=ULP2)
row("arange-float-default", lambda x: C.arange(0.5, 3.0), lambda x: torch.arange(0.5, 3.0),
    randn(1), tol=ULP2)
row("arange-int-as-float", lambda x: C.arange(4, dtype="float32"),
    lambda x: torch.arange(4, dtype=torch.float32), randn(1))
row("arange-sym", lambda x: C.arange(x.shape[0], like=x), lambda x: torch.arange(x.shape[0]),
    randn("b", 2), sym=(0,))
row("arange-sym-start", lambda x: C.arange(1, x.shape[0], like=x),
    lambda x: torch.arange(1, x.shape[0]), randn("b", 2), sym=(0,))
row("arange-sym-step", lambda x: C.arange(0, x.shape[0] * 4, 2, like=x),
    lambda x: torch.arange(0, x.shape[0] * 4, 2), randn("b", 2), sym=(0,))
row("full", lambda x: C.full((2, 3), 1.5), lambda x: torch.full((2, 3), 1.5), randn(1))
row("full-int", lambda x: C.full((2, 3), 7), lambda x: torch.full((2, 3), 7), randn(1))
row("full-bool", lambda x: C.full((2, 3), True), lambda x: torch.full((2, 3), True), randn(1))
row("full-neg-inf", lambda x: C.full((3,), -INF), lambda x: torch.full((3,), -INF), randn(1))
row("full-sym", lambda x: C.full((x.shape[0], 2), 3.0), lambda x: torch.full((x.shape[0], 2), 3.0),
    randn("b", 4), sym=(0,))
row("zeros", lambda x: C.zeros((2, 3)), lambda x: torch.zeros(2, 3), randn(1))
row("zeros-rank0", lambda x: C.zeros(()), lambda x: torch.zeros(()), randn(1))
row("zeros-empty", lambda x: C.zeros((0, 3)), lambda x: torch.zeros(0, 3), randn(1))
row("zeros-sym", lambda x: C.zeros((x.shape[0],)), lambda x: torch.zeros(x.shape[0]),
    randn("b", 4), sym=(0,))
row("ones-i64-sym", lambda x: C.ones((x.shape[0], 1), "int64"),
    lambda x: torch.ones(x.shape[0], 1, dtype=torch.int64), randn("b", 4), sym=(0,))


# -- the driver -------------------------------------------------------------------------------

def _specs(inputs, sym):
    return [tdag.TensorSpec((("b",) + tuple(t.shape[1:])) if i in sym else tuple(t.shape), t.dtype)
            for i, t in enumerate(inputs)]


def _as_tuple(value):
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _within_ulps(got: torch.Tensor, want: torch.Tensor, ulps: int) -> bool:
    both_nan = torch.isnan(got) & torch.isnan(want)
    equal = got == want
    ulp = (torch.nextafter(want, torch.tensor(INF, dtype=want.dtype)) - want).abs()
    close = (got - want).abs() <= ulps * ulp
    return bool((both_nan | equal | close).all())


def check(got: torch.Tensor, want: torch.Tensor, tol, what: str):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, torch gives {want.dtype}"
    assert got.shape == want.shape, (f"{what}: shape {tuple(got.shape)}, "
                                     f"torch gives {tuple(want.shape)}")
    if tol is None or not want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=what)
    elif tol[0] == "ulp":
        assert _within_ulps(got, want, tol[1]), \
            f"{what}: more than {tol[1]} ulp from torch\n{got}\n{want}"
    else:
        torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1], equal_nan=True, msg=what)


def test_rows_are_unique():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("r", ROWS, ids=[r.id for r in ROWS])
def test_core_op(r: Row):
    torch.manual_seed(zlib.crc32(r.id.encode()))
    inputs = r.make(3)
    prog = tdag.trace(r.fn, *_specs(inputs, r.sym))
    tdag.verify(prog)
    for n in ((3, 6) if r.sym else (3,)):
        if n != 3:
            inputs = r.make(n)
        got = _as_tuple(tdag.run(prog, *inputs))
        want = _as_tuple(r.ref(*inputs))
        assert len(got) == len(want), r.id
        for i, (g, w) in enumerate(zip(got, want)):
            check(g, w, r.tol, f"{r.id}[{i}] at batch {n}")


def test_helpers_emit_only_primitives():
    """The helpers reduce to primitives: a torch-level op never leaks into the graph."""
    prog = tdag.trace(lambda x, y: C.remainder(C.matmul(x, y), 3.0) + C.round(x @ y),
                      tdag.TensorSpec(("b", 3)), tdag.TensorSpec((3, 2)))
    assert {n.op for n in prog.graph.nodes} <= set(tdag.PRIMITIVES)
    assert any(n.op is Op.divide for n in prog.graph.nodes)


def test_abs_of_either_zero_is_positive_zero():
    """torch.abs(-0.0) is 0.0; x * sign(x) alone gives -0.0 there."""
    prog = tdag.trace(lambda x: C.abs(x), tdag.TensorSpec((5,)))
    x = torch.tensor([-0.0, 0.0, -2.0, float("nan"), -float("inf")])
    for got in (tdag.run(prog, x), tdag.to_torch(prog)(x)):
        torch.testing.assert_close(got, torch.abs(x), equal_nan=True)
        assert not got[:2].signbit().any()
