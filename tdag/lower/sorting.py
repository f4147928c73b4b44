"""Sorted values -> the framework's top-k; the arg-extreme composition -> argmax / argmin.

    gather(x, [slice(] sort(x, 0) [, 0, k)])                      -> topk(x, 0, k)
    (a whole sort whose positions are read too stays: its values are a gather of them)
    slice(sort(x, a), a, 0, k), its positions read     -> topk[indices](x, a, k)
    gather(flat(permute?(x)), rows * n + permute?([slice(] sort(x, a) [)]))
                                                 -> permute?(topk(x, a, k))
    min(where(x == bcast(max(x, a)) | isnan(x), positions, >= n - 1), a) -> argmax(x, a)
    (min for max: argmin; every row has a hit, at most n - 1, so a miss of n - 1 never wins)
    the last step of binary_search(b, v)                          -> searchsorted(b, v)
    gather(flat(x), rows * n + sort(k))                  -> take_along(x, sort(k))
    scatter[replace](flat(t), flat(rows * n + sort(k)), flat(v)) -> flat(put_along(t, sort(k), v))
    (a sort's permutation along the last axis, its positions read elsewhere too: each row
    read or written with its own positions, in range and each once, so no flat index and
    no dedupe of the writes)

The gather form is ``tdag.ops.sorting.take_sorted``: the rows' offsets ``row * n`` are a
constant (static sizes) or ``iota(rows) * n``; both are checked, value by value.
"""
from __future__ import annotations

import torch

from tdag.deinops.movement import Permute
from tdag.deinops.reduce import ReduceKind
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import dims_equal, is_static, product
from tdag.ir.types import DType, TensorKind
from tdag.lower.kernels.sorting import PACKED, Along, Arg, SearchSorted, TopK
from tdag.lower.match import is_unit, matches_kernel, scalar, trace_axes

# views that show the same values on more or fewer unit axes (the offsets' [rows] -> [..., 1])
_RESHAPES = frozenset({Op.ungroup, Op.unsqueeze, Op.squeeze, Op.reshape})


def _sorted_positions(ctx: Context, index: str, perm: tuple | None):
    """(sort node, k) where ``index`` is a sort's permutation, or its first k along the
    sorted axis, moved by ``perm`` (None: not moved); else None."""
    if perm is not None:
        node = ctx.made(index, Op.permute)
        if node is None or tuple(node.spec.perm) != perm:
            return None
        index = node.inputs[0]
    sort = ctx.made(index, Op.sort)
    if sort is not None:  # the values of a whole sort: only if its positions are not read
        return (sort, ctx.type(index).shape[sort.spec.axis]) if ctx.single_use(index) \
            else None
    cut = ctx.made(index, Op.slice)
    sort = ctx.made(cut.inputs[0], Op.sort) if cut is not None else None
    if sort is None or cut.spec.axes != (sort.spec.axis,) or cut.spec.steps != (1,) \
            or cut.spec.starts != (0,):
        return None
    return sort, cut.spec.stops[0]


def _row_offsets(ctx: Context, name: str, rows, n) -> bool:
    """Whether ``name`` holds ``row * n`` for each row (broadcast over the last axis)."""
    node = ctx.producer(name)
    while node is not None and (node.op in _RESHAPES or node.op in (Op.repeat, Op.expand)):
        name = node.inputs[0]
        node = ctx.producer(name)
    if product(ctx.type(name).shape) != rows if is_static(rows) else \
            not dims_equal(product(ctx.type(name).shape), rows):
        return False
    weight = ctx.weight(name)
    if weight is not None:
        if weight.kind is not TensorKind.const or weight.value is None or not is_static(n):
            return False
        want = torch.arange(int(rows), dtype=weight.value.dtype) * int(n)
        return torch.equal(weight.value.reshape(-1), want)
    if node is None or node.op is not Op.multiply or not is_static(n):
        return False
    for it, step in (node.inputs, reversed(node.inputs)):
        while ctx.op(it) in _RESHAPES:  # the iota given its unit axis first
            it = ctx.producer(it).inputs[0]
        if ctx.made(it, Op.iota) is not None and scalar(ctx, step) == int(n):
            return True
    return False


def topk_rule(node: Node, ctx: Context):
    """gather of a sort's first k positions of its own input -> topk"""
    table, index = node.inputs
    if node.spec.axis != 0 or ctx.type(table).rank != 1:
        return NoMatch("not a gather from a flat table")
    if ctx.type(index).rank == 1:  # a 1-d x: the positions are the index itself
        found = _sorted_positions(ctx, index, None)
        if found is None or found[0].inputs[0] != table:
            return NoMatch("not a sort of the table")
        return _emit_topk(node, ctx, table, found, None)
    flat = ctx.made(table, Op.group)
    if flat is None or flat.spec.axis != 0 or flat.spec.count != ctx.type(flat.inputs[0]).rank:
        return NoMatch("the table is not a flattened tensor")
    moved = ctx.made(flat.inputs[0], Op.permute)
    x = moved.inputs[0] if moved is not None else flat.inputs[0]
    perm = tuple(moved.spec.perm) if moved is not None else None
    shape = ctx.type(flat.inputs[0]).shape
    rows, n = product(shape[:-1]), shape[-1]
    add = ctx.made(index, Op.add)
    if add is not None:
        pairs = (add.inputs, tuple(reversed(add.inputs)))
    elif is_static(rows) and rows == 1:  # one row: simplify dropped its offset, 0
        pairs = ((None, index),)
    else:
        return NoMatch("the index is not row offsets plus positions")
    for offsets, positions in pairs:
        found = _sorted_positions(ctx, positions, perm)
        if found is None or found[0].inputs[0] != x or \
                (offsets is not None and not _row_offsets(ctx, offsets, rows, n)):
            continue
        axis = found[0].spec.axis
        if (perm[-1] if perm is not None else ctx.type(x).rank - 1) != axis:
            continue
        return _emit_topk(node, ctx, x, found, perm)
    return NoMatch("not a sort's positions of the flattened table, row by row")


def _emit_topk(node: Node, ctx: Context, x: str, found, perm):
    sort, k = found
    emit = ctx.emitter(node)
    out = emit(Op.topk, TopK(sort.spec.axis, k, sort.spec.descending), x)
    if perm is not None:
        out = emit(Op.permute, Permute(perm), out)
    return emit.finish(out)


def _hits(ctx: Context, name: str, x: str, kind: ReduceKind, axis: int) -> bool:
    """Whether ``name`` is ``x == bcast(reduce[kind](x, axis))``, or that or isnan(x)."""
    where = ctx.made(name, Op.where)
    if where is not None and scalar(ctx, where.inputs[1]) == 1.0:  # a | b as where(a, T, b)
        nan = ctx.made(where.inputs[2], Op.compare)
        if nan is None or nan.spec.kind.value != "ne" or nan.inputs != (x, x):
            return False
        name = where.inputs[0]
    eq = ctx.made(name, Op.compare)
    if eq is None or eq.spec.kind.value != "eq":
        return False
    for a, m in (eq.inputs, reversed(eq.inputs)):
        source, mapping = trace_axes(ctx, m)
        red = ctx.made(source, Op.reduce)
        if a == x and red is not None and red.spec.kind is kind and red.spec.axes == (axis,) \
                and red.inputs[0] == x and mapping.count(None) == 1 and mapping[axis] is None:
            return True
    return False


def positions_along(ctx: Context, name: str, axis: int) -> bool:
    """Whether ``name`` shows 0..n-1 along ``axis``, broadcast over the others: an iota (or
    its constant) given unit axes, then repeated along them (or expanded, which adds the
    leading ones)."""
    rank = ctx.type(name).rank
    node = ctx.producer(name)
    while node is not None and node.op in (Op.repeat, Op.expand):
        name, node = node.inputs[0], ctx.producer(node.inputs[0])
    shape = (1,) * (rank - ctx.type(name).rank) + tuple(ctx.type(name).shape)
    while node is not None and node.op in _RESHAPES:
        name, node = node.inputs[0], ctx.producer(node.inputs[0])
    length = ctx.type(name).shape[0] if ctx.type(name).rank == 1 else None
    if length is None or not all(dims_equal(d, length) if i == axis else is_unit(d)
                                 for i, d in enumerate(shape)):
        return False
    if node is not None:
        return node.op is Op.iota
    weight = ctx.weight(name)  # simplify folds a static iota into a constant
    return weight is not None and weight.kind is TensorKind.const and \
        weight.value is not None and torch.equal(weight.value, torch.arange(
            int(length), dtype=weight.value.dtype))


def arg_rule(node: Node, ctx: Context):
    """min(where(x == bcast(max(x, a)) | isnan(x), positions, n - 1), a) -> argmax(x, a)"""
    if node.spec.kind is not ReduceKind.min or len(node.spec.axes) != 1:
        return NoMatch("not a min over one axis")
    where = ctx.made(node.inputs[0], Op.where)
    if where is None:
        return NoMatch("not a min of a where")
    axis = node.spec.axes[0]
    hits, positions, miss = where.inputs
    n = ctx.type(node.inputs[0]).shape[axis]
    if not positions_along(ctx, positions, axis):
        return NoMatch("not positions along the axis")
    missed = scalar(ctx, miss)
    if missed is None or not is_static(n) or missed < int(n) - 1:
        return NoMatch("a miss that could be the min")
    for kind, op in ((ReduceKind.max, Op.argmax), (ReduceKind.min, Op.argmin)):
        for x in _candidates(ctx, hits):
            if ctx.type(x).dtype.value != "bool" and _hits(ctx, hits, x, kind, axis):
                emit = ctx.emitter(node)
                return emit.finish(emit(op, Arg(axis), x))
    return NoMatch("not the first position of an extreme")


def _candidates(ctx: Context, hits: str):
    """The tensors the hit mask may compare with their extreme: its eq's operands."""
    where = ctx.made(hits, Op.where)
    eq = ctx.made(where.inputs[0] if where is not None else hits, Op.compare)
    return eq.inputs if eq is not None else ()


def topk_indices_rule(node: Node, ctx: Context):
    """slice(sort(x), a, 0, k) -> topk[indices](x, a, k), unless only its values are read
    (topk_rule takes the gather of them)"""
    sort = ctx.made(node.inputs[0], Op.sort)
    x = sort.inputs[0] if sort is not None else None
    if sort is None or node.spec.axes != (sort.spec.axis,) or node.spec.steps != (1,) \
            or node.spec.starts != (0,):
        return NoMatch("not the first k of a sort")
    if ctx.type(x).dtype not in PACKED:
        return NoMatch(f"{ctx.type(x).dtype.value} positions need the sort")
    if _only_gathered(ctx, node.name):
        return NoMatch("only its values are read")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.topk, TopK(sort.spec.axis, node.spec.stops[0],
                                          sort.spec.descending, True), x))


def _only_gathered(ctx: Context, name: str) -> bool:
    """Whether ``name`` feeds, alone and through permutes and adds only, a single gather."""
    while ctx.single_use(name):
        readers = ctx.readers(name)
        if not readers:
            return False
        if readers[0].op is Op.gather:
            return True
        if readers[0].op not in (Op.permute, Op.add):
            return False
        name = readers[0].name
    return False


def searchsorted_rule(node: Node, ctx: Context):
    """where(go, mid + 1, lo) ending ``tdag.ops.sorting.binary_search`` -> searchsorted(b, v):
    b and v are read off a comparison of a gathered boundary with the value, then the whole
    search is checked against the kernel's decomposition"""
    for right, b, v in _search_operands(ctx, node):
        if matches_kernel(ctx, node, Op.searchsorted, SearchSorted(right), (b, v)):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.searchsorted, SearchSorted(right), b, v))
    return NoMatch("not the last step of a binary search")


def _search_operands(ctx: Context, node: Node):
    """(right, boundaries, values) candidates: a ``gather(table) >= v`` (> for right) a few
    steps above the where, and as boundaries each tensor a few steps above the table of v's
    dtype (the table is the boundaries padded, and flattened where they are batched)."""
    for compare in ancestors(ctx, node.name, 5):
        if compare.op is not Op.compare or compare.spec.kind.value not in ("ge", "gt"):
            continue
        gathered = ctx.made(compare.inputs[0], Op.gather)
        if gathered is None:
            continue
        v = compare.inputs[1]
        sources = [gathered.inputs[0]] + [i for n in ancestors(ctx, gathered.inputs[0], 3)
                                          for i in n.inputs]
        for b in dict.fromkeys(sources):
            if ctx.type(b).dtype is ctx.type(v).dtype and ctx.type(b).rank >= 1:
                yield compare.spec.kind.value == "gt", b, v


def ancestors(ctx: Context, name: str, depth: int):
    """The nodes that produce ``name`` and its inputs up to ``depth`` steps above it."""
    seen, todo = set(), [(name, 0)]
    while todo:
        name, d = todo.pop()
        node = ctx.producer(name)
        if node is None or name in seen or d > depth:
            continue
        seen.add(name)
        yield node
        todo.extend((i, d + 1) for i in node.inputs)


def take_along_rule(node: Node, ctx: Context):
    """gather(flat(x), rows * n + sort(k, a)) -> take_along(x, sort(k, a), a)"""
    x = _unflattened(ctx, node.inputs[0])
    if node.spec.axis != 0 or x is None:
        return NoMatch("not a gather from a flattened tensor")
    sort = _row_permutation(ctx, node.inputs[1], x)
    if sort is None:
        return NoMatch("not a sort's positions along the last axis, row by row")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.take_along, Along(sort.spec.axis), x, sort.name))


def put_along_rule(node: Node, ctx: Context):
    """scatter[replace](flat(t), flat(rows * n + sort(k, a)), flat(v))
    -> flat(put_along(t, sort(k, a), v, a)): a permutation writes each position once"""
    target, index, values = node.inputs
    flat = ctx.producer(target)
    t, v = _unflattened(ctx, target), _unflattened(ctx, values)
    if node.spec.combine != "replace" or t is None or v is None or \
            ctx.type(v) != ctx.type(t):
        return NoMatch("not a replace into a flattened tensor by values shaped as it")
    rows = _unflattened(ctx, index)
    sort = None if rows is None else _row_permutation(ctx, rows, t)
    if sort is None:
        return NoMatch("not a sort's positions along the last axis, row by row")
    emit = ctx.emitter(node)
    out = emit(Op.put_along, Along(sort.spec.axis), t, sort.name, v)
    return emit.finish(emit(flat.op, flat.spec, out))


def _unflattened(ctx: Context, name: str) -> str | None:
    """The tensor ``name`` flattens (a reshape or group to one axis), else None."""
    node = ctx.producer(name)
    if node is None or ctx.type(name).rank != 1 or not (
            node.op is Op.reshape or node.op is Op.group and node.spec.axis == 0 and
            node.spec.count == ctx.type(node.inputs[0]).rank):
        return None
    return node.inputs[0]


def _row_permutation(ctx: Context, index: str, x: str) -> Node | None:
    """The sort along x's last axis whose permutation, plus each row's start (``row * n``:
    one term, or one per leading axis as ``element_positions`` adds them; none for one
    row), is ``index``: every position of x once."""
    shape = ctx.type(x).shape
    if ctx.type(x).rank < 1 or not is_static(shape[-1]):
        return None
    terms = _terms(ctx, index)
    for i, positions in enumerate(terms):
        sort = ctx.made(positions, Op.sort)
        if sort is not None and sort.spec.axis == ctx.type(x).rank - 1 and \
                ctx.type(positions) == ctx.type(x).with_dtype(DType.i64) and \
                _row_starts(ctx, terms[:i] + terms[i + 1:], shape):
            return sort
    return None


def _terms(ctx: Context, name: str) -> list[str]:
    """The summands of a tree of adds."""
    add = ctx.made(name, Op.add)
    return [name] if add is None else [t for i in add.inputs for t in _terms(ctx, i)]


def _row_starts(ctx: Context, offsets: list[str], shape) -> bool:
    """Whether ``offsets`` sum to ``row * n`` for each row of a tensor of ``shape``."""
    rows, n = product(shape[:-1]), shape[-1]
    if len(offsets) < 2:
        return _row_offsets(ctx, offsets[0], rows, n) if offsets else \
            is_static(rows) and rows == 1
    values = [_constant(ctx, t) for t in offsets]
    if not is_static(rows) or any(v is None for v in values):
        return False
    want = torch.arange(int(rows)).reshape(*shape[:-1], 1) * int(n)
    try:
        return torch.equal(sum(values).expand(want.shape), want)
    except RuntimeError:  # they do not broadcast to one column per row
        return False


def _constant(ctx: Context, name: str) -> torch.Tensor | None:
    """The value ``name`` broadcasts (what its expands read, at that rank), if a constant."""
    node = ctx.producer(name)
    while node is not None and node.op in (Op.repeat, Op.expand):
        name, node = node.inputs[0], ctx.producer(node.inputs[0])
    shape = tuple(ctx.type(name).shape)
    while node is not None and node.op in _RESHAPES:
        name, node = node.inputs[0], ctx.producer(node.inputs[0])
    weight = ctx.weight(name)
    if node is not None or weight is None or weight.kind is not TensorKind.const or \
            weight.value is None or not all(is_static(d) for d in shape):
        return None
    return weight.value.reshape(shape)


RULES = (
    Rule(Op.where, searchsorted_rule),  # binary_search(b, v) -> searchsorted(b, v)
    Rule(Op.gather, topk_rule),   # gather(x, slice(sort(x), k)) -> topk(x, k)
    Rule(Op.gather, take_along_rule),  # gather(flat(x), rows*n + sort) -> take_along
    Rule(Op.scatter, put_along_rule),  # scatter(flat(t), rows*n + sort, v) -> put_along
    Rule(Op.slice, topk_indices_rule),  # slice(sort(x), k) -> topk[indices](x, k)
    Rule(Op.reduce, arg_rule),    # min(where(x == max(x) | isnan, pos, n-1)) -> argmax(x)
)
