"""How a framework should run an einsum kernel: ``F.linear``, ``matmul`` or ``einsum``.

Both reifiers share the plan, so torch and ONNX pick the same fast path (``Gemm``/``MatMul``
in ONNX). Transposes are of the last two axes only (free views in torch).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from tdag.lower.kernels import parse_equation


@dataclass(frozen=True)
class EinsumPlan:
    """``kind``: "linear" (``F.linear(x, w)``, w is [n, k]), "matmul" (``x @ y``) or
    "einsum". ``swap``: x is the second operand. ``transpose_a/b``: swap the last two axes
    of x / y first (for linear, ``transpose_b`` means y is [k, n])."""

    kind: str
    swap: bool = False
    transpose_a: bool = False
    transpose_b: bool = False


@lru_cache(maxsize=None)
def plan_einsum(equation: str, bias_rank: int | None = None) -> EinsumPlan:
    (la, lb), lo = parse_equation(equation)
    for swap in (False, True):
        x, y = (lb, la) if swap else (la, lb)
        plan = _linear(x, y, lo) or _matmul(x, y, lo)
        if plan is not None:
            if plan.kind == "linear" and bias_rank not in (None, 1):
                plan = _matmul(x, y, lo) or EinsumPlan("einsum")
            return replace(plan, swap=swap) if plan.kind != "einsum" else plan
    return EinsumPlan("einsum")


def _t(labels: str, flag: bool) -> str:
    return labels[:-2] + labels[-1] + labels[-2] if flag else labels


def _linear(x: str, y: str, out: str) -> EinsumPlan | None:
    if len(y) != 2 or len(x) < 1:
        return None
    for ta in (False, True) if len(x) >= 2 else (False,):
        xa = _t(x, ta)
        k = xa[-1]
        if k not in y or k in out:
            continue
        n = y[0] if y[1] == k else y[1]
        if n in x or out != xa[:-1] + n:
            continue
        return EinsumPlan("linear", transpose_a=ta, transpose_b=(y[0] == k))
    return None


def _matmul(x: str, y: str, out: str) -> EinsumPlan | None:
    if len(x) < 2 or len(y) < 2:
        return None
    for ta in (False, True):
        for tb in (False, True):
            xa, yb = _t(x, ta), _t(y, tb)
            (m, k), (k2, n) = xa[-2:], yb[-2:]
            bx, by = xa[:-2], yb[:-2]
            batch = bx if len(bx) >= len(by) else by
            short = by if len(bx) >= len(by) else bx
            if k != k2 or k in out or m in y or n in x or m == n:
                continue
            if not batch.endswith(short) or out != batch + m + n:
                continue
            return EinsumPlan("matmul", transpose_a=ta, transpose_b=tb)
    return None
