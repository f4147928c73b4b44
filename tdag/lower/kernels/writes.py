"""Write kernels: ``bincount``, a count of each position an index names, added to a target;
``embedding_bag``, rows of a table gathered and reduced into bags.

The composition is a scatter-add of ones into an integer target (torch's ``bincount`` and
``histc`` front ends, ``writes_per_row``); torch's ``index_add`` reads an expanded tensor
of ones as its source, where ``torch.bincount`` counts in one pass over the index. Integer
counts are exact in any order, and an integer target wraps the same whether the ones are
added one by one or their count at once, so the kernel is exact. A weighted scatter-add
stays the primitive: on CPU ``index_add`` of the weights is faster than a weighted
``bincount`` (which also sums f16 and integers in f64).

``embedding_bag`` is ``tdag.ops.embedding_bag``: a bag number for every position (a count of
the offsets, a cumsum), a gather of the rows and a scatter into the bags, six passes and an
[n, dim] intermediate where torch's ``embedding_bag`` reduces each bag's rows as it reads
them (and ONNX, which has no such op, runs the composition).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from tdag import ops
from tdag.deinops import inplace
from tdag.deinops.primitive import Cost, traffic
from tdag.deinops.primitive import primitive
from tdag.deinops.scatter import Scatter
from tdag.errors import ShapeError, TdagError
from tdag.ir.batching import Refuse
from tdag.ir.symbols import as_dim, dims_equal, is_static, symbol
from tdag.ir.op import Op
from tdag.ir.record import NoSpec, Trait, has, record
from tdag.ir.types import DType, TensorType
from tdag.lower.kernels.common import decomposed_onnx
from tdag.lower.match import scalar
from tdag.ops import writes
from tdag.ops.nn.functional import BAG_MODES, embedding_bag

_INDEX = (DType.i64, DType.i32)


def _shape(spec, ins):
    target, index = ins
    if target.rank != 1 or not target.dtype.is_integer or index.dtype not in _INDEX:
        raise ShapeError(f"bincount: an integer vector and an i64/i32 index, got {target}, "
                         f"{index}")
    return target


def _eval(spec, xs, resolve):
    target, index = xs
    counts = torch.bincount(index.reshape(-1), minlength=target.shape[0])
    return (target + counts).to(target.dtype)


def _cost(spec, ins, out) -> Cost:
    return traffic(ins, out, ins[1].numel)  # one increment per index entry


def _torch(node, a, code):
    counts = f"torch.bincount({a[1]}.reshape(-1), minlength={a[0]}.shape[0])"
    if code.ctx.type(node.inputs[0]).dtype is not DType.i64:
        counts = f"{counts}.to({a[0]}.dtype)"
    return counts if scalar(code.ctx, node.inputs[0]) == 0 else f"{a[0]} + {counts}"


def _onnx(node, ins, g, cx):
    """ONNX has no count op: the scatter-add of ones it stands for."""
    ones = g.node("Expand", [g.const(1, node.type.dtype), g.node("Shape", [ins[1]])])
    stand_in = node.replace(op=Op.scatter, spec=Scatter(0, "add"))
    return record(Op.scatter).onnx(stand_in, [*ins, ones], g, cx)


def _jax(node, a, cx):
    return a[0].at[a[1].reshape(-1)].add(1)


primitive(Op.bincount, NoSpec, 2, _shape, _eval, _cost,
          "index_add reads a source of ones as long as the index; bincount counts the index "
          "in one pass",
          traits=Trait.KERNEL, batch=Refuse("counts along its only axis"), torch=_torch,
          onnx=_onnx, jax=_jax,
          decompose=lambda s, target, index: writes.scatter(target, index, 1, 0, "add"))


# -- histc -----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Histc:
    """torch.histc over the range [lo, hi] (lo < hi): ``bins`` counts in x's dtype."""

    bins: int
    lo: float
    hi: float


def _histc_shape(spec: Histc, ins):
    (x,) = ins
    if not x.dtype.is_float:
        raise ShapeError(f"histc: needs a float input, got {x}")
    if spec.bins < 1 or not spec.lo < spec.hi:
        raise ShapeError(f"histc: bins {spec.bins} over [{spec.lo}, {spec.hi}]: needs at "
                         "least one bin and lo < hi")
    return TensorType((spec.bins,), x.dtype)


def _histc_jax(node, a, cx):
    """The composition's arithmetic, in its order (a value on a bin's edge lands where
    tdag.run puts it)."""
    s, jnp, x = node.spec, cx.jnp, a[0].reshape(-1)
    lo, hi = jnp.asarray(s.lo, x.dtype), jnp.asarray(s.hi, x.dtype)
    index = jnp.floor((x - lo) * s.bins / (hi - lo)).astype(cx.dtype(DType.i64))
    index = jnp.where(x == hi, s.bins - 1, index)
    index = jnp.where((x >= lo) & (x <= hi), index, s.bins)
    return jnp.zeros((s.bins + 1,), x.dtype).at[index].add(1)[:s.bins]


primitive(Op.histc, Histc, 1, _histc_shape,
          lambda s, xs, r: torch.histc(xs[0], s.bins, s.lo, s.hi),
          lambda s, ins, out: traffic(ins, out, 6 * ins[0].numel),
          "a bin's index (subtract, scale, floor, the top edge), the range test and a "
          "scatter-add of ones: ten passes over the values and three bool tensors; histc "
          "makes one", traits=Trait.KERNEL,
          batch=Refuse("counts over the whole tensor: strip the batch before lowering"),
          torch=lambda node, a, code: f"torch.histc({a[0]}, {node.spec.bins}, "
                                      f"{node.spec.lo!r}, {node.spec.hi!r})",
          onnx=decomposed_onnx, jax=_histc_jax,
          decompose=lambda s, x: writes.histc(x, s.bins, s.lo, s.hi))


# -- bincount_sized ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BincountSized:
    """torch.bincount(x, minlength=minlength): ``length`` (a fresh symbol) is max(x) + 1, at
    least ``minlength``; a negative x is refused."""

    length: str
    minlength: int = 0

    @property
    def fresh(self) -> tuple[str, ...]:
        return (self.length,)

    def bounds(self, in_types) -> dict:
        return {}  # max(x) + 1: any value the data holds


def _sized_shape(spec: BincountSized, ins):
    (x,) = ins
    if x.rank != 1 or x.dtype is not DType.i64:
        raise ShapeError(f"bincount_sized: an i64 vector, got {x}")
    return TensorType((symbol(spec.length),), DType.i64)


def _sized_eval(spec: BincountSized, xs, resolve):
    (x,) = xs
    if x.numel() and int(x.min()) < 0:
        raise TdagError(f"bincount: x holds {int(x.min())}, the values must be >= 0")
    return torch.bincount(x, minlength=spec.minlength)


def _sized_cost(spec, ins, out) -> Cost:
    """torch.bincount's three passes over x: a min (no negative value), a max (the length)
    and an increment per entry."""
    return Cost(as_dim(3 * ins[0].numel), as_dim(3 * ins[0].nbytes), out.nbytes)


def _sized_onnx(node, ins, g, cx):
    """The composition: the length from ReduceMax (-1 where ReduceMin is negative, which
    ConstantOfShape refuses) and a ScatterElements count of ones."""
    from onnx import TensorProto, helper  # noqa: PLC0415  (onnx only where ONNX is emitted)
    x, low = ins[0], g.const(node.spec.minlength)
    length = low
    if not _empty(cx.type(node.inputs[0])):
        top = g.node("Add", [g.node("ReduceMax", [x], keepdims=0), g.const(1)])
        ok = g.node("GreaterOrEqual", [g.node("ReduceMin", [x], keepdims=0), g.const(0)])
        length = g.node("Where", [ok, g.node("Max", [top, low]), g.const(-1)])
    zeros = g.node("ConstantOfShape", [g.node("Reshape", [length, g.const([1])])],
                   value=helper.make_tensor("zero", TensorProto.INT64, [1], [0]))
    ones = g.node("Expand", [g.const(1), g.node("Shape", [x])])
    return g.node("ScatterElements", [zeros, x, ones], axis=0, reduction="add")


def _empty(t: TensorType) -> bool:
    return is_static(t.numel) and t.numel == 0


def _sized_jax(node, a, cx):
    """Runs eagerly only (``to_jax`` runs a TDAG with a fresh size without jit): the
    length is a concrete value."""
    (x,) = a
    if x.size and int(x.min()) < 0:
        raise TdagError(f"bincount: x holds {int(x.min())}, the values must be >= 0",
                        node=node.name, origin=node.origin)
    length = max(int(x.max()) + 1 if x.size else 0, node.spec.minlength)
    return cx.jnp.zeros((length,), cx.dtype(DType.i64)).at[x].add(1)


primitive(Op.bincount_sized, BincountSized, 1, _sized_shape, _sized_eval,
          _sized_cost,
          "bincount's length (a max and a check for negative values, two passes) and its "
          "count: torch.bincount finds the length as it counts, as eager does (its own min "
          "and max passes); five passes where eager makes three",
          traits=Trait.KERNEL | Trait.FRESH_SIZE,
          batch=Refuse("sizes its result by the largest value of every sample together"),
          torch=lambda node, a, code:
              f"torch.bincount({a[0]}, minlength={node.spec.minlength})",
          onnx=_sized_onnx, jax=_sized_jax,
          decompose=lambda s, x: writes.bincount(x, None, s.minlength, s.length))


# -- embedding_bag -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EmbeddingBag:
    """torch's ``embedding_bag`` of (weight, indices, offsets[, per_sample_weights]): bag b
    holds ``indices[offsets[b]:offsets[b + 1]]``; ``padding_idx`` entries are left out."""

    mode: str = "sum"
    include_last_offset: bool = False
    padding_idx: int | None = None


def _bag_shape(spec: EmbeddingBag, ins):
    weight, indices, offsets, *weights = ins
    if spec.mode not in BAG_MODES or weights and spec.mode != "sum":
        raise ShapeError(f"embedding_bag: mode {spec.mode!r} (per-sample weights in sum only)")
    if weight.rank != 2 or not weight.dtype.is_float or indices.rank != 1 or \
            offsets.rank != 1 or indices.dtype not in _INDEX or offsets.dtype not in _INDEX:
        raise ShapeError(f"embedding_bag: a float table and i64/i32 vectors, got {weight}, "
                         f"{indices}, {offsets}")
    if weights and (weights[0].dtype is not weight.dtype or weights[0].rank != 1 or
                    not dims_equal(weights[0].shape[0], indices.shape[0])):
        raise ShapeError(f"embedding_bag: per-sample weights {weights[0]} do not fit "
                         f"{indices} of {weight}")
    bags = as_dim(offsets.shape[0] - int(spec.include_last_offset))
    return TensorType((bags, weight.shape[1]), weight.dtype)


def _bag_eval(spec: EmbeddingBag, xs, resolve):
    weight, indices, offsets, *weights = xs
    return torch.nn.functional.embedding_bag(
        indices, weight, offsets, mode=spec.mode, per_sample_weights=weights[0] if weights
        else None, include_last_offset=spec.include_last_offset, padding_idx=spec.padding_idx)


def _bag_cost(spec: EmbeddingBag, ins, out) -> Cost:
    """One combine per gathered element (and a multiply where weighted, a divide per output
    element for a mean); the rows read are the gathered ones, not the table."""
    weight, indices, offsets, *weights = ins
    rows = as_dim(indices.shape[0] * weight.shape[1])
    flops = as_dim(rows * (1 + len(weights)) + (out.numel if spec.mode == "mean" else 0))
    read = as_dim(rows * weight.dtype.itemsize + sum(t.nbytes for t in ins[1:]))
    return Cost(flops, read, out.nbytes)


def _bag_torch(node, a, code):
    s = node.spec
    weights = f", per_sample_weights={a[3]}" if len(a) > 3 else ""
    return (f"torch.nn.functional.embedding_bag({a[1]}, {a[0]}, {a[2]}, mode={s.mode!r}"
            f"{weights}, include_last_offset={s.include_last_offset}, "
            f"padding_idx={s.padding_idx})")


def _bag_onnx(node, ins, g, cx):
    """The composition (ONNX has no embedding_bag): Gather, a bag number per position from
    a ScatterElements count of the offsets and a CumSum, and one ScatterND into the bags."""
    s, out_type = node.spec, node.type
    weight, indices, offsets = ins[:3]
    n, bags = cx.type(node.inputs[1]).shape[0], out_type.shape[0]
    indices, offsets = _i64(indices, node.inputs[1], g, cx), _i64(offsets, node.inputs[2], g, cx)
    rows = g.node("Gather", [weight, indices], axis=0)
    if len(ins) > 3:
        rows = g.node("Mul", [rows, g.node("Unsqueeze", [ins[3], g.const([1])])])
    starts = g.node("ScatterElements", [g.filled((as_dim(n + 1),), 0, DType.i64), offsets,
                                        g.node("Expand", [g.const(1), g.node("Shape", [offsets])])],
                    axis=0, reduction="add")
    bag = g.node("Sub", [g.node("CumSum", [g.node("Slice", [starts, g.const([0]), g.dim(n)]),
                                           g.const(0)]), g.const(1)])
    keep = g.node("And", [g.node("GreaterOrEqual", [bag, g.const(0)]),
                          g.node("Less", [bag, g.scalar_dim(bags)])])
    if s.padding_idx is not None:
        keep = g.node("And", [keep, g.node("Not", [g.node("Equal", [indices,
                                                                     g.const(s.padding_idx)])])])
    bag = g.node("Unsqueeze", [g.node("Where", [keep, bag, g.scalar_dim(bags)]), g.const([1])])
    shape = (as_dim(bags + 1), out_type.shape[1])
    dtype = out_type.dtype
    start = g.filled(shape, float("-inf") if s.mode == "max" else 0.0, dtype)
    out = g.node("ScatterND", [start, bag, rows], reduction="max" if s.mode == "max" else "add")
    if s.mode != "sum":
        count = g.node("ScatterND", [g.filled((as_dim(bags + 1), 1), 0.0, dtype), bag,
                                     g.node("Expand", [g.const(1.0, dtype),
                                                       g.node("Shape", [bag])])],
                       reduction="add")
        out = g.node("Where", [g.node("Greater", [count, g.const(0.0, dtype)]), out,
                               g.const(0.0, dtype)]) if s.mode == "max" else \
            g.node("Div", [out, g.node("Max", [count, g.const(1.0, dtype)])])
    return g.node("Slice", [out, g.const([0]), g.dim(bags)])


def _i64(x: str, name: str, g, cx) -> str:
    return x if cx.type(name).dtype is DType.i64 else g.cast(x, DType.i64)


def _bag_jax(node, a, cx):
    """The composition in jnp: a bag number per position, ``.at[bag].add/max`` of the rows."""
    s, jnp = node.spec, cx.jnp
    weight, indices, offsets = a[:3]
    n, bags = indices.shape[0], offsets.shape[0] - int(s.include_last_offset)
    starts = jnp.zeros((n + 1,), jnp.int32).at[offsets].add(1)
    bag = jnp.cumsum(starts[:n]) - 1
    keep = (bag >= 0) & (bag < bags)
    if s.padding_idx is not None:
        keep = keep & (indices != s.padding_idx)
    bag = jnp.where(keep, bag, bags)
    rows = jnp.take(weight, indices, axis=0)
    if len(a) > 3:
        rows = rows * a[3][:, None]
    if s.mode == "max":
        best = jnp.full((bags + 1, weight.shape[1]), -jnp.inf, weight.dtype).at[bag].max(rows)
        count = jnp.zeros((bags + 1,), jnp.int32).at[bag].add(1)
        return jnp.where(count[:bags, None] > 0, best[:bags], 0).astype(weight.dtype)
    out = jnp.zeros((bags + 1, weight.shape[1]), weight.dtype).at[bag].add(rows)[:bags]
    if s.mode == "mean":
        count = jnp.zeros((bags + 1,), jnp.int32).at[bag].add(1)[:bags]
        out = out / jnp.maximum(count, 1)[:, None].astype(weight.dtype)
    return out


primitive(Op.embedding_bag, EmbeddingBag, range(3, 5), _bag_shape, _bag_eval, _bag_cost,
          "a bag number per position (a count of the offsets and a cumsum), a gather of every "
          "row into an [n, dim] intermediate and a scatter into the bags: six passes, where "
          "embedding_bag reduces each bag's rows as it reads them",
          traits=Trait.KERNEL, batch=Refuse("reduces along its bags, which no axis holds"),
          torch=_bag_torch, onnx=_bag_onnx, jax=_bag_jax,
          decompose=lambda s, weight, indices, offsets, *weights: embedding_bag(
              weight, indices, offsets, s.mode, weights[0] if weights else None,
              s.include_last_offset, s.padding_idx))


# -- write_slice ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriteSlice:
    """``target`` with ``target[..., start:start + n, ...]`` along ``axis`` replaced by
    ``values`` (n their length there): torch's ``slice_scatter`` / ``select_scatter``,
    ``out[:, t] = h`` in a loop functionalized."""

    axis: int
    start: int


def _write_shape(spec: WriteSlice, ins):
    target, values = ins
    fits = values.rank == target.rank and values.dtype is target.dtype and \
        0 <= spec.axis < target.rank and all(
            dims_equal(a, b) for k, (a, b) in enumerate(zip(values.shape, target.shape))
            if k != spec.axis)
    n = values.shape[spec.axis] if fits else 0
    if not fits or spec.start < 0 or not is_static(n) or \
            (is_static(target.shape[spec.axis]) and spec.start + n > target.shape[spec.axis]):
        raise ShapeError(f"write_slice: values {values} do not fit {target} at {spec.start} "
                         f"along axis {spec.axis}")
    return target


def _write_eval(spec: WriteSlice, xs, resolve):
    target, values = xs
    return write_slice(target.clone(), spec.axis, spec.start, values)


def write_slice(target: torch.Tensor, axis: int, start: int, values: torch.Tensor):
    """``values`` copied into ``target``'s run at ``start`` along ``axis``; ``target``."""
    target.narrow(axis, start, values.shape[axis]).copy_(values)
    return target


def _write_cost(spec, ins, out) -> Cost:
    """A scatter's convention: the values read, the output written once (the copy of the
    target, which the torch module skips where the target dies here)."""
    return Cost(0, ins[1].nbytes, out.nbytes)


def _write_torch(node, a, code):
    s = node.spec
    fresh = f"_rt.write_slice({a[0]}.clone(), {s.axis}, {s.start}, {a[1]})"
    if not code.written_over(node):
        return fresh
    written = f"_rt.write_slice({a[0]}, {s.axis}, {s.start}, {a[1]})"
    return written if _saved_by_none(node, code) else inplace.in_place(fresh, written)


# ops whose backward keeps none of their result: a write into it breaks no gradient
_UNSAVED_RESULT = (Op.write_slice, Op.concat, Op.pad)


def _saved_by_none(node, code) -> bool:
    """Whether autograd can have saved the target for no backward, so the write may go in
    place while it records too (torch's CopySlices, as eager's ``out[:, t] = h``): only
    this write reads it (no view of it either), and its producer's backward needs no
    result. A scan's chain of writes then stays O(T x width) with gradients on."""
    target = node.inputs[0]
    producer = code.ctx.producer(target)
    return producer is not None and producer.op in _UNSAVED_RESULT and \
        code.ctx.single_use(target)


def _write_overwritten(node, code) -> tuple[str, ...]:
    """(target,) where the torch code may copy the values into the target itself: its own
    storage (a fresh tensor, not a view of one: an expand's elements share memory), read by
    nothing after, sharing none with the values."""
    target, values = node.inputs
    producer = code.ctx.producer(target)
    own = target in code.owned or (producer is not None and producer.op not in
                                   (Op.cast, Op.bitcast) and not has(producer.op, Trait.VIEW))
    if not own or code.root(target) != target or code.root(values) == target or \
            not code.may_overwrite(node, target):
        return ()
    return (target,)


def _write_onnx(node, ins, g, cx):
    """A ScatterElements of the values at their positions (an index as large as the values,
    each entry its position along the axis): onnxruntime writes it into the target's buffer
    where nothing reads the target after (a scan of 512 steps 18 ms, where a Concat of the
    target's runs copies all of it per step, 284 ms)."""
    s, rank = node.spec, cx.type(node.inputs[0]).rank
    n = cx.type(node.inputs[1]).shape[s.axis]
    positions = torch.arange(s.start, s.start + n).reshape(
        [n if k == s.axis else 1 for k in range(rank)])
    index = g.node("Expand", [g.const(positions), g.node("Shape", [ins[1]])])
    return g.node("ScatterElements", [ins[0], index, ins[1]], axis=s.axis)


def _write_jax(node, a, cx):
    return cx.lax.dynamic_update_slice_in_dim(a[0], a[1], node.spec.start, node.spec.axis)


def _write_decompose(spec: WriteSlice, target, values):
    stop = spec.start + values.shape[spec.axis]
    parts = [ops.slice(target, spec.axis, 0, spec.start), values,
             ops.slice(target, spec.axis, stop, target.shape[spec.axis])]
    return ops.concat([p for p in parts if not (is_static(p.shape[spec.axis]) and
                                                p.shape[spec.axis] == 0)], spec.axis)


primitive(Op.write_slice, WriteSlice, 2, _write_shape, _write_eval, _write_cost,
          "a concatenation copies every run of the target around the values; the write "
          "copies the values alone into a target nothing else reads (a scan's T steps "
          "O(T x width), not O(T^2 x width))",
          traits=Trait.KERNEL, batch=Refuse("is a write kernel whose spec names an axis: strip "
                                            "the batch before lowering"),
          torch=_write_torch, onnx=_write_onnx, jax=_write_jax, decompose=_write_decompose,
          in_place=_write_overwritten)
