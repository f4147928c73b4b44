"""The one node emitter: ``typed_node`` makes a Node typed by its op's record.

Every pass that makes nodes (the Builder of ``tdag.ops``, the rewrite engine, strip and add
batch) makes them here: the spec's type and the operand count are checked against the
record, the output type is the record's shape rule, and a node the record refuses raises a
ShapeError naming the op, the node, its origin and the operands' types (or the caller's own
error, built from the record's reason: a rewrite rule's bug, a node strip_batch cannot
rewrite).

>>> import tdag  # importing tdag fills the op registry
>>> from tdag.ir.op import Op
>>> from tdag.ir.types import TensorType
>>> node = typed_node(Op.add, None, ("x", "y"), [TensorType((2, 3), "float32")] * 2, name="z")
>>> node.spec, str(node.type)
(NoSpec(), 'f32[2,3]')
>>> typed_node(Op.add, None, ("x", "y"), [TensorType((2,), "float32"),
...            TensorType((3,), "float32")], name="z")
Traceback (most recent call last):
tdag.errors.ShapeError: add: ... (operands: %x: f32[2], %y: f32[3]) [node %z]
"""
from __future__ import annotations

from typing import Callable, Sequence

from tdag.errors import ShapeError, TdagError
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.record import NoSpec, record
from tdag.ir.types import Origin, TensorType

_NOWHERE = Origin()  # a node made by a pass, with no source op


def typed_node(op: Op, spec: object, inputs: Sequence[str], in_types: Sequence[TensorType],
               *, name: str, origin: Origin = _NOWHERE, cache: dict | None = None,
               refused: Callable[[str], TdagError] | None = None) -> Node:
    """``name = op[spec](inputs)``, its type given by the shape rule of ``op``'s record on
    the operands' types ``in_types``; a None ``spec`` is ``NoSpec()``.

    ``cache`` maps ``(op, spec, operand types)`` to the output type, for a pass that makes
    nodes of the same shapes over and over (strip_batch): each shape rule then runs once.
    ``refused`` makes the error for a node the record refuses from the record's reason.
    """
    spec = NoSpec() if spec is None else spec
    rec = record(op)
    if not isinstance(spec, rec.spec_type) or not rec.takes(len(inputs)):
        reason = (f"{op.value}: expected {rec.arity} inputs and a "
                  f"{rec.spec_type.__name__} spec")
        raise ShapeError(reason, node=name, origin=origin) if refused is None else \
            refused(reason)
    key = None if cache is None else (op, spec, tuple(in_types))
    out = None if key is None else cache.get(key)
    if out is None:
        try:
            out = rec.shape(spec, in_types)
        except ShapeError as exc:
            if refused is not None:
                raise refused(exc.args[0]) from None
            operands = ", ".join(f"%{x}: {t}" for x, t in zip(inputs, in_types))
            raise ShapeError(f"{exc.args[0]} (operands: {operands})", node=name,
                             origin=origin) from None
        if key is not None:
            cache[key] = out
    return Node(name, op, tuple(inputs), spec, out, origin)


__all__ = ["typed_node"]
