"""The op records: one per op, every field filled, and the three views of an op agree.

A record (``tdag/ir/record.py``) holds everything keyed by an op. These tests guard that:
- every op of the enum has a record, and every field of every record is filled with the
  right kind of value (a new field added to ``OpRecord`` fails here until every op has it);
  a kernel's ``decompose`` is its composition and a primitive's is None
  (``tests/lower/test_decompose.py`` checks each lowers back to its kernel);
- for every primitive, on every one of its differential cases (``support.primitive_cases.CASES``),
  the reference evaluator, the generated torch code (``to_torch``) and the emitted ONNX on
  onnxruntime (``to_onnx``) agree; for every kernel, on the lowering tables' programs
  (``support.lowering_tables.KERNEL_PROGRAMS``, which must cover every kernel);
- no table keyed by op survives outside the records in the back ends.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import zlib

import numpy as np
import pytest
import torch

import tdag
import tdag.lower
from tdag.ir.batching import BatchRule
from tdag.ir.op import Op
from tdag.ir.record import REGISTRY, OpRecord, Trait, ops_with, record
from tdag.reify import to_onnx, to_torch

from support.guards import assert_close, run_onnx
from support.lowering_tables import KERNEL_PROGRAMS
from support.primitive_cases import CASES, as_pairs, build


def test_every_op_has_a_record():
    assert set(REGISTRY) == set(Op)
    assert set(tdag.PRIMITIVES) == set(Op) - ops_with(Trait.KERNEL)


@pytest.mark.parametrize("op", list(Op), ids=[op.value for op in Op])
def test_every_record_is_complete(op):
    rec = record(op)
    assert isinstance(rec, OpRecord) and rec.op is op
    for f in dataclasses.fields(OpRecord):
        if f.name not in ("decompose", "vjp", "view", "workspace", "in_place"):  # below
            assert getattr(rec, f.name) is not None, f"{op.value}: record field {f.name} is empty"
    assert dataclasses.is_dataclass(rec.spec_type), op
    assert rec.spec_type.__dataclass_params__.frozen, f"{op.value}: spec must be frozen"
    assert isinstance(rec.arity, (int, range))
    assert isinstance(rec.reason, str) and len(rec.reason) > 10, op
    assert isinstance(rec.traits, Trait)
    assert isinstance(rec.batch, BatchRule), f"{op.value}: batch rule {rec.batch!r}"
    for fn in (rec.shape, rec.evaluate, rec.cost, rec.torch, rec.onnx, rec.jax):
        assert callable(fn), op
    # a kernel is a kernel by its traits, and only then
    assert rec.has(Trait.KERNEL) == (op not in tdag.PRIMITIVES)
    # a kernel carries the composition it stands for; a primitive has none
    if rec.has(Trait.KERNEL):
        assert callable(rec.decompose), f"{op.value}: a kernel without decompose"
    else:
        assert rec.decompose is None, f"{op.value}: a primitive with a decompose"
    # every primitive has its gradient rule; a kernel has one or differentiates its
    # composition (tests/refine/grad/test_vjps.py checks them)
    assert callable(rec.vjp) or rec.has(Trait.KERNEL), f"{op.value}: a primitive without vjp"
    # the ops torch runs as views say what strides torch gives them (tdag.memory reads them)
    assert callable(rec.view) == rec.has(Trait.VIEW), f"{op.value}: view rule vs Trait.VIEW"
    assert rec.workspace is None or callable(rec.workspace), op
    assert rec.in_place is None or callable(rec.in_place), op


def test_traits_are_consistent():
    """Families nest as their definitions say."""
    assert ops_with(Trait.UNARY | Trait.BINARY) <= ops_with(Trait.ELEMENTWISE)
    assert ops_with(Trait.ELEMENTWISE) <= ops_with(Trait.POINTWISE)
    assert ops_with(Trait.COMMUTATIVE) <= ops_with(Trait.BINARY)
    assert ops_with(Trait.EXPANDING) <= ops_with(Trait.VIEW)
    assert ops_with(Trait.MOVEMENT) <= set(tdag.PRIMITIVES)
    assert ops_with(Trait.UNARY) == {op for op in ops_with(Trait.UNARY)
                                     if record(op).arity == 1}


# -- evaluator, torch code and ONNX agree -----------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_primitive_evaluator_torch_and_onnx_agree(case):
    prog = build(case)
    module, model = to_torch(prog, lower=False), to_onnx(build(case, pairs=True), lower=False)
    rng = np.random.default_rng(zlib.crc32(case.id.encode()))
    for dims in case.bindings:
        args = [torch.from_numpy(np.array(x.draw(rng, dims))) for x in case.ins]
        ref = tdag.run(prog, *args)
        assert_close(module(*args), ref, f"torch {case.id} at {dims}")
        assert_close(run_onnx(model, *map(as_pairs, args)), as_pairs(ref),
                     f"onnx {case.id} at {dims}")


def test_kernel_programs_cover_every_kernel():
    """The agreement of kernels runs in test_reify.test_every_kernel_reifies over these."""
    seen = set()
    for fn, specs in KERNEL_PROGRAMS.values():
        seen |= {n.op for n in tdag.lower.lower(tdag.trace(fn, *specs)).graph.nodes}
    assert ops_with(Trait.KERNEL) <= seen, ops_with(Trait.KERNEL) - seen


def test_no_table_keyed_by_op_outside_the_records():
    """Everything keyed by an op lives in its record (tdag/deinops, next to the op): no
    module of the passes or back ends keeps a dict from ops to rules."""
    for info in pkgutil.walk_packages(tdag.__path__, "tdag."):
        if info.name.startswith(("tdag.deinops", "tdag.ir")):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if value is REGISTRY or not isinstance(value, dict) or not value:
                continue
            if all(isinstance(k, Op) for k in value):
                pytest.fail(f"{info.name}.{name} is a table keyed by op")
