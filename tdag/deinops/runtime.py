"""Sizes that only data decides: the ``nonzero`` and ``arange`` primitives.

A value whose size depends on data (the rows of ``nonzero``, a length read from a tensor with
``.item()`` or fed to an ONNX Reshape at run time) gets a *fresh* size symbol, what
torch.export calls an unbacked symbol. The op that makes such a value names the symbol in its
spec (``nonzero[count=nz0](%m) : i64[nz0,2]``), so the text form round-trips and the verifier
checks that each fresh symbol is defined by exactly one node and used only after it; these ops
have the trait ``FRESH_SIZE`` and their spec's ``fresh`` lists the symbols. The interpreter and
the torch code bind the symbol from the result's shape right after the node (``s_nz0 =
v.shape[0]``), the ONNX emitter reads it with ``Shape`` of the result where an op needs it;
every pass treats it like any other symbol. Cost stays symbolic in it, and
``tdag.cost(prog).bounds`` gives an upper bound where the op knows one (``nonzero`` of an
n-element tensor has at most n rows).

Two primitives suffice. ``nonzero`` makes a size from a mask; ``arange`` turns a scalar's
value into a size (``arange[n](%t)``: 0..t-1, and n == t): every other run-time size
(``x[:t]``, a Reshape to a shape tensor, an ONNX Range) is ordinary ops over that iota.
The rest are compositions (``tdag/ops/masking.py``, which also mints the fresh symbols):
``masked_select`` and ``x[mask]`` are nonzero + gather; ``unique`` is sort + compare +
nonzero + gather.

A node that uses a fresh symbol should read, directly or not, the node that defines it (a
gather of the nonzero rows, an add to the arange): then dead-code removal, extraction and
reordering keep the definer before its users without knowing about symbols.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag.deinops.codegen import dtype_expr
from tdag.deinops.primitive import Cost, primitive
from tdag.errors import ShapeError, TdagError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait, no_gradient
from tdag.ir.symbols import Dim, symbol
from tdag.ir.types import DType, TensorType


def _fresh_dim(name: str, what: str) -> Dim:
    if not isinstance(name, str):
        raise ShapeError(f"{what}: the fresh size must be a symbol name, got {name!r}")
    return symbol(name)


# -- nonzero ------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NonZero:
    count: str  # the fresh symbol: how many elements are nonzero

    @property
    def fresh(self) -> tuple[str, ...]:
        return (self.count,)

    def bounds(self, in_types) -> dict:
        """At most every element is nonzero."""
        return {self.count: in_types[0].numel}


def _nonzero_shape(spec: NonZero, ins):
    (x,) = ins
    return TensorType((_fresh_dim(spec.count, "nonzero"), x.rank), DType.i64)


def _nonzero_cost(spec, ins, out: TensorType) -> Cost:
    # one test per element; the rows written depend on the data (symbolic in the count)
    return Cost(ins[0].numel, ins[0].nbytes, out.nbytes)


def _nonzero_onnx(node, ins, g, cx):
    rows = g.node("Transpose", [g.node("NonZero", ins)], perm=[1, 0])
    if node.type.shape[1] != 0:
        return rows
    # onnxruntime reads a 0-d input as one element: (count, 1) where torch gives (count, 0)
    return g.node("Slice", [rows, g.const([0]), g.const([0]), g.const([1])])


primitive(Op.nonzero, NonZero, 1, _nonzero_shape, lambda s, xs, r: torch.nonzero(xs[0]),
          _nonzero_cost,
          "indices of the nonzero elements, in row-major order: the one op whose size data "
          "decides; from arange it would cost O(n x count) compares",
          traits=Trait.FRESH_SIZE,
          batch=Refuse("counts the nonzero elements of every sample together"),
          torch=lambda node, a, code: f"torch.nonzero({a[0]})", onnx=_nonzero_onnx,
          jax=lambda node, a, cx: cx.jnp.argwhere(a[0]).astype(cx.dtype(DType.i64)),
          vjp=no_gradient)


# -- arange of a run-time scalar ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Arange:
    length: str  # the fresh symbol: the scalar operand's value

    @property
    def fresh(self) -> tuple[str, ...]:
        return (self.length,)

    def bounds(self, in_types) -> dict:
        return {}  # any value the data holds


def _arange_shape(spec: Arange, ins):
    (t,) = ins
    if t.rank != 0 or t.dtype not in (DType.i64, DType.i32, DType.i16, DType.i8, DType.u8):
        raise ShapeError(f"arange: the length must be an integer scalar, got {t}")
    return TensorType((_fresh_dim(spec.length, "arange"),), DType.i64)


def _arange_eval(spec: Arange, xs, resolve):
    n = int(xs[0])
    if n < 0:  # a size, never a negative one: refuse rather than give an empty range
        raise TdagError(f"arange: the length of {spec.length} is {n}, a size must be >= 0")
    return torch.arange(n, device=xs[0].device)


def _arange_torch(node, a, code):
    # torch.arange refuses a negative end, as the interpreter does
    return f"torch.arange({a[0]}.item(), dtype={dtype_expr(DType.i64)}, device={a[0]}.device)"


def _arange_onnx(node, ins, g, cx):
    from onnx import TensorProto, helper  # noqa: PLC0415  (onnx only where ONNX is emitted)
    # ConstantOfShape fails on a negative size where Range would quietly give nothing
    n = g.node("Reshape", [g.cast(ins[0], DType.i64), g.const([1])])
    ones = g.node("ConstantOfShape", [n], value=helper.make_tensor("one", TensorProto.INT64,
                                                                     [1], [1]))
    return g.node("Sub", [g.node("CumSum", [ones, g.const(0)]), g.const(1)])


def _arange_jax(node, a, cx):
    """Runs eagerly only (``to_jax`` runs a TDAG with a fresh size without jit): the
    length is a concrete value."""
    n = int(a[0])
    if n < 0:
        raise TdagError(f"arange: the length is {n}, a size must be >= 0", node=node.name,
                        origin=node.origin)
    return cx.jnp.arange(n, dtype=cx.dtype(DType.i64))


primitive(Op.arange, Arange, 1, _arange_shape, _arange_eval,
          lambda s, ins, out: Cost(0, ins[0].nbytes, out.nbytes),
          "0..t-1 for a scalar t that data decides: the one way a tensor's value becomes a "
          "size (.item(), ONNX shapes given at run time); iota's length is known before",
          traits=Trait.FRESH_SIZE,
          batch=Refuse("turns one value into a size shared by every sample"),
          torch=_arange_torch, onnx=_arange_onnx, jax=_arange_jax, vjp=no_gradient)

