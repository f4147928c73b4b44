"""ONNX ops whose shapes, pads, repeats or bounds arrive at run time (issue 11).

Each output size such an input decides is a fresh size: an ``arange`` of the value
(tdag/deinops/runtime.py), and the result a ``gather`` of the input at indices built from
those aranges, so every value whose shape holds a fresh symbol reads the node that defines
it. What ONNX would refuse (a Reshape whose sizes do not multiply to the element count, an
Expand of incompatible sizes, Split sizes that do not add up, a zero Range delta) sets the
arange's length to -1, which every runtime refuses (``checked_size``): a bad value raises,
it never answers. The rank must stay known: inputs that decide it (the axes of Reduce*,
Squeeze and Unsqueeze, Resize's scales) are pinned instead (``from_onnx(..., inputs=)``).

The entries in onnx/ops/ call these when ``ctx.known`` of the input is None. A shape
Concat'ed from known sizes and run-time ones (``[Shape(x)[0], k, -1]``) keeps the known ones
(``note_entries``): only the rest become fresh sizes, and the ops that take a run-time entry
as it is (ConstantOfShape, Expand of a size-1 axis) share one fresh size per entry.
"""
from __future__ import annotations

import numpy as np

from tdag import ops
from tdag.canonicalize.onnx.values import MAX_KNOWN, Known
from tdag.ops.tensor import Tensor
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ir.symbols import dims_equal, is_static, product
from tdag.ir.types import DType

I64 = DType.i64


def int_vector(ctx, value, what: str) -> Tensor:
    """A 1-d integer input of a static length, as i64."""
    t = ops.cast(ctx.tensor(value), I64)
    if t.ndim == 0:
        t = ops.reshape(t, (1,))
    if t.ndim != 1 or not is_static(t.shape[0]):
        raise UnsupportedOpError(f"{ctx.node.op_type}: {what} of type {t.type} (a 1-d tensor "
                                 "of a static length is needed: it fixes the output's rank)")
    return t


def _entry(v: Tensor, k: int) -> Tensor:
    return ops.select(v, 0, k)


def _size(x: Tensor, axis: int) -> Tensor:
    return ops.size_tensor(x, (axis,), I64)


def _all(flags: list) -> Tensor | None:
    out = None
    for f in flags:
        out = f if out is None else ops.logical_and(out, f)
    return out


def _product(values: list, like: Tensor) -> Tensor:
    out = ops.full((), 1, I64, like=like)
    for v in values:
        out = ops.mul(out, v)
    return out


def _regrid(flat: Tensor, dims: list, ok: Tensor | None, sizes: list) -> Tensor:
    """``flat`` (1-d) read as a row-major grid of the run-time sizes ``dims``: the size
    known at import time where ``sizes`` has one, else a fresh one, the first checked by
    ``ok`` (the index carries the check where every size is known)."""
    aranges = []
    for d, size in zip(dims, sizes):
        if size is not None:
            aranges.append(ops.iota(size, I64, flat.builder))
        else:
            aranges.append(ops.arange_of(d) if ok is None else ops.checked_size(d, ok))
            ok = None
    strides, stride = [], ops.full((), 1, I64, like=flat)
    for d in reversed(dims):
        strides.insert(0, stride)
        stride = ops.mul(stride, d)
    index = ops.broadcast_index(aranges, strides)
    if ok is not None:
        index = ops.add(index, ops.checked_zero(ok))
    return ops.gather(flat, index, 0, wrap=False)


# -- entries known at import time -----------------------------------------------------------

def note_entries(ctx, out, parts) -> None:
    """Remember which entries of an integer Concat along its one axis are known at import
    time (from Knowns: ``Shape(x)[0]`` beside a size read from data): a Reshape, Expand or
    ConstantOfShape to it keeps those sizes, a fresh one only for the rest."""
    if not isinstance(out, Tensor) or out.ndim != 1 or out.dtype.is_float:
        return
    if not is_static(out.shape[0]) or int(out.shape[0]) > MAX_KNOWN:
        return  # no shape has that many entries; noting them would cost memory per element
    entries = []
    for part in parts:
        if len(part.shape) != 1 or not is_static(part.shape[0]):
            return
        known = ctx.known(part)
        entries += known.dims() if known is not None else \
            ctx.importer.entries.get(part.name, [None] * int(part.shape[0]))
    if any(e is not None for e in entries):
        ctx.importer.entries[out.name] = entries


def picked_entries(ctx, x, pick):
    """Elements ``pick`` (a numpy index) of a 1-d shape tensor with noted entries, as an
    object array (Dims, None where data decides); None where x has none noted."""
    entries = ctx.importer.entries.get(x.name) if isinstance(x, Tensor) else None
    return None if entries is None else \
        np.asarray(np.array(entries, dtype=object)[pick], dtype=object)  # 0-d kept


def known_or_noted(ctx, picked, dtype, out):
    """The picked entries as a Known where every one is known at import time (the batch in
    ``Concat(Shape(x)[:1], k)[0]``); else ``out()``, the tensor, with them noted."""
    if picked is not None and all(e is not None for e in picked.flat):
        return Known(picked, dtype)
    result = out()
    if picked is not None and picked.ndim == 1 and any(e is not None for e in picked):
        ctx.importer.entries[result.name] = list(picked)
    return result


def _entry_size(ctx, given, shape: Tensor, k: int) -> Tensor:
    """``arange(shape[k])``: one fresh size per entry of a shape tensor, shared by the ops
    whose output takes that entry as it is (a ConstantOfShape and an Expand of a size-1 axis
    to the same shape agree on it)."""
    key = (getattr(given, "name", None), k)
    sizes = ctx.importer.entry_sizes
    if key[0] is None or key not in sizes:
        made = ops.arange_of(_entry(shape, k))
        if key[0] is None:
            return made
        sizes[key] = made
    return sizes[key]


def _known_entries(ctx, value, count: int) -> list:
    """The entries of a shape input known at import time (Dims), None where data decides
    (or where a known one is negative: the run-time path checks it)."""
    entries = ctx.importer.entries.get(getattr(value, "name", None))
    if entries is None or len(entries) != count:
        return [None] * count
    return [None if is_static(e) and e < 0 else e for e in entries]


# -- Reshape, Expand, Tile, ConstantOfShape -----------------------------------------------------

def reshape(ctx, x, shape, allow_zero: bool) -> Tensor:
    """Each output size a fresh one; 0 copies the input's size (unless ``allow_zero``), one
    -1 is inferred; the sizes must multiply to the element count."""
    x, given = ctx.tensor(x), shape
    shape = int_vector(ctx, shape, "the shape")
    rank = int(shape.shape[0])
    if rank == 0:
        return ops.reshape(x, ())
    sizes = [x.shape[k] if is_static(e) and e == 0 and not allow_zero and k < x.ndim else
             None if is_static(e) and e == 0 and not allow_zero else e
             for k, e in enumerate(_known_entries(ctx, given, rank))]
    n = ops.size_tensor(x, tuple(range(x.ndim)), I64)
    dims = []
    for k in range(rank):
        d = _entry(shape, k)
        if not allow_zero and k < x.ndim:
            d = ops.where(ops.eq(d, 0), _size(x, k), d)
        dims.append(d)
    wild = [ops.eq(d, -1) for d in dims]
    rest = _product([ops.where(w, 1, d) for w, d in zip(wild, dims)], x)
    inferred = ops.floor_divide(n, ops.maximum(rest, 1))
    dims = [ops.where(w, inferred, d) for w, d in zip(wild, dims)]
    wilds = ops.sum(ops.stack([ops.cast(w, I64) for w in wild], 0), 0)
    ok = _all([ops.eq(_product(dims, x), n), ops.le(wilds, 1)] +
              [ops.ge(d, 0) for d in dims])
    return _regrid(ops.reshape(x, (-1,)), dims, ok, sizes)


def expand(ctx, x, shape) -> Tensor:
    """Broadcast to a run-time shape: an axis of size 1 takes the shape's size (a fresh
    one); any other keeps its size, checked at run time to match (or the shape's 1)."""
    x, given = ctx.tensor(x), shape
    shape = int_vector(ctx, shape, "the shape")
    r = int(shape.shape[0])
    rank = max(x.ndim, r)
    if rank > x.ndim:
        x = ops.unsqueeze(x, tuple(range(rank - x.ndim)))
    checks, known = [], _known_entries(ctx, given, r)
    for k in range(rank - r, rank):
        size = known[k - (rank - r)]
        if size is not None and (size == 1 or dims_equal(size, x.shape[k])):
            continue  # the axis stays as it is
        if size is not None and x.shape[k] == 1:  # broadcast to a size known now
            x = ops.broadcast_to(x, tuple(size if j == k else d for j, d in enumerate(x.shape)))
            continue
        s, n = _entry(shape, k - (rank - r)), _size(x, k)
        fits = ops.logical_or(ops.logical_or(ops.eq(s, 1), ops.eq(s, n)), ops.eq(n, 1))
        if is_static(x.shape[k]) and x.shape[k] != 1:  # the size stays; only a check
            checks.append(fits)
            continue
        if x.shape[k] == 1:  # the shape's size, as a ConstantOfShape to it has
            x = ops.gather(x, ops.mul(_entry_size(ctx, given, shape, k - (rank - r)), 0), k,
                           wrap=False)
            continue
        length = ops.checked_size(ops.where(ops.eq(n, 1), s, n), fits)
        x = ops.gather(x, ops.minimum(length, ops.sub(n, 1)), k, wrap=False)
    ok = _all(checks)
    if ok is not None:  # an identity gather along the first such axis carries the check
        axis = next(k for k in range(rank - r, rank) if is_static(x.shape[k]))
        index = ops.add(ops.iota(x.shape[axis], I64, x.builder), ops.checked_zero(ok))
        x = ops.gather(x, index, axis, wrap=False)
    return x


def broadcast_operands(xs: list[Tensor]) -> list[Tensor]:
    """Operands of a broadcasting op where an axis is a fixed size in one and an expression in
    the sizes in another (a ViT exported with dynamic height and width adds its patches,
    ``floor(h/p)*floor(w/p) + 1`` of them, to a position table of a fixed length): the
    expression must be that size or 1 at run time, as ONNX's broadcast has it, so that operand
    is gathered to the fixed size (a copy, or its one entry repeated) with a run-time check
    that refuses any other size. Axes that broadcast as they are stay as they are."""
    rank = max(x.ndim for x in xs)
    for axis in range(1, rank + 1):
        sizes = [x.shape[x.ndim - axis] for x in xs if x.ndim >= axis]
        fixed = {d for d in sizes if is_static(d) and d != 1}
        if len(fixed) == 1:
            size = fixed.pop()
            xs = [_to_fixed(x, x.ndim - axis, size) if x.ndim >= axis else x for x in xs]
    return xs


def _to_fixed(x: Tensor, axis: int, size: int) -> Tensor:
    if is_static(x.shape[axis]):
        return x
    n = _size(x, axis)
    ok = ops.logical_or(ops.eq(n, size), ops.eq(n, 1))
    index = ops.mul(ops.iota(size, I64, x.builder), ops.cast(ops.ne(n, 1), I64))
    return ops.gather(x, ops.add(index, ops.checked_zero(ok)), axis, wrap=False)


def tile(ctx, x, repeats) -> Tensor:
    x, repeats = ctx.tensor(x), int_vector(ctx, repeats, "repeats")
    if int(repeats.shape[0]) != x.ndim:
        raise InvalidModelError(f"Tile: {repeats.shape[0]} repeats for {x.type}")
    for k in range(x.ndim):
        r, n = _entry(repeats, k), _size(x, k)
        length = ops.checked_size(ops.mul(n, r), ops.ge(r, 0))
        x = ops.gather(x, ops.remainder(length, ops.maximum(n, 1)), k, wrap=False)
    return x


def constant_of_shape(ctx, shape, value) -> Tensor:
    given, shape = shape, int_vector(ctx, shape, "the shape")
    rank = int(shape.shape[0])
    x = ops.reshape(ctx.builder.const(value), (1,) * rank)
    for k, size in enumerate(_known_entries(ctx, given, rank)):
        length = _entry_size(ctx, given, shape, k) if size is None else \
            ops.iota(size, I64, x.builder)
        x = ops.gather(x, ops.mul(length, 0), k, wrap=False)
    return x


# -- Range, Pad, Split --------------------------------------------------------------------------

def range_(ctx, start, limit, delta, dtype: DType) -> Tensor:
    """``start + i * delta`` for i < max(ceil((limit - start) / delta), 0), delta not 0."""
    start, limit, delta = (ops.reshape(ops.cast(ctx.tensor(v), dtype), ())
                           for v in (start, limit, delta))
    wide = DType.f64
    count = ops.ceil(ops.div(ops.sub(ops.cast(limit, wide), ops.cast(start, wide)),
                             ops.cast(delta, wide)))
    count = ops.maximum(ops.cast(count, I64), 0)
    steps = ops.checked_size(count, ops.ne(ops.cast(delta, wide), 0))
    calc = wide if dtype.is_float else I64  # as torch: in double, rounded once to dtype
    value = ops.add(ops.mul(ops.cast(steps, calc), ops.cast(delta, calc)), ops.cast(start, calc))
    return ops.cast(value, dtype)


def pad(ctx, x, pads, fill, axes, mode: str) -> Tensor:
    """Each padded axis a fresh size ``n + before + after`` (negative pads crop), read by a
    gather at the source index the mode gives. Axes given at run time pad every axis, by
    the pads of the entry naming it (none if no entry does)."""
    x, pads = ctx.tensor(x), int_vector(ctx, pads, "pads")
    count = len(axes) if isinstance(axes, list) else int(int_vector(ctx, axes, "axes").shape[0])
    if int(pads.shape[0]) != 2 * count:
        raise InvalidModelError(f"Pad: {pads.shape[0]} pads for {count} axes")
    plan, ok = _axis_plan(ctx, x, axes, count)
    for axis, which in plan:
        if isinstance(which, int):
            before, after = _entry(pads, which), _entry(pads, which + count)
        else:
            before, after = (ops.sum(ops.where(which, ops.slice(pads, 0, lo, lo + count), 0), 0)
                             for lo in (0, count))
        if is_static(x.shape[axis]) and x.shape[axis] == 0:
            raise UnsupportedOpError("Pad: a run-time pad of an empty axis")
        n = _size(x, axis)
        out = ops.add(ops.add(n, before), after)
        out = ops.arange_of(out) if ok is None else ops.checked_size(out, ok)
        ok = None  # the axes check rides on the first axis only
        src = ops.sub(out, before)
        if mode == "constant":
            index = ops.clamp(src, 0, ops.sub(n, 1))
        elif mode == "edge":
            index = ops.clamp(src, 0, ops.sub(n, 1))
        elif mode == "wrap":
            index = ops.remainder(src, n)
        elif mode == "reflect":
            period = ops.maximum(ops.mul(ops.sub(n, 1), 2), 1)
            index = ops.remainder(src, period)
            index = ops.where(ops.ge(index, n), ops.sub(period, index), index)
        else:
            raise UnsupportedOpError(f"Pad: mode {mode!r}")
        picked = ops.gather(x, index, axis, wrap=False)
        if mode == "constant":
            inside = ops.logical_and(ops.ge(src, 0), ops.lt(src, n))
            others = tuple(j for j in range(x.ndim) if j != axis)
            inside = ops.broadcast_to(ops.unsqueeze(inside, others) if others else inside,
                                      picked.shape)
            picked = ops.where(inside, picked, ops.broadcast_to(fill, picked.shape))
        x = picked
    return x


def split(ctx, x, sizes, axis: int) -> tuple:
    """Each part a fresh size; the sizes, none negative, must add up to the axis."""
    x, sizes = ctx.tensor(x), int_vector(ctx, sizes, "split")
    count = int(sizes.shape[0])
    if count != ctx.num_outputs:
        raise InvalidModelError(f"Split: {count} sizes for {ctx.num_outputs} outputs")
    parts, offset = [], ops.full((), 0, I64, like=x)
    total = ops.sum(sizes, 0)
    for k in range(count):
        size = _entry(sizes, k)
        length = ops.checked_size(size, ops.eq(total, _size(x, axis))) if k == count - 1 \
            else ops.arange_of(size)
        parts.append(ops.gather(x, ops.add(length, offset), axis, wrap=False))
        offset = ops.add(offset, size)
    return tuple(parts)


# -- Slice --------------------------------------------------------------------------------------

def _axis_plan(ctx, x, axes, count: int) -> tuple:
    """[(axis of x, which entry)], and a check or None. Known axes: the entry's index. Axes
    given at run time: every axis of x, with a bool[count] mask of the entries naming it;
    the check says they are in range and name no axis twice."""
    if isinstance(axes, list):
        if len({a % max(x.ndim, 1) for a in axes}) != len(axes) or \
                any(not -x.ndim <= a < x.ndim for a in axes):
            raise InvalidModelError(f"{ctx.node.op_type}: axes {axes} are out of range or "
                                    "repeat one")
        return [(a % x.ndim, k) for k, a in enumerate(axes)], None
    axes = int_vector(ctx, axes, "axes")
    axes = ops.where(ops.lt(axes, 0), ops.add(axes, x.ndim), axes)
    matches = [ops.eq(axes, j) for j in range(x.ndim)]  # bool[count] per axis of x
    in_range = ops.logical_and(ops.ge(axes, 0), ops.lt(axes, x.ndim))
    ok = _all([ops.le(ops.sum(ops.cast(m, I64), 0), 1) for m in matches] +
              [ops.eq(ops.sum(ops.cast(in_range, I64), 0), count)])
    return [(j, matches[j]) for j in range(x.ndim)], ok


def _bounds(n, start, end, step):
    """ONNX's clamping of one axis's bounds: (the first index, the count)."""
    start, end = (ops.where(ops.lt(v, 0), ops.add(v, n), v) for v in (start, end))
    up = ops.gt(step, 0)
    start, end = (ops.where(up, ops.clamp(v, 0, n), ops.clamp(v, -1, ops.sub(n, 1)))
                  for v in (start, end))
    bias = ops.where(up, ops.sub(step, 1), ops.add(step, 1))
    count = ops.floor_divide(ops.add(ops.sub(end, start), bias),
                             ops.where(ops.eq(step, 0), 1, step))
    return start, ops.maximum(count, 0)


# -- integer tensors that differ by a constant ------------------------------------------------

def note_offset(ctx, out, a, b, sign: int) -> None:
    """Remember that ``out = a + sign * b`` is an integer tensor a constant away from another
    (``end = i + 1`` for a loop counter i), element by element: a Slice between the two then
    has a constant length (``slice_fixed``)."""
    if not isinstance(out, Tensor) or out.dtype.is_float:
        return
    for base, const, factor in ((a, b, sign), (b, a, 1 if sign > 0 else 0)):
        if factor and isinstance(base, Tensor) and isinstance(const, Known) and const.static:
            values = {int(v) for v in const.dims()}
            if len(values) == 1 and dims_equal(product(base.shape), product(out.shape)):
                root, offset = ctx.importer.offsets.get(base.name, (base.name, 0))
                ctx.importer.offsets[out.name] = (root, offset + factor * values.pop())
                return


def keep_offset(ctx, out, x) -> None:
    """``out`` holds ``x``'s elements in the same order (Unsqueeze, Squeeze, Reshape)."""
    if isinstance(out, Tensor) and isinstance(x, Tensor) and not x.dtype.is_float:
        ctx.importer.offsets[out.name] = ctx.importer.offsets.get(x.name, (x.name, 0))


def _span(ctx, starts, ends) -> int | None:
    """``ends - starts`` where both are offsets of one tensor, else None."""
    if not (isinstance(starts, Tensor) and isinstance(ends, Tensor)):
        return None
    offsets = ctx.importer.offsets
    (a, i), (b, j) = (offsets.get(v.name, (v.name, 0)) for v in (starts, ends))
    return j - i if a == b and j >= i else None


def slice_fixed(ctx, x, starts, span: int, axes: list, steps: list) -> Tensor:
    """A slice ``[s, s + span)`` with s given at run time: ``ceil(span / step)`` elements
    from ``s``, a static length; a start for which ONNX would clamp (out of the axis) raises
    at run time (``checked_zero``), where the length would differ."""
    x, starts = ctx.tensor(x), int_vector(ctx, starts, "starts")
    for k, (axis, step) in enumerate(zip(axes, steps)):
        n, start = _size(x, axis), _entry(starts, k)
        end = ops.add(start, span)
        inside = _all([ops.ge(start, 0), ops.le(end, n)])
        from_end = _all([ops.ge(start, ops.neg(n)), ops.lt(end, 0)])
        first = ops.where(ops.lt(start, 0), ops.add(start, n), start)
        first = ops.add(first, ops.checked_zero(ops.logical_or(inside, from_end)))
        length = -(-span // step)
        index = ops.add(ops.mul(ops.iota(length, I64, x.builder), step), first)
        x = ops.gather(x, index, axis, wrap=False)
    return x


def slice_(ctx, x, starts, ends, axes, steps) -> Tensor:
    """Slice with any of starts, ends, axes, steps given at run time: each sliced axis a
    fresh size (when the axes are run-time values, every axis is one); the slice is a
    gather of ``start + step * arange``. Starts and ends that differ by a constant (ends =
    starts + 1, as a loop counter gives) keep that constant length (``slice_fixed``)."""
    span = _span(ctx, starts, ends)
    known_steps = ctx.known(steps) if steps is not None else None
    if span is not None and (axes is None or isinstance(axes, list)) and \
            (steps is None or known_steps is not None and known_steps.static):
        count = int(ctx.tensor(starts).shape[0]) if ctx.tensor(starts).ndim else 1
        plan, _ = _axis_plan(ctx, ctx.tensor(x), list(range(count)) if axes is None else axes,
                             count)
        step_values = [int(v) for v in known_steps.dims()] if steps is not None \
            else [1] * count
        if len(step_values) == count and all(v > 0 for v in step_values):
            return slice_fixed(ctx, x, starts, span, [a for a, _ in plan], step_values)
    x = ctx.tensor(x)
    starts, ends = int_vector(ctx, starts, "starts"), int_vector(ctx, ends, "ends")
    count = int(starts.shape[0])
    steps = int_vector(ctx, steps, "steps") if steps is not None else \
        ops.full((count,), 1, I64, like=x)
    plan, ok = _axis_plan(ctx, x, list(range(count)) if axes is None else axes, count)
    if int(steps.shape[0]) != count or int(ends.shape[0]) != count:
        raise InvalidModelError("Slice: starts, ends, axes and steps must have one entry each")
    for axis, which in plan:
        n = _size(x, axis)
        if isinstance(which, int):
            start, end, step = (_entry(v, which) for v in (starts, ends, steps))
        else:  # the entry whose axis is this one, else the whole axis
            hit = ops.gt(ops.sum(ops.cast(which, I64), 0), 0)
            start, end, step = (ops.sum(ops.where(which, v, 0), 0)
                                for v in (starts, ends, steps))
            start = ops.where(hit, start, 0)
            end = ops.where(hit, end, n)
            step = ops.where(hit, step, 1)
        first, length = _bounds(n, start, end, step)
        good = ops.ne(step, 0) if ok is None else ops.logical_and(ok, ops.ne(step, 0))
        ok = None  # the axes check rides on the first axis only
        positions = ops.checked_size(length, good)
        x = ops.gather(x, ops.add(ops.mul(positions, step), first), axis, wrap=False)
    return x
