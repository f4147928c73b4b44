"""The grouped matmul of a mixture-of-experts layer: each expert's rows by its own matrix.

``grouped_mm(x [S, K], weight [E, K, N], offsets [E])``: the rows sorted by expert, expert
``e`` owning rows ``ends[e-1] <= r < ends[e]`` (``torch._grouped_mm``, transformers'
``grouped_mm_fallback``). Its composition (``ops.grouped_matmul``) finds each row's expert
and gathers that expert's matrix for every row, an [S, K, N] intermediate: E / top-k times
the weights' own size at real sizes, where the kernel reads each expert's matrix once.

What the composition computes for any offsets, not only the sorted ones the front ends
write: row r belongs to the group that counts the offsets <= r (at most the last), and rows
from the last offset on are zero. So the kernel runs on ``ends``, the offsets sorted and
clamped to [0, last] with ``last`` the last offset clamped to [0, S]: row r < last is in
group e where ``ends[e-1] <= r < ends[e]``, and rows from ``last`` on are zero. Sorting E
offsets costs E log E, nothing beside the rows' products.
"""
from __future__ import annotations

import torch

from tdag.deinops.primitive import Cost, NoSpec, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import dims_equal, is_static
from tdag.ir.types import DType, TensorType
from tdag.ops.experts import grouped_matmul

_OFFSETS = (DType.i64, DType.i32)


def _shape(spec, ins):
    x, weight, offsets = ins
    if x.rank != 2 or weight.rank != 3 or offsets.rank != 1 or not x.dtype.is_float or \
            weight.dtype is not x.dtype or offsets.dtype not in _OFFSETS:
        raise ShapeError(f"grouped_mm: a float [S, K] input, [E, K, N] experts of its dtype "
                         f"and i64/i32 offsets [E], got {x}, {weight}, {offsets}")
    experts = weight.shape[0]
    if not is_static(experts) or experts < 1 or not dims_equal(offsets.shape[0], experts) \
            or not dims_equal(x.shape[1], weight.shape[1]):
        raise ShapeError(f"grouped_mm: {x} by {weight} in groups {offsets} (a static count "
                         f"of experts, one offset each)")
    return TensorType((x.shape[0], weight.shape[2]), x.dtype)


def group_ends(offsets: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ends, last): the offsets sorted and clamped to [0, last], last the last offset
    clamped to [0, rows] (see the module docstring)."""
    last = offsets[-1].clamp(0, rows)
    return offsets.sort().values.clamp(torch.zeros_like(last), last), last


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """The kernel in eager torch: one ``mm`` per non-empty group into its rows of the output,
    as transformers' fallback. (``torch._grouped_mm`` runs on CPU too, but only in 16-bit and
    f32 with strides of whole 16 bytes, and it is no faster: 512 tokens top-2 into 8 experts
    1024 -> 4096, 125-134 ms against the loop's 127-132 ms, one thread.)"""
    ends, _ = group_ends(offsets, x.shape[0])
    out = x.new_zeros(x.shape[0], weight.shape[2])
    start = 0
    for e, end in enumerate(ends.tolist()):  # E numbers read once
        if end > start:
            out[start:end] = x[start:end] @ weight[e]  # autograd refuses mm(out=)
        start = end
    return out


def _cost(spec, ins, out: TensorType) -> Cost:
    # every row by one expert's matrix: 2 S K N, the top-k experts of each token only
    x, weight, _ = ins
    flops = 2 * x.shape[0] * x.shape[1] * weight.shape[2]
    return traffic(ins, out, flops, matmul_flops=flops)


def _torch(node, a, code):
    return f"_rt.grouped_mm({a[0]}, {a[1]}, {a[2]})"


def _onnx(node, ins, g, cx):
    """One Slice of rows and one MatMul per expert (E is static), the rows past the last
    end zeros: linear in the rows, each expert's matrix read once."""
    x, weight, offsets = ins
    experts = cx.type(node.inputs[1]).shape[0]
    offsets = g.cast(offsets, DType.i64)
    rows = g.node("Shape", [x], start=0, end=1)
    zero = g.const([0])
    last = g.node("Min", [g.node("Max", [g.node("Slice", [offsets, g.const([-1]),
                                                          g.const([experts])]), zero]), rows])
    ordered = g.node("TopK", [offsets, g.const([experts])], axis=0, largest=0, sorted=1,
                     outputs=2)[0]
    ends = g.node("Min", [g.node("Max", [ordered, zero]), last])
    bounds = g.node("Concat", [zero, ends], axis=0)
    parts = []
    for e in range(experts):
        start = g.node("Slice", [bounds, g.const([e]), g.const([e + 1])])
        end = g.node("Slice", [bounds, g.const([e + 1]), g.const([e + 2])])
        mine = g.node("Slice", [x, start, end, zero])
        parts.append(g.node("MatMul", [mine, g.node("Gather", [weight, g.const(e)], axis=0)]))
    width = g.node("Shape", [weight], start=2, end=3)
    tail = g.node("ConstantOfShape", [g.node("Concat", [g.node("Sub", [rows, last]), width],
                                             axis=0)])
    tail = g.cast(tail, node.type.dtype)
    return g.node("Concat", [*parts, tail], axis=0)


def _jax(node, a, cx):
    """``lax.ragged_dot`` over the group sizes of ``ends``; rows past the last end are
    zeroed by a select (ragged_dot does not say what it writes there)."""
    x, weight, offsets = a
    jnp = cx.jnp
    rows = x.shape[0]
    last = jnp.clip(offsets[-1], 0, rows)
    ends = jnp.clip(jnp.sort(offsets), 0, last)
    sizes = jnp.diff(ends, prepend=0).astype(jnp.int32)
    out = cx.lax.ragged_dot(x, weight, sizes)
    return jnp.where((jnp.arange(rows) < last)[:, None], out, jnp.zeros((), out.dtype))


primitive(Op.grouped_mm, NoSpec, 3, _shape, lambda s, xs, r: grouped_mm(*xs), _cost,
          "each row's expert matrix gathered and a batched row-by-matrix product: an "
          "[S, K, N] intermediate (E / top-k times the weights) where a grouped matmul reads "
          "each expert's matrix once",
          traits=Trait.KERNEL, batch=Refuse("groups rows along the batch axis by the offsets"),
          torch=_torch, onnx=_onnx, jax=_jax,
          decompose=lambda s, x, weight, offsets: grouped_matmul(x, weight, offsets))
