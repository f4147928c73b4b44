"""The chains ``tdag.grad`` writes for the input gradients of ReLU, a clamp (ReLU6), SiLU,
max pooling and inference batch norm -> relu_backward, clamp_backward, silu_backward,
max_pool_backward and batch_norm_backward (tdag/lower/kernels/cnn_backward.py).

They run before the activation rules, while the forward values the chains read (the masks
of max/min, exp(-x)) are still the compositions the templates write. A clamp's bounds are
constants inside its chain: the rule binds a probe spec's template with its constants free,
reads the bounds back from what the probe's met, and then matches that spec's template node
for node. Batch norm's epsilon is found the same way.
"""
from __future__ import annotations

from tdag.deinops.primitive import NoSpec
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import shape_is_static
from tdag.ir.types import TensorType
from tdag.lower.backward import EPS_PROBE, may_match
from tdag.lower.kernels.activations import Clamp
from tdag.lower.kernels.norms import BatchNorm
from tdag.lower.kernels.windows import Pool
from tdag.lower.pool import first_max_rule
from tdag.lower.match import (bind_template, kernel_operands, kernel_template, met_constant,
                              scalar)

# probe bounds: distinct from each other and from the 0 and 1 (True) the chain also holds
PROBES = (Clamp(0.25, 0.75), Clamp(0.25, None))


def _emit(node: Node, ctx: Context, op: Op, spec, operands):
    emit = ctx.emitter(node)
    return emit.finish(emit(op, spec, *operands))


def _pointwise(node: Node, ctx: Context, op: Op):
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    types = (node.type, node.type)
    found = None if not may_match(ctx, op, NoSpec(), types) else \
        _gradient(kernel_operands(ctx, node, op, NoSpec(), types))
    if found is None:
        return NoMatch(f"not {op.value}'s chain")
    return _emit(node, ctx, op, NoSpec(), found)


def _gradient(operands: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The operands (dy, x) of a gradient; not the forward activation itself, which is
    the same chain at dy = x (where(x < 0, 0, x) is relu(x))."""
    return None if operands is None or operands[0] == operands[1] else operands


def relu_backward_rule(node: Node, ctx: Context):
    """where(x < 0, 0, dy) -> relu_backward(dy, x)"""
    return _pointwise(node, ctx, Op.relu_backward)


def silu_backward_rule(node: Node, ctx: Context):
    """the derivative chain of x / (1 + exp(-x)) at dy -> silu_backward(dy, x)"""
    return _pointwise(node, ctx, Op.silu_backward)


def clamp_backward_rule(node: Node, ctx: Context):
    """where(x > lo | isnan(x), where(max(x, lo) < hi | isnan(..), dy, 0), 0)
    -> clamp_backward(dy, x, lo, hi)"""
    if not node.type.dtype.is_float:
        return NoMatch("not a float")
    types = (node.type, node.type)
    for probe in PROBES:
        if not may_match(ctx, Op.clamp_backward, probe, types):
            continue
        bound = bind_template(ctx, node, kernel_template(Op.clamp_backward, probe, types),
                              free_consts=True)
        spec = None if bound is None else _bounds(ctx, probe, bound, types)
        found = None if spec is None else _gradient(
            kernel_operands(ctx, node, Op.clamp_backward, spec, types))
        if found is not None:
            return _emit(node, ctx, Op.clamp_backward, spec, found)
    return NoMatch("not a clamp's chain")


def _bounds(ctx: Context, probe: Clamp, bound: dict, types) -> Clamp | None:
    """The spec whose bounds are the graph constants the probe's bounds met."""
    template = kernel_template(Op.clamp_backward, probe, types)
    met = {float(template.weights[t].value): scalar(ctx, g)
           for t, g in bound.items() if t in template.weights}
    lo = met.get(probe.lo)
    hi = None if probe.hi is None else met.get(probe.hi)
    if lo is None or (probe.hi is not None and hi is None):
        return None
    return Clamp(lo, hi)


def max_pool_backward_rule(node: Node, ctx: Context):
    """slice?(fold+(where(first_max(windows of x), dy repeated, 0)))
    -> max_pool_backward(dy, x)"""
    if any(r.op is Op.slice for r in ctx.readers(node.name)):
        return NoMatch("the padding's slice goes on: match there")
    found = _pool_geometry(ctx, node)
    if found is None:
        return NoMatch("not folded window cotangents")
    spec, dy = found
    operands = kernel_operands(ctx, node, Op.max_pool_backward, spec, (dy, node.type))
    if operands is None:
        return NoMatch("not max pooling's gradient")
    return _emit(node, ctx, Op.max_pool_backward, spec, operands)


def _pool_geometry(ctx: Context, node: Node) -> tuple[Pool, TensorType] | None:
    """The pooling and the cotangent's type that the slices (padding) and folds (stride,
    dilation) under ``node`` and the window cotangent's trailing axes (kernel) say; the
    template match then checks all of it."""
    padding, folds = {}, {}
    while node is not None and node.op is Op.slice and node.spec.steps == (1,):
        padding[node.spec.axes[0]] = node.spec.starts[0]
        node = ctx.producer(node.inputs[0])
    while node is not None and node.op is Op.fold:
        folds[node.spec.axis] = node.spec
        node = ctx.producer(node.inputs[0])
    if node is None or node.op is not Op.where or len(folds) not in (2, 3):
        return None
    windows, d = ctx.type(node.name), len(folds)
    axes = sorted(folds)
    if axes != list(range(windows.rank - 2 * d, windows.rank - d)) or not set(padding) <= set(axes):
        return None
    kernel = windows.shape[-d:]
    if not shape_is_static(kernel):
        return None
    spec = Pool(tuple(int(k) for k in kernel), tuple(folds[a].step for a in axes),
                tuple(padding.get(a, 0) for a in axes), tuple(folds[a].dilation for a in axes))
    return spec, windows.with_shape(windows.shape[:-d])


def batch_norm_backward_rule(node: Node, ctx: Context):
    """dy * w (per channel) * 1/sqrt(var + eps) (per channel)
    -> batch_norm_backward(dy, var, w)"""
    if not node.type.dtype.is_float or node.type.rank < 2:
        return NoMatch("not a float with channels")
    channel = node.type.with_shape((node.type.shape[1],))
    types = (node.type, channel, channel)
    if not may_match(ctx, Op.batch_norm_backward, BatchNorm(EPS_PROBE), types):
        return NoMatch("not inference batch norm's input gradient")
    probe = kernel_template(Op.batch_norm_backward, BatchNorm(EPS_PROBE), types)
    bound = bind_template(ctx, node, probe, free_consts=True)
    eps = None if bound is None else met_constant(ctx, probe, bound, EPS_PROBE)
    found = None if eps is None else \
        kernel_operands(ctx, node, Op.batch_norm_backward, BatchNorm(eps), types)
    if found is None:
        return NoMatch("not inference batch norm's input gradient")
    return _emit(node, ctx, Op.batch_norm_backward, BatchNorm(eps), found)


RULES = (
    # max pooling's value, before the pool pass makes the max inside its mask a max_pool
    Rule(Op.reduce, first_max_rule),
    Rule(Op.where, clamp_backward_rule),
    Rule(Op.where, relu_backward_rule),
    Rule(Op.add, silu_backward_rule),
    Rule(Op.slice, max_pool_backward_rule),
    Rule(Op.fold, max_pool_backward_rule),  # no padding
    Rule(Op.multiply, batch_norm_backward_rule),
)
