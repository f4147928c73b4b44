"""The record of an op: everything keyed by an op, in one place.

A primitive (or a kernel placeholder) is a name with its rules attached next to it, as JAX
registers a primitive's rules beside it. One ``OpRecord`` per op holds:

- ``spec_type``, ``arity``: the static arguments (a frozen dataclass) and operand count;
- ``shape``: the shape rule, ``(spec, input types) -> output type``, raising ShapeError;
- ``evaluate``: the reference evaluator on torch tensors, ``(spec, tensors, resolve)``;
- ``cost``: flops and unfused bytes, ``(spec, input types, output type) -> Cost``;
- ``reason``: why the op exists (a primitive: why no composition is exact or cheap; a
  kernel: what running the primitives would cost a framework);
- ``traits``: what passes ask of an op (is it a view, pointwise, commutative ...); the op
  families are queries on traits (``ops_with(Trait.VIEW)``);
- ``batch``: how the op treats a batch axis (``tdag.ir.batching``), for strip/add batch;
- ``torch``: the emitter of one line of torch code, ``(node, args, code) -> expression``;
- ``onnx``: the emitter of ONNX nodes, ``(node, ins, graph, context) -> output name``;
- ``jax``: the JAX emitter, called at trace time, ``(node, args, ctx) -> jax.Array``: ``args``
  are the operands' arrays, ``ctx`` gives the namespaces (``ctx.jnp``, ``ctx.lax``,
  ``ctx.nn``), ``ctx.resolve(dim)`` and ``ctx.shape(dims)`` for symbolic sizes bound from the
  input shapes, and ``ctx.dtype(DType)`` (``tdag/reify/jax/context.py``). Emitters take
  jax from ``ctx`` so that importing tdag never imports jax;
- ``decompose``: for a kernel, the composition it stands for, ``(spec, *operands) -> Tensor``
  (or a tuple of Tensors) written with ``tdag.ops``: it adapts the spec to the one ``tdag.ops``
  function that holds the composition (``ops.softmax``, ``ops.conv`` ...), which lowering
  recognises back as this kernel (``tests/lower/test_decompose.py``); None for a primitive;
- ``vjp``: the reverse-mode rule, ``(spec, operands, output, cotangent, ops) -> one cotangent
  per operand`` (None where none flows: integer operands, a constant the output does not vary
  with). The values are Tensors of the gradient graph under construction and ``ops`` is
  ``tdag.ops``, handed in by ``tdag.refine.grad`` as JAX emitters get jax from ``ctx``, so the
  records never import the compositions. A kernel without one is differentiated through its
  ``decompose``;
- ``view``: for an op the torch emitter runs as a view (every ``Trait.VIEW`` op), the strides
  torch gives its output, ``(spec, in shape, in strides, out shape) -> strides``, or None
  where the call copies (a reshape of a permuted tensor); None for every other op;
- ``workspace``: for a kernel whose torch call allocates scratch it frees before returning
  (ATen's layer norm keeps a mean and a 1/std per row), its bytes, ``(spec, input types,
  output type, which inputs are contiguous) -> bytes`` (a call may first copy a strided
  operand); None where the call allocates only its output. ``tdag.memory``
  reads both.

A new target or a new analysis is one new field here, filled in every record; a new op is
one new record, written next to its spec in ``tdag/deinops``. ``tdag.ir`` reads the registry
but never imports ``tdag.deinops``: importing ``tdag`` (or ``tdag.deinops``) fills it.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

from tdag.errors import UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.symbols import Dim, as_dim

if TYPE_CHECKING:
    import torch

    from tdag.ir.batching import BatchRule
    from tdag.ir.types import TensorType


@dataclass(frozen=True, slots=True)
class NoSpec:
    """The spec of an op that has no static arguments."""


@dataclass(frozen=True, slots=True)
class Cost:
    """Work of one node: flops and unfused memory traffic in bytes (may be symbolic).

    ``matmul_flops`` is the part a kernel spends in contractions, 2*M*K*N as
    ``torch.utils.flop_counter`` counts it; for primitives the cost report finds contractions
    from the graph's structure instead (a multiply of broadcast operands feeding a sum)."""

    flops: Dim = 0
    bytes_read: Dim = 0
    bytes_written: Dim = 0
    matmul_flops: Dim = 0

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(as_dim(self.flops + other.flops), as_dim(self.bytes_read + other.bytes_read),
                    as_dim(self.bytes_written + other.bytes_written),
                    as_dim(self.matmul_flops + other.matmul_flops))


class Trait(enum.Flag):
    """What a pass may ask of an op. An op family is the set of ops with a trait."""

    NONE = 0
    MOVEMENT = enum.auto()     # one of the deconstructed einops or its mirror
    VIEW = enum.auto()         # frameworks run it as a strided view: no data moves
    REMAP = enum.auto()        # an index remap with a constant default (pad): free when fused
    EXPANDING = enum.auto()    # reads some source elements more than once (broadcast, windows)
    INSERTING = enum.auto()    # gives its output an axis the input does not index
    KEEPS_VALUES = enum.auto()  # the output holds the input's values, rearranged or copied
    PICKS = enum.auto()        # reads only the elements of operand 0 its output picks
    ACCUMULATES = enum.auto()  # sums its input into fewer elements (reduce, overlap-add)
    ELEMENTWISE = enum.auto()  # output element i depends on input elements i only
    UNARY = enum.auto()        # an elementwise function of one tensor, no spec
    BINARY = enum.auto()       # an elementwise function of two tensors
    POINTWISE = enum.auto()    # fuses into its producer's kernel as an epilogue
    COMMUTATIVE = enum.auto()  # op(a, b) == op(b, a)
    SCALAR_OPERAND = enum.auto()  # frameworks take a Python scalar operand and broadcast it
    KERNEL = enum.auto()       # a placeholder for one fused framework call (tdag.lower)
    FRESH_SIZE = enum.auto()   # data decides a size of its output: a fresh symbol named in
                               # its spec (``spec.fresh``), bound at run time from the result


# resolve: maps a (possibly symbolic) Dim in a spec to an int, given the run's symbol bindings
Resolve = Callable[[Dim], int]
ShapeRule = Callable[[object, "Sequence[TensorType]"], "TensorType"]
Evaluator = Callable[[object, "Sequence[torch.Tensor]", Resolve], "torch.Tensor"]
CostRule = Callable[[object, "Sequence[TensorType]", "TensorType"], Cost]
TorchEmitter = Callable[..., str]   # (node, operand expressions, code generator) -> expression
OnnxEmitter = Callable[..., str]    # (node, operand names, GraphBuilder, context) -> name
JaxEmitter = Callable[..., object]  # (node, operand arrays, JaxContext) -> jax.Array
Decomposer = Callable[..., object]  # (spec, *operand Tensors) -> Tensor: a kernel's composition
VjpRule = Callable[..., tuple]      # (spec, operands, output, cotangent, ops) -> cotangents
ViewRule = Callable[..., "tuple | None"]  # (spec, in shape, in strides, out shape) -> strides
WorkspaceRule = Callable[..., Dim]  # (spec, in types, out type, contiguous flags) -> bytes
InPlaceRule = Callable[..., tuple]  # (node, torch code generator) -> the operands written over


@dataclass(frozen=True)
class OpRecord:
    op: Op
    spec_type: type
    arity: int | range  # a range for ops with optional operands (a conv's bias)
    shape: ShapeRule
    evaluate: Evaluator
    cost: CostRule
    reason: str
    traits: Trait
    batch: "BatchRule"
    torch: TorchEmitter
    onnx: OnnxEmitter
    jax: JaxEmitter
    decompose: Decomposer | None = None  # kernels only
    vjp: VjpRule | None = None  # every primitive; a kernel may differentiate its decompose
    view: ViewRule | None = None  # the ops torch runs as views (Trait.VIEW)
    workspace: WorkspaceRule | None = None  # calls that allocate scratch beside the output
    in_place: InPlaceRule | None = None  # calls that may write their result over operands

    def takes(self, count: int) -> bool:
        """Whether ``count`` operands are accepted."""
        return count in self.arity if isinstance(self.arity, range) else count == self.arity

    def has(self, trait: Trait) -> bool:
        return bool(self.traits & trait)


REGISTRY: dict[Op, OpRecord] = {}
_WITH: dict[Trait, frozenset] = {}


def no_gradient(spec, operands, output, cotangent, ops) -> tuple:
    """The VJP of an op whose output does not vary smoothly with any operand (a comparison,
    an index, a sort's permutation, a bit pattern): no cotangent flows back."""
    return (None,) * len(operands)


def register(record: OpRecord) -> OpRecord:
    """Register an op's record; called once per op, next to its definition."""
    assert record.op not in REGISTRY, f"{record.op} registered twice"
    REGISTRY[record.op] = record
    _WITH.clear()
    return record


def record(op: Op) -> OpRecord:
    """The record of ``op``."""
    try:
        return REGISTRY[op]
    except KeyError:
        raise UnsupportedOpError(f"op {op.value!r} has no record (import tdag first)") from None


def ops_with(trait: Trait) -> frozenset:
    """Every registered op that has ``trait`` (any of them, for a union of traits)."""
    if trait not in _WITH:
        _WITH[trait] = frozenset(op for op, rec in REGISTRY.items() if rec.traits & trait)
    return _WITH[trait]


def has(op: Op, trait: Trait) -> bool:
    """Whether ``op`` has ``trait``."""
    return op in ops_with(trait)


__all__ = ["Cost", "NoSpec", "OpRecord", "REGISTRY", "Trait", "ViewRule", "WorkspaceRule", "has",
           "no_gradient", "ops_with", "record", "register"]
