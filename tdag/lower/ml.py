"""The tree ensemble's walk -> the tree_sum kernel; a row's scaling by its norm -> the
normalize_rows kernel.

The ONNX importer writes the classic ai.onnx.ml tree ops as ``tdag.ops.ml.tree_sum``, which
is also the kernel's ``decompose``. The rule proposes the operands from the walk's landmarks
(the sum of the gathered leaf rows, the chain of ``where(go, true[at], false[at])`` down to
the broadcast roots, the first level's gathers of the node tables), then checks the proposal
by matching: the kernel's decomposition of those operands, traced and simplified as lowering
simplifies the program, must be the subgraph under the node, node for node. Only then is the
node replaced, so a near miss stays the exact composition it was.

    sum_T(leaves[walk^depth(roots)])      -> tree_sum(x, tables..., leaves)
    where(norm(x) != 0, x / norm(x), x)   -> normalize_rows(x)   (MAX, L1; L2 signed sqrt)
    f32(sum_S(f32(k(x, V) * W)) + rho)    -> svm_scores(x, V, W, rho)   (and row @ W + rho)
    labels[first_highest(x @ W + b)]      -> linear_classifier[labels](x, W, b)
    transform(x @ W + b)                  -> linear_classifier[transform](x, W, b)
    labels[argmax(votes(svm_scores(...)))] -> svm_label[labels](svm_scores(...))

An imported SVM's V, W and rho are constants that simplify has folded (x - V became x + c,
c = -V of shape [1, S, F]): its rule proposes them unfolded and matches the decomposition of
those constants, folded the same way.
"""
from __future__ import annotations

import numpy as np
import torch

from tdag.deinops.elementwise import Cast
from tdag.deinops.movement import Squeeze
from tdag.deinops.primitive import NoSpec
from tdag.ir.program import Program
from tdag.ir.record import record
from tdag.ir.types import TensorKind
from tdag.ops.builder import Builder
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rewrite, Rule
from tdag.ir.types import DType
from tdag.lower.kernels.ml import Normalize, SvmScores, TreeSum
from tdag.lower.kernels.ml_classifiers import LINEAR_TRANSFORMS, LinearClassify, SvmLabel
from tdag.lower.match import matches_kernel, simplified, trace_axes
from tdag.ops.ml import COMPARE, NORMS

_VIEWS = frozenset({Op.unsqueeze, Op.repeat})
_MODE = {fn.__name__: mode for mode, fn in COMPARE.items()}  # compare kind -> mode
_CONE = 48  # nodes between a level's go and the roots: a dozen per mode


def _roots(ctx: Context, at: str) -> str | None:
    """The i64 [T] tensor that ``at`` broadcasts to [N, T]."""
    while ctx.type(at).rank != 1:
        node = ctx.producer(at)
        if node is None or node.op not in _VIEWS:
            return None
        at = node.inputs[0]
    return at if ctx.type(at).dtype is DType.i64 else None


def _level(ctx: Context, go: str, at: str):
    """The first level's (x, features, thresholds, {mode: mask}, tracks) read off the nodes
    between its ``go`` and ``at``, or None."""
    tables, pairs, x, tracks = {}, {}, None, None
    seen, frontier = {go}, [go]
    while frontier and len(seen) < _CONE:
        node = ctx.producer(frontier.pop())
        if node is None:
            continue
        if node.op is Op.gather and node.inputs[1] == at:
            tables.setdefault(ctx.type(node.inputs[0]).dtype, []).append(node.inputs[0])
            continue
        if node.op is Op.gather and ctx.type(node.inputs[0]).rank == 1:  # x's flat rows
            flat = ctx.producer(node.inputs[0])
            x = flat.inputs[0] if flat is not None and flat.op is Op.group else x
        if node.op is Op.multiply and node.type.dtype is DType.bool:
            pairs[node.name] = node.inputs
        for name in node.inputs:
            if name not in seen and name != at:
                seen.add(name)
                frontier.append(name)
    floats, ints = tables.get(ctx.type(x).dtype, []) if x else [], tables.get(DType.i64, [])
    if x is None or len(floats) != 1 or len(ints) != 1:
        return None
    masks = {}
    for a, b in pairs.values():  # mask[at] & compare, or isnan & tracks[at]
        for mask, other in ((a, b), (b, a)):
            source = ctx.made(mask, Op.gather)
            compare = ctx.made(other, Op.compare)
            if source is None or source.inputs[1] != at or compare is None:
                continue
            if compare.inputs[0] == compare.inputs[1]:
                tracks = source.inputs[0]
            else:
                masks[_MODE[compare.spec.kind.value]] = source.inputs[0]
    return x, ints[0], floats[0], masks, tracks


def _kinds(ctx: Context, go: str) -> list[str]:
    """The modes of the compares (not isnan's) between ``go`` and the level's gathers."""
    out, frontier = [], [go]
    for _ in range(_CONE):
        if not frontier:
            break
        node = ctx.producer(frontier.pop())
        if node is None or node.op is Op.gather:
            continue
        if node.op is Op.compare and node.inputs[0] != node.inputs[1]:
            out.append(_MODE[node.spec.kind.value])
            continue
        frontier += node.inputs
    return out


def tree_sum_rule(node: Node, ctx: Context):
    """sum_T(leaves[walk^depth(roots)]) -> tree_sum(x, tables..., leaves)"""
    pick = ctx.made(node.inputs[0], Op.gather)
    if node.spec.kind.value != "sum" or node.spec.axes != (1,) or pick is None or \
            node.type.rank != 2 or ctx.type(pick.inputs[0]).rank != 2:
        return NoMatch("not a sum over trees of gathered leaf rows")
    leaves, at, depth, step = pick.inputs[0], pick.inputs[1], 0, None
    while (where := ctx.made(at, Op.where)) is not None:
        true, false = (ctx.made(n, Op.gather) for n in where.inputs[1:])
        if true is None or false is None or true.inputs[1] != false.inputs[1]:
            return NoMatch("a step of the walk is not where(go, true[at], false[at])")
        step, at, depth = (where.inputs[0], true.inputs[0], false.inputs[0]), true.inputs[1], \
            depth + 1
    roots = _roots(ctx, at)
    if step is None or roots is None:
        return NoMatch("no walk from broadcast roots")
    go, true, false = step
    level = _level(ctx, go, at)
    if level is None:
        return NoMatch("the first step reads no rows, features and thresholds")
    x, features, thresholds, masks, tracks = level
    modes = tuple(m for m in COMPARE if m in masks) if len(masks) > 1 else \
        tuple(dict.fromkeys(_kinds(ctx, go)))
    spec = TreeSum(depth, modes, tracks is not None)
    operands = (x, features, thresholds, true, false, roots, leaves) + \
        ((tracks,) if tracks else ()) + (tuple(masks[m] for m in modes) if len(modes) > 1 else ())
    if len(modes) != 1 and len(modes) != len(masks) or \
            not matches_kernel(ctx, node, Op.tree_sum, spec, operands):
        return NoMatch("not the walk tree_sum decomposes to")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.tree_sum, spec, *operands))


def normalize_rule(node: Node, ctx: Context):
    """where(norm(x) != 0, x / norm(x), x) -> normalize_rows(x): the guard's copy of x is the
    operand, the norm the one whose decomposition is the subgraph."""
    x = node.inputs[2]
    for norm in NORMS:
        if matches_kernel(ctx, node, Op.normalize_rows, Normalize(norm), (x,)):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.normalize_rows, Normalize(norm), x))
    return NoMatch("not a row scaled by its MAX, L1 or L2 norm")


# -- svm_scores ---------------------------------------------------------------------------------

_SVM_VIEWS = frozenset({Op.unsqueeze, Op.repeat, Op.permute, Op.cast})
_SVM_CONE = 40  # nodes of a kernel row: a dozen


def _behind(ctx: Context, name: str) -> str:
    """``name`` with the views and casts over it stripped."""
    while (node := ctx.producer(name)) is not None and node.op in _SVM_VIEWS:
        name = node.inputs[0]
    return name


def _value(ctx: Context, name: str) -> np.ndarray | None:
    """The constant behind ``name``'s views, as float64."""
    weight = ctx.weight(_behind(ctx, name))
    if weight is None or weight.kind is not TensorKind.const or weight.value is None or \
            weight.value.is_meta:
        return None
    return weight.value.double().numpy()


def _rows_of(ctx: Context, name: str) -> str:
    """The rows [N, F] that ``name`` broadcasts."""
    while (node := ctx.producer(name)) is not None and node.op in (Op.unsqueeze, Op.repeat):
        name = node.inputs[0]
    return name


def _row_leaves(ctx: Context, row: str):
    """(rows, {rank: [constant name]}, {reader op: [scalar]}) under the kernel row: the rows
    are what the support vectors' constant meets (its cone is not the kernel's), else the
    inputs the walk reaches."""
    xs, consts, scalars, seen, frontier = set(), {}, {}, {row}, [row]
    while frontier and len(seen) < _SVM_CONE:
        node = ctx.producer(frontier.pop())
        if node is None:
            continue
        values = [_value(ctx, name) for name in node.inputs]
        table = any(v is not None and v.ndim > 1 for v in values)
        for name, value in zip(node.inputs, values):
            if value is not None and value.ndim == 0:
                scalars.setdefault(node.op, []).append(float(value))
            elif value is not None:
                consts.setdefault(value.ndim, []).append(_behind(ctx, name))
            elif table or ctx.producer(_rows_of(ctx, name)) is None:
                xs.add(_rows_of(ctx, name))
            elif ctx.producer(leaf := _behind(ctx, name)) is None:
                xs.add(leaf)
            elif leaf not in seen:
                seen.add(leaf)
                frontier.append(leaf)
    return xs, consts, scalars


def _svm_spec(ctx: Context, row: str, wide: bool):
    """The kernel row's spec and its (x, vectors) candidates: a constant's (RBF: -V
    [1, S, F], folded) with the one input, or, of two inputs, either order; or None."""
    xs, consts, scalars = _row_leaves(ctx, row)
    top = ctx.producer(row)
    kind = {Op.exp: "RBF", Op.tanh: "SIGMOID", Op.reduce: "LINEAR"}.get(top.op, "POLY") \
        if top is not None else None
    rank = 3 if kind == "RBF" else 2
    if kind is None or len(scalars.get(Op.multiply, [0.0])) != 1 or \
            kind == "POLY" and top.op not in (Op.multiply, Op.pow):
        return None
    xs = sorted(xs)
    if len(xs) == 1 and len(consts.get(rank, [])) == 1:
        pairs = [(xs[0], consts[rank][0])]
    elif len(xs) == 2 and not consts:
        pairs = [tuple(xs), tuple(reversed(xs))]
    else:
        return None
    gamma, coef0 = scalars.get(Op.multiply, [0.0])[0], scalars.get(Op.add, [0.0])[0]
    if kind == "RBF":
        return SvmScores(kind, -gamma, 0.0, 0.0, wide), pairs
    if kind == "LINEAR":
        return SvmScores(kind, 0.0, 0.0, 0.0, wide), pairs
    degree = 0.0 if kind == "SIGMOID" else scalars[Op.pow][0] if Op.pow in scalars else \
        3.0 if ctx.made(top.inputs[0], Op.multiply) is not None else 2.0
    return SvmScores(kind, gamma, coef0, degree, wide), pairs


def _svm_template(values):
    """The decomposition of x and the proposed constants, simplified: folded as lowering
    folded the graph's."""
    def template(op, spec, types):
        builder = Builder()
        with builder.active():
            args = [builder.input("t0", types[0])] + \
                [builder.const(torch.from_numpy(np.ascontiguousarray(v, np.float32)))
                 for v in values]
            out = record(op).decompose(spec, *args)
        return simplified(Program.from_tdag(builder.build([out])))
    return template


def _f32(emit, ctx: Context, name: str) -> str:
    return name if ctx.type(name).dtype is DType.f32 else emit(Op.cast, Cast(DType.f32), name)


def svm_rule(node: Node, ctx: Context):
    """f32(sum_S(f32(row * W)) + rho) (SVMClassifier) or sum_S(row * W) + rho
    (SVMRegressor) -> svm_scores(x, V, W, rho): x, V and the kernel read off the row, W and
    rho behind their views. With constant V, W and rho (an imported SVM), it matches if
    their decomposition, folded as the graph was, is the subgraph."""
    wide = node.op is Op.cast
    add = ctx.made(node.inputs[0], Op.add) if wide else node
    if add is None or node.type.rank != 2 or node.type.dtype is not DType.f32 or \
            (wide and ctx.type(add.name).dtype is not DType.f64):
        return NoMatch("not an SVM's scores plus rho")
    for total, offset in (add.inputs, add.inputs[::-1]):
        reduce, rho = ctx.made(_behind(ctx, total), Op.reduce), _behind(ctx, offset)
        if reduce is not None and ctx.producer(rho) is None and ctx.type(rho).rank == 1:
            break
    else:
        return NoMatch("no sum over the support vectors plus rho")
    product = ctx.made(_behind(ctx, reduce.inputs[0]), Op.multiply)
    found = [(_behind(ctx, a), _behind(ctx, b)) for a, b in (product.inputs,
                                                             product.inputs[::-1])
             if ctx.producer(_behind(ctx, a)) is None and ctx.type(_behind(ctx, a)).rank == 2] \
        if product else []
    proposal = _svm_spec(ctx, found[0][1], wide) if len(found) == 1 else None
    if proposal is None:
        return NoMatch("no kernel row of the rows and support vectors times a weight")
    (spec, pairs), weight = proposal, found[0][0]
    if spec.kernel == "LINEAR" and not wide:  # x @ (V^T W) + rho: any linear layer looks so
        return NoMatch("a linear regressor's scores are a matmul: kept as one")
    for x, vectors in pairs:
        emit, weight_of = ctx.emitter(node), ctx.weight(vectors)
        if weight_of is None or weight_of.kind is not TensorKind.const:  # traced operands
            operands = (x, vectors, weight, rho)
            if matches_kernel(ctx, node, Op.svm_scores, spec, operands):
                return emit.finish(emit(Op.svm_scores, spec, *operands))
            continue
        values = (-_value(ctx, vectors)[0] if spec.kernel == "RBF" else _value(ctx, vectors),
                  _value(ctx, weight), _value(ctx, rho))
        if spec.kernel == "RBF":
            vectors = emit(Op.squeeze, Squeeze((0,)), emit(Op.neg, NoSpec(), vectors))
        operands = (x, *(_f32(emit, ctx, n) for n in (vectors, weight, rho)))
        if matches_kernel(ctx, node, Op.svm_scores, spec, operands,
                          template=_svm_template(values)):
            return emit.finish(emit(Op.svm_scores, spec, *operands))
    return NoMatch("not the scores svm_scores decomposes to")


# -- linear_classifier --------------------------------------------------------------------------

_LABEL_CONE = 40  # nodes between a label and its scores (a NaN test, votes): two dozen


def _affine(ctx: Context, scores: str):
    """The (x, W, b) candidates of ``scores`` = x @ W + b: the sources of the matmul's
    broadcast product (either order; matching decides) and the bias's."""
    add = ctx.made(scores, Op.add)
    for product, bias in (add.inputs, add.inputs[::-1]) if add is not None else ():
        total, (b, _) = ctx.made(product, Op.reduce), trace_axes(ctx, bias)
        multiply = ctx.made(total.inputs[0], Op.multiply) if total is not None else None
        if multiply is not None and ctx.type(b).rank == 1:
            x, w = (trace_axes(ctx, n)[0] for n in multiply.inputs)
            return [(x, w, b), (w, x, b)]
    return []


def _labels(ctx: Context, node: Node) -> tuple[int, ...] | None:
    """The int64 labels of the constant table ``node`` gathers rows [N] from, or None."""
    table = ctx.weight(node.inputs[0])
    if node.type.rank != 1 or table is None or table.kind is not TensorKind.const or \
            table.value is None or table.type.rank != 1 or table.type.dtype is not DType.i64:
        return None
    return tuple(table.value.tolist())


def _cone(ctx: Context, start: str, limit: int = _LABEL_CONE):
    """The nodes behind ``start`` (itself first), up to ``limit`` names seen."""
    seen, frontier = {start}, [start]
    while frontier and len(seen) < limit:
        at = ctx.producer(frontier.pop())
        if at is None:
            continue
        yield at
        fresh = [name for name in at.inputs if name not in seen]
        seen.update(fresh)
        frontier += fresh


def _replace(ctx: Context, node: Node, op: Op, spec, operands) -> Rewrite | None:
    """``node`` as ``op[spec](*operands)`` if that kernel's decomposition is its subgraph."""
    if not matches_kernel(ctx, node, op, spec, operands):
        return None
    emit = ctx.emitter(node)
    return emit.finish(emit(op, spec, *operands))


def linear_label_rule(node: Node, ctx: Context):
    """labels[first_highest(x @ W + b)] -> linear_classifier[labels](x, W, b): the scores
    are what the label's NaN test (s != s) reads."""
    labels = _labels(ctx, node)
    for at in _cone(ctx, node.inputs[1]) if labels else ():
        if at.op is Op.compare and at.inputs[0] == at.inputs[1]:
            for operands in _affine(ctx, at.inputs[0]):
                found = _replace(ctx, node, Op.linear_classifier, LinearClassify(labels=labels),
                                 operands)
                if found:
                    return found
    return NoMatch("not the label of a linear classifier's first highest score")


def linear_scores_rule(node: Node, ctx: Context):
    """softmax or logistic of x @ W + b -> linear_classifier[transform](x, W, b): the scores
    are the transform's nearest add of a matmul (raw scores, NONE, stay a matmul: the
    label's rule reads them)."""
    if node.type.rank != 2 or node.type.dtype is not DType.f32:
        return NoMatch("not f32 [N, C] scores")
    for at in _cone(ctx, node.name):
        candidates = _affine(ctx, at.name)
        for operands in candidates:
            for kind in LINEAR_TRANSFORMS[1:]:
                found = _replace(ctx, node, Op.linear_classifier, LinearClassify(kind),
                                 operands)
                if found:
                    return found
        if candidates:
            break
    return NoMatch("not a softmax or logistic of a linear classifier's scores")


def svm_label_rule(node: Node, ctx: Context):
    """labels[argmax(votes(s))] -> svm_label[labels](s): the pair scores are what the
    votes compare with 0."""
    labels = _labels(ctx, node)
    for at in _cone(ctx, node.inputs[1]) if labels else ():
        if at.op is Op.compare and at.spec.kind.value == "gt" and \
                ctx.type(at.inputs[0]).rank == 2:
            found = _replace(ctx, node, Op.svm_label, SvmLabel(labels), (at.inputs[0],))
            if found:
                return found
    return NoMatch("not the one-vs-one label of an SVM's pair scores")


RULES = (
    Rule(Op.reduce, tree_sum_rule),  # sum_T(leaves[walk^depth(roots)]) -> tree_sum
    Rule(Op.where, normalize_rule),  # where(norm != 0, x / norm, x) -> normalize_rows
    Rule(Op.cast, svm_rule),  # f32(sum_S(row * W) + rho) -> svm_scores (SVMClassifier)
    Rule(Op.add, svm_rule),  # sum_S(row * W) + rho -> svm_scores (SVMRegressor)
    Rule(Op.gather, linear_label_rule),  # labels[first_highest(x W + b)] -> linear_classifier
    Rule(Op.gather, svm_label_rule),  # labels[argmax(votes(svm_scores))] -> svm_label
    Rule(Op.divide, linear_scores_rule),  # softmax(x W + b) -> linear_classifier
    Rule(Op.where, linear_scores_rule),  # logistic(x W + b) -> linear_classifier
)
