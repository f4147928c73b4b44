"""The write primitive: ``scatter``, gather's mirror.

``scatter[axis, combine](target, index, values)`` writes row ``values[..., k, ...]`` (the
index's axes in the target's ``axis`` place, exactly gather's output shape) at target
position ``index[k]`` along ``axis``, combined with what is there: ``replace``, ``add``,
``mul``, ``max`` or ``min``, the target's own value included (torch's
``index_reduce(include_self=True)``); so ``gather(scatter(z, i, v), i) == v`` where ``i``
holds distinct positions. Every index is in ``[0, target.shape[axis])``: the front ends wrap
negatives and check the range as their framework does.

Duplicates under ``replace``: the last in the index's row-major order wins. No framework
promises an order (torch's CPU kernels happen to keep it; ONNX ScatterND and XLA leave it
undefined), so every emitter first makes each duplicate write the last one's row
(``last_writes``): then any order gives the same result. NaN propagates through ``max`` and
``min`` as torch's ``index_reduce`` does. A bool target reads ``add`` as or and ``mul`` as
and (torch's sum cast back to bool).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from tdag.deinops.primitive import Cost, primitive
from tdag.errors import ShapeError
from tdag.ir.batching import Affine, Batched, Folded, Mixes, OperandRule, nonnegative
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import as_dim, dims_equal, shapes_equal
from tdag.ir.types import DType, TensorType

COMBINES = ("replace", "add", "mul", "max", "min")


@dataclass(frozen=True, slots=True)
class Scatter:
    axis: int
    combine: str = "replace"


def values_shape(target: TensorType, index: TensorType, axis: int) -> tuple:
    """The shape of the values a scatter writes: gather's output shape."""
    return target.shape[:axis] + index.shape + target.shape[axis + 1:]


def _scatter_shape(spec: Scatter, ins):
    target, index, values = ins
    if spec.combine not in COMBINES:
        raise ShapeError(f"scatter: combine {spec.combine!r} is not one of {COMBINES}")
    if not 0 <= spec.axis < target.rank:
        raise ShapeError(f"scatter: axis {spec.axis} out of range for {target}")
    if index.dtype not in (DType.i64, DType.i32):
        raise ShapeError(f"scatter: index must be i64 or i32, got {index.dtype.value}")
    expected = values_shape(target, index, spec.axis)
    if values.dtype is not target.dtype or not shapes_equal(values.shape, expected):
        raise ShapeError(f"scatter: values {values} do not fit target {target} at index "
                         f"{index} along axis {spec.axis} (expected shape {list(expected)})")
    return target


# -- the one eager implementation: the evaluator, and the generated torch code's runtime -----

_TORCH_REDUCE = {"mul": "prod", "max": "amax", "min": "amin"}
_BOOL_COMBINE = {"add": "max", "mul": "min"}  # or, and


def scatter_rows(target: torch.Tensor, axis: int, index: torch.Tensor, values: torch.Tensor,
                 combine: str) -> torch.Tensor:
    """tdag's scatter in torch: ``index_copy`` / ``index_add`` / ``scatter_reduce``."""
    index, values = _flat_writes_torch(target, axis, index, values)
    if combine == "replace":
        return target.index_copy(axis, index, _replacing_rows(target, axis, index, values))
    if target.dtype == torch.bool:
        out = scatter_rows(target.to(torch.uint8), axis, index, values.to(torch.uint8),
                           _BOOL_COMBINE.get(combine, combine))
        return out.bool()
    if combine == "add":
        return target.index_add(axis, index, values)
    return target.scatter_reduce(axis, _spread(target, axis, index, values), values,
                                 _TORCH_REDUCE[combine])


def scatter_rows_(target: torch.Tensor, axis: int, index: torch.Tensor, values: torch.Tensor,
                  combine: str) -> torch.Tensor:
    """``scatter_rows`` written into ``target`` (``index_copy_``, as torch's static KV cache
    writes itself): the generated code calls it where nothing reads the target after it
    (``scatter_overwritten``), so a cache step holds no second copy of its cache."""
    index, values = _flat_writes_torch(target, axis, index, values)
    if combine == "replace":
        return target.index_copy_(axis, index, _replacing_rows(target, axis, index, values))
    if combine == "add":
        return target.index_add_(axis, index, values)
    return target.scatter_reduce_(axis, _spread(target, axis, index, values), values,
                                  _TORCH_REDUCE[combine])


def _flat_writes_torch(target, axis: int, index, values) -> tuple:
    """(the index flat as int64, the values with its axes merged into one)."""
    index = index.reshape(-1).long()
    return index, values.reshape(*target.shape[:axis], index.numel(), *target.shape[axis + 1:])


def _replacing_rows(target, axis: int, index, values):
    """The rows a replace writes: one write has no duplicate (a KV-cache step)."""
    if index.numel() < 2:
        return values
    return values.index_select(axis, last_writes(index, target.shape[axis]))


def _spread(target, axis: int, index, values):
    """scatter_reduce's index: the flat index spread over each row (index_reduce is beta)."""
    spread = index.reshape([-1 if a == axis else 1 for a in range(target.dim())])
    return spread.expand(values.shape)


def last_writes(index: torch.Tensor, length: int) -> torch.Tensor:
    """For each of the flat index's writes, the number of the last write to its position:
    the row every duplicate writes, so that the order of writes cannot matter."""
    order = torch.arange(index.numel(), device=index.device)
    last = torch.full((length,), -1, dtype=torch.int64, device=index.device)
    return last.scatter_reduce(0, index, order, "amax")[index]


def _scatter_eval(spec: Scatter, xs, resolve):
    target, index, values = xs
    return scatter_rows(target, spec.axis, index, values, spec.combine)


def _scatter_cost(spec: Scatter, ins, out: TensorType) -> Cost:
    """Linear in what it touches: the index and the values are read, and a combine reads
    the target row each value meets (one flop each); the output is written once (the copy
    of the target)."""
    target, index, values = ins
    combined = spec.combine != "replace"
    read = as_dim(index.nbytes + values.nbytes * (2 if combined else 1))
    return Cost(values.numel if combined else 0, read, out.nbytes)


# -- batch rule ----------------------------------------------------------------------------

def _values_axis(spec: Scatter, index_rank: int, p: int) -> int:
    """The values' axis that lines up with the target's axis ``p`` (not the scatter axis)."""
    return p if p < spec.axis else p + index_rank - 1


def _scatter_strip(spec: Scatter, in_types, states, facts) -> tuple:
    """Per sample, a target batched off the written axis takes the sample's values at the
    same positions; an index batched writes every sample's positions into one target,
    unless it holds each sample's own rows of a target with the batch folded into the
    written axis (``_own_rows``)."""
    target, index, values = states
    if facts[1].stride:
        return _own_rows(spec, in_types, states, facts[1])
    if index is not None:
        raise Mixes("writes every sample's positions into one target")
    if target is None or values is None:
        raise Mixes("writes values into a target where only one of them holds the batch")
    if target.axis == spec.axis:
        raise Mixes("writes along the batch axis")
    want = _values_axis(spec, in_types[1].rank, target.axis)
    if type(values) is not type(target) or values.axis != want \
            or getattr(values, "inner", 1) != getattr(target, "inner", 1):
        raise Mixes("writes values that hold the batch on another axis than the target")
    if isinstance(target, Folded):  # the folded axis is only shorter: the spec stays
        return spec, target
    return (Scatter(spec.axis - (target.axis < spec.axis), spec.combine),
            replace(target, broadcast=target.broadcast and values.broadcast))


def _own_rows(spec: Scatter, in_types, states, fact: Affine) -> tuple:
    """A target with the batch folded into the written axis (``inner`` rows per sample, as
    torch flattens a batched tensor) written at ``inner * i + j``, ``0 <= j < inner``: each
    sample writes its own rows (gather's ``_own_rows`` mirrored)."""
    target, index, values = states
    own = (isinstance(target, Folded) and target.axis == spec.axis
           and dims_equal(fact.stride, target.inner) and fact.lo is not None
           and fact.hi is not None and nonnegative(fact.lo)
           and nonnegative(target.inner - 1 - fact.hi))
    if not own or not isinstance(index, Batched) or not isinstance(values, Batched) \
            or values.axis != spec.axis + index.axis:
        raise Mixes("writes at an index computed from the sample index (an arange over the "
                    "batch) outside the sample's own rows")
    return spec, target


def _scatter_insert(spec: Scatter, in_types, batched) -> tuple:
    """A batch axis 0 in front of the target and its values moves the written axis on;
    anything else would write the samples into one another's rows."""
    target, index, values = batched
    if index or target != values:
        raise Mixes("writes every sample's positions, or its values, into one target")
    return Scatter(spec.axis + 1, spec.combine), 0, None


# -- emitters --------------------------------------------------------------------------------

def _scatter_torch(node, a, code):
    s = node.spec
    fn = "scatter_rows_" if code.written_over(node) else "scatter_rows"
    return f"_rt.{fn}({a[0]}, {s.axis}, {a[1]}, {a[2]}, {s.combine!r})"


def scatter_overwritten(node, code) -> tuple[str, ...]:
    """(target,) where the generated torch code writes the scatter into its target
    (``scatter_rows_``): the code may write over the target (``code.may_overwrite``: its own
    storage, or consumed state, read by nothing after), and neither the index nor the values
    share its storage (an overlapping copy); () otherwise, as for a bool target combined
    (widened to u8, so written anew)."""
    target, index, values = node.inputs
    if node.type.dtype is DType.bool and node.spec.combine != "replace":
        return ()
    if not code.may_overwrite(node, target) or \
            code.root(target) in (code.root(index), code.root(values)):
        return ()
    return (target,)


_ONNX_REDUCTION = {"replace": "none", "add": "add", "mul": "mul", "max": "max", "min": "min"}


def _scatter_onnx(node, ins, g, cx):
    """Along axis 0, ScatterND with the index given one trailing axis (its k-th entry names
    a row); along another axis, ScatterElements with the flat index spread over each row (no
    transpose of the target: a KV-cache step costs the cache's copy only). onnxruntime
    reduces no bool (made u8, or / and as max / min) nor f16 (reduced in f32)."""
    s = node.spec
    target, index, values = ins
    ttype, itype = cx.type(node.inputs[0]), cx.type(node.inputs[1])
    combine, dtype = s.combine, ttype.dtype
    if itype.dtype is not DType.i64:
        index = g.cast(index, DType.i64)
    if s.axis:  # values as [..., writes, ...] and the index flat
        index, values = _flat_writes(index, values, s.axis, itype.rank, g)
    if combine == "replace":
        last = _last_writes_onnx(index, target, s.axis, g)
        rows = values if s.axis else _flat_rows(values, itype.rank, g)
        values = g.node("Gather", [rows, last], axis=s.axis)
    work = {DType.bool: DType.u8, DType.f16: DType.f32}.get(dtype) if combine != "replace" \
        else None
    if work is not None:
        target, values = g.cast(target, work), g.cast(values, work)
        combine = _BOOL_COMBINE.get(combine, combine) if dtype is DType.bool else combine
    reduction = _ONNX_REDUCTION[combine]
    if s.axis:
        spread = g.node("Reshape", [index, g.const([1] * s.axis + [-1] + [1] * (
            ttype.rank - s.axis - 1))])
        spread = g.node("Expand", [spread, g.node("Shape", [values])])
        out = g.node("ScatterElements", [target, spread, values], axis=s.axis,
                     reduction=reduction)
    else:
        out = g.node("ScatterND", [target, g.node("Unsqueeze", [index, g.const([-1])]),
                                   values], reduction=reduction)
    return g.cast(out, dtype) if work is not None else out


def _flat_writes(index: str, values: str, axis: int, ri: int, g) -> tuple:
    """(the index as [writes], the values' index axes merged into one: [..., writes, ...])."""
    shape = g.node("Shape", [values])
    parts = [g.node("Slice", [shape, g.const([0]), g.const([axis])]), g.const([-1]),
             g.node("Slice", [shape, g.const([axis + ri]), g.const([2 ** 62])])]
    return (g.node("Reshape", [index, g.const([-1])]),
            g.node("Reshape", [values, g.node("Concat", parts, axis=0)]))


def _flat_rows(rows: str, ri: int, g) -> str:
    """The values [index axes..., rest...] as [writes, rest...]."""
    rest = g.node("Shape", [rows], start=ri)
    return g.node("Reshape", [rows, g.node("Concat", [g.const([-1]), rest], axis=0)])


def _last_writes_onnx(index: str, target: str, axis: int, g) -> str:
    """``last_writes``: each write's last duplicate, by a ScatterElements max of the write
    numbers (shaped like the index, to gather the rows with)."""
    flat = g.node("Reshape", [index, g.const([-1])])
    order = g.node("Range", [g.const(0), g.node("Size", [flat]), g.const(1)])
    length = g.node("Shape", [target], start=axis, end=axis + 1)
    last = g.node("Expand", [g.const([-1]), length])
    last = g.node("ScatterElements", [last, flat, order], axis=0, reduction="max")
    return g.node("Gather", [last, index], axis=0)


def _scatter_jax(node, a, cx):
    """``.at[..., index, ...]``: the index's axes stand in the written axis's place, as the
    values hold them; duplicates under replace first write the last one's row."""
    s = node.spec
    target, index, values = a
    jnp = cx.jnp
    where = (slice(None),) * s.axis + (index,)
    if s.combine == "replace":
        flat = index.reshape(-1)
        order = jnp.arange(flat.shape[0])
        last = jnp.full((target.shape[s.axis],), -1, order.dtype).at[flat].max(order)
        rows = values.reshape(values.shape[:s.axis] + (-1,) + values.shape[s.axis + index.ndim:])
        values = jnp.take(rows, last[index], axis=s.axis)
        return target.at[where].set(values)
    if target.dtype == jnp.bool_:
        combine = _BOOL_COMBINE.get(s.combine, s.combine)
        wide = target.astype(jnp.uint8).at[where]
        return getattr(wide, combine)(values.astype(jnp.uint8)).astype(jnp.bool_)
    method = {"add": "add", "mul": "multiply", "max": "max", "min": "min"}[s.combine]
    return getattr(target.at[where], method)(values)


def _scatter_vjp(spec: Scatter, xs, y, dy, ops):
    """The mirror: each written row's cotangent gathered from where it landed. add: the
    target keeps all of it; replace: the target's written positions and the rows a later
    duplicate overwrote get none; max/min: shared evenly by the target and the rows that
    attain the result (torch's scatter_reduce amax rule); mul: ``_product_scatter_vjp``."""
    target, index, values = xs
    axis = spec.axis
    landed = ops.gather(dy, index, axis, wrap=False)
    if spec.combine == "add":
        return dy, None, landed
    if spec.combine == "replace":
        kept = _rows_of_values(_last_writes(index, target.shape[axis], ops), axis, values, ops)
        return ops.scatter(dy, index, 0.0, axis), None, ops.where(kept, landed, 0.0)
    if spec.combine == "mul":
        return _product_scatter_vjp(spec, target, index, values, y, dy, ops)
    hit_target = target == y
    hit_values = values == ops.gather(y, index, axis, wrap=False)
    count = ops.scatter(ops.cast(hit_target, y.dtype), index, ops.cast(hit_values, y.dtype),
                        axis, "add")
    share = dy / count
    return (ops.where(hit_target, share, 0.0), None,
            ops.where(hit_values, ops.gather(share, index, axis, wrap=False), 0.0))


def _last_writes(index, length, ops):
    """Whether each write is the last one at its position (row-major order), the one a
    replace keeps: each position's winner is the scatter of the writes' numbers."""
    flat = ops.reshape(index, (-1,))
    number = ops.iota(flat.shape[0], "i64", index.builder)
    winner = ops.scatter(ops.full((length,), -1, "i64", like=index), flat, number, 0)
    return ops.reshape(ops.gather(winner, flat, 0, wrap=False) == number, index.shape)


def _rows_of_values(mask, axis: int, values, ops):
    """A mask over the index's shape broadcast to the values' (the target's other axes)."""
    before, after = axis, values.ndim - axis - mask.ndim
    mask = ops.unsqueeze(mask, tuple(range(before)) + tuple(
        range(before + mask.ndim, before + mask.ndim + after)))
    return ops.broadcast_to(mask, values.shape)


def _product_scatter_vjp(spec: Scatter, target, index, values, y, dy, ops):
    """Each factor's cotangent is dy times the product of the other factors at its position
    (the target's and every row written there): the product of the nonzero factors over the
    factor itself where no other factor is zero, else 0; exact with zeros."""
    axis = spec.axis
    zero_t, zero_v = target == 0.0, values == 0.0
    zeros = ops.scatter(ops.cast(zero_t, y.dtype), index, ops.cast(zero_v, y.dtype), axis, "add")
    nonzero = ops.scatter(ops.where(zero_t, 1.0, target), index, ops.where(zero_v, 1.0, values),
                          axis, "mul")

    def others(x, is_zero, zeros_here, nonzero_here):
        alone = (zeros_here - ops.cast(is_zero, y.dtype)) == 0.0
        return ops.where(alone, nonzero_here / ops.where(is_zero, 1.0, x), 0.0)

    d_target = dy * others(target, zero_t, zeros, nonzero)
    gathered = [ops.gather(t, index, axis, wrap=False) for t in (dy, zeros, nonzero)]
    d_values = gathered[0] * others(values, zero_v, gathered[1], gathered[2])
    return d_target, None, d_values


primitive(Op.scatter, Scatter, 3, _scatter_shape, _scatter_eval, _scatter_cost,
          "writes rows at computed positions with a combine (index_add, scatter_reduce, "
          "index_put, bincount); comparing every write with every target element costs "
          "O(writes x target) where the kernel is O(writes + target)",
          traits=Trait.NONE,
          batch=OperandRule(_scatter_strip, _scatter_insert, mixing="writes along the batch axis"),
          torch=_scatter_torch, onnx=_scatter_onnx, jax=_scatter_jax, vjp=_scatter_vjp,
          in_place=scatter_overwritten)
