"""A scatter-add of ones -> torch's bincount; bincount's range check -> one min; rows
gathered and scattered into bags -> embedding_bag; bincount with the length it computes ->
one torch.bincount.

    scatter[add](t, index, 1, axis 0), t an integer vector   -> bincount(t, index)
    max(x < c) over every axis, x integer, c one number      -> min(x) < c
    tdag.ops.embedding_bag(w, i, o[, p]) (its slice)         -> embedding_bag(w, i, o[, p])
    tdag.ops.writes.bincount(x, minlength=m)                 -> bincount_sized(x)
    tdag.ops.writes.histc(x, bins, lo, hi) (its slice)       -> histc(x, bins, lo, hi)
    concat(x[.., :t], v, x[.., t+n:]) along one axis         -> write_slice(x, v, t)

The second is the check the bincount front end makes (no negative index): ``x < 0`` and an
``any`` are two passes and a bool tensor as large as x, the min one pass (for integers the
two agree; a float min would be NaN where x holds one, so floats keep theirs; an x that may
be empty too, as torch's min of nothing fails). The third proposes the operands from the
composition's landmarks (the scatter into the bags, its gather, the offsets' count) and
matches the kernel's decomposition of them (``matches_kernel``); a 2-D input's offsets (an
arange) are folded with their count into constants, matched with the decomposition over
offsets folded the same way (``_equal_bags``); it runs before bincount
takes the bag count apart (``BAG_RULES``, the "ml" pass). The fourth matches torch.bincount's
whole composition (its length max(x) + 1 behind a check for negative values, the zeros of
that length, the count) against ``bincount_sized``'s decomposition, with the fresh size of
the matched count and each non-negative constant on the way as minlength: torch.bincount
makes the min and max passes itself, where the composition makes them again before it.

The fifth is torch's ``slice_scatter`` (``out[:, t] = h`` in a Python-loop scan,
functionalized): a concat copies the whole of x for each write, so T writes cost
O(T^2 x width), where the torch module's ``write_slice`` copies the values alone into an x
that nothing reads after it.
"""
from __future__ import annotations

from functools import lru_cache

from tdag.deinops.elementwise import Compare
from tdag.deinops.reduce import Reduce, ReduceKind
from tdag.deinops.extent import Slice
from tdag.deinops.indexing import Iota
from tdag.ir.graph import TDAG, Node
from tdag.ir.program import Program
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import as_dim, dims_equal, is_static
from tdag.lower.kernels.writes import BincountSized, EmbeddingBag, Histc, WriteSlice
from tdag.lower.match import bind_template, matches_kernel, scalar, simplified, trace_axes
from tdag.ops import core
from tdag.ops.builder import Builder
from tdag.ops.creation import iota
from tdag.ops.nn.functional import embedding_bag


def bincount_rule(node: Node, ctx: Context):
    """scatter[add](t, index, ones) along the only axis of an integer t -> bincount"""
    target, index, values = node.inputs
    if node.spec.combine != "add" or ctx.type(target).rank != 1 or \
            not ctx.type(target).dtype.is_integer:
        return NoMatch("not an add into an integer vector")
    if scalar(ctx, values) != 1:
        return NoMatch("adds values other than ones")
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.bincount, NoSpec(), target, index))


def bincount_sized_rule(node: Node, ctx: Context):
    """scatter[add](zeros[u], x, 1), u = max(x) + 1 checked (ops.writes.bincount)
    -> bincount_sized(x)"""
    length = node.type.shape[0] if node.type.rank == 1 else 0
    if node.spec.combine != "add" or is_static(length) or not length.is_Symbol:
        return NoMatch("not an add into a length data decides")
    for minlength in _minlengths(ctx, node.inputs[0]):
        spec = BincountSized(length.name, minlength)
        if matches_kernel(ctx, node, Op.bincount_sized, spec, (node.inputs[1],)):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.bincount_sized, spec, node.inputs[1]))
    return NoMatch("not the length and count bincount decomposes to")


def _minlengths(ctx: Context, target: str) -> list[int]:
    """The non-negative integer constants on the way to the count's target: minlength is
    one of them."""
    found = {int(value) for n in _cone(ctx, target) for i in n.inputs
             if (value := scalar(ctx, i)) is not None and value >= 0 and value == int(value)}
    return sorted(found)


def any_below_rule(node: Node, ctx: Context):
    """max(x < c) over all of x's axes -> min(x) < c, for an integer x"""
    lt = ctx.made(node.inputs[0], Op.compare)
    if node.spec.kind is not ReduceKind.max or lt is None or lt.spec.kind.value != "lt" \
            or len(node.spec.axes) != ctx.type(lt.name).rank:
        return NoMatch("not an any of x < c over every axis")
    x, bound = lt.inputs
    spread = ctx.made(bound, Op.expand)
    if not ctx.type(x).dtype.is_integer or spread is None or \
            ctx.type(spread.inputs[0]).rank != 0:
        return NoMatch("not an integer x below one number")
    if not is_static(ctx.type(x).numel) or ctx.type(x).numel == 0:
        return NoMatch("x may be empty: its any is False where a min fails")
    emit = ctx.emitter(node)
    low = emit(Op.reduce, Reduce(ReduceKind.min, node.spec.axes), x)
    return emit.finish(emit(Op.compare, Compare(lt.spec.kind), low, spread.inputs[0]))


def embedding_bag_rule(node: Node, ctx: Context):
    """slice(bags combined from gather(w, i) [* p], axis 0) -> embedding_bag(w, i, o[, p])"""
    if node.spec.axes != (0,) or node.spec.starts != (0,) or node.spec.steps != (1,):
        return NoMatch("not the first rows")
    into = ctx.producer(node.inputs[0])
    mode = {Op.scatter: "sum", Op.divide: "mean", Op.where: "max"}.get(getattr(into, "op", None))
    scatter = into if mode == "sum" else \
        mode and ctx.made(into.inputs[0 if mode == "mean" else 1], Op.scatter)
    if not scatter or scatter.spec.axis != 0:
        return NoMatch("not bags scattered along axis 0")
    rows, weights = scatter.inputs[2], ()
    if (scaled := ctx.made(rows, Op.multiply)) is not None:
        rows, weights = scaled.inputs[0], (trace_axes(ctx, scaled.inputs[1])[0],)
    pick, counts = ctx.made(rows, Op.gather), _offsets_count(ctx, scatter.inputs[1])
    if pick is not None and counts is None:
        return _equal_bags(node, ctx, mode, pick, weights, scatter)
    if pick is None:
        return NoMatch("no gathered rows")
    indices, offsets = (_uncast(ctx, x) for x in (pick.inputs[1], counts.inputs[1]))
    operands = (pick.inputs[0], indices, offsets, *weights)
    last = not dims_equal(ctx.type(offsets).shape[0], node.type.shape[0])
    for padding in (None, *_padding(ctx, scatter.inputs[1], pick.inputs[1])):
        spec = EmbeddingBag(mode, last, padding)
        if matches_kernel(ctx, node, Op.embedding_bag, spec, operands):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.embedding_bag, spec, *operands))
    return NoMatch("not the bags embedding_bag decomposes to")


def histc_rule(node: Node, ctx: Context):
    """slice(scatter[add](zeros[bins + 1], where(lo <= x <= hi, bin(x), bins), 1), 0, bins)
    -> histc(x, bins, lo, hi)  (checked node for node against the kernel's decomposition;
    before the activations pass makes its floor a kernel)"""
    scatter = ctx.made(node.inputs[0], Op.scatter)
    (bins,) = node.type.shape if node.type.rank == 1 else (None,)
    if scatter is None or not isinstance(bins, int) or not node.type.dtype.is_float:
        return NoMatch("not the first bins of a float scatter")
    kept = ctx.made(scatter.inputs[1], Op.where)
    both = ctx.made(kept.inputs[0], Op.multiply) if kept is not None else None
    tests = [ctx.made(t, Op.compare) for t in (both.inputs if both is not None else ())]
    if len(tests) != 2 or None in tests or tests[0].inputs[0] != tests[1].inputs[0]:
        return NoMatch("not a range test of one tensor")
    lo, hi = (scalar(ctx, t.inputs[1]) for t in tests)
    flat = tests[0].inputs[0]
    flattened = ctx.producer(flat)  # x's axes grouped into one (ops.reshape's form)
    whole = flattened.inputs[0] if flattened is not None and \
        flattened.op in (Op.group, Op.reshape) else flat
    for x in dict.fromkeys((whole, flat)):
        if lo is not None and hi is not None and lo < hi and \
                matches_kernel(ctx, node, Op.histc, Histc(bins, lo, hi), (x,)):
            emit = ctx.emitter(node)
            return emit.finish(emit(Op.histc, Histc(bins, lo, hi), x))
    return NoMatch("not histc's composition")


def _equal_bags(node: Node, ctx: Context, mode: str, pick: Node, weights: tuple, scatter: Node):
    """Bags of n consecutive indices each: F.embedding_bag of a 2-D input, whose offsets
    (torch's arange(0, b * n, n)) simplify folds, with their count, into a constant bag
    number per position. Matched against the kernel's decomposition with those offsets
    folded the same way; the kernel gets them back as iota(b * n)[::n]."""
    weight, indices = pick.inputs[0], _uncast(ctx, pick.inputs[1])
    total, bags = ctx.type(indices).shape[0], node.type.shape[0]
    if not is_static(total) or not is_static(bags) or bags == 0 or total % bags:
        return NoMatch("no count of the offsets, and not bags of equal static size")
    operands = (weight, indices, *weights)
    types = tuple(ctx.type(x) for x in operands)
    for padding in (None, *_padding(ctx, scatter.inputs[1], pick.inputs[1])):
        spec = EmbeddingBag(mode, False, padding)
        template = _equal_bags_template(spec, types, bags)
        bound = bind_template(ctx, node, template)
        if bound is not None and tuple(bound[v.name] for v in template.inputs) == operands:
            emit = ctx.emitter(node)
            offsets = emit(Op.slice, Slice((0,), (0,), (total,), (total // bags,)),
                           emit(Op.iota, Iota(total)))
            return emit.finish(emit(Op.embedding_bag, spec, weight, indices, offsets, *weights))
    return NoMatch("not the equal bags embedding_bag decomposes to")


@lru_cache(maxsize=64)
def _equal_bags_template(spec: EmbeddingBag, types: tuple, bags: int) -> TDAG:
    """The kernel's decomposition over offsets iota(n)[::n / bags], simplified."""
    builder = Builder()
    with builder.active():
        weight, indices, *weights = (builder.input(f"t{i}", t) for i, t in enumerate(types))
        n = indices.shape[0]
        offsets = core.slice(iota(n, "i64", builder), 0, 0, n, n // bags)
        out = embedding_bag(weight, indices, offsets, spec.mode, *weights[:1],
                            padding_idx=spec.padding_idx)
    return simplified(Program.from_tdag(builder.build([out])))


_CONE = 24  # nodes between a position's bag and the offsets' count: about a dozen


def _cone(ctx: Context, name: str):
    """The nodes behind ``name``, nearest first, up to the first scatter (the count of the
    offsets, yielded last) or ``_CONE`` names."""
    seen, frontier = {name}, [name]
    while frontier and len(seen) < _CONE:
        node = ctx.producer(frontier.pop(0))
        if node is None:
            continue
        yield node
        if node.op is Op.scatter:
            return
        frontier += [i for i in node.inputs if i not in seen]
        seen.update(node.inputs)


def _offsets_count(ctx: Context, bag: str):
    """The scatter-add that counts the bag starts (the first scatter behind ``bag``)."""
    return next((n for n in _cone(ctx, bag) if n.op is Op.scatter), None)


def _padding(ctx: Context, bag: str, index: str) -> list[int]:
    """The values the index is compared unequal with on the way to ``bag`` (padding_idx)."""
    return [int(value) for n in _cone(ctx, bag) if n.op is Op.compare and
            n.spec.kind.value == "ne" and n.inputs[0] == index and
            (value := scalar(ctx, n.inputs[1])) is not None]


def write_slice_rule(node: Node, ctx: Context):
    """concat(x[.., :t], v.., x[.., t+n:]) along one axis, the other runs x's own at their
    own place -> write_slice(x, v.., t) (the pieces written, one run of them, concatenated)"""
    axis, offset, base, written = node.spec.axis, 0, None, []
    for k, piece in enumerate(node.inputs):
        run = ctx.made(piece, Op.slice)
        if run is not None and run.spec.axes == (axis,) and run.spec.steps == (1,) and \
                dims_equal(run.spec.starts[0], offset) and base in (None, run.inputs[0]):
            base = run.inputs[0]
        else:
            written.append((k, offset))
        offset = as_dim(offset + ctx.type(piece).shape[axis])
    if base is None or not written or not is_static(written[0][1]) or \
            written[-1][0] - written[0][0] != len(written) - 1:
        return NoMatch("not one run written into the rest of one tensor")
    if ctx.type(base) != node.type:
        return NoMatch("the runs' tensor is not of the concatenation's type")
    values = [node.inputs[k] for k, _ in written]
    if not is_static(sum(ctx.type(v).shape[axis] for v in values)):
        return NoMatch("a run of symbolic length written")
    emit = ctx.emitter(node)
    values = values[0] if len(values) == 1 else emit(Op.concat, node.spec, *values)
    return emit.finish(emit(Op.write_slice, WriteSlice(axis, int(written[0][1])), base, values))


def _uncast(ctx: Context, name: str) -> str:
    """The integer tensor an index was widened from (``as_index``), else ``name``."""
    cast = ctx.made(name, Op.cast)
    return cast.inputs[0] if cast is not None and ctx.type(cast.inputs[0]).dtype.is_integer \
        else name


RULES = (
    Rule(Op.scatter, bincount_rule),  # scatter[add](t, i, 1) -> bincount(t, i)
    Rule(Op.reduce, any_below_rule),  # any(x < c) -> min(x) < c
    Rule(Op.concat, write_slice_rule),  # concat(x[:t], v, x[t+n:]) -> write_slice(x, v, t)
)

# before "sorting"'s bincount takes the count of the offsets (and any_below bincount's check) apart
BAG_RULES = (
    Rule(Op.slice, embedding_bag_rule),  # bags of gathered rows -> embedding_bag
    Rule(Op.slice, histc_rule),  # ones scattered into the bins of x's range -> histc(x)
    Rule(Op.scatter, bincount_sized_rule),  # zeros[max(x) + 1] + count of x -> bincount_sized
)
