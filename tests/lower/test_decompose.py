"""Every kernel's ``decompose`` is the composition lowering recognises as that kernel.

A kernel record carries the composition it stands for (``OpRecord.decompose``, written with
``tdag.ops``). For every kernel, on every example of ``CASES`` (tests/support/kernel_cases.py;
a kernel without one fails ``test_every_kernel_has_an_example``):

- tracing ``decompose(spec, *operands)`` and lowering it (``tdag.lower.lower``, the default
  passes) gives back exactly one node: that kernel, with an equal spec, reading the program's
  inputs. An einsum's spec is equal up to a renaming of its equation's letters (the matcher
  names axes a, b, c ... as it finds them). An example marked ``xfail`` is a decomposition
  lowering does not give back exactly (its reason says how), kept strict so that a fixed
  matcher shows;
- ``tdag.run`` of the traced composition matches the kernel's reference evaluator on random
  inputs, to ``RTOL``/``ATOL`` (float32; the composition and torch's kernel round
  differently).
"""
from __future__ import annotations

import pytest
import torch

import tdag
import tdag.lower
from support.kernel_cases import CASES, GAUGE_FREE, Case, case_id, draw_inputs
from tdag.ir.op import Op
from tdag.ir.record import Trait, ops_with, record

RTOL, ATOL = 1e-4, 1e-5


def _param(case: Case):
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case_id(case), marks=marks)


def _canonical(equation: str) -> str:
    """An einsum equation with its letters renamed a, b, c ... in order of appearance."""
    names: dict[str, str] = {}
    return "".join(names.setdefault(c, chr(ord("a") + len(names))) if c.isalpha() else c
                   for c in equation)


def _same_spec(op: Op, got, want) -> bool:
    if op is Op.einsum:
        return _canonical(got.equation) == _canonical(want.equation)
    return got == want


def test_every_kernel_has_an_example():
    assert ops_with(Trait.KERNEL) <= {c.op for c in CASES}, \
        ops_with(Trait.KERNEL) - {c.op for c in CASES}


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_decompose_lowers_to_its_kernel(case: Case):
    rec = record(case.op)
    prog = tdag.trace(lambda *xs: rec.decompose(case.spec, *xs), *case.specs(),
                      names=[f"x{i}" for i in range(len(case.shapes))])
    low = tdag.lower.lower(prog, check=True)
    nodes = low.graph.nodes
    assert [n.op for n in nodes] == [case.op], f"{case_id(case)} lowers to\n{low}"
    assert _same_spec(case.op, nodes[0].spec, case.spec), f"{case_id(case)} lowers to\n{low}"
    assert list(nodes[0].inputs) == [v.name for v in low.graph.inputs]


EXACT = [c for c in CASES if c.op not in GAUGE_FREE]


@pytest.mark.parametrize("case", EXACT, ids=[case_id(c) for c in EXACT])
def test_decompose_matches_the_kernel_evaluator(case: Case):
    rec = record(case.op)
    prog = tdag.trace(lambda *xs: rec.decompose(case.spec, *xs), *case.specs())
    xs = draw_inputs(case)
    got = tdag.run(prog, *xs)
    want = rec.evaluate(case.spec, xs, int)
    torch.testing.assert_close(got, want, rtol=RTOL, atol=ATOL)
