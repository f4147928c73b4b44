"""Matching helpers shared by the lowering rules: see through broadcasts and constants.

Recognition works on data flow and axis structure only (never on names or provenance):
``trace_axes`` says which axis of a source tensor each axis of a broadcast view comes from,
``scalar`` finds the value of a broadcast constant, ``constant_value`` that of a value
consts alone compute (a mask), and ``matches_kernel`` checks a rule's
proposed operands against the kernel's own decomposition, node for node.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable

import torch

from tdag.errors import TdagError
from tdag.ops.builder import Builder
from tdag.ops.reshape_plan import reshape_segments
from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.record import Trait, has, record
from tdag.ir.rewrite import Context
from tdag.ir.symbols import dims_equal, is_static
from tdag.ir.types import TensorKind, TensorType
from tdag.refine.constants import Constants
from tdag.refine.simplify import PIPELINE as SIMPLIFY
from tdag.refine.simplify import PassManager

# the views ``_step`` follows axis by axis, keeping which values each source axis holds: a
# property of this walk, not a trait (group and ungroup keep values too, but merge and split
# axes, which the walk does not follow)
BROADCAST = frozenset({Op.unsqueeze, Op.squeeze, Op.repeat, Op.expand, Op.permute, Op.reshape})


def is_unit(dim) -> bool:
    return is_static(dim) and dim == 1


def trace_axes(ctx: Context, name: str, through=BROADCAST,
               units: bool = False) -> tuple[str, tuple]:
    """Walk back through broadcast views to a source: ``(source, mapping)`` where
    ``mapping[i]`` is the source axis shown on axis ``i`` of ``name``, or None where ``name``
    is a broadcast (a repeated or inserted axis). Every source axis appears exactly once: a
    step that would drop or broadcast a real source axis ends the walk there. With
    ``units=True`` a size-1 source axis may be broadcast (numpy semantics) and stays mapped."""
    chain = []
    cur = name
    while True:
        node = ctx.producer(cur)
        if node is None or node.op not in through or _step(node, None, ctx) is False:
            break
        chain.append(node)
        cur = node.inputs[0]
    src, mapping = cur, tuple(range(ctx.type(cur).rank))
    for node in reversed(chain):
        stepped = _step(node, mapping, ctx, units)
        if stepped is None:  # this step loses a source axis: start again from its output
            src, mapping = node.name, tuple(range(node.type.rank))
        else:
            mapping = stepped
    return src, mapping


def _step(node, m, ctx: Context, units: bool = False):
    """The mapping after ``node``; None if it loses a source axis; False if ``node`` is not
    a pure broadcast view at all (a reshape that regroups real axes)."""
    op, spec = node.op, node.spec
    in_type = ctx.type(node.inputs[0])
    if op is Op.reshape:
        return _reshape_step(in_type.shape, node.type.shape, m)
    if m is None:
        return True
    if op is Op.permute:
        return tuple(m[p] for p in spec.perm)
    if op is Op.unsqueeze:
        it = iter(m)
        return tuple(None if i in spec.axes else next(it) for i in range(node.type.rank))
    if op is Op.squeeze:
        if any(m[a] is not None for a in spec.axes):
            return None
        return tuple(x for i, x in enumerate(m) if i not in spec.axes)
    if op is Op.repeat:
        grown = [a for a, s in zip(spec.axes, spec.sizes) if not is_unit(s)]
        return None if not units and any(m[a] is not None for a in grown) else m
    if op is Op.expand:
        lead = node.type.rank - in_type.rank
        for i, d in enumerate(in_type.shape):
            if not units and m[i] is not None and is_unit(d) and \
                    not is_unit(node.type.shape[lead + i]):
                return None
        return (None,) * lead + tuple(m)
    return False


def _reshape_step(src_shape, dst_shape, m):
    """A reshape that only inserts or removes size-1 axes is a broadcast view."""
    real_in = [i for i, d in enumerate(src_shape) if not is_unit(d)]
    real_out = [i for i, d in enumerate(dst_shape) if not is_unit(d)]
    if len(real_in) != len(real_out) or not all(
            dims_equal(src_shape[i], dst_shape[j]) for i, j in zip(real_in, real_out)):
        return False
    if m is None:
        return True
    if any(m[i] is not None for i, d in enumerate(src_shape) if is_unit(d)):
        return None
    out = [None] * len(dst_shape)
    for i, j in zip(real_in, real_out):
        out[j] = m[i]
    return tuple(out)


def is_broadcast_of(ctx: Context, name: str, source: str, kept: tuple) -> bool:
    """Whether ``name`` shows ``source``'s axes in order on axes ``kept`` and broadcasts
    the rest (the keepdim + broadcast of a reduction, a bias over trailing axes)."""
    src, mapping = trace_axes(ctx, name)
    if src != source:
        return False
    return tuple(i for i, a in enumerate(mapping) if a is not None) == tuple(kept) and \
        [a for a in mapping if a is not None] == list(range(len(kept)))


def scalar(ctx: Context, name: str, single: bool = False) -> float | int | None:
    """The value of a constant that is one number broadcast to ``name``'s shape, else None.
    With ``single``, only a one-element constant counts, not a tensor of equal values."""
    cur = name
    while True:
        node = ctx.producer(cur)
        if node is None:
            break
        if node.op is Op.cast:
            if not node.type.dtype.is_float:
                return None
        elif not has(node.op, Trait.KEEPS_VALUES):  # a constant stays constant through it
            return None
        cur = node.inputs[0]
    weight = ctx.weight(cur)
    if weight is None or weight.kind is not TensorKind.const or weight.value is None:
        return None
    value = weight.value
    if value.numel() == 0 or value.numel() > 65536 or (single and value.numel() > 1):
        return None
    first = value.reshape(-1)[0]
    if value.numel() > 1 and not bool((value == first).all()):
        return None
    if value.dtype in (torch.float32, torch.float16):
        # the shortest decimal that rounds back to the same value: 1e-05, not 9.99999974e-06
        return float(str(first.numpy()))
    if value.dtype.is_complex:
        return None  # no real number: the rules that ask compare and scale reals
    if not value.dtype.is_floating_point:
        return int(first)  # exact: float(2**63 - 1) rounds up past int64's largest
    return float(first)


def constant_value(ctx: Context, name: str, nodes: int = 16,
                   limit: int = 1 << 21) -> torch.Tensor | None:
    """``name``'s value where const weights alone feed it (a mask made from positions), by
    the reference evaluators; None where an input or a parameter feeds it, or more than
    ``nodes`` nodes, or a node past ``limit`` elements that is not a view."""
    order: list = []
    leaves: dict = {}
    seen: set = set()

    def visit(cur: str) -> bool:  # post-order: each node after its inputs
        if cur in seen:
            return True
        seen.add(cur)
        node = ctx.producer(cur)
        if node is None:
            weight = ctx.weight(cur)
            leaves[cur] = weight
            return weight is not None and weight.kind is TensorKind.const and \
                weight.value is not None
        if len(order) >= nodes or not all(visit(i) for i in node.inputs):
            return False
        order.append(node)
        return True

    if not visit(name):
        return None
    consts = Constants(leaves, limit)
    for node in order:
        consts.add(node)
    return consts.value(name)


def is_scalar(ctx: Context, name: str, value: float, rel: float = 1e-6) -> bool:
    got = scalar(ctx, name)
    if got is None:
        return False
    if got == value:
        return True
    return abs(got - value) <= rel * abs(value)


def commuted(node, pred: Callable[[str], object]):
    """For a commutative binary node: ``(a, b, found)`` with ``found = pred(a)`` truthy,
    trying both operand orders; None if neither matches."""
    a, b = node.inputs
    for x, y in ((a, b), (b, a)):
        found = pred(x)
        if found is not None and found is not False:
            return x, y, found
    return None


# -- chains of views and pointwise ops --------------------------------------------------------

# the unary ops the patterns read in a chain (softmax's exp, log, neg and reciprocal, the
# norms' reciprocal square root, erf and tanh): the vocabulary of the matchers, not the UNARY
# trait; ``trace_chain`` stops at other unary ops, so a chain it returns is one they can read
POINTWISE_UNARY = frozenset({Op.neg, Op.reciprocal, Op.exp, Op.log, Op.erf, Op.tanh})


def trace_chain(ctx: Context, name: str) -> tuple[str, tuple, list]:
    """Like ``trace_axes``, but also through unary ops and binary ops with a scalar
    operand, which commute with views. Returns ``(source, mapping, ops)`` with ``ops`` the
    pointwise steps from the source outwards: ``(op, None)`` for unary ops,
    ``(op, value, scalar_first)`` for ``op(x, value)`` (or ``op(value, x)``)."""
    ops, views = [], []
    cur = name
    while True:
        node = ctx.producer(cur)
        if node is None:
            break
        if node.op in BROADCAST and _step(node, None, ctx) is not False:
            views.append(node)
            cur = node.inputs[0]
            continue
        step = _pointwise(node, ctx)
        if step is None:
            break
        ops.append(step[0])
        views.append(None)  # a pointwise op keeps the axes
        cur = step[1]
    mapping = tuple(range(ctx.type(cur).rank))
    for node in reversed(views):
        if node is None:
            continue
        mapping = _step(node, mapping, ctx)
        if mapping is None:
            return name, tuple(range(ctx.type(name).rank)), []
    return cur, mapping, list(reversed(ops))


def _pointwise(node, ctx: Context):
    if node.op in POINTWISE_UNARY:
        return (node.op, None), node.inputs[0]
    if has(node.op, Trait.BINARY):  # with a scalar operand it commutes with views
        if node.op is Op.divide and node.spec.mode.value != "true":
            return None
        a, b = node.inputs
        vb, va = scalar(ctx, b), scalar(ctx, a)
        if vb is not None and va is None:
            return (node.op, vb, False), a
        if va is not None and vb is None:
            return (node.op, va, True), b
    return None


def linear_coefficient(ops) -> float | None:
    """The c of ``ops`` that compute ``c * x`` (negations and scalings), else None."""
    coef = 1.0
    for step in ops:
        if step[0] is Op.neg:
            coef = -coef
        elif step[0] is Op.multiply:
            coef *= step[1]
        elif step[0] is Op.divide and not step[2]:
            coef /= step[1]
        else:
            return None
    return coef


def close(a: float, b: float, rel: float = 1e-5) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def maps_reduced(mapping, axes, rank: int) -> bool:
    """Whether ``mapping`` (a view of a reduction over ``axes`` of a rank-``rank`` tensor)
    shows the kept axes in place and broadcasts the reduced ones."""
    if len(mapping) != rank:
        return False
    kept = [a for a in range(rank) if a not in axes]
    for i, m in enumerate(mapping):
        if i in axes:
            if m is not None:
                return False
        elif m is None or kept[m] != i:
            return False
    return True


def reshape_groups(src_shape, dst_shape) -> list[tuple[tuple, tuple]] | None:
    """Runs of source axes paired with runs of target axes of equal size (a reshape's
    structure): ``[((in axes), (out axes)), ...]``; None if there is no such pairing."""
    segments = reshape_segments(tuple(src_shape), tuple(dst_shape))
    if segments is None:
        return None
    groups, i, j = [], 0, 0
    for n_in, sizes in segments:
        groups.append((tuple(range(i, i + n_in)), tuple(range(j, j + len(sizes)))))
        i, j = i + n_in, j + len(sizes)
    return groups


# -- a kernel's decomposition as a template -------------------------------------------------

COMMUTATIVE = frozenset({Op.add, Op.multiply})  # a template node matches either order


def decomposition(op: Op, spec, types: tuple[TensorType, ...]) -> Program:
    """The kernel's decomposition of operands of ``types``, as a program of its own."""
    builder = Builder()
    with builder.active():
        args = [builder.input(f"t{i}", t) for i, t in enumerate(types)]
        out = record(op).decompose(spec, *args)
    return Program.from_tdag(builder.build([out]))


def simplified(prog: Program) -> TDAG:
    """``prog``'s graph simplified as ``lower`` simplifies a program before any rule sees
    it: the form a composition has when a kernel's rule looks for it."""
    return PassManager(SIMPLIFY)(prog)[0].graph


@lru_cache(maxsize=256)
def kernel_template(op: Op, spec, types: tuple[TensorType, ...]) -> TDAG:
    """The kernel's decomposition of operands of ``types``, simplified: the template of a
    kernel whose rule runs before any other rule has rewritten its composition."""
    return simplified(decomposition(op, spec, types))


def matches_kernel(ctx: Context, root, op: Op, spec, operands: tuple[str, ...],
                   template: Callable[..., TDAG] = kernel_template) -> bool:
    """Whether ``root`` computes ``op[spec](*operands)`` as ``template(op, spec, types)``
    (the kernel's decomposition in the form the rule meets it) writes it: node for node,
    same ops, specs, types and constants. Operands the kernel refuses match nothing, so a
    near miss stays the exact composition it was."""
    types = tuple(ctx.type(n) for n in operands)
    try:
        record(op).shape(spec, types)
        graph = template(op, spec, types)
    except TdagError:
        return False
    bound = {v.name: o for v, o in zip(graph.inputs, operands)}
    producers = {n.name: n for n in graph.nodes}
    return _unify(ctx, graph, producers, graph.outputs[0], root.name, bound) is not None


def kernel_operands(ctx: Context, root, op: Op, spec, types: tuple[TensorType, ...],
                    template: Callable[..., TDAG] = kernel_template) -> tuple[str, ...] | None:
    """The operands with which ``root`` computes ``op[spec]`` of operands of ``types`` as
    ``template`` writes it, found by the match itself (for a kernel whose operands lie deep
    in its composition: a gradient's cotangent and forward input); None if it does not."""
    try:
        record(op).shape(spec, types)
        graph = template(op, spec, types)
    except TdagError:
        return None
    bound = bind_template(ctx, root, graph)
    return None if bound is None else tuple(bound[v.name] for v in graph.inputs)


def bind_template(ctx: Context, root, template: TDAG, free_consts: bool = False) -> dict | None:
    """The binding of ``template``'s names to graph names that makes its output compute
    ``root``: its inputs bind to whatever they meet (type-checked), and with
    ``free_consts`` its scalar constants to the graph's constants (a probe spec whose
    constants say which hyperparameter each graph constant is); None where they differ."""
    producers = {n.name: n for n in template.nodes}
    bound = _unify(ctx, template, producers, template.outputs[0], root.name, {}, free_consts)
    if bound is None or any(v.name not in bound for v in template.inputs):
        return None
    return bound


def met_constant(ctx: Context, template: TDAG, bound: dict, probe: float) -> float | None:
    """The value of the graph constant that ``template``'s one-element constant ``probe``
    met in ``bound`` (from ``bind_template(..., free_consts=True)``): a probe spec's
    hyperparameter read back from the graph."""
    for t, g in bound.items():
        weight = template.weights.get(t)
        if weight is not None and weight.value.numel() == 1 and float(weight.value) == probe:
            return scalar(ctx, g)
    return None


def _input_type(template: TDAG, name: str) -> TensorType:
    return next(v.type for v in template.inputs if v.name == name)


def _unify(ctx, template: TDAG, producers, t: str, g: str, bound: dict,
           free_consts: bool = False) -> dict | None:
    """The binding of template names to graph names that makes ``t`` compute ``g`` (a
    template node reached twice is bound once, so a walk of any depth unifies in one pass)."""
    if t in bound:
        return bound if bound[t] == g else None
    node = producers.get(t)
    if node is None and t not in template.weights:  # an operand left free: bound where met
        return dict(bound, **{t: g}) if ctx.type(g).same_as(_input_type(template, t)) else None
    if node is None:
        if free_consts:
            return _any_const(ctx, template.weights[t], g, bound, t)
        return _same_const(ctx, template.weights[t], g, bound, t)
    other = ctx.producer(g)
    if other is None or other.op is not node.op or other.spec != node.spec or \
            not other.type.same_as(node.type) or len(other.inputs) != len(node.inputs):
        return None
    orders = [other.inputs]
    if node.op in COMMUTATIVE:
        orders.append(tuple(reversed(other.inputs)))
    for inputs in orders:
        trial = dict(bound, **{t: g})
        for ti, gi in zip(node.inputs, inputs):
            trial = _unify(ctx, template, producers, ti, gi, trial, free_consts)
            if trial is None:
                break
        if trial is not None:
            return trial
    return None


def _any_const(ctx, weight, g: str, bound: dict, t: str) -> dict | None:
    got = ctx.weight(g)
    if got is None or got.kind is not TensorKind.const or got.value is None or \
            not got.type.same_as(weight.type):
        return None
    return dict(bound, **{t: g})


def _same_const(ctx, weight, g: str, bound: dict, t: str) -> dict | None:
    got = ctx.weight(g)
    if weight.kind is not TensorKind.const or got is None or got.kind is not TensorKind.const \
            or got.value is None or not got.type.same_as(weight.type) or \
            not bool((got.value == weight.value).all()):
        return None
    return dict(bound, **{t: g})


# a sum of at most this many terms is searched for a kernel's two terms (a gradient's
# accumulation over a value's uses: a residual stream's has three or four)
SUM_TERMS = 8


def bind_sum_template(ctx: Context, root, template: TDAG,
                      free_consts: bool = False) -> tuple[dict, list[str]] | None:
    """Like ``bind_template`` for a template whose output is a sum of terms (a tree of
    adds), met inside a larger sum at ``root``: ``(binding, the sum's other terms)``, where
    the template's terms bind to disjoint terms of the tree of adds at ``root`` (its inner
    adds used once). ``tdag.grad`` sums a value's cotangent contributions in the order it
    meets the uses, so a kernel's terms (layer norm's centring and mean paths) may lie
    apart, the residual's between them: ``(r + a) + b`` is ``r + kernel``."""
    producers = {n.name: n for n in template.nodes}
    out = producers.get(template.outputs[0])
    leaves = _sum_tree(ctx, root.name, root.type, {})
    if out is None or out.op is not Op.add or leaves is None:
        return None
    # each leaf by its position (a term added twice is two), and each inner sum
    terms_at = [(leaf[0], [leaf]) for leaf in leaves[root.name]] + \
        [(g, mine) for g, mine in leaves.items() if len(mine) > 1]
    # the output add's two operands as terms, else every term of the template's add tree
    # (RMS norm's x * x gives x two contributions: (a + b) + b)
    for terms in (list(out.inputs), _template_terms(producers, out.name)):
        found = _bind_terms(ctx, template, producers, terms, terms_at, {}, frozenset(),
                            free_consts)
        if found is not None and all(v.name in found[0] for v in template.inputs):
            bound, used = found
            return bound, [leaf[0] for leaf in leaves[root.name] if leaf not in used]
    return None


def _template_terms(producers: dict, name: str) -> list[str]:
    """The terms of the tree of adds at ``name`` in a template (itself where no add)."""
    node = producers.get(name)
    if node is None or node.op is not Op.add:
        return [name]
    return [t for i in node.inputs for t in _template_terms(producers, i)]


def _bind_terms(ctx, template, producers, terms, terms_at, bound, used, free_consts):
    """``terms`` bound in order to graph terms ``(name, its leaves)`` of ``terms_at`` whose
    leaves are not in ``used``: ``(binding, leaves used)``, or None."""
    if not terms:
        return bound, used
    for g, mine in terms_at:
        if used & set(mine):
            continue
        trial = _unify(ctx, template, producers, terms[0], g, bound, free_consts)
        found = None if trial is None else _bind_terms(
            ctx, template, producers, terms[1:], terms_at, trial, used | set(mine),
            free_consts)
        if found is not None:
            return found
    return None


def _sum_tree(ctx: Context, name: str, type_: TensorType, out: dict) -> dict | None:
    """``{term: its leaves}`` for every node of the tree of same-typed adds at ``name``
    (leaves as positions, ``(name, path)``, so a term added twice counts twice); None past
    ``SUM_TERMS``."""
    def walk(cur: str, path: str, top: bool) -> list:
        node = ctx.producer(cur)
        if node is None or node.op is not Op.add or not (top or ctx.single_use(cur)) or \
                not all(ctx.type(i).same_as(type_) for i in node.inputs):
            out[cur] = [(cur, path)]
            return out[cur]
        mine = walk(node.inputs[0], path + "0", False) + walk(node.inputs[1], path + "1", False)
        out[cur] = mine
        return mine
    walk(name, "", True)
    return out if len(out[name]) <= SUM_TERMS else None
