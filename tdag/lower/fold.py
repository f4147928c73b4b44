"""Deployment folds: work the weights fix is done once here, not on every call.

    batch_norm(k(x, W, b), mean, var, g, beta)  -> k(x, W * s, (b - mean) * s + beta)
    k(x, W, b) * bcast(s over k's channels)     -> k(x, W * s, b * s)
    k(x, W, b) + bcast(t over k's channels)     -> k(x, W, b + t)
    k(x, W, 0)                                  -> k(x, W)
    cast(cast(x: A, B), C), A exact in B        -> cast(x, C)  (x when C is A)

    einsum(x, W[n, k]) (x not 2-d)              -> einsum(x, W^T[k, n])

with ``s = g / sqrt(var + eps)`` and ``k`` a conv, a transposed conv or an einsum whose
output channel comes from W alone (nn.Linear's last axis). Only weights the TDAG holds with a
value fold, never what a program trains: ``tdag.train_step`` passes its parameters in as
inputs, and a ``tdag.grad`` program's ``wrt`` weights stay. New weights are ``const``s
(under the name of the weight they replace, where that one goes), computed in float64 and
rounded once to the weight's dtype. ``fold_weights`` then turns nodes that compute from
weights alone (a transposed or reshaped weight, a rotary table) into weights, where that
costs no memory. The pass "fold" folds every kind of weight (to_onnx's deployed file);
to_torch and to_jax run "fold_consts", so their parameters and buffers stay the source's,
to load, swap or train by name.
"""
from __future__ import annotations

from collections import Counter
from functools import partial
from typing import Callable

import torch

from tdag.ir.graph import TDAG, Node, Weight
from tdag.ir.symbols import shape_is_static
from tdag.ir.op import Op
from tdag.ir.passes import per_graph
from tdag.ir.program import Program
from tdag.ir.record import Trait, has
from tdag.ir.rewrite import Alias, Context, NoMatch, Result, Rule, RuleSet, rewrite
from tdag.ir.types import DType, TensorKind, TensorType, fill_of
from tdag.lower.kernels.contraction import Einsum
from tdag.lower.kernels.einsum_plan import parse_equation, plan_einsum
from tdag.lower.kernels.norms import batch_norm_affine
from tdag.lower.match import trace_axes
from tdag.refine.dataflow import live_names, prune, renamed
from tdag.refine.grad.program import GradProgram
from tdag.refine.constants import FOLD_LIMIT, evaluate_node

_KERNELS = (Op.conv, Op.conv_transpose, Op.einsum)
_QDQ = (Op.quantize, Op.dequantize)


class FoldContext(Context):
    """A rewrite context over a graph whose ``fixed`` weights may fold: it can add ``const``
    weights (each remembers the weight it came from) and remembers the weights it read."""

    def __init__(self, graph: TDAG, fixed: frozenset):
        super().__init__(graph)
        self.fixed = fixed
        self.added: dict[str, Weight] = {}
        self.source: dict[str, str] = {}  # added const -> the weight it replaces
        self.read: set[str] = set()

    def weight(self, name: str) -> Weight | None:
        return self.added.get(name) or super().weight(name)

    def value(self, name: str) -> torch.Tensor | None:
        """The value of fixed weight ``name`` (None for inputs, nodes and other weights, and
        for a fill: one element broadcast, which a fold would write out dense)."""
        w = self.added.get(name)
        if w is None and name in self.fixed:
            w = self.graph.weights[name]
        return None if w is None or fill_of(w.value) is not None else w.value

    def const(self, hint: str, value: torch.Tensor, dtype: DType) -> str:
        """A new const weight holding ``value`` rounded to ``dtype``."""
        name = self.fresh(hint)
        self.source[name] = hint
        type_ = TensorType(tuple(value.shape), dtype)
        self.added[name] = Weight(TensorKind.const, type_, value.to(dtype.torch).contiguous())
        self.types[name] = type_
        return name


# -- where a kernel's output channels live in its weight ----------------------------------------

def _channel_axis(node: Node) -> int:
    """The output axis of ``node``'s channels that a weight scale can absorb: 1 for a conv,
    the last axis for an einsum (where its bias broadcasts)."""
    return node.type.rank - 1 if node.op is Op.einsum else 1


def _scaled_weight(kernel: Node, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor | None:
    """``kernel``'s weight with output channel ``o`` scaled by ``s[o]``."""
    if kernel.op is Op.conv:
        return w * s.reshape((-1,) + (1,) * (w.dim() - 1))
    if kernel.op is Op.conv_transpose:
        g = kernel.spec.groups  # w[Cin, Cout/g, *K]: output channel o = group * Cout/g + j
        grouped = w.reshape((g, w.shape[0] // g) + tuple(w.shape[1:]))
        scale = s.reshape((g, 1, -1) + (1,) * (w.dim() - 2))
        return (grouped * scale).reshape(w.shape)
    (a, b), out = parse_equation(kernel.spec.equation)
    letter = out[-1]
    if letter in a or b.count(letter) != 1:
        return None  # the channel is not W's alone: scaling W would scale other outputs
    axis = b.index(letter)
    return w * s.reshape((-1,) + (1,) * (w.dim() - 1 - axis))


def _kernel_of(ctx: FoldContext, name: str) -> Node | None:
    """The conv / einsum computing ``name`` from a fixed weight, read by nothing else."""
    kernel = ctx.producer(name)
    if kernel is None or kernel.op not in _KERNELS or not ctx.single_use(name):
        return None
    if len(kernel.inputs) < 2 or ctx.value(kernel.inputs[1]) is None:
        return None
    bias = kernel.inputs[2] if len(kernel.inputs) == 3 else None
    if bias is not None and (ctx.value(bias) is None or ctx.type(bias).rank != 1):
        return None  # an einsum's bias over several trailing axes is not a channel vector
    return kernel


def _channel_vector(ctx: FoldContext, name: str, rank: int, axis: int) -> torch.Tensor | None:
    """The fixed [C] vector that ``name`` broadcasts along ``axis`` only, in float64."""
    src, mapping = trace_axes(ctx, name)
    value = ctx.value(src)
    if value is None or value.dim() != 1 or len(mapping) != rank:
        return None
    if [i for i, m in enumerate(mapping) if m is not None] != [axis]:
        return None
    return value.double()


def _refolded(node: Node, ctx: FoldContext, kernel: Node, scale, shift) -> Result:
    """``kernel`` with its weight scaled by ``scale`` and its bias ``bias * scale + shift``
    (None: no change), standing for ``node``."""
    w_name = kernel.inputs[1]
    w = ctx.value(w_name)
    channels = int(kernel.type.shape[_channel_axis(kernel)])
    bias = kernel.inputs[2] if len(kernel.inputs) == 3 else None
    b = ctx.value(bias).double() if bias is not None else torch.zeros(channels,
                                                                         dtype=torch.float64)
    inputs = list(kernel.inputs[:2])
    if scale is not None:
        scaled = _scaled_weight(kernel, w.double(), scale)
        if scaled is None:
            return NoMatch("the channel axis is not the weight's alone")
        inputs[1] = ctx.const(w_name, scaled, ctx.type(w_name).dtype)
        b = b * scale
    if shift is not None:
        b = b + shift
    dtype = ctx.type(w_name).dtype
    inputs.append(ctx.const(bias or f"{w_name}.bias", b, dtype))
    ctx.read.update(kernel.inputs[1:])
    emit = ctx.emitter(node)
    return emit.finish(emit(kernel.op, kernel.spec, *inputs))


# -- the rules ----------------------------------------------------------------------------------

def batch_norm_fold(node: Node, ctx: FoldContext):
    """batch_norm(k(x, W, b), mean, var, g, beta) -> k(x, W * s, (b - mean) * s + beta)"""
    kernel = _kernel_of(ctx, node.inputs[0])
    if kernel is None:
        return NoMatch("not a conv or einsum with fixed weights, read only here")
    if _channel_axis(kernel) != 1:
        return NoMatch("the einsum's channel axis is not batch norm's axis 1")
    values = [ctx.value(n) for n in node.inputs[1:]]
    if any(v is None for v in values):
        return NoMatch("statistics or affine are not fixed values")
    mean, var, *affine = values
    affine += [None] * (2 - len(affine))
    scale, shift = batch_norm_affine(mean, var, *affine, node.spec.eps)
    ctx.read.update(node.inputs[1:])
    return _refolded(node, ctx, kernel, scale, shift)


def scale_fold(node: Node, ctx: FoldContext):
    """k(x, W, b) * bcast(s over k's channels) -> k(x, W * s, b * s)"""
    return _channel_fold(node, ctx, shift=False) or \
        NoMatch("not a conv or einsum with fixed weights times a fixed channel vector")


def shift_fold(node: Node, ctx: FoldContext):
    """k(x, W, b) + bcast(t over k's channels) -> k(x, W, b + t)"""
    return _channel_fold(node, ctx, shift=True) or \
        NoMatch("not a conv or einsum with a fixed bias plus a fixed channel vector")


def _channel_fold(node: Node, ctx: FoldContext, shift: bool) -> Result | None:
    """A kernel operand of ``node`` with the other, a fixed channel vector, folded in as its
    scale or (into a bias it has: else fuse's bias rules take the vector) its shift."""
    for mine, other in (node.inputs, reversed(node.inputs)):
        kernel = _kernel_of(ctx, mine)
        if kernel is None or not ctx.type(mine).same_as(node.type) or \
                (shift and len(kernel.inputs) != 3):
            continue
        vector = _channel_vector(ctx, other, node.type.rank, _channel_axis(kernel))
        if vector is not None:
            ctx.read.add(trace_axes(ctx, other)[0])
            return _refolded(node, ctx, kernel, None if shift else vector,
                             vector if shift else None)
    return None


def weight_layout_fold(node: Node, ctx: FoldContext):
    """einsum(x, W[n, k]) -> einsum(x, W^T[k, n]) (a fixed W, x not 2-d): the product reads
    W as [k, n], and a file would transpose it on every call (``Gemm`` takes 2-d x as is)"""
    bias_rank = ctx.type(node.inputs[2]).rank if len(node.inputs) == 3 else None
    plan = plan_einsum(node.spec.equation, bias_rank)
    wants_t = (plan.kind == "linear" and not plan.transpose_b) or \
        (plan.kind == "matmul" and plan.transpose_b)
    yi, xi = (0, 1) if plan.swap else (1, 0)
    w_name = node.inputs[yi]
    w = ctx.value(w_name)
    if not wants_t or w is None or ctx.type(node.inputs[xi]).rank == 2:
        return NoMatch("the weight is read in its own layout, or is not fixed")
    if len(ctx.readers(w_name)) != 1:
        return NoMatch("the weight is read elsewhere too: a transposed copy would double it")
    ins, out = parse_equation(node.spec.equation)
    letters = list(ins)
    letters[yi] = letters[yi][:-2] + letters[yi][-1] + letters[yi][-2]
    inputs = list(node.inputs)
    inputs[yi] = ctx.const(w_name, w.transpose(-1, -2), ctx.type(w_name).dtype)
    ctx.read.add(w_name)
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.einsum, Einsum(f"{letters[0]},{letters[1]}->{out}"), *inputs))


def zero_bias(node: Node, ctx: FoldContext):
    """k(x, W, 0) -> k(x, W): a fixed all-zero bias (a fresh model's, as transformers and
    torchvision initialise theirs) adds nothing but a pass, or an epilogue, on every call;
    torch.onnx.export's optimiser drops it too (only a -0.0 output's sign may differ)"""
    bias = node.inputs[2] if len(node.inputs) == 3 else None
    value = None if bias is None else ctx.value(bias)
    if value is None or value.any():
        return NoMatch("no fixed bias, or not all zero")
    ctx.read.add(bias)
    emit = ctx.emitter(node)
    return emit.finish(emit(node.op, node.spec, *node.inputs[:2]))


# types whose every value the wider type holds exactly (so a round trip is the identity)
_EXACT_IN: dict[DType, frozenset] = {
    DType.f16: frozenset({DType.f32, DType.f64}),
    DType.bf16: frozenset({DType.f32, DType.f64}),
    DType.f32: frozenset({DType.f64}),
    DType.i8: frozenset({DType.i16, DType.i32, DType.i64, DType.f16, DType.f32, DType.f64}),
    DType.u8: frozenset({DType.i16, DType.u16, DType.i32, DType.u32, DType.i64, DType.u64,
                         DType.f16, DType.f32, DType.f64}),
    DType.i16: frozenset({DType.i32, DType.i64, DType.f32, DType.f64}),
    DType.u16: frozenset({DType.i32, DType.u32, DType.i64, DType.u64, DType.f32, DType.f64}),
    DType.i32: frozenset({DType.i64, DType.f64}),
    DType.u32: frozenset({DType.i64, DType.u64, DType.f64}),
    DType.bool: frozenset({DType.f16, DType.bf16, DType.f32, DType.f64, DType.i8, DType.u8,
                           DType.i16, DType.u16, DType.i32, DType.u32, DType.i64, DType.u64}),
}


def cast_chain(node: Node, ctx: Context):
    """cast(cast(x: A, B), C) -> cast(x, C) where B holds every A exactly; x when C is A"""
    inner = ctx.made(node.inputs[0], Op.cast)
    if inner is None:
        return NoMatch("not a cast of a cast")
    source = inner.inputs[0]
    if inner.spec.dtype not in _EXACT_IN.get(ctx.type(source).dtype, ()):
        return NoMatch("the inner cast rounds")
    if ctx.type(source).same_as(node.type):
        return Alias(source)
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.cast, node.spec, source))


RULES = RuleSet((
    Rule(Op.batch_norm, batch_norm_fold),  # bn(k(x, W, b)) -> k(x, W * s, (b - mean) * s + beta)
    Rule(Op.multiply, scale_fold),         # k(x, W, b) * bcast(s) -> k(x, W * s, b * s)
    Rule(Op.add, shift_fold),              # k(x, W, b) + bcast(t) -> k(x, W, b + t)
    Rule(Op.einsum, weight_layout_fold),   # einsum(x, W[n, k]) -> einsum(x, W^T[k, n])
    *(Rule(op, zero_bias) for op in _KERNELS),  # k(x, W, 0) -> k(x, W)
    Rule(Op.cast, cast_chain),             # cast(cast(x: A, B), C) -> cast(x, C), A exact in B
))


# -- nodes of weights alone -----------------------------------------------------------------------

def fold_weights(graph: TDAG, fixed_weights: frozenset) -> tuple[TDAG, bool]:
    """Each node computing from fixed weights alone that a computed node reads becomes a
    ``const`` of its value, where the weights it alone reads pay for its bytes (a weight read
    elsewhere too stays, and a copy would double it) or where it is small (a rotary table,
    a scale); where not, its inputs are the candidates. Weights only folded nodes read go."""
    users, outputs = graph.users(), set(graph.outputs)  # an output stays a node
    refused: set[str] = set()
    while True:
        fixed = _fixed_nodes(graph, fixed_weights, refused)
        frontier = _frontier(graph, fixed, users)
        cones = {n.name: _cone(n.name, fixed, graph) for n in frontier}
        owners: dict[str, int] = {}
        for cone in cones.values():
            for w in cone:
                owners[w] = owners.get(w, 0) + 1
        big = {n.name for n in frontier if n.name in outputs or
               _bytes(n.type) > _freed(cones[n.name], owners, users, fixed, graph) and
               n.type.numel > FOLD_LIMIT}
        if not big:
            break
        refused |= big
    values: dict[str, torch.Tensor] = {k: w.value for k, w in graph.weights.items()
                                       if w.value is not None}
    weights, folded = dict(graph.weights), set()
    for node in frontier:
        value = _value(node.name, fixed, values)
        if value is not None:
            weights[node.name] = Weight(TensorKind.const, node.type, value.contiguous())
            folded.add(node.name)
    if not folded:
        return graph, False
    nodes = tuple(n for n in graph.nodes if n.name not in folded)
    sources = {n: next(iter(cones[n])) for n in folded if len(cones[n]) == 1}
    return _settled(graph.replace(nodes=nodes, weights=weights),
                    set().union(*(cones[n] for n in folded)), sources), True


def _frontier(graph: TDAG, fixed: dict[str, Node], users: dict) -> list[Node]:
    """The fixed nodes a computed node reads, directly or through broadcasts of fixed values
    (a broadcast stays a node reading the folded value: a copy would be bigger)."""
    through: set[str] = set()  # fixed broadcasts a computed node reads
    found = []
    for node in reversed(graph.nodes):
        if node.name not in fixed or all(u.name in fixed and u.name not in through
                                         for u in users.get(node.name, ())):
            continue
        if has(node.op, Trait.EXPANDING):
            through.add(node.name)
        else:
            found.append(node)
    return found[::-1]


def _freed(cone: frozenset, owners: dict, users: dict, fixed: dict, graph: TDAG) -> int:
    """The bytes of the weights in ``cone`` that go when its node folds (a fill holds one
    element: ONNX's ConstantOfShape, and a fold would write it out dense)."""
    return sum(_stored_bytes(graph.weights[w]) for w in cone
               if owners[w] == 1 and all(u.name in fixed for u in users.get(w, ())))


def _fixed_nodes(graph: TDAG, fixed_weights: frozenset, refused: set) -> dict[str, Node]:
    """The nodes but ``refused`` whose inputs are all fixed weights or such nodes (an iota
    has none), statically shaped; a big broadcast stays a node (its source folds, and a copy
    would be bigger), and so do (de)quantizations (a runtime fuses Q/DQ around a conv or a
    matmul into an integer kernel)."""
    known = set(fixed_weights)
    fixed: dict[str, Node] = {}
    for node in graph.nodes:
        if node.name not in refused and node.op not in _QDQ and \
                all(i in known for i in node.inputs) and \
                shape_is_static(node.type.shape) and \
                (not has(node.op, Trait.EXPANDING) or node.type.numel <= FOLD_LIMIT):
            fixed[node.name] = node
            known.add(node.name)
    return fixed


def _cone(name: str, fixed: dict[str, Node], graph: TDAG) -> frozenset:
    """The weights that fixed node ``name`` computes from."""
    seen, stack, weights = set(), [name], set()
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        if cur in fixed:
            stack.extend(fixed[cur].inputs)
        elif cur in graph.weights:
            weights.add(cur)
    return frozenset(weights)


def _value(name: str, fixed: dict[str, Node], values: dict) -> torch.Tensor | None:
    """The value of fixed node ``name`` by the reference evaluators (memoised in
    ``values``), or None where one cannot compute it."""
    if name in values:
        return values[name]
    node = fixed[name]
    args = [_value(i, fixed, values) for i in node.inputs]
    value = None if any(a is None for a in args) else evaluate_node(node, args)
    if value is not None and (tuple(value.shape) != tuple(node.type.shape) or
                              value.dtype != node.type.dtype.torch):
        value = None
    values[name] = value
    return value


def _bytes(type_: TensorType) -> int:
    return int(type_.numel) * type_.dtype.itemsize


def _stored_bytes(weight: Weight) -> int:
    held = 1 if fill_of(weight.value) is not None else int(weight.type.numel)
    return held * weight.type.dtype.itemsize


def _settled(graph: TDAG, consumed: set, sources: dict[str, str]) -> TDAG:
    """``graph`` pruned, without the ``consumed`` weights nothing reads now; a new const
    whose source weight went takes its name (a file keeps its initializers' names), unless
    other new consts came from it too (a split weight's slices: none is the weight)."""
    graph = prune(graph)
    live = live_names(graph)
    weights = {k: w for k, w in graph.weights.items() if k not in consumed or k in live}
    made = Counter(old for new, old in sources.items() if new in weights)
    env: dict[str, str] = {}
    for new, old in sources.items():
        if new in weights and old not in weights and made[old] == 1:
            env[new] = old
            weights[old] = weights.pop(new)
    nodes = tuple(renamed(n, env) for n in graph.nodes)
    return graph.replace(nodes=nodes, weights=weights)


def fold(graph: TDAG, kinds: frozenset, trained: frozenset = frozenset()) -> tuple[TDAG, bool]:
    """The rules above over ``graph``, then weight-only nodes folded (``fold_weights``): the
    weights of ``kinds`` with a value fold, but for the ``trained`` ones. The weights a fold
    consumed go when nothing reads them any more."""
    kinds = kinds | {TensorKind.const}  # what a fold makes folds further

    def fixed(g: TDAG) -> frozenset:
        return frozenset(k for k, w in g.weights.items()
                         if w.kind in kinds and w.value is not None and k not in trained)
    ctx = FoldContext(graph, fixed(graph))
    out, changed = rewrite(graph, RULES, ctx)
    if changed:
        out = _settled(out.replace(weights={**out.weights, **ctx.added}), ctx.read,
                       ctx.source)
    out, folded = fold_weights(out, fixed(out))
    return out, changed or folded


def fold_pass(kinds: frozenset) -> Callable[[Program], tuple[Program, bool]]:
    """The lowering pass folding weights of ``kinds``; a gradient program's ``wrt`` weights
    are what it trains, so they never fold (its other weights may)."""
    def run(prog: Program) -> tuple[Program, bool]:
        trained = frozenset(prog.wrt) if isinstance(prog, GradProgram) else frozenset()
        return per_graph(partial(fold, kinds=kinds, trained=trained))(prog)
    return run


# every weight the program holds: what a deployed file wants
FOLD = fold_pass(frozenset(TensorKind) - {TensorKind.input})
# consts only: a torch module keeps its parameters and buffers, trainable and loadable
FOLD_CONSTS = fold_pass(frozenset({TensorKind.const}))


__all__ = ["FOLD", "FOLD_CONSTS", "FoldContext", "RULES", "batch_norm_fold", "cast_chain",
           "fold", "fold_pass", "fold_weights", "scale_fold", "shift_fold", "weight_layout_fold",
           "zero_bias"]
