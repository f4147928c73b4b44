"""Differential tests: every primitive, traced into a Program and run by ``tdag.run``, against
an independent numpy (scipy for erf/erfinv) reference.

Each case is one row of a table (tests/support/primitive_cases.py): the op, its spec, the
operand types (``"b"`` is a symbolic batch, run at two sizes) and how to draw the operands.
Every case also checks the primitive's shape rule: ``tdag.verify`` accepts the traced program,
and the evaluated tensor has exactly the shape and dtype the shape rule declared.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

import tdag
from tdag.ir.symbols import evaluate

from support.primitive_cases import CASES, Case, build, compare


def test_every_primitive_has_cases():
    """A primitive added without differential cases fails here."""
    assert {c.op for c in CASES} == set(tdag.PRIMITIVES)
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), "duplicate case ids"


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_primitive(c: Case):
    prog = build(c)
    tdag.verify(prog)
    node = prog.graph.nodes[-1]
    assert node.op is c.op
    rng = np.random.default_rng(zlib.crc32(c.id.encode()))
    for dims in c.bindings:
        arrays = [x.draw(rng, dims) for x in c.ins]
        out = tdag.run(prog, *[torch.from_numpy(np.array(a)) for a in arrays])
        # a fresh size (one data decides) is bound from the result, as the interpreter does
        dims = {**dims, **{d.name: out.shape[i] for i, d in enumerate(node.type.shape)
                           if not isinstance(d, int) and d.is_Symbol and d.name not in dims}}
        # the evaluator agrees with the shape rule, at every batch size
        assert out.dtype == node.type.dtype.torch, c.id
        assert tuple(out.shape) == tuple(evaluate(d, dims) for d in node.type.shape), \
            (c.id, dims, node.type)
        arity = tdag.deinops.REGISTRY[c.op].arity
        with np.errstate(all="ignore"):
            expected = c.ref(c.spec, dims, *arrays[:arity])
        compare(out, expected, node.type.dtype, c.exact, f"{c.id} at {dims}")
