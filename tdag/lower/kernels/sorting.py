"""Order kernels: the framework's top-k (sorted values), its one-pass argmax/argmin and its
binary search (``searchsorted``).

``topk`` is the first k values of a stable sort along an axis (k the axis length: the
sorted values); values do not depend on how ties are ordered, so any framework's top-k
gives them. Its positions do: torch's top-k gives them where its first k + 1 values hold no
tie (``topk_positions``), a top-k of unique packed keys where they do. ``argmax``/``argmin``
give the first position of the extreme, NaN counting as both the max and the min (torch's
rule), one pass where the composition makes three. ``searchsorted`` is torch's binary search
itself, the one its composition (``tdag.ops.sorting.binary_search``) unrolls.
"""
from __future__ import annotations

from dataclasses import dataclass

import onnx
import torch

from tdag import ops
from tdag.deinops.primitive import Cost, traffic
from tdag.deinops.primitive import primitive
from tdag.deinops.scatter import scatter_rows
from tdag.deinops.sort import comparisons, onnx_order_key
from tdag.errors import ShapeError
from tdag.lower.kernels.common import decomposed_onnx
from tdag.ir.batching import AxisRule, Refuse, same_axis
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, is_static
from tdag.ir.types import DType, TensorType
from tdag.ops import sorting, writes

# -- top-k ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopK:
    """The first k values along ``axis`` of the stable sort, or (``indices``) their
    positions: ties by the lower position."""

    axis: int
    k: Dim
    largest: bool = True
    indices: bool = False


def _topk_shape(spec: TopK, ins):
    (x,) = ins
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"topk: axis {spec.axis} out of range for {x}")
    if spec.indices and x.dtype not in PACKED:
        raise ShapeError(f"topk: the positions of {x.dtype.value} values are a sort's")
    shape = list(x.shape)
    shape[spec.axis] = as_dim(spec.k)
    out = x.with_shape(shape)
    return TensorType(out.shape, DType.i64) if spec.indices else out


def _full(spec: TopK, x_shape) -> bool:
    return dims_equal(as_dim(spec.k), x_shape[spec.axis])


def _topk_eval(spec: TopK, xs, resolve):
    x = xs[0]
    order = torch.sort(x, dim=spec.axis, descending=spec.largest, stable=True).indices
    first = order.narrow(spec.axis, 0, resolve(spec.k))
    return first if spec.indices else x.gather(spec.axis, first)


def _topk_cost(spec: TopK, ins, out: TensorType) -> Cost:
    # a heap of k per row: n log2 k compares (the full sort: n log2 n)
    (x,) = ins
    return traffic(ins, out, as_dim(x.numel * comparisons(as_dim(spec.k))))


# the dtypes whose order fits 32 bits: their top-k positions come from a key packing the
# value's order and the position into one i64, unique, so that any top-k orders ties stably
PACKED = frozenset({DType.f32, DType.f16, DType.bf16, DType.i32, DType.i16, DType.i8, DType.u8,
                    DType.bool})


def topk_positions(x: torch.Tensor, k: int, dim: int, largest: bool) -> torch.Tensor:
    """The positions of the stable sort's first k along ``dim`` (ties by the lower position,
    NaN largest, as torch's ``sort(stable=True)``). ``torch.topk`` does not say how it orders
    ties; without equal values (or NaN) among its first k + 1 there are none to order and its
    positions are the answer. Otherwise, a top-k over ``_packed_key`` (unique keys)."""
    m = min(k + 1, x.shape[dim])
    if x.dtype != torch.bool and m > 0:
        top = torch.topk(x, m, dim, largest)
        v = top.values.movedim(dim, -1)
        if not bool((v[..., 1:] == v[..., :-1]).any() | v.isnan().any()):
            return top.indices.narrow(dim, 0, k)
    return torch.topk(_packed_key(x, dim, largest), k, dim, largest).indices


def _packed_key(x: torch.Tensor, dim: int, largest: bool) -> torch.Tensor:
    """(the value's order in 32 bits) << 32 | the position's rank, where a float's order is
    its bits with the negatives' magnitude bits flipped, after -0.0 is made 0.0 and every NaN
    the one positive NaN (larger than inf), as torch orders them."""
    order = x
    if x.is_floating_point():
        bits = torch.where(x.isnan(), torch.nan, x.float() + 0.0).view(torch.int32)
        order = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    n = x.shape[dim]
    pos = torch.arange(n, device=x.device).view(n, *[1] * (x.dim() - 1 - dim))
    return (order.long() << 32) | (n - 1 - pos if largest else pos)


def _topk_torch(node, a, code):
    s, x = node.spec, a[0]
    if s.indices:
        return f"_rt.topk_positions({x}, {code.dim(s.k)}, {s.axis}, {s.largest})"
    if _full(s, code.shape_of(node.inputs[0])):
        return f"torch.sort({x}, dim={s.axis}, descending={s.largest}).values"
    return f"torch.topk({x}, {code.dim(s.k)}, dim={s.axis}, largest={s.largest}).values"


def _topk_onnx(node, ins, g, cx):
    x, back = onnx_order_key(g, ins[0], cx.type(node.inputs[0]).dtype)
    k = g.node("Reshape", [g.scalar_dim(node.spec.k), g.const([1])])
    values, index = g.node("TopK", [x, k], axis=node.spec.axis,
                           largest=int(node.spec.largest), sorted=1, outputs=2)
    # onnxruntime orders ties by the lower index, as the spec says
    return index if node.spec.indices else back(values)


def _topk_jax(node, a, cx):
    # jnp's sort, then the first k: NaN ordered as torch (lax.top_k's NaN order is not stated)
    s = node.spec
    if s.indices:
        out = cx.jnp.argsort(a[0], axis=s.axis, stable=True, descending=s.largest)
        out = out.astype(cx.dtype(DType.i64))
    else:
        out = cx.jnp.sort(a[0], axis=s.axis, descending=s.largest)
    return cx.lax.slice_in_dim(out, 0, cx.resolve(s.k), axis=s.axis)


_TOPK_BATCH = AxisRule(
    lambda s, t: {s.axis}, same_axis,
    lambda s, t, p: TopK(s.axis - (p < s.axis), s.k, s.largest, s.indices),
    lambda s: TopK(s.axis + 1, s.k, s.largest, s.indices), mixing="sorts along the batch axis")

primitive(Op.topk, TopK, 1, _topk_shape, _topk_eval, _topk_cost,
          "sort, then gather the values at the first k positions: a sort of the whole row "
          "(n log n), an index pass and a gather, where top-k keeps a heap of k (n log k)",
          traits=Trait.KERNEL, batch=_TOPK_BATCH, torch=_topk_torch, onnx=_topk_onnx,
          jax=_topk_jax,
          decompose=lambda s, x: sorting.topk(x, s.k, s.axis, s.largest)[s.indices])


# -- argmax / argmin --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arg:
    axis: int


def _arg_shape(spec: Arg, ins):
    (x,) = ins
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"arg extreme: axis {spec.axis} out of range for {x}")
    if x.dtype is DType.bool:
        raise ShapeError("arg extreme: torch has no argmax/argmin of bool")
    return TensorType(tuple(d for i, d in enumerate(x.shape) if i != spec.axis), DType.i64)


def _arg_cost(spec, ins, out: TensorType) -> Cost:
    return traffic(ins, out, ins[0].numel)


def _arg_onnx(kind: str):
    def emit(node, ins, g, cx):
        """ArgMax/ArgMin (first index) ignore NaN where torch returns the first NaN. The
        guard (each row's first NaN where it holds one) costs more than the ArgMax itself,
        so it runs under an If on the whole tensor's sum being NaN: one cheap pass where no
        NaN is present (an inf - inf sum only sends an exact input down the guarded path)."""
        axis, x = node.spec.axis, ins[0]
        found = g.node(kind, [x], axis=axis, keepdims=0, select_last_index=0)
        if not cx.type(node.inputs[0]).dtype.is_float or _never_nan(node.inputs[0], cx):
            return found
        guarded, plain = g.child(), g.child()
        outs = (guarded.node("Where", _nan_guard(guarded, x, axis, found)),
                plain.node("Identity", [found]))
        infos = [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.INT64, None)
                 for o in outs]
        any_nan = g.node("IsNaN", [g.node("ReduceSum", [x], keepdims=0)])
        return g.node("If", [any_nan], then_branch=guarded.graph(g.names("nan"), [], infos[:1]),
                      else_branch=plain.graph(g.names("no_nan"), [], infos[1:]))
    return emit


def _nan_guard(g, x: str, axis: int, found: str) -> list[str]:
    """Where's operands: each row's first NaN position where the row holds one, else
    ``found``."""
    nan = g.cast(g.node("IsNaN", [x]), DType.u8)
    first_nan = g.node("ArgMax", [nan], axis=axis, keepdims=0, select_last_index=0)
    any_nan = g.node("ReduceMax", [nan, g.const([axis])], keepdims=0)
    return [g.cast(any_nan, DType.bool), first_nan, found]


def _never_nan(name: str, cx) -> bool:
    """Whether ``name`` is a tree_sum whose constant leaves are finite and whose sum over
    its trees cannot overflow to an infinity (so never reach inf - inf): a forest's scores,
    which hold no NaN whatever the rows, so the argmax needs no NaN guard."""
    forest = cx.ctx.made(name, Op.tree_sum)
    leaves = None if forest is None else cx.ctx.weight(forest.inputs[6])
    trees = None if forest is None else cx.type(forest.inputs[5]).shape[0]
    if leaves is None or leaves.value is None or not isinstance(trees, int):
        return False
    bound = leaves.value.double().abs().amax() * trees
    return bool(bound.isfinite()) and float(bound) < float(torch.finfo(torch.float32).max)


_ARG_BATCH = AxisRule(
    lambda s, t: {s.axis}, lambda s, t, p: p - (p > s.axis),
    lambda s, t, p: Arg(s.axis - (p < s.axis)), lambda s: Arg(s.axis + 1),
    mixing="finds an extreme along the batch axis")

for _op, _fn, _kind in ((Op.argmax, "argmax", "ArgMax"), (Op.argmin, "argmin", "ArgMin")):
    primitive(_op, Arg, 1, _arg_shape,
              lambda s, xs, r, fn=_fn: getattr(torch, fn)(xs[0], s.axis), _arg_cost,
              f"max, compare and min over positions make three passes; {_fn} makes one",
              traits=Trait.KERNEL, batch=_ARG_BATCH,
              torch=lambda node, a, code, fn=_fn: f"torch.{fn}({a[0]}, {node.spec.axis})",
              onnx=_arg_onnx(_kind),
              jax=lambda node, a, cx, fn=_fn: getattr(cx.jnp, fn)(a[0], axis=node.spec.axis),
              decompose=lambda s, x, fn=_fn: getattr(ops, fn)(x, s.axis))


# -- searchsorted -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SearchSorted:
    """Each value's insertion point among the boundaries: the first i with b[i] >= v (> with
    ``right``) as ATen's binary search finds it (``binary_search``)."""

    right: bool = False


def _search_shape(spec: SearchSorted, ins):
    b, v = ins
    if b.rank == 0 or not is_static(b.shape[-1]) or b.dtype != v.dtype or \
            b.dtype is DType.bool:
        raise ShapeError(f"searchsorted: static boundaries and values of one number dtype, "
                         f"got {b}, {v}")
    if b.rank > 1 and (v.rank != b.rank or
                       not all(dims_equal(x, y) for x, y in zip(b.shape[:-1], v.shape[:-1]))):
        raise ShapeError(f"searchsorted: boundaries {b} and values {v} differ off the last axis")
    return TensorType(v.shape, DType.i64)


def _search_cost(spec: SearchSorted, ins, out: TensorType) -> Cost:
    # the loop's most trips: one comparison per bit of m, per value
    b, v = ins
    return traffic(ins, out, as_dim(v.numel * int(b.shape[-1]).bit_length()))


def _search_jax(node, a, cx):
    """The composition's steps: ``jnp.searchsorted`` orders NaN as the largest value, where
    torch's search moves right past a NaN wherever it meets one."""
    (b, v), jnp = a, cx.jnp
    m, i64 = b.shape[-1], cx.dtype(DType.i64)
    lo, size = jnp.zeros(v.shape, i64), jnp.full(v.shape, m, i64)
    table = jnp.concatenate([b, b[..., :1]], -1)
    for _ in range(m.bit_length()):
        half = size // 2
        mid = lo + half
        at = table[mid] if b.ndim == 1 else jnp.take_along_axis(table, mid, -1)
        stop = at > v if node.spec.right else at >= v
        go = ~stop & (size > 0)
        lo, size = jnp.where(go, mid + 1, lo), jnp.where(go, size - half - 1, half)
    return lo


primitive(Op.searchsorted, SearchSorted, 2, _search_shape,
          lambda s, xs, r: torch.searchsorted(xs[0], xs[1], right=s.right), _search_cost,
          "the binary search unrolled makes ~13 elementwise passes and a gather per bit of "
          "the boundaries' length (n log m each); torch.searchsorted makes one",
          traits=Trait.KERNEL, batch=Refuse("searches each sample's values in its boundaries"),
          torch=lambda node, a, code: f"torch.searchsorted({a[0]}, {a[1]}, "
                                      f"right={node.spec.right})",
          onnx=decomposed_onnx, jax=_search_jax,
          decompose=lambda s, b, v: sorting.binary_search(b, v, s.right))


# -- reads and writes along a sort's permutation ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Along:
    """torch's ``gather`` / ``scatter`` along ``axis`` with an i64 index shaped as x: each
    row's own positions, in range. Lowering makes them only where the index is a sort's
    permutation along ``axis`` (top-p's sorted logits, and its mask sent back): in range,
    each position once, so no duplicate is ever written."""

    axis: int


def _along_check(op: str, spec: Along, x: TensorType, index: TensorType) -> None:
    if not 0 <= spec.axis < x.rank or index.dtype is not DType.i64 or index.rank != x.rank \
            or not all(dims_equal(a, b) for a, b in zip(x.shape, index.shape)):
        raise ShapeError(f"{op}: an i64 index shaped as {x} along axis {spec.axis}, got {index}")


def _take_shape(spec: Along, ins):
    _along_check("take_along", spec, *ins)
    return ins[0]


def _put_shape(spec: Along, ins):
    target, index, values = ins
    _along_check("put_along", spec, target, index)
    if values != target:
        raise ShapeError(f"put_along: values {values} do not fit the target {target}")
    return target


def _put_eval(spec: Along, xs, resolve):
    """The flat scatter the rule replaces (the last duplicate wins, as ``scatter_rows``):
    each row's positions moved to the end and offset by the row's start."""
    target, index, values = (x.movedim(spec.axis, -1) for x in xs)
    n = target.shape[-1]
    rows = torch.arange(target.numel() // max(n, 1)).view(*target.shape[:-1], 1) * n
    out = scatter_rows(target.reshape(-1), 0, (rows + index).reshape(-1), values.reshape(-1),
                       "replace")
    return out.reshape(target.shape).movedim(-1, spec.axis)


def _put_jax(node, a, cx):
    return cx.jnp.put_along_axis(a[0], a[1], a[2], node.spec.axis, inplace=False)


_ALONG_BATCH = Refuse("reads or writes rows by a permutation: strip the batch before lowering")

primitive(Op.take_along, Along, 2, _take_shape,
          lambda s, xs, r: xs[0].gather(s.axis, xs[1]),
          lambda s, ins, out: Cost(0, as_dim(ins[1].nbytes + out.nbytes), out.nbytes),
          "row offsets added to the index and a gather from the flattened tensor: an index "
          "pass and a random read over all of it, where torch.gather reads each row's own",
          traits=Trait.KERNEL, batch=_ALONG_BATCH,
          torch=lambda node, a, code: f"{a[0]}.gather({node.spec.axis}, {a[1]})",
          onnx=lambda node, ins, g, cx: g.node("GatherElements", ins, axis=node.spec.axis),
          jax=lambda node, a, cx: cx.jnp.take_along_axis(a[0], a[1], node.spec.axis),
          decompose=lambda s, x, index: writes.take_along(x, s.axis, index))

primitive(Op.put_along, Along, 3, _put_shape, _put_eval,
          lambda s, ins, out: Cost(0, as_dim(ins[1].nbytes + ins[2].nbytes), out.nbytes),
          "row offsets added to the index and a flat scatter, which orders duplicate writes "
          "(a scatter of the write numbers and a gather, over all of it) where a "
          "permutation has none: torch.scatter writes each row's own",
          traits=Trait.KERNEL, batch=_ALONG_BATCH,
          torch=lambda node, a, code: f"{a[0]}.scatter({node.spec.axis}, {a[1]}, {a[2]})",
          onnx=lambda node, ins, g, cx: g.node("ScatterElements", ins, axis=node.spec.axis),
          jax=_put_jax,
          decompose=lambda s, target, index, values: writes.write(
              target, writes.element_positions(target, s.axis, index), values))
