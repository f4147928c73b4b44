"""How a framework should run an einsum kernel: ``F.linear``, ``matmul`` or ``einsum``.

The equation parser lives here too, below the einsum record (kernels/contraction.py), whose
emitters use the plan.

Both reifiers share the plan, so torch and ONNX pick the same fast path (``Gemm``/``MatMul``
in ONNX). Transposes are of the last two axes only (free views in torch); the product may be
permuted afterwards (a view too), as ``nn.MultiheadAttention`` does with its projections.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from tdag.errors import ShapeError


@lru_cache(maxsize=None)
def parse_equation(equation: str) -> tuple[tuple[str, str], str]:
    """``"bmk,nk->bmn"`` -> ``(("bmk", "nk"), "bmn")``, checked."""
    lhs, arrow, out = equation.partition("->")
    ins = tuple(lhs.split(","))
    if not arrow or len(ins) != 2:
        raise ShapeError(f"einsum: {equation!r} is not of the form 'ab,bc->ac'")
    for labels in ins + (out,):
        if not all(c.isalpha() for c in labels) or len(set(labels)) != len(labels):
            raise ShapeError(f"einsum: {equation!r}: labels must be distinct letters per operand")
    if not set(out) <= set(ins[0]) | set(ins[1]):
        raise ShapeError(f"einsum: {equation!r}: an output label is in no operand")
    return ins, out


@dataclass(frozen=True)
class EinsumPlan:
    """``kind``: "linear" (``F.linear(x, w)``, w is [n, k]), "matmul" (``x @ y``) or
    "einsum". ``swap``: x is the second operand. ``transpose_a/b``: swap the last two axes
    of x / y first (for linear, ``transpose_b`` means y is [k, n]). ``out_perm``: permute
    the product into the equation's output order (None: already in order). ``bias_inside``:
    a bias goes into ``F.linear`` / ``Gemm`` (1-d, on the product's last axis)."""

    kind: str
    swap: bool = False
    transpose_a: bool = False
    transpose_b: bool = False
    out_perm: tuple | None = None
    bias_inside: bool = False


@lru_cache(maxsize=None)
def plan_einsum(equation: str, bias_rank: int | None = None) -> EinsumPlan:
    """The first plan whose product needs no permute, else the first plan: a permuted
    product is a strided view, and what reads it (an optimizer's elementwise update of a
    weight gradient ``dy^T x``) runs several times slower on it than on a contiguous one."""
    (la, lb), lo = parse_equation(equation)
    plans = [p for p in (_plan(la, lb, lo, bias_rank, swap) for swap in (False, True)) if p]
    plans.sort(key=lambda p: p.out_perm is not None)
    return plans[0] if plans else EinsumPlan("einsum")


def _plan(la: str, lb: str, lo: str, bias_rank: int | None, swap: bool) -> EinsumPlan | None:
    x, y = (lb, la) if swap else (la, lb)
    found = _linear(x, y) or _matmul(x, y)
    if found is None or set(found[1]) != set(lo) or len(found[1]) != len(lo):
        return None
    plan, natural = found
    perm = tuple(natural.index(c) for c in lo)
    inside = plan.kind == "linear" and bias_rank == 1 and natural[-1] == lo[-1]
    return replace(plan, swap=swap, bias_inside=inside,
                   out_perm=None if perm == tuple(range(len(perm))) else perm)


def _t(labels: str, flag: bool) -> str:
    return labels[:-2] + labels[-1] + labels[-2] if flag else labels


def _linear(x: str, y: str):
    """``(plan, natural output letters)`` when y is a 2-d weight contracted with x's last
    axis (after an optional transpose of x)."""
    if len(y) != 2 or len(x) < 1:
        return None
    for ta in (False, True) if len(x) >= 2 else (False,):
        xa = _t(x, ta)
        k = xa[-1]
        if k not in y:
            continue
        n = y[0] if y[1] == k else y[1]
        if n in x:
            continue
        return EinsumPlan("linear", transpose_a=ta, transpose_b=(y[0] == k)), xa[:-1] + n
    return None


def _matmul(x: str, y: str):
    """``(plan, natural output letters)`` for a batched matmul with broadcast batch axes."""
    if len(x) < 2 or len(y) < 2:
        return None
    for ta in (False, True):
        for tb in (False, True):
            xa, yb = _t(x, ta), _t(y, tb)
            (m, k), (k2, n) = xa[-2:], yb[-2:]
            bx, by = xa[:-2], yb[:-2]
            batch = bx if len(bx) >= len(by) else by
            short = by if len(bx) >= len(by) else bx
            if k != k2 or m in y or n in x or m == n or not batch.endswith(short):
                continue
            return EinsumPlan("matmul", transpose_a=ta, transpose_b=tb), batch + m + n
    return None
