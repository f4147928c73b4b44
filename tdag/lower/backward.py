"""The chains ``tdag.grad`` writes for the input gradient of softmax, GELU, layer norm and
RMS norm -> softmax_backward, gelu_backward, layer_norm_backward and rms_norm_backward
(tdag/lower/kernels/backward.py).

Each chain ends in the sum of an operand's cotangent contributions (an add); the rule tries
the kernel's template at that add for each axis (softmax) or mode (GELU), and the match
itself finds the cotangent and the forward input deep inside it. Layer norm's input is a
residual stream, whose other uses' contributions the sum takes between the kernel's two
terms; its rule finds the two terms inside the sum, and its epsilon by a probe (RMS
norm's rule likewise, with three terms: x * x gives x two contributions).
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

from tdag import ops
from tdag.errors import TdagError
from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.record import record
from tdag.ir.rewrite import Context, NoMatch, Rule, node_kind
from tdag.ir.symbols import is_static
from tdag.ir.types import TensorType
from tdag.lower.kernels.activations import Gelu, Softmax
from tdag.lower.kernels.backward import vjp_of
from tdag.lower.kernels.norms import LayerNorm, RMSNorm
from tdag.lower.match import (BROADCAST, bind_sum_template, kernel_operands, kernel_template,
                              met_constant, simplified)
from tdag.ops.builder import Builder

# an epsilon no other constant of layer norm's gradient equals (7 * 2**-15, exact in f32)
EPS_PROBE = 7 * 2.0 ** -15


@lru_cache(maxsize=256)
def _template_kinds(op: Op, spec, types, template: Callable[..., TDAG]) -> frozenset:
    return frozenset(node_kind(n) for n in template(op, spec, types).nodes)


@lru_cache(maxsize=256)
def _template_ops(op: Op, spec, types, template: Callable[..., TDAG]) -> frozenset:
    return frozenset(n.op for n in template(op, spec, types).nodes)


def _same_pattern(types: tuple[TensorType, ...]) -> tuple[TensorType, ...] | None:
    """``types`` with each distinct static size but 1 renamed 2, 3, 4, ... in order of first
    sight (None where a size is symbolic): a template's ops depend on which sizes are 1 and
    which equal which, not on the sizes, so one template of the pattern serves every shape."""
    sizes: dict = {1: 1}
    if not all(is_static(d) for t in types for d in t.shape):
        return None
    return tuple(t.with_shape(sizes.setdefault(int(d), len(sizes) + 1) for d in t.shape)
                 for t in types)


def may_match(ctx: Context, op: Op, spec, types, template=kernel_template) -> bool:
    """Whether the graph has a node of each op, spec and dtype of the template's nodes, as
    a match needs: the rules are tried at every float add, and in a program without the
    chain (an inference program) this check fails where the search would. The ops are
    checked first, on a template of the shapes' pattern, so that a graph without them
    (DenseNet-121's 3,500 adds of a hundred shapes) builds no template per shape. A template
    that cannot be built is left to the search to refuse."""
    try:
        record(op).shape(spec, types)
        pattern = _same_pattern(types)
        if pattern is not None and not ctx.has_ops(_template_ops(op, spec, pattern, template)):
            return False
        kinds = _template_kinds(op, spec, types, template)
    except TdagError:
        return True
    return ctx.has_kinds(kinds)


def _lower(node: Node, ctx: Context, op: Op, specs):
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    types = (node.type, node.type)
    for spec in specs:
        if not may_match(ctx, op, spec, types):
            continue
        found = kernel_operands(ctx, node, op, spec, types)
        if found is not None:
            emit = ctx.emitter(node)
            return emit.finish(emit(op, spec, *found))
    return NoMatch(f"not {op.value}'s chain")


def softmax_backward_rule(node: Node, ctx: Context):
    """the derivative chain of softmax(x, a) at dy -> softmax_backward(dy, x, a)"""
    axes = range(node.type.rank)
    return _lower(node, ctx, Op.softmax_backward, [Softmax(a) for a in reversed(axes)])


def gelu_backward_rule(node: Node, ctx: Context):
    """the derivative chain of gelu(x) at dy -> gelu_backward(dy, x)"""
    return _lower(node, ctx, Op.gelu_backward, [Gelu("none"), Gelu("tanh")])


def gelu_new(v):
    """transformers' gelu_new (GPT-2's NewGELUActivation) as torch computes it: the tanh
    GELU, its cube a pow, in an order of its own (ops.gelu writes x * x * x)."""
    half = v * 0.5  # first: the order of x's uses is the order its gradient sums them
    inner = (v + ops.pow(v, 3.0) * 0.044715) * math.sqrt(2.0 / math.pi)
    return half * (ops.tanh(inner) + 1.0)


@lru_cache(maxsize=64)
def _gelu_new_template(op: Op, spec, types) -> TDAG:
    """gelu_backward's template for ``gelu_new``: the gradient ``tdag.grad`` writes for it."""
    builder = Builder()
    with builder.active():
        dy, x = (builder.input(f"t{i}", t) for i, t in enumerate(types))
        out = vjp_of(gelu_new, x, dy)
    return simplified(Program.from_tdag(builder.build([out])))


def gelu_new_backward_rule(node: Node, ctx: Context):
    """the derivative chain of gelu_new(x) at dy -> gelu_backward(dy, x, 'tanh')"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    types = (node.type,) * 2
    found = None if not may_match(ctx, Op.gelu_backward, Gelu("tanh"), types,
                                   _gelu_new_template) else \
        kernel_operands(ctx, node, Op.gelu_backward, Gelu("tanh"), types, _gelu_new_template)
    if found is None:
        return NoMatch("not gelu_new's chain")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.gelu_backward, Gelu("tanh"), *found))


def layer_norm_backward_rule(node: Node, ctx: Context):
    """r + (the derivative chain of layer_norm(x) at dy) -> r + layer_norm_backward(dy, x)"""
    return _norm_backward(node, ctx, Op.layer_norm_backward, LayerNorm)


def rms_norm_backward_rule(node: Node, ctx: Context):
    """r + (the derivative chain of rms_norm(x) at dy) -> r + rms_norm_backward(dy, x)"""
    return _norm_backward(node, ctx, Op.rms_norm_backward, RMSNorm, _uncentred)


def _uncentred(ctx: Context, bound: dict, template: TDAG) -> bool:
    """Layer norm holds RMS norm's chain on x - mean(x): that x is left to its own rule."""
    x = ctx.producer(bound[template.inputs[1].name])  # x - m is add(x, neg(m) broadcast)
    return x is None or x.op is not Op.add or not any(
        _under_views(ctx, i) is Op.neg for i in x.inputs)


def _under_views(ctx: Context, name: str) -> Op | None:
    """The op that makes ``name`` under its broadcast views, None for an input."""
    node = ctx.producer(name)
    while node is not None and node.op in BROADCAST:
        node = ctx.producer(node.inputs[0])
    return None if node is None else node.op


def _norm_backward(node: Node, ctx: Context, op: Op, kind: type,
                   accept: Callable[[Context, dict, TDAG], bool] | None = None):
    """The norm's input gradient where its template binds inside the sum at ``node`` (and
    ``accept`` takes the binding); the sum's other terms added to it."""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    types = (node.type, node.type)
    for count in range(1, node.type.rank + 1):
        spec = _probed_spec(ctx, node, op, kind, count, types)
        template = None if spec is None else kernel_template(op, spec, types)
        found = None if template is None else bind_sum_template(ctx, node, template)
        if found is not None and (accept is None or accept(ctx, found[0], template)):
            bound, rest = found
            emit = ctx.emitter(node)
            total = emit(op, spec, *(bound[v.name] for v in template.inputs))
            for term in rest:
                total = emit(Op.add, node.spec, term, total)
            return emit.finish(total)
    return NoMatch(f"not {op.value}'s chain")


def _probed_spec(ctx: Context, node: Node, op: Op, kind: type, count: int, types):
    """The spec whose epsilon is the graph constant that the probe's epsilon met, where
    the probe's template binds at ``node`` with its constants free."""
    if not may_match(ctx, op, kind(count, EPS_PROBE), types):
        return None
    probe = kernel_template(op, kind(count, EPS_PROBE), types)
    found = bind_sum_template(ctx, node, probe, free_consts=True)
    eps = None if found is None else met_constant(ctx, probe, found[0], EPS_PROBE)
    return None if eps is None else kind(count, eps)


RULES = (
    Rule(Op.add, softmax_backward_rule),
    Rule(Op.add, gelu_backward_rule),
    Rule(Op.add, gelu_new_backward_rule),
    Rule(Op.add, layer_norm_backward_rule),
    Rule(Op.add, rms_norm_backward_rule),
)
