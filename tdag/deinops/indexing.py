"""Indexing and generator primitives."""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tdag.deinops.codegen import dtype_expr
from tdag.deinops.movement import Group, Permute, Squeeze
from tdag.deinops.primitive import Cost, primitive
from tdag.errors import ShapeError
from tdag.ir.batching import (
    Affine,
    Aligned,
    Batched,
    Folded,
    Mixes,
    OperandRule,
    SampleCount,
    divide,
    nonnegative,
)
from tdag.ir.op import Op
from tdag.ir.record import Trait, no_gradient
from tdag.ir.symbols import Dim, as_dim, dims_equal, format_dim, is_static
from tdag.ir.types import DType, TensorType, check_dim


@dataclass(frozen=True, slots=True)
class Gather:
    axis: int


def _gather_shape(spec: Gather, ins):
    table, index = ins
    if not 0 <= spec.axis < table.rank:
        raise ShapeError(f"gather: axis {spec.axis} out of range for {table}")
    if index.dtype not in (DType.i64, DType.i32):
        raise ShapeError(f"gather: index must be i64 or i32, got {index.dtype.value}")
    return table.with_shape(table.shape[:spec.axis] + index.shape + table.shape[spec.axis + 1:])


def _gather_eval(spec: Gather, xs, resolve):
    table, index = xs
    picked = table.index_select(spec.axis, index.reshape(-1).long())
    return picked.reshape(*table.shape[:spec.axis], *index.shape, *table.shape[spec.axis + 1:])


def _gather_cost(spec, ins, out: TensorType) -> Cost:
    # only the picked rows of the table are read
    return Cost(0, as_dim(ins[1].nbytes + out.nbytes), out.nbytes)


_BOTH_BATCHED = "looks up every sample's indices in every sample's table"


def _gather_strip(spec: Gather, in_types, states, facts) -> tuple:
    """Batched indices pick the same rows for every sample; a table batched off the gathered
    axis is looked up per sample; one batched on it is gathered across samples, unless the
    index is the sample's own rows (``_own_rows``)."""
    table, index = states
    if facts[1].stride:
        return _own_rows(spec, table, index, facts[1])
    if table is not None and index is not None:
        raise Mixes(_BOTH_BATCHED)
    if index is not None:  # the index axes replace the gathered axis
        return spec, replace(index, axis=spec.axis + index.axis)
    p = table.axis
    if p == spec.axis:
        raise Mixes("gathers along the batch axis")
    out = p if p < spec.axis else p + in_types[1].rank - 1
    if isinstance(table, Batched):  # a Folded axis stays (shorter), so the spec stays too
        spec = Gather(spec.axis - (p < spec.axis))
    return spec, replace(table, axis=out)


def _own_rows(spec: Gather, table, index, fact: Affine) -> tuple:
    """A table with the batch folded into the gathered axis (``inner`` rows per sample, as
    torch flattens positions repeated over the batch), indexed by ``inner * i + j`` with
    ``0 <= j < inner`` (i the sample index): each sample looks up ``j`` in its own rows.
    The index may hold the batch folded too (DeBERTa's take-along over ``[batch * heads,
    q, k]``): the output holds it as the index does."""
    own = (isinstance(table, Folded) and table.axis == spec.axis
           and dims_equal(fact.stride, table.inner) and fact.lo is not None
           and fact.hi is not None and nonnegative(fact.lo)
           and nonnegative(table.inner - 1 - fact.hi))
    if not own or index is None:
        rows = f"[0, {format_dim(table.inner)})" if isinstance(table, Folded) else "its rows"
        raise Mixes("looks up an index computed from the sample index (an arange over the "
                    "batch) outside the sample's own rows: "
                    f"{format_dim(fact.stride)} * sample + j with j in "
                    f"[{_bound(fact.lo)}, {_bound(fact.hi)}], not provably within {rows}")
    return spec, replace(index, axis=spec.axis + index.axis)


def _bound(x: Dim | None) -> str:
    return "?" if x is None else format_dim(x)


def _gather_values(spec: Gather, facts, batch, types) -> Affine | None:
    """The table's values (its bounds); the index's stride is _gather_strip's business."""
    table = facts[0]
    return None if table.stride else Affine(0, table.lo, table.hi)


def _gather_insert(spec: Gather, in_types, batched) -> tuple:
    """A batch axis 0 of the table moves the gathered axis on; one of the indices lands at
    the gathered axis, where the index axes go. Both batched (each sample looks up its own
    indices in its own table): the batch folds into the gathered axis, as torch flattens
    it, and each sample's indices move on by its rows, ``n * i`` (``_own_rows`` read back)."""
    table, index = batched
    if not (table and index):
        return (Gather(spec.axis + 1), 0, None) if table else (spec, spec.axis, None)
    n = in_types[0].shape[spec.axis]
    perm = tuple(range(1, spec.axis + 1)) + (0,) + tuple(range(spec.axis + 1,
                                                               in_types[0].rank + 1))
    fold = ((Op.permute, Permute(perm)),) if spec.axis else ()
    return spec, spec.axis, ((fold + ((Op.group, Group(spec.axis, 2)),), 0), ((), n))


def _gather_torch(node, a, code):
    axis = node.spec.axis
    table_rank = node.type.rank - code.rank(node.inputs[1]) + 1
    if axis == 0 and table_rank == 2:  # rows of a matrix: an embedding lookup
        return f"F.embedding({a[1]}, {a[0]})"
    return f"{a[0]}[{', '.join([':'] * axis + [a[1]])}]"


def _gather_onnx(node, ins, g, cx):
    return g.node("Gather", ins, axis=node.spec.axis)


def _gather_jax(node, a, cx):
    table, index = a
    if table.shape[node.spec.axis] == 0:  # no index is valid: traced only where it never
        return cx.jnp.zeros(cx.shape(node.type.shape), table.dtype)  # runs (a scan of no trips)
    # clip: an index past the table reads its edge (torch raises; jit cannot)
    return cx.jnp.take(table, index, axis=node.spec.axis, mode="clip")


def _gather_vjp(spec: Gather, xs, y, dy, ops):
    """The mirror: the cotangent's rows scatter-added back to where they were read."""
    table, index = xs
    zeros = ops.zeros(table.shape, table.dtype, like=table)
    return ops.scatter(zeros, index, dy, spec.axis, "add"), None


primitive(Op.gather, Gather, 2, _gather_shape, _gather_eval, _gather_cost,
          "takes rows by index (embeddings); one-hot x table costs O(vocab) more",
          traits=Trait.PICKS,
          batch=OperandRule(_gather_strip, _gather_insert, values=_gather_values),
          torch=_gather_torch, onnx=_gather_onnx, jax=_gather_jax, vjp=_gather_vjp,
          complex_half=True)  # index_select and indexing take complex32 (torch.gather not)


@dataclass(frozen=True, slots=True)
class Iota:
    length: Dim
    dtype: DType = DType.i64


def _iota_shape(spec: Iota, ins):
    return TensorType((check_dim(spec.length, "iota: the length"),), spec.dtype)


def _iota_torch(node, a, code):
    return (f"torch.arange({code.dim(node.spec.length)}, dtype={dtype_expr(node.spec.dtype)}, "
            f"device={code.device})")


def _iota_onnx(node, ins, g, cx):
    out = g.node("Range", [g.const(0), g.scalar_dim(node.spec.length), g.const(1)])
    return out if node.spec.dtype is DType.i64 else g.cast(out, node.spec.dtype)


def _iota_values(spec: Iota, facts, batch, types) -> Affine:
    """0 .. length-1; an iota over a symbolic batch is the sample index (``_iota_sample``),
    one over ``k`` times it counts ``k`` positions per sample: ``k * i + j``."""
    k = _per_sample(spec, batch)
    if k is not None:
        return Affine(k, 0, k - 1)
    return Affine(0, 0, as_dim(spec.length - 1))


def _iota_sample(spec: Iota, target, batch: Dim) -> tuple | None:
    """Per sample, ``arange(batch)`` is ``i = 1 * i + 0``: the per-sample part is a 0; the
    flat row numbers ``arange(k * batch)`` of a take-along over ``[batch * heads, ...]``
    are ``k * i + j``, folded (``k`` per sample): the per-sample part is ``arange(k)``."""
    k = _per_sample(spec, batch)
    if isinstance(target, Folded):
        return ((Op.iota, Iota(k, spec.dtype)),) if k and dims_equal(target.inner, k) else None
    return ((Op.iota, Iota(1, spec.dtype)), (Op.squeeze, Squeeze((0,)))) if k == 1 else None


def _per_sample(spec: Iota, batch: Dim) -> int | None:
    """``k`` where the iota counts ``k`` positions per sample (its length is ``k`` times the
    batch), else None. A symbolic length says it counts samples; iota(3) at a static batch
    of 3 may be three positions, read as samples only where strip_batch says so
    (SampleCount), and iota(6) is read as positions (at a batch of 2, so may be arange(q))."""
    if is_static(batch):
        return 1 if isinstance(batch, SampleCount) and spec.length == batch else None
    k = divide(spec.length, batch)
    return k if k is not None and is_static(k) and k > 0 else None


primitive(Op.iota, Iota, 0, _iota_shape,
          lambda s, xs, r: torch.arange(r(s.length), dtype=s.dtype.torch),
          lambda s, ins, out: Cost(0, 0, out.nbytes),
          "0, 1, ..., n-1 for a symbolic n (positions, masks); a const cannot be symbolic",
          # no operands, so never batched: the walkers copy it, except an iota over a
          # symbolic batch, the sample index
          traits=Trait.NONE, batch=Aligned(values=_iota_values, broadcast=_iota_sample),
          torch=_iota_torch, onnx=_iota_onnx,
          jax=lambda node, a, cx: cx.jnp.arange(cx.resolve(node.spec.length),
                                                dtype=cx.dtype(node.spec.dtype)),
          vjp=no_gradient)
