"""The differential cases of every primitive: one row per case (the op, its spec, the operand
types, how to draw the operands, a numpy reference), the one-node Program of a case, and the
comparison of a result with its reference.

tests/deinops/test_primitives.py runs them through ``tdag.run``; the records' agreement
(tests/ir/test_records.py) and the JAX back end (tests/reify/test_to_jax.py) reuse them.
``"b"`` is a symbolic batch, run at two sizes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import scipy.special
import sympy
import torch

import tdag
from tdag.deinops.bitcast import BitCast, bitcast
from tdag.ops.builder import Builder
from tdag.deinops.elementwise import Cast, Compare, CompareKind, Divide, DivideMode
from tdag.deinops.indexing import Gather, Iota
from tdag.deinops.extent import Pad, Repeat, Select, Slice
from tdag.deinops.movement import Group, Permute, Squeeze, Ungroup, Unsqueeze
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.runtime import Arange, NonZero
from tdag.deinops.scan import Scan
from tdag.deinops.scatter import Scatter
from tdag.deinops.sort import Sort
from tdag.deinops.windows import Fold, Unfold
from tdag.ir.symbols import as_dim, evaluate
from tdag.ir.types import DType, TensorType
from tdag.ir.op import Op

B = as_dim("b")
SYM = ({"b": 2}, {"b": 5})  # the two batch sizes every symbolic case runs at

_NP = {DType.f64: np.float64, DType.f32: np.float32, DType.f16: np.float16,
       DType.i64: np.int64, DType.i32: np.int32, DType.i16: np.int16, DType.i8: np.int8,
       DType.u8: np.uint8, DType.bool: np.bool_, DType.c64: np.complex64,
       DType.c128: np.complex128}
_TOL = {DType.f64: (1e-10, 1e-12), DType.f32: (1e-5, 1e-6), DType.f16: (2e-3, 2e-3),
        DType.c64: (1e-5, 1e-5), DType.c128: (1e-10, 1e-12)}


# -- operand generators -----------------------------------------------------------------------

def uniform(lo, hi):
    return lambda rng, shape, dt: rng.uniform(lo, hi, shape).astype(_NP[dt])


def nonzero(lo, hi):
    """Magnitudes in [lo, hi) with a random sign: safe divisors and reciprocals."""
    return lambda rng, shape, dt: (rng.uniform(lo, hi, shape)
                                   * rng.choice([-1, 1], shape)).astype(_NP[dt])


def integers(lo, hi):
    return lambda rng, shape, dt: rng.integers(lo, hi, shape).astype(_NP[dt])


def choice(values):
    """Draws from a few values, so comparisons see ties, nan and infinities."""
    return lambda rng, shape, dt: rng.choice(np.array(values), shape).astype(_NP[dt])


def default_gen(dtype: DType):
    if dtype is DType.bool:
        return lambda rng, shape, dt: rng.random(shape) < 0.5
    if dtype is DType.u8:
        return integers(0, 10)
    if not dtype.is_float:
        return integers(-5, 6)
    return uniform(-3, 3)


@dataclass(frozen=True)
class In:
    shape: tuple
    dtype: DType = DType.f32
    gen: Callable | None = None

    def draw(self, rng, dims):
        shape = tuple(evaluate(as_dim(d), dims) for d in self.shape)
        return (self.gen or default_gen(self.dtype))(rng, shape, self.dtype)


@dataclass
class Case:
    op: Op
    spec: object
    ins: tuple  # operand types; inputs beyond the op's arity only bind symbols
    ref: Callable  # ref(spec, dims, *arrays) -> expected array
    id: str
    bindings: tuple = ({},)
    exact: bool = False  # floats compared exactly (movement, select-like ops)
    extra: dict = field(default_factory=dict)


CASES: list[Case] = []


def is_symbolic(value) -> bool:
    """Whether a spec (or any field of it, nested) holds a symbolic dimension."""
    if isinstance(value, sympy.Expr):
        return bool(value.free_symbols)
    if isinstance(value, (tuple, list)):
        return any(is_symbolic(v) for v in value)
    fields = getattr(value, "__dataclass_fields__", None)
    return bool(fields) and any(is_symbolic(getattr(value, f)) for f in fields)


def case(op, spec, ins, ref, name, bindings=None, exact=False):
    symbolic = any(not isinstance(as_dim(d), int) for x in ins for d in x.shape) or \
        is_symbolic(spec)
    if bindings is None:
        bindings = SYM if symbolic else ({},)
    CASES.append(Case(op, spec, tuple(ins), ref, f"{op.value}-{name}", bindings, exact))


# -- elementwise unary ------------------------------------------------------------------------

def _sign(x):
    # tdag follows torch: sign(nan) is 0 (numpy says nan)
    return np.where(np.isnan(x), 0, np.sign(x)) if x.dtype.kind == "f" else np.sign(x)


UNARY = {
    Op.neg: (np.negative, uniform(-3, 3)),
    Op.reciprocal: (lambda x: 1 / x, nonzero(0.25, 3)),
    Op.exp: (np.exp, uniform(-3, 3)),
    Op.log: (np.log, uniform(0.05, 5)),
    Op.sin: (np.sin, uniform(-4, 4)),
    Op.cos: (np.cos, uniform(-4, 4)),
    Op.tan: (np.tan, uniform(-1.2, 1.2)),
    Op.asin: (np.arcsin, uniform(-0.95, 0.95)),
    Op.acos: (np.arccos, uniform(-0.95, 0.95)),
    Op.atan: (np.arctan, uniform(-5, 5)),
    Op.sinh: (np.sinh, uniform(-3, 3)),
    Op.cosh: (np.cosh, uniform(-3, 3)),
    Op.tanh: (np.tanh, uniform(-3, 3)),
    Op.asinh: (np.arcsinh, uniform(-5, 5)),
    Op.acosh: (np.arccosh, uniform(1.05, 5)),
    Op.atanh: (np.arctanh, uniform(-0.9, 0.9)),
    Op.erf: (scipy.special.erf, uniform(-3, 3)),
    Op.erfinv: (scipy.special.erfinv, uniform(-0.95, 0.95)),
    Op.sign: (_sign, uniform(-3, 3)),
}
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 2.0, 1.0, -1.0]
UNARY_SHAPES = [(), (1,), (0, 3), (2, 3, 4), ("b", 3)]


def _unary_ref(fn):
    return lambda spec, dims, x: fn(x.astype(np.float64) if x.dtype.kind == "f" else x)


for _op, (_fn, _gen) in UNARY.items():
    for _dt in (DType.f32, DType.f64, DType.f16):
        for _shape in UNARY_SHAPES:
            case(_op, None, [In(_shape, _dt, _gen)], _unary_ref(_fn),
                 f"{_dt.value}-{_shape}")
    case(_op, None, [In((len(SPECIAL),), DType.f32, lambda r, s, d: np.array(SPECIAL, "f4"))],
         _unary_ref(_fn), "special")
for _op in (Op.neg, Op.sign):  # the two unary ops defined on integers
    for _dt in (DType.i64, DType.i32, DType.i8):
        case(_op, None, [In((3, 4), _dt)], _unary_ref(UNARY[_op][0]), _dt.value)
    case(_op, None, [In(("b",), DType.i64)], _unary_ref(UNARY[_op][0]), "i64-sym")


# -- elementwise binary -----------------------------------------------------------------------

def _floor_div(a, b):
    return np.floor_divide(a, b)


def _trunc_div(a, b):
    if a.dtype.kind == "f":
        return np.trunc(a / b)
    return np.sign(a) * np.sign(b) * (np.abs(a) // np.abs(b))


DIVIDE_MODES = ((DivideMode.floor, _floor_div), (DivideMode.trunc, _trunc_div),
                (DivideMode.remainder, np.remainder), (DivideMode.fmod, np.fmod))
BIN_SHAPES = [(), (1,), (0, 2), (2, 3, 4), ("b", 3)]
for _dt in (DType.f32, DType.f64, DType.f16, DType.i64, DType.i32, DType.u8):
    for _shape in BIN_SHAPES:
        _x = In(_shape, _dt)
        case(Op.add, None, [_x, _x], lambda s, d, a, b: a + b, f"{_dt.value}-{_shape}")
        case(Op.multiply, None, [_x, _x], lambda s, d, a, b: a * b, f"{_dt.value}-{_shape}")
for _shape in [(), (4, 5), ("b", 2)]:
    _x = In(_shape, DType.bool)
    case(Op.multiply, None, [_x, _x], lambda s, d, a, b: a & b, f"bool-{_shape}")
case(Op.add, None, [In((10,), DType.f32, choice(SPECIAL))] * 2,
     lambda s, d, a, b: a + b, "special")
case(Op.multiply, None, [In((10,), DType.f32, choice(SPECIAL))] * 2,
     lambda s, d, a, b: a * b, "special")

for _dt in (DType.f32, DType.f64, DType.f16):
    for _shape in BIN_SHAPES:
        case(Op.divide, Divide(), [In(_shape, _dt), In(_shape, _dt, nonzero(0.25, 3))],
             lambda s, d, a, b: a.astype(np.float64) / b, f"true-{_dt.value}-{_shape}")
        for _mode, _ref in DIVIDE_MODES:
            case(Op.divide, Divide(_mode),
                 [In(_shape, _dt, uniform(-8, 8)), In(_shape, _dt, nonzero(0.5, 3))],
                 lambda s, d, a, b, f=_ref: f(a, b), f"{_mode.value}-{_dt.value}-{_shape}")
case(Op.divide, Divide(), [In((10,), DType.f32, choice(SPECIAL))] * 2,
     lambda s, d, a, b: a / b, "true-special")
for _mode, _ref in DIVIDE_MODES[2:]:  # remainders are exact: large quotients, infinities
    case(Op.divide, Divide(_mode), [In((64,), DType.f32, choice([1e10, -7.5, 3.0, np.inf, 0.0])),
                                    In((64,), DType.f32, choice([3.0, -0.7, np.inf, 2.5]))],
         lambda s, d, a, b, f=_ref: f(a, b), f"{_mode.value}-special", exact=True)
for _dt in (DType.i64, DType.i32):
    for _shape in [(), (3, 4), ("b",)]:
        for _mode, _ref in DIVIDE_MODES:
            case(Op.divide, Divide(_mode), [In(_shape, _dt, integers(-9, 10)),
                                            In(_shape, _dt, choice([-3, -2, -1, 1, 2, 3]))],
                 lambda s, d, a, b, f=_ref: f(a, b), f"{_mode.value}-{_dt.value}-{_shape}")

for _dt in (DType.f32, DType.f64, DType.f16):
    for _shape in [(), (1,), (0, 3), (3, 4), ("b", 2)]:
        case(Op.pow, None, [In(_shape, _dt, uniform(0.1, 3)), In(_shape, _dt, uniform(-2, 2))],
             lambda s, d, a, b: np.power(a.astype(np.float64), b), f"{_dt.value}-{_shape}")
    # negative bases with integral exponents are defined (exp(y*log x) would be nan)
    case(Op.pow, None, [In((3, 4), _dt, uniform(-3, -0.1)),
                        In((3, 4), _dt, choice([-2, 0, 1, 2, 3]))],
         lambda s, d, a, b: np.power(a.astype(np.float64), b), f"{_dt.value}-negbase")
for _dt in (DType.i64, DType.i32):
    case(Op.pow, None, [In((3, 4), _dt, integers(-3, 4)), In((3, 4), _dt, integers(0, 5))],
         lambda s, d, a, b: np.power(a, b), _dt.value)


# -- where / compare / cast -------------------------------------------------------------------

for _dt in (DType.f32, DType.f64, DType.f16, DType.i64, DType.i32, DType.bool):
    for _shape in [(), (1,), (0, 2), (3, 4), ("b", 3)]:
        case(Op.where, None, [In(_shape, DType.bool), In(_shape, _dt), In(_shape, _dt)],
             lambda s, d, c, a, b: np.where(c, a, b), f"{_dt.value}-{_shape}")
case(Op.where, None, [In((10,), DType.bool), In((10,), DType.f32, choice([-np.inf, np.nan])),
                      In((10,), DType.f32, choice([np.inf, 1.0]))],
     lambda s, d, c, a, b: np.where(c, a, b), "inf-nan")

_NP_CMP = {CompareKind.eq: np.equal, CompareKind.ne: np.not_equal, CompareKind.lt: np.less,
           CompareKind.le: np.less_equal, CompareKind.gt: np.greater,
           CompareKind.ge: np.greater_equal}
for _kind, _fn in _NP_CMP.items():
    for _dt, _gen in ((DType.f32, choice([-1.0, 0.0, 1.0, np.inf, -np.inf, np.nan])),
                      (DType.f64, choice([-1.5, 0.0, 2.0, np.nan])),
                      (DType.f16, choice([-1.0, 0.5, 1.0])),
                      (DType.i64, integers(-2, 3)), (DType.i32, integers(-2, 3)),
                      (DType.bool, None)):
        for _shape in [(), (0,), (4, 5), ("b", 3)]:
            case(Op.compare, Compare(_kind), [In(_shape, _dt, _gen), In(_shape, _dt, _gen)],
                 lambda s, d, a, b, f=_fn: f(a, b), f"{_kind.value}-{_dt.value}-{_shape}")

_CASTS = [
    (DType.f32, DType.i32, uniform(-5, 5)),        # truncates toward zero
    (DType.f32, DType.i64, uniform(-5, 5)),
    (DType.f32, DType.bool, choice([0.0, -0.0, 0.5, -2.0, np.nan])),
    (DType.f32, DType.f16, uniform(-100, 100)),
    (DType.f64, DType.f32, uniform(-3, 3)),
    (DType.f16, DType.f64, uniform(-3, 3)),
    (DType.i64, DType.f32, integers(-1000, 1000)),
    (DType.i64, DType.i32, integers(-1000, 1000)),
    (DType.i32, DType.i64, integers(-1000, 1000)),
    (DType.i64, DType.bool, integers(-2, 3)),
    (DType.bool, DType.f32, None),
    (DType.bool, DType.i64, None),
    (DType.u8, DType.f32, None),
    (DType.f32, DType.f32, None),
]
for _src, _dst, _gen in _CASTS:
    for _shape in [(), (0,), (3, 4), ("b",)]:
        case(Op.cast, Cast(_dst), [In(_shape, _src, _gen)],
             lambda s, d, x: x.astype(_NP[s.dtype]), f"{_src.value}-{_dst.value}-{_shape}")


# bitcast: the bits as another type of the same width (integers drawn to be ordinary floats)
_BITCASTS = [
    (DType.f32, DType.i32, uniform(-3, 3)),
    (DType.i32, DType.f32, integers(0x3F000000, 0x40800000)),
    (DType.f64, DType.i64, choice([0.0, -0.0, 1.5, -2.25, np.inf, 1e-310])),
    (DType.i64, DType.f64, integers(-2 ** 62, 2 ** 62)),
    (DType.i8, DType.u8, integers(-128, 128)),
    (DType.f16, DType.i16, uniform(-3, 3)),
]
for _src, _dst, _gen in _BITCASTS:
    for _shape in [(), (3, 4), ("b",)]:
        case(Op.bitcast, BitCast(_dst), [In(_shape, _src, _gen)],
             lambda s, d, x: x.view(_NP[s.dtype]), f"{_src.value}-{_dst.value}-{_shape}",
             exact=True)


# -- indexing and generators ------------------------------------------------------------------

def _take(spec, dims, table, idx):
    return np.take(table, idx.astype(np.int64), axis=spec.axis)


for _dt in (DType.f32, DType.i64, DType.bool, DType.f16):
    case(Op.gather, Gather(0), [In((5, 3), _dt), In((4,), DType.i64, integers(0, 5))], _take,
         f"{_dt.value}-rows")
case(Op.gather, Gather(1), [In((2, 5, 3)), In((2, 2), DType.i32, integers(0, 5))], _take,
     "axis1-i32-2d")
case(Op.gather, Gather(0), [In((5, 3)), In((), DType.i64, integers(0, 5))], _take, "scalar-idx")
case(Op.gather, Gather(1), [In((5, 3)), In((0,), DType.i64)], _take, "empty-idx")
case(Op.gather, Gather(0), [In((1,)), In((3,), DType.i64, integers(0, 1))], _take, "size1")
case(Op.gather, Gather(0), [In(("b", 4)), In((3,), DType.i64, integers(0, 2))], _take,
     "sym-table")
case(Op.gather, Gather(0), [In((6, 4)), In(("b",), DType.i64, integers(0, 6))], _take,
     "sym-index")

for _dt in (DType.i64, DType.i32, DType.f32, DType.f16):
    for _n in (0, 1, 5):
        case(Op.iota, Iota(_n, _dt), [], lambda s, d: np.arange(s.length, dtype=_NP[s.dtype]),
             f"{_dt.value}-{_n}")
    case(Op.iota, Iota(B, _dt), [In(("b",))],  # the input only binds b
         lambda s, d: np.arange(d["b"], dtype=_NP[s.dtype]), f"{_dt.value}-sym")
case(Op.iota, Iota(B + 3), [In(("b",))], lambda s, d: np.arange(d["b"] + 3), "sym-expr")


def _scatter_ref(spec, dims, target, idx, values):
    """The writes one by one in the index's row-major order (the last replace wins)."""
    out = np.moveaxis(target.copy(), spec.axis, 0)
    rows = np.moveaxis(values, list(range(spec.axis, spec.axis + idx.ndim)),
                       list(range(idx.ndim))).reshape((-1,) + out.shape[1:])
    fn = {"replace": lambda a, v: v, "add": np.add, "mul": np.multiply,
          "max": np.maximum, "min": np.minimum}[spec.combine]
    if out.dtype == np.bool_:
        fn = {"add": np.logical_or, "mul": np.logical_and}.get(spec.combine, fn)
    for k, i in enumerate(idx.reshape(-1).astype(np.int64)):
        out[i] = fn(out[i], rows[k])
    return np.moveaxis(out, 0, spec.axis)


for _combine in ("replace", "add", "mul", "max", "min"):
    for _dt in (DType.f32, DType.f16, DType.i64, DType.i32, DType.u8, DType.bool):
        case(Op.scatter, Scatter(0, _combine),  # 6 writes into 4 rows: duplicates
             [In((4, 3), _dt), In((6,), DType.i64, integers(0, 4)), In((6, 3), _dt)],
             _scatter_ref, f"{_combine}-{_dt.value}-dups")
    case(Op.scatter, Scatter(1, _combine),
         [In((2, 5, 3)), In((2, 3), DType.i32, integers(0, 5)), In((2, 2, 3, 3))],
         _scatter_ref, f"{_combine}-axis1-i32-2d")
    case(Op.scatter, Scatter(2, _combine),
         [In((2, 3, 4)), In((), DType.i64, integers(0, 4)), In((2, 3))], _scatter_ref,
         f"{_combine}-last-scalar-idx")
    case(Op.scatter, Scatter(1, _combine), [In((2, 3)), In((0,), DType.i64), In((2, 0))],
         _scatter_ref, f"{_combine}-no-writes")
    case(Op.scatter, Scatter(1, _combine),
         [In(("b", 6)), In((4,), DType.i64, integers(0, 6)), In(("b", 4))], _scatter_ref,
         f"{_combine}-sym-target")
    case(Op.scatter, Scatter(0, _combine),
         [In((5, 2)), In(("b",), DType.i64, integers(0, 5)), In(("b", 2))], _scatter_ref,
         f"{_combine}-sym-index")


def _argsort(spec, dims, x):
    return torch.sort(torch.from_numpy(np.ascontiguousarray(x)), dim=spec.axis, stable=True,
                      descending=spec.descending).indices.numpy()


_TIES = choice([0.0, -0.0, 1.0, 2.0, np.inf, -np.inf, np.nan])  # ties, signed zeros and NaN
for _dt, _gen in ((DType.f32, _TIES), (DType.f64, _TIES), (DType.f16, _TIES),
                  (DType.i64, integers(-3, 4)), (DType.i32, integers(-3, 4)),
                  (DType.i16, integers(-3, 4)), (DType.i8, integers(-3, 4)),
                  (DType.u8, integers(0, 4)), (DType.bool, None)):
    for _desc in (False, True):
        case(Op.sort, Sort(1, _desc), [In((3, 7), _dt, _gen)], _argsort,
             f"{_dt.value}-{'desc' if _desc else 'asc'}")
case(Op.sort, Sort(0), [In((6,))], _argsort, "1d")
case(Op.sort, Sort(0), [In((0, 3))], _argsort, "empty-axis")
case(Op.sort, Sort(1), [In((0, 3))], _argsort, "empty-rows")
case(Op.sort, Sort(1, True), [In(("b", 5), DType.f32, _TIES)], _argsort, "sym-rows")
case(Op.sort, Sort(0), [In(("b", 2), DType.i64, integers(0, 3))], _argsort, "sym-axis")


# -- movement ---------------------------------------------------------------------------------

def _dim(value, dims):
    return evaluate(as_dim(value), dims)


case(Op.permute, Permute(()), [In(())], lambda s, d, x: x, "rank0", exact=True)
case(Op.permute, Permute((0,)), [In((3,))], lambda s, d, x: x, "rank1", exact=True)
for _perm in [(0, 1, 2), (2, 0, 1), (1, 0, 2), (2, 1, 0)]:
    for _shape in [(2, 3, 4), (1, 0, 3), ("b", 3, 1)]:
        for _dt in (DType.f32, DType.i64, DType.bool):
            case(Op.permute, Permute(_perm), [In(_shape, _dt)],
                 lambda s, d, x: np.transpose(x, s.perm), f"{_perm}-{_shape}-{_dt.value}",
                 exact=True)


def _group_ref(spec, dims, x):
    merged = int(np.prod(x.shape[spec.axis:spec.axis + spec.count], dtype=np.int64))
    return x.reshape(x.shape[:spec.axis] + (merged,) + x.shape[spec.axis + spec.count:])


for _spec, _shape in [(Group(0, 2), (2, 3, 4)), (Group(1, 2), (2, 3, 4)), (Group(0, 3), (2, 3, 4)),
                      (Group(1, 1), (2, 3, 4)), (Group(0, 2), (2, 0, 3)), (Group(0, 2), (1, 1)),
                      (Group(0, 2), ("b", 3, 4)), (Group(1, 2), (2, "b", 3))]:
    for _dt in (DType.f32, DType.f16, DType.bool):
        case(Op.group, _spec, [In(_shape, _dt)], _group_ref, f"{_spec}-{_shape}-{_dt.value}",
             exact=True)


def _ungroup_ref(spec, dims, x):
    sizes = [_dim(s, dims) for s in spec.sizes]
    return x.reshape(x.shape[:spec.axis] + tuple(sizes) + x.shape[spec.axis + 1:])


for _spec, _shape in [(Ungroup(0, (2, 3)), (6, 4)), (Ungroup(0, (2, -1)), (6, 4)),
                      (Ungroup(1, (1, 4, 1)), (6, 4)), (Ungroup(1, (-1, 2)), (3, 4)),
                      (Ungroup(0, (1, 1)), (1,)), (Ungroup(1, (0, 3)), (2, 0)),
                      (Ungroup(1, (3, 4)), ("b", 12)), (Ungroup(0, (B, 1)), ("b", 2)),
                      (Ungroup(0, (1, -1)), ("b", 2)), (Ungroup(1, (2, -1, 2)), ("b", 12))]:
    for _dt in (DType.f32, DType.i32):
        case(Op.ungroup, _spec, [In(_shape, _dt)], _ungroup_ref, f"{_spec}-{_shape}-{_dt.value}",
             exact=True)

for _axes, _shape in [((0, 2), (1, 3, 1)), ((0,), (1,)), ((), ()), ((), (2, 3)), ((1,), (0, 1)),
                      ((1,), ("b", 1, 3)), ((0, 1), (1, 1))]:
    for _dt in (DType.f32, DType.bool):
        case(Op.squeeze, Squeeze(_axes), [In(_shape, _dt)],
             lambda s, d, x: np.squeeze(x, axis=s.axes), f"{_axes}-{_shape}-{_dt.value}",
             exact=True)

for _axes, _shape in [((0,), ()), ((0, 1), ()), ((0, 2), (3,)), ((1,), (2, 3)), ((2,), (2, 3)),
                      ((0, 3), (0, 2)), ((1, 2), ("b", 3))]:
    for _dt in (DType.f32, DType.i64):
        case(Op.unsqueeze, Unsqueeze(_axes), [In(_shape, _dt)],
             lambda s, d, x: np.expand_dims(x, s.axes), f"{_axes}-{_shape}-{_dt.value}",
             exact=True)


def _slice_ref(spec, dims, x):
    index = [slice(None)] * x.ndim
    for a, start, stop, step in zip(spec.axes, spec.starts, spec.stops, spec.steps):
        index[a] = slice(_dim(start, dims), _dim(stop, dims), step)
    return x[tuple(index)]


for _spec, _shape in [(Slice((0,), (2,), (8,), (3,)), (10,)),
                      (Slice((0,), (0,), (10,), (1,)), (10,)),
                      (Slice((0,), (4,), (4,), (1,)), (10,)),
                      (Slice((0,), (9,), (10,), (5,)), (10,)),
                      (Slice((0, 1), (1, 0), (3, 6), (1, 2)), (4, 6)),
                      (Slice((1,), (0,), (1,), (1,)), (2, 1)),
                      (Slice((0,), (0,), (0,), (1,)), (0, 3)),
                      (Slice((0,), (1,), (B,), (1,)), ("b", 5)),
                      (Slice((0, 1), (0, 1), (B - 1, 5), (1, 2)), ("b", 5)),
                      (Slice((1,), (2,), (4,), (1,)), ("b", 5))]:
    for _dt in (DType.f32, DType.i64, DType.bool):
        case(Op.slice, _spec, [In(_shape, _dt)], _slice_ref, f"{_spec}-{_shape}-{_dt.value}",
             exact=True)


def _pad_ref(spec, dims, x):
    widths = [(_dim(lo, dims), _dim(hi, dims)) for lo, hi in spec.widths]
    if not widths:  # rank 0: nothing to pad (np.pad rejects an empty width list)
        return x
    value = spec.value if x.dtype.kind == "f" else (bool(spec.value) if x.dtype == np.bool_
                                                      else int(spec.value))
    return np.pad(x, widths, constant_values=value)


for _spec, _shape in [(Pad(((1, 2),)), (3,)), (Pad(((0, 1), (2, 0)), -1.5), (2, 3)),
                      (Pad(((0, 0), (0, 0))), (2, 3)), (Pad(((1, 1), (0, 0)), 7.0), (0, 3)),
                      (Pad((), 2.0), ()), (Pad(((2, 0),), 1.0), (1,)),
                      (Pad(((1, 0), (0, 2)), 3.0), ("b", 3)), (Pad(((0, B), (1, 1))), ("b", 2))]:
    for _dt in (DType.f32, DType.f16, DType.i64, DType.bool):
        case(Op.pad, _spec, [In(_shape, _dt)], _pad_ref, f"{_spec}-{_shape}-{_dt.value}",
             exact=True)

for _spec, _shape in [(Select(1, 2), (3, 4)), (Select(0, 0), (5,)), (Select(0, 0), (1, 3)),
                      (Select(2, 1), (2, 0, 3)), (Select(0, B - 1), ("b", 3)),
                      (Select(1, 0), ("b", 3))]:
    for _dt in (DType.f32, DType.i64, DType.bool):
        case(Op.select, _spec, [In(_shape, _dt)],
             lambda s, d, x: np.take(x, _dim(s.index, d), axis=s.axis),
             f"{_spec}-{_shape}-{_dt.value}", exact=True)


def _repeat_ref(spec, dims, x):
    shape = list(x.shape)
    for a, size in zip(spec.axes, spec.sizes):
        shape[a] = _dim(size, dims)
    return np.broadcast_to(x, shape).copy()


for _spec, _shape in [(Repeat((0,), (4,)), (1, 3)), (Repeat((1, 2), (3, 2)), (2, 1, 1)),
                      (Repeat((0,), (0,)), (1, 3)), (Repeat((0,), (1,)), (1,)),
                      (Repeat((), ()), (2, 3)), (Repeat((1,), (B,)), ("b", 1)),
                      (Repeat((0,), (B + 1,)), (1, 2))]:
    for _dt in (DType.f32, DType.i32, DType.bool):
        case(Op.repeat, _spec, [In(_shape, _dt)] + ([In(("b",))] if is_symbolic(_spec) and
                                                      "b" not in _shape else []),
             _repeat_ref, f"{_spec}-{_shape}-{_dt.value}", exact=True)


def _unfold_ref(spec, dims, x):
    length = x.shape[spec.axis]
    span = spec.dilation * (spec.size - 1) + 1
    n = (length - span) // spec.step + 1
    windows = [np.moveaxis(np.take(x, i * spec.step + np.arange(spec.size) * spec.dilation,
                                   axis=spec.axis), spec.axis, -1) for i in range(n)]
    return np.stack(windows, axis=spec.axis)


for _spec, _shape in [(Unfold(0, 3), (10,)), (Unfold(0, 3, 2, 2), (10,)),
                      (Unfold(1, 2, 3), (2, 7, 3)),
                      (Unfold(0, 1), (4, 2)), (Unfold(0, 4, 4), (8, 2)), (Unfold(0, 5), (5,)),
                      (Unfold(1, 2), (0, 3)), (Unfold(1, 3, 1, 2), (2, 9))]:
    for _dt in (DType.f32, DType.i64, DType.bool):
        case(Op.unfold, _spec, [In(_shape, _dt)], _unfold_ref, f"{_spec}-{_shape}-{_dt.value}",
             exact=True)
case(Op.unfold, Unfold(0, 3), [In(("b", 2))], _unfold_ref, "sym", bindings=({"b": 3}, {"b": 7}),
     exact=True)
case(Op.unfold, Unfold(1, 2, 2), [In((2, "b"))], _unfold_ref, "sym-step",
     bindings=({"b": 4}, {"b": 7}), exact=True)


def _fold_ref(spec, dims, x):
    x = np.moveaxis(x, spec.axis, -2)
    n, k = x.shape[-2:]
    out = np.zeros(x.shape[:-2] + (_dim(spec.length, dims),), dtype=x.dtype)
    for i in range(n):
        for j in range(k):
            out[..., i * spec.step + j * spec.dilation] += x[..., i, j]
    return np.moveaxis(out, -1, spec.axis)


for _spec, _shape in [(Fold(0, 1, 1, 6), (4, 3)), (Fold(1, 2, 1, 6), (2, 3, 2)),
                      (Fold(1, 2, 1, 8), (2, 3, 2)), (Fold(0, 1, 2, 9), (5, 3)),
                      (Fold(0, 3, 1, 6), (2, 3)), (Fold(0, 1, 1, 3), (3, 1)),
                      (Fold(1, 1, 1, 4), (2, 3, 2, 2)), (Fold(0, 1, 1, 2), (0, 3)),
                      (Fold(0, 1, 1, B + 2), ("b", 3)), (Fold(1, 1, 1, 5), ("b", 3, 3))]:
    for _dt in (DType.f32, DType.f64, DType.i64):
        case(Op.fold, _spec, [In(_shape, _dt)], _fold_ref, f"{_spec}-{_shape}-{_dt.value}")


# -- reduce -----------------------------------------------------------------------------------

_NP_REDUCE = {ReduceKind.sum: np.sum, ReduceKind.max: np.max, ReduceKind.min: np.min,
              ReduceKind.prod: np.prod}


def _reduce_ref(spec, dims, x):
    out = _NP_REDUCE[spec.kind](x.astype(np.float64) if x.dtype.kind == "f" else x,
                                axis=spec.axes)
    return np.asarray(out).astype(x.dtype)


for _kind in ReduceKind:
    for _axes, _shape in [((1,), (2, 3, 4)), ((0, 2), (2, 3, 4)), ((0, 1, 2), (2, 3, 4)),
                          ((), (2, 3)), ((), ()), ((0,), (1,)), ((0,), ("b", 4)),
                          ((1,), ("b", 4)), ((0, 1), ("b", 4))]:
        for _dt, _gen in ((DType.f32, uniform(-2, 2)), (DType.f64, uniform(-2, 2)),
                          (DType.f16, uniform(-1.5, 1.5)), (DType.i64, integers(-3, 4)),
                          (DType.i32, integers(-3, 4)), (DType.bool, None)):
            case(Op.reduce, Reduce(_kind, _axes), [In(_shape, _dt, _gen)], _reduce_ref,
                 f"{_kind.value}-{_axes}-{_shape}-{_dt.value}")
    case(Op.reduce, Reduce(_kind, (1,)), [In((2, 3), DType.f32, choice([1.0, np.inf, np.nan]))],
         _reduce_ref, f"{_kind.value}-inf-nan")
for _kind in (ReduceKind.sum, ReduceKind.prod):  # identities over an empty axis: 0 and 1
    for _dt in (DType.f32, DType.i64):
        case(Op.reduce, Reduce(_kind, (0,)), [In((0, 3), _dt)], _reduce_ref,
             f"{_kind.value}-empty-{_dt.value}")


# -- scan -------------------------------------------------------------------------------------

_NP_SCAN = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
_NP_SCAN_BOOL = {"add": np.logical_or, "mul": np.logical_and, "max": np.logical_or,
                 "min": np.logical_and}


def _scan_ref(spec, dims, x):
    """numpy's accumulate (NaN propagates through maximum/minimum, as torch's cummax)."""
    y = np.flip(x, spec.axis) if spec.reverse else x
    if x.dtype == np.bool_:
        y = _NP_SCAN_BOOL[spec.combine].accumulate(y, axis=spec.axis)
    else:
        wide = np.float64 if x.dtype.kind == "f" else x.dtype  # ints wrap in their dtype
        y = _NP_SCAN[spec.combine].accumulate(y.astype(wide), axis=spec.axis, dtype=wide)
    y = y.astype(x.dtype)
    return np.flip(y, spec.axis) if spec.reverse else y


for _combine in ("add", "mul", "max", "min"):
    for _dt in (DType.f32, DType.f64, DType.f16, DType.i64, DType.i32, DType.i8, DType.bool):
        _gen = nonzero(0.5, 1.5) if _combine == "mul" and _dt.is_float else None
        case(Op.scan, Scan(1, _combine), [In((2, 5), _dt, _gen)], _scan_ref,
             f"{_combine}-{_dt.value}")
    for _rev in (False, True):
        for _shape, _axis in [((4, 3), 0), ((3, 37), 1), ((6,), 0), ((2, 0), 1), ((1, 3), 0),
                              (("b", 4), 1)]:
            case(Op.scan, Scan(_axis, _combine, _rev), [In(_shape, DType.f32, nonzero(0.8, 1.25))],
                 _scan_ref, f"{_combine}-{_shape}-{_axis}-{'rev' if _rev else 'fwd'}")
    case(Op.scan, Scan(1, _combine, True), [In((2, 9), DType.i64)], _scan_ref,
         f"{_combine}-i64-rev")
    case(Op.scan, Scan(1, _combine), [In((3, 6), DType.f32, choice([1.0, 2.0, np.inf, -np.inf,
                                                                     np.nan]))],
         _scan_ref, f"{_combine}-inf-nan")
for _rev in (False, True):  # along a symbolic axis: ONNX's CumSum, else an ONNX Scan
    for _combine in ("add", "mul", "max", "min"):
        case(Op.scan, Scan(0, _combine, _rev), [In(("b", 3))], _scan_ref,
             f"{_combine}-sym-axis-{_rev}")


# -- sizes data decides -----------------------------------------------------------------------

for _shape in [(6,), (2, 3), ("b", 3), (0, 2), (3, 0)]:
    for _dt in (DType.bool, DType.f32, DType.i64):
        case(Op.nonzero, NonZero("nz"), [In(_shape, _dt, integers(-1, 2) if _dt is not DType.bool
                                            else None)],
             lambda s, d, x: np.argwhere(x), f"{_shape}-{_dt.value}")
for _dt in (DType.i64, DType.i32):
    case(Op.arange, Arange("n"), [In((), _dt, integers(0, 7))],
         lambda s, d, x: np.arange(int(x)), f"{_dt.value}", bindings=({}, {}))
case(Op.arange, Arange("n"), [In((), DType.i64, integers(0, 1))],
     lambda s, d, x: np.arange(int(x)), "zero")


from support import complex_cases  # noqa: E402,F401  (the complex values' cases join CASES)


# -- the one-node Program of a case, and its comparison --------------------------------------

def build(c: Case, pairs: bool = False) -> tdag.Program:
    """The case's op on its inputs; with ``pairs``, complex inputs and outputs cross the
    program's boundary as their (real, imaginary) pairs (``as_pairs``), as to_onnx needs."""
    b = Builder()
    xs = []
    for i, x in enumerate(c.ins):
        if pairs and x.dtype.is_complex:
            pair = b.input(f"x{i}", TensorType((*x.shape, 2), x.dtype.real))
            xs.append(bitcast(pair, x.dtype))
        else:
            xs.append(b.input(f"x{i}", TensorType(x.shape, x.dtype)))
    arity = tdag.deinops.REGISTRY[c.op].arity
    y = b.emit(c.op, c.spec, *xs[:arity], name="y")
    if pairs and y.dtype.is_complex:
        y = bitcast(y, y.dtype.real)
    return tdag.Program.from_tdag(b.build([y]))


def as_pairs(t: torch.Tensor) -> torch.Tensor:
    """A complex tensor's (real, imaginary) pairs; any other tensor itself."""
    return torch.view_as_real(t) if t.is_complex() else t


def compare(out: torch.Tensor, expected: np.ndarray, dtype: DType, exact: bool, what: str):
    expected = np.asarray(expected)
    got = out.numpy()
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    if (dtype.is_float or dtype.is_complex) and not exact:
        with np.errstate(all="ignore"):
            expected = expected.astype(_NP[dtype])  # round (or overflow) as the dtype would
        rtol, atol = _TOL[dtype]
        wide = np.complex128 if dtype.is_complex else np.float64
        np.testing.assert_allclose(got.astype(wide), expected.astype(wide),
                                   rtol=rtol, atol=atol, equal_nan=True, err_msg=what)
    else:
        assert got.dtype == _NP[dtype], what
        np.testing.assert_array_equal(got, expected.astype(_NP[dtype]), err_msg=what)
