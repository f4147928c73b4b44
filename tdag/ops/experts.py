"""Mixture-of-experts compositions: the grouped matmul a routed layer runs.

A grouped matmul multiplies each row of ``x`` [S, K] (rows sorted by expert) by its own
expert's matrix ``weight[e]`` [K, N], expert ``e`` owning rows ``offsets[e-1] <= r <
offsets[e]``. Composed here as: each row's expert id (the count of offsets <= r, an [S, E]
comparison: E is a few dozen, so linear in the rows), that expert's matrix gathered per
row, and one batched row-times-matrix product. It computes exactly what the kernel runs,
2 S K N flops for the S routed (token, expert) pairs, top-k of n experts per token, never
the dense product of every token with every expert (n / top-k times more); but the gathered
matrices are S K N values, where a grouped matmul reads each expert's matrix once:
``tdag.lower`` puts the ``grouped_mm`` kernel (tdag/lower/kernels/experts.py) in its place.

Defined for any offsets, not only the sorted ones the front ends write: a row's group counts
the offsets <= r (at most the last group), and rows from the last offset on are zero.
"""
from __future__ import annotations

from tdag.ir.types import DType
from tdag.ops import contraction, core, creation
from tdag.ops.tensor import Tensor


def grouped_matmul(x: Tensor, weight: Tensor, offsets: Tensor,
                   bias: Tensor | None = None) -> Tensor:
    """``torch.nn.functional.grouped_mm(x, weight, offs=offsets)`` for a 2-d ``x`` [S, K] and
    a 3-d ``weight`` [E, K, N]: row r times ``weight[e]`` where ``offsets`` (the cumulative
    row counts, [E]) put r in group e, plus ``bias[e]`` [E, N] if given. Rows past
    ``offsets[-1]`` belong to no group and are zero, as transformers' fallback leaves them.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(ops.grouped_matmul, tdag.TensorSpec((6, 4)),
    ...                   tdag.TensorSpec((3, 4, 5)), tdag.TensorSpec((3,), "int64"))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[6,5]']
    """
    rows = creation.iota(x.shape[0], offsets.dtype, x.builder)
    last = weight.shape[0] - 1
    # row r's group is the count of offsets <= r; rows past the end are clamped, then zeroed
    passed = core.le(core.unsqueeze(offsets, (0,)), core.unsqueeze(rows, (1,)))
    group = core.minimum(core.sum(core.cast(passed, DType.i64), 1), last)
    out = contraction.einsum("s k, s k n -> s n", x, core.gather(weight, group, 0, wrap=False))
    if bias is not None:
        out = core.add(out, core.gather(bias, group, 0, wrap=False))
    grouped = core.lt(rows, core.slice(offsets, 0, last, last + 1))
    return core.where(core.unsqueeze(grouped, (1,)), out, 0)
