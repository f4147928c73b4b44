"""Quantized compositions -> quantize, dequantize and matmul_integer kernels.

The ONNX importer writes QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear and
MatMulInteger as the compositions of ``tdag.ops.quantize``, which are also these kernels'
``decompose``. A rule proposes operands from a few landmarks of the composition (the divide
by the scale, the casts of 8-bit tensors), then checks the proposal by matching: the kernel's
decomposition of those operands, traced and simplified as lowering simplifies the program,
must be the subgraph under the node, node for node (same ops, specs, types and constants).
Only then is the node replaced, so a near miss stays the exact composition it was.

    saturate(round(x / bcast(s)) + bcast(z))      -> quantize(x, s, z)
    (cast(q) - bcast(z)) * bcast(s)               -> dequantize(q, s, z)
    (cast_i32(a) - za) @ (cast_i32(b) - zb)       -> matmul_integer(a, b, za, zb)
    cast_i32(conv(cast(x - zx), cast(w - zw)))    -> conv_integer(x, w, zx, zw)
    saturate(round(f64(conv_integer [+ b]) * f64(xs * ws / ys) + yz)) -> qlinear_conv
    saturate(round(f64(matmul_integer) * f64(as * bs / ys) + yz))      -> qlinear_matmul
    DynamicQuantizeLinear's scale, zero point, output -> dynamic_quantize[1], [2], [0](x)
"""
from __future__ import annotations

import itertools
from functools import lru_cache

from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.rewrite import Context, NoMatch, Rule, RuleSet, rewrite
from tdag.ir.types import DType, TensorType
from tdag.lower import activations
from tdag.lower.kernels.qlinear import QLinearConv, QLinearMatMul
from tdag.lower.kernels.quant import (
    QUANTIZED,
    ConvInteger,
    Dequantize,
    DynamicQuantize,
    MatMulInteger,
    Quantize,
)
from tdag.lower.match import (
    BROADCAST,
    decomposition,
    is_unit,
    matches_kernel,
    simplified,
    trace_axes,
)
from tdag.lower.passes import default_pipeline, rule_pass, run_passes

_CONE = 64  # nodes a proposal looks through: a composition is a few dozen
_VIEWS = BROADCAST | {Op.ungroup}


@lru_cache(maxsize=256)
def _template(op: Op, spec, types: tuple[TensorType, ...]) -> TDAG:
    """The kernel's decomposition of operands of ``types``, simplified as ``lower`` simplifies
    a program before any rule sees it, then lowered by the rules that run before this
    kernel's (``_BEFORE``): the form the graph has when the kernel's rule looks."""
    prog = decomposition(op, spec, types)
    if op is Op.conv_integer:  # the quant pass meets it again once lowering made the conv
        return _lowered_without_quant(prog).graph
    if op in (Op.qlinear_conv, Op.qlinear_matmul):  # it looks once conv_integer is made
        return _lowered_without_requantize(prog).graph
    graph = simplified(prog)
    passes = [RuleSet(rules) for rules in _BEFORE(op, spec)]
    changed = bool(passes)
    while changed:  # as lower's passes run: each in turn, until none changes the graph
        changed = False
        for rules in passes:
            graph, step = rewrite(graph, rules)
            changed |= step
    return graph


def _lowered_without_quant(prog: Program) -> Program:
    """``prog`` through lower's default passes but this one."""
    passes, order = default_pipeline()
    return run_passes(prog, [p for p in order if p != "quant"], passes)


def _lowered_without_requantize(prog: Program) -> Program:
    """``prog`` through lower's default passes, the quant pass without the requantizing
    kernels' rules."""
    passes, order = default_pipeline()
    return run_passes(prog, order, dict(passes, quant=rule_pass(*INTEGER_RULES)))


def _matches(ctx: Context, root: Node, op: Op, spec, operands: tuple[str, ...]) -> bool:
    """Whether ``root`` computes ``op[spec](*operands)`` as its decomposition writes it."""
    return matches_kernel(ctx, root, op, spec, operands, _template)


def _cone(ctx: Context, root: Node) -> list[Node]:
    """The nodes under ``root``, nearest first, at most ``_CONE`` of them; a cast of an
    integer tensor is a leaf of every composition here, so the walk stops there."""
    seen, order, frontier = {root.name}, [], [root.name]
    while frontier and len(order) < _CONE:
        node = ctx.producer(frontier.pop(0))
        if node is None:
            continue
        order.append(node)
        if node.op is Op.cast and not ctx.type(node.inputs[0]).dtype.is_float:
            continue
        for name in node.inputs:
            if name not in seen:
                seen.add(name)
                frontier.append(name)
    return order


def _casts_from(ctx: Context, cone, dtypes) -> list[str]:
    """The tensors of ``dtypes`` that nodes of ``cone`` cast to something else, and the
    sources those are views of (a per-axis zero point reshaped before its cast)."""
    found = []
    for node in cone:
        if node.op is not Op.cast or ctx.type(node.inputs[0]).dtype not in dtypes:
            continue
        name = node.inputs[0]
        while name is not None:
            if name not in found:
                found.append(name)
            view = ctx.producer(name)
            name = view.inputs[0] if view is not None and view.op in _VIEWS else None
    return found


def _scale_axis(ctx: Context, name: str, rank: int):
    """(scale, axis) of a scale broadcast to rank ``rank``: axis None for one value, -1 for
    a broadcast that is neither. Simplify writes a 1-D scale's reshape to (1, C, 1) as an
    ungroup, which the walk steps over here."""
    src, mapping = trace_axes(ctx, name, units=True)
    ungroup = ctx.made(src, Op.ungroup)
    if ungroup is not None and ctx.type(ungroup.inputs[0]).rank == 1:
        real = [i for i, d in enumerate(ungroup.type.shape) if not is_unit(d)]
        if len(real) == 1 and real[0] in mapping:
            src, mapping = ungroup.inputs[0], tuple(
                0 if a == real[0] else None for a in mapping)
    t = ctx.type(src)
    if t.rank == 0 or (t.rank == 1 and is_unit(t.shape[0])):
        return src, None
    axes = [i for i, a in enumerate(mapping) if a is not None]
    return src, (axes[0] if t.rank == 1 and len(axes) == 1 and len(mapping) == rank else -1)


def _replace(ctx: Context, root: Node, op: Op, spec, operands):
    emit = ctx.emitter(root)
    return emit.finish(emit(op, spec, *operands))


def quantize_rule(node: Node, ctx: Context):
    """saturate(round(x / bcast(s)) + bcast(z)) -> quantize(x, s, z)"""
    dtype = node.spec.dtype
    if dtype not in QUANTIZED:
        return NoMatch("not a cast to a quantized type")
    cone = _cone(ctx, node)
    zeros = _casts_from(ctx, cone, {dtype}) + [None]
    for div in cone:
        if div.op is not Op.divide or not div.type.dtype.is_float or \
                div.type.shape != node.type.shape:
            continue
        scale, axis = _scale_axis(ctx, div.inputs[1], node.type.rank)
        for zero in zeros:
            operands = (div.inputs[0], scale) + ((zero,) if zero else ())
            if axis != -1 and _matches(ctx, node, Op.quantize, Quantize(dtype, axis), operands):
                return _replace(ctx, node, Op.quantize, Quantize(dtype, axis), operands)
    return NoMatch("not a quantization")


def dequantize_rule(node: Node, ctx: Context):
    """(cast(q) - bcast(z)) * bcast(s) -> dequantize(q, s, z)"""
    if node.type.dtype is not DType.f32:
        return NoMatch("not an f32 product")
    cone = _cone(ctx, node)[:12]
    ints = _casts_from(ctx, cone, QUANTIZED | {DType.i32})
    for q, side in itertools.product(ints, node.inputs):
        if ctx.type(q).shape != node.type.shape:
            continue
        scale, axis = _scale_axis(ctx, side, node.type.rank)
        if axis == -1:
            continue
        for zero in [z for z in ints if z != q and ctx.type(z).dtype is ctx.type(q).dtype] + \
                [None]:
            operands = (q, scale) + ((zero,) if zero else ())
            if _matches(ctx, node, Op.dequantize, Dequantize(axis), operands):
                return _replace(ctx, node, Op.dequantize, Dequantize(axis), operands)
    return NoMatch("not a dequantization")


def matmul_integer_rule(node: Node, ctx: Context):
    """(cast_i32(a) - za) @ (cast_i32(b) - zb) -> matmul_integer(a, b, za, zb)"""
    if node.spec.kind.value != "sum" or node.type.dtype is not DType.i32:
        return NoMatch("not an i32 sum")
    eight = _casts_from(ctx, _cone(ctx, node)[:24], {DType.u8, DType.i8})
    mats = [n for n in eight if ctx.type(n).rank >= 2]
    zeros = [n for n in eight if ctx.type(n).rank <= 1]
    for a, b in itertools.permutations(mats, 2):
        for az, bz in itertools.product(zeros + [None], repeat=2):
            spec = MatMulInteger(az is not None, bz is not None)
            operands = tuple(n for n in (a, b, az, bz) if n is not None)
            if _matches(ctx, node, Op.matmul_integer, spec, operands):
                return _replace(ctx, node, Op.matmul_integer, spec, operands)
    return NoMatch("not an integer matmul")


def dynamic_scale_rule(node: Node, ctx: Context):
    """(max(amax(x), 0) - min(amin(x), 0)) / 255 -> dynamic_quantize[1](x)"""
    if node.type.rank != 0 or node.type.dtype is not DType.f32:
        return NoMatch("not an f32 scalar")
    for reduce in _cone(ctx, node)[:12]:
        x = reduce.inputs[0] if reduce.op is Op.reduce else None
        if x is not None and _matches(ctx, node, Op.dynamic_quantize, DynamicQuantize(1), (x,)):
            return _replace(ctx, node, Op.dynamic_quantize, DynamicQuantize(1), (x,))
    return NoMatch("not DynamicQuantizeLinear's scale")


def _dynamic_part(node: Node, ctx: Context, part: int):
    """A quantize by DynamicQuantizeLinear's scale of x -> its ``part`` of x."""
    scale = ctx.made(node.inputs[1], Op.dynamic_quantize)
    if scale is None or (len(node.inputs) == 3) != (part == 0):
        return NoMatch("not quantized by a dynamic scale")
    x = scale.inputs[0]
    if _matches(ctx, node, Op.dynamic_quantize, DynamicQuantize(part), (x,)):
        return _replace(ctx, node, Op.dynamic_quantize, DynamicQuantize(part), (x,))
    return NoMatch(f"not DynamicQuantizeLinear's output {part}")


def dynamic_zero_rule(node: Node, ctx: Context):
    """quantize(-min(amin(x), 0), dynamic_quantize[1](x)) -> dynamic_quantize[2](x)"""
    return _dynamic_part(node, ctx, 2)


def dynamic_output_rule(node: Node, ctx: Context):
    """quantize(x, dynamic_quantize[1](x), dynamic_quantize[2](x)) -> dynamic_quantize[0](x)"""
    return _dynamic_part(node, ctx, 0)


def _conv_leaves(ctx: Context, node: Node) -> tuple[Node | None, list[str], list[str]]:
    """(the conv, its 8-bit candidate tensors, their 8-bit zero point candidates) of
    ``cast_i32(conv(cast(x - zx), cast(w - zw)))``; (None, [], []) for any other node."""
    inner = ctx.made(node.inputs[0], Op.conv) if node.op is Op.cast else None
    if inner is None or node.spec.dtype is not DType.i32:
        return None, [], []
    # the conv reads casts of the centred i32 tensors: the cone walk stops at those casts
    centred = [ctx.made(i, Op.cast) for i in inner.inputs]
    cone = [n for c in centred if c is not None and ctx.producer(c.inputs[0]) is not None
            for n in _cone(ctx, ctx.producer(c.inputs[0]))[:12]]
    eight = _casts_from(ctx, cone, QUANTIZED)
    return inner, [n for n in eight if ctx.type(n).rank == node.type.rank], \
        [n for n in eight if ctx.type(n).rank <= 1]


def conv_integer_rule(node: Node, ctx: Context):
    """cast_i32(conv(cast(x - zx), cast(w - zw))) -> conv_integer(x, w, zx, zw)"""
    inner, mats, zeros = _conv_leaves(ctx, node)
    if inner is None:
        return NoMatch("not an i32 cast of a conv")
    s = inner.spec
    for x, w in itertools.permutations(mats, 2):
        for xz, wz in itertools.product(zeros + [None], repeat=2):
            spec = ConvInteger(s.stride, s.padding, s.dilation, s.groups, xz is not None,
                               wz is not None)
            operands = tuple(n for n in (x, w, xz, wz) if n is not None)
            if _matches(ctx, node, Op.conv_integer, spec, operands):
                return _replace(ctx, node, Op.conv_integer, spec, operands)
    return NoMatch("not an integer convolution")


def _BEFORE(op: Op, spec) -> tuple[tuple[Rule, ...], ...]:
    """The passes (rules) whose kernels a kernel's decomposition holds when its own rule
    looks, in lower's order: DynamicQuantizeLinear's parts are built on one another (and its
    min(x, 0) is a clamp by then)."""
    if op is Op.dynamic_quantize and spec.part != 1:
        own = (Rule(Op.cast, quantize_rule), Rule(Op.divide, dynamic_scale_rule)) + \
            ((Rule(Op.quantize, dynamic_zero_rule),) if spec.part == 0 else ())
        return own, activations.RULES
    return ()


def _views_of(ctx: Context, name: str) -> list[str]:
    """``name`` and the tensors it is a view (reshape, broadcast) of, nearest first."""
    chain = [name]
    view = ctx.producer(name)
    while view is not None and view.op in _VIEWS | {Op.reshape}:
        chain.append(view.inputs[0])
        view = ctx.producer(view.inputs[0])
    return chain


def _integer_products(ctx: Context, name: str) -> list[tuple[Node, tuple[str, ...]]]:
    """(integer kernel or conv, (x, w, x_zero, w_zero)) candidates for the i32 product
    ``name``: a conv_integer or matmul_integer with both zero points, or the i32 cast of a conv
    of centred 8-bit tensors (a weight zero point per channel, which conv_integer refuses)."""
    node = ctx.producer(name)
    if node is not None and node.op in (Op.conv_integer, Op.matmul_integer):
        return [(node, node.inputs)] if len(node.inputs) == 4 else []
    conv, mats, zeros = _conv_leaves(ctx, node) if node is not None else (None, [], [])
    return [(conv, (x, w, xz, wz)) for x, w in itertools.permutations(mats, 2)
            for xz, wz in itertools.product(zeros, repeat=2) if _one_zero(ctx, wz)]


def _one_zero(ctx: Context, name: str) -> bool:
    """Whether the weight zero point ``name`` is one value, or one per channel all equal (what
    onnxruntime's QLinearConv accepts)."""
    if ctx.type(name).numel == 1:
        return True
    weight = ctx.weight(name)
    return weight is not None and weight.value is not None and \
        bool((weight.value == weight.value.reshape(-1)[0]).all())


def _accumulator(ctx: Context, name: str) -> tuple[list, list[str | None]]:
    """The integer products (``_integer_products``) whose i32 accumulator ``name`` is, and
    the rank-1 bias candidates added to a convolution's ([None]: no bias)."""
    node = ctx.producer(name)
    if node is None or node.op is not Op.add:
        return _integer_products(ctx, name), [None]
    for acc, other in (node.inputs, tuple(reversed(node.inputs))):
        products = [(k, ops) for k, ops in _integer_products(ctx, acc)
                    if k.op is not Op.matmul_integer]
        if products:
            return products, [b for b in _views_of(ctx, other) if ctx.type(b).rank == 1]
    return [], []


def _scales(ctx: Context, cone) -> list[tuple[str, str, str]]:
    """(x_scale, w_scale, y_scale) candidates: ``x_scale * w_scale / y_scale`` in f32, each
    scale possibly broadcast or reshaped to one per channel."""
    found = []
    for div in cone:
        mul = ctx.made(div.inputs[0], Op.multiply) if div.op is Op.divide and \
            div.type.dtype is DType.f32 else None
        for xs, ws in (mul.inputs, tuple(reversed(mul.inputs))) if mul is not None else ():
            found += itertools.product(_views_of(ctx, xs), _views_of(ctx, ws),
                                       _views_of(ctx, div.inputs[1]))
    return found


def qlinear_rule(node: Node, ctx: Context):
    """saturate(round((conv_integer [+ b]) * (xs * ws / ys) + yz)) -> qlinear_conv;
    saturate(round(matmul_integer * (as * bs / ys) + yz)) -> qlinear_matmul"""
    if node.spec.dtype not in QUANTIZED:
        return NoMatch("not a cast to 8 bits")
    cone = _cone(ctx, node)
    zeros = [z for z in _casts_from(ctx, cone, {node.spec.dtype}) if ctx.type(z).rank <= 1]
    for cast in cone:
        if cast.op is not Op.cast or cast.spec.dtype is not DType.f64 or \
                ctx.type(cast.inputs[0]).dtype is not DType.i32:
            continue
        products, biases = _accumulator(ctx, cast.inputs[0])
        for (kernel, (x, w, xz, wz)), (xs, ws, ys), yz, b in itertools.product(
                products, _scales(ctx, cone), zeros, biases):
            operands = (x, xs, xz, w, ws, wz, ys, yz) + ((b,) if b is not None else ())
            if kernel.op is Op.matmul_integer:
                op, spec = Op.qlinear_matmul, QLinearMatMul()
            else:
                s = kernel.spec
                op, spec = Op.qlinear_conv, QLinearConv(s.stride, s.padding, s.dilation,
                                                        s.groups, b is not None)
            if _matches(ctx, node, op, spec, operands):
                return _replace(ctx, node, op, spec, operands)
    return NoMatch("not a requantized integer conv or matmul")


INTEGER_RULES = (
    Rule(Op.cast, quantize_rule),           # saturate(round(x / s) + z) -> quantize
    Rule(Op.multiply, dequantize_rule),     # (cast(q) - z) * s -> dequantize
    Rule(Op.reduce, matmul_integer_rule),   # (a - za) @ (b - zb) in i32 -> matmul_integer
    Rule(Op.cast, conv_integer_rule),       # cast_i32(conv(x - zx, w - zw)) -> conv_integer
    Rule(Op.divide, dynamic_scale_rule),    # (max(x, 0) - min(x, 0)) / 255 -> its scale
    Rule(Op.quantize, dynamic_zero_rule),   # quantize(-min(x, 0), scale) -> its zero point
    Rule(Op.quantize, dynamic_output_rule),  # quantize(x, scale, zero) -> its output
)

RULES = INTEGER_RULES + (
    Rule(Op.cast, qlinear_rule),  # saturate(round(integer kernel * s + z)) -> qlinear_*
)
