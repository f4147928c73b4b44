"""An unrolled LSTM layer -> one lstm kernel.

Each step t of a layer (torch's gate order i, f, g, o, each H wide):

    G_t = select(P, 0, t) + einsum(h_prev, w_hh, b_hh)     with P = einsum(x, w_ih, b_ih)
    c_t = sigmoid(G_t[f]) * c_prev + sigmoid(G_t[i]) * tanh(G_t[g])
    h_t = sigmoid(G_t[o]) * tanh(c_t)

and the layer's output stacks h_0 .. h_{T-1} along a new first axis (a concat of
reshapes). The chain is followed from the stacked pieces: every piece must be the next (or,
running backwards, the previous) step of one recurrence over the same P and weights.

Then layers join, as torch runs them in one call: a forward and a reverse layer over the
same input, concatenated on the feature axis, are one bidirectional layer; a layer that
reads the output of another alike (same directions) stacks onto it. A forward layer run over
the time-reversed input and reversed back (``from_torch``'s reverse direction, a Loop lowered
to a kernel) is a reverse layer.
"""
from __future__ import annotations

from tdag.lower.kernels.contraction import parse_equation
from tdag.lower.kernels.sequence import Lstm, lstm_parts
from tdag.deinops.movement import Permute
from tdag.deinops.reduce import ReduceKind
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, NoMatch, Rule
from tdag.ir.symbols import Dim, dims_equal, is_static, product
from tdag.lower.movement import RESHAPES


def _of(ctx: Context, name: str, op: Op) -> str | None:
    node = ctx.made(name, op)
    return node.inputs[0] if node is not None else None


def _pair(ctx: Context, name: str, op: Op):
    """The operands of a commutative ``op`` node, or None."""
    node = ctx.made(name, op)
    return tuple(node.inputs) if node is not None else None


def match_hidden(ctx: Context, h: str):
    """h = sigmoid(o) * tanh(c) -> (o, c)."""
    pair = _pair(ctx, h, Op.multiply)
    if pair is None:
        return None
    for s, t in (pair, pair[::-1]):
        o, c = _of(ctx, s, Op.sigmoid), _of(ctx, t, Op.tanh)
        if o is not None and c is not None:
            return o, c
    return None


def match_cell_state(ctx: Context, c: str):
    """c = sigmoid(f) * c_prev + sigmoid(i) * tanh(g) -> (i, f, g, c_prev)."""
    pair = _pair(ctx, c, Op.add)
    if pair is None:
        return None
    for new, old in (pair, pair[::-1]):
        a, b = _pair(ctx, new, Op.multiply) or (None, None), _pair(ctx, old, Op.multiply)
        if a[0] is None or b is None:
            continue
        for si, tg in (a, a[::-1]):
            i, g = _of(ctx, si, Op.sigmoid), _of(ctx, tg, Op.tanh)
            if i is None or g is None:
                continue
            for sf, prev in (b, b[::-1]):
                f = _of(ctx, sf, Op.sigmoid)
                if f is not None:
                    return i, f, g, prev
    return None


def match_gates(ctx: Context, parts, hidden) -> str | None:
    """Slices [0:H], [H:2H], [2H:3H], [3H:4H] of one value's last axis -> that value."""
    source = None
    for k, name in enumerate(parts):
        node = ctx.made(name, Op.slice)
        if node is None or len(node.spec.axes) != 1 or node.spec.steps != (1,):
            return None
        if node.spec.axes[0] != ctx.type(node.inputs[0]).rank - 1 or \
                node.spec.starts[0] != k * hidden or node.spec.stops[0] != (k + 1) * hidden:
            return None
        if source not in (None, node.inputs[0]):
            return None
        source = node.inputs[0]
    return source


def is_linear_form(node: Node) -> bool:
    """einsum "ab,cb->ac" with a 1-d bias: x @ w.T + b."""
    (la, lb), lo = parse_equation(node.spec.equation)
    return len(node.inputs) == 3 and len(la) == 2 and len(lb) == 2 and la[1] == lb[1] and \
        lo == la[0] + lb[0]


def _step(ctx: Context, h: str):
    """One step ending in h -> dict(P, t, w_hh, b_hh, h_prev, c, c_prev)."""
    found = match_hidden(ctx, h)
    if found is None:
        return None
    o, c = found
    cell = match_cell_state(ctx, c)
    if cell is None:
        return None
    i, f, g, c_prev = cell
    hidden = ctx.type(h).shape[-1]
    gates = match_gates(ctx, (i, f, g, o), hidden) if is_static(hidden) else None
    pair = _pair(ctx, gates, Op.add) if gates is not None else None
    if pair is None:
        return None
    for xs, rs in (pair, pair[::-1]):
        sel, rec = ctx.made(xs, Op.select), ctx.made(rs, Op.einsum)
        if sel is None or rec is None or sel.spec.axis != 0 or not is_linear_form(rec) or \
                not is_static(sel.spec.index):
            continue
        return dict(P=sel.inputs[0], t=int(sel.spec.index), w_hh=rec.inputs[1],
                    b_hh=rec.inputs[2], h_prev=rec.inputs[0], c=c, c_prev=c_prev)
    return None


def _projection(ctx: Context, p: str):
    """P = einsum(x, w_ih, b_ih) with P [T, B, 4H] -> (x, permutation to [T, B, I], w, b)."""
    node = ctx.made(p, Op.einsum)
    if node is None or len(node.inputs) != 3:
        return None
    (lx, lw), lo = parse_equation(node.spec.equation)
    if len(lx) != 3 or len(lw) != 2 or len(lo) != 3 or lo[2] != lw[0] or lw[1] not in lx:
        return None
    order = lo[:2] + lw[1]  # T, B, I
    if set(order) != set(lx):
        return None
    return node.inputs[0], tuple(lx.index(c) for c in order), node.inputs[1], node.inputs[2]


def lstm_rule(node: Node, ctx: Context):
    """concat(h_0 .. h_{T-1} as [1, B, H]) of an unrolled LSTM -> lstm(x, weights, h0, c0)"""
    if node.spec.axis != 0 or len(node.inputs) < 2:
        return NoMatch("not a stack of several pieces on axis 0")
    hs = []
    for piece in node.inputs:
        reshape = ctx.producer(piece)
        if reshape is None or reshape.op not in RESHAPES or ctx.type(piece).shape[0] != 1:
            return NoMatch("pieces are not [1, B, H] views")
        hs.append(reshape.inputs[0])
    steps = [_step(ctx, h) for h in hs]
    if None in steps or any(s["t"] != t for t, s in enumerate(steps)):
        return NoMatch("not the steps of one recurrence, in order")
    reverse = steps[0]["h_prev"] == hs[1]
    order = list(reversed(range(len(hs)))) if reverse else list(range(len(hs)))
    first = steps[order[0]]
    for k in range(1, len(order)):
        now, before = steps[order[k]], steps[order[k - 1]]
        if now["h_prev"] != hs[order[k - 1]] or now["c_prev"] != before["c"] or \
                any(now[key] != first[key] for key in ("P", "w_hh", "b_hh")):
            return NoMatch("the steps do not chain")
    proj = _projection(ctx, first["P"])
    if proj is None or not dims_equal(ctx.type(first["P"]).shape[0], len(hs)):
        return NoMatch("the input projection is not one einsum over the sequence")
    x, perm, w_ih, b_ih = proj
    emit = ctx.emitter(node)
    if perm != (0, 1, 2):
        x = emit(Op.permute, Permute(perm), x)
    return emit.finish(emit(Op.lstm, Lstm(reverse), x, w_ih, first["w_hh"], b_ih,
                            first["b_hh"], first["h_prev"], first["c_prev"]))


def _lstm_of(ctx: Context, name: str) -> Node | None:
    """The lstm node computing ``name`` when nothing else reads it."""
    node = ctx.made(name, Op.lstm)
    return node if node is not None and ctx.single_use(name) else None


def bidirectional_rule(node: Node, ctx: Context):
    """concat(lstm(x), lstm[reverse](x), axis=-1) -> lstm[bidirectional](x)"""
    if len(node.inputs) != 2 or node.spec.axis != 2:
        return NoMatch("not two pieces joined on axis 2")
    fwd, bwd = (_lstm_of(ctx, n) for n in node.inputs)
    if fwd is None or bwd is None:
        return NoMatch("not two single-use lstm layers")
    if fwd.spec != Lstm() or bwd.spec != Lstm(reverse=True) or fwd.inputs[0] != bwd.inputs[0]:
        return NoMatch("not one forward and one reverse layer over the same input")
    if not dims_equal(fwd.type.shape[-1], bwd.type.shape[-1]):
        return NoMatch("the directions differ in hidden size")
    f, b = fwd.inputs, bwd.inputs
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.lstm, Lstm(bidirectional=True), f[0], *f[1:5], *b[1:5],
                            f[5], b[5], f[6], b[6]))


def stack_rule(node: Node, ctx: Context):
    """lstm(lstm(x, cells A), cells B) -> lstm(x, cells A + B): one call for the stack"""
    below = _lstm_of(ctx, node.inputs[0])
    if below is None or below.spec.reverse != node.spec.reverse or \
            below.spec.bidirectional != node.spec.bidirectional:
        return NoMatch("not over a single-use lstm running the same directions")
    x, w_low, h_low, c_low = lstm_parts(below.spec, list(below.inputs))
    _, w_high, h_high, c_high = lstm_parts(node.spec, list(node.inputs))
    if not dims_equal(ctx.type(h_low[0]).shape[-1], ctx.type(h_high[0]).shape[-1]):
        return NoMatch("the layers differ in hidden size")
    spec = Lstm(node.spec.reverse, below.spec.layers + node.spec.layers, node.spec.bidirectional)
    weights = [w for cell in w_low + w_high for w in cell]
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.lstm, spec, x, *weights, *h_low, *h_high, *c_low, *c_high))


# -- time reversal ----------------------------------------------------------------------------

# the views that carry one scalar to every position of an index (the scalar broadcast)
_BROADCASTS = (Op.expand, Op.repeat, Op.unsqueeze)


def _scalar_dim(ctx: Context, name: str) -> Dim | None:
    """The size a scalar i64 expression computes, where it is one: an integer const, a sum
    of ones over a (symbolic) shape (a size read at run time), or sums and broadcasts of
    those."""
    weight = ctx.weight(name)
    if weight is not None:
        value = weight.value
        ok = value is not None and value.numel() == 1 and not value.is_floating_point()
        return int(value.reshape(())) if ok else None
    node = ctx.producer(name)
    if node is None:
        return None
    if node.op in _BROADCASTS or node.op is Op.cast:
        return _scalar_dim(ctx, node.inputs[0]) if ctx.type(name).rank == 0 or \
            node.op is not Op.cast else None
    if node.op is Op.add:
        a, b = (_scalar_dim(ctx, n) for n in node.inputs)
        return a + b if a is not None and b is not None else None
    if node.op is Op.reduce and node.spec.kind is ReduceKind.sum:
        one = _scalar_dim(ctx, _broadcast_source(ctx, node.inputs[0]))
        return product(ctx.type(node.inputs[0]).shape) if one == 1 else None
    return None


def _broadcast_source(ctx: Context, name: str) -> str:
    node = ctx.producer(name)
    while node is not None and node.op in _BROADCASTS:
        name, node = node.inputs[0], ctx.producer(node.inputs[0])
    return name


def _reverses(ctx: Context, index: str, length: Dim) -> bool:
    """Whether ``index`` is ``length-1, ..., 1, 0``: a const, or ``(n - 1) - iota(n)``."""
    weight = ctx.weight(index)
    if weight is not None:
        value = weight.value
        return value is not None and is_static(length) and value.dim() == 1 and \
            value.tolist() == list(range(int(length) - 1, -1, -1))
    pair = _pair(ctx, index, Op.add)
    if pair is None:
        return False
    for ramp, start in (pair, pair[::-1]):
        iota = ctx.made(_of(ctx, ramp, Op.neg) or "", Op.iota)
        if iota is not None and dims_equal(iota.spec.length, length):
            first = _scalar_dim(ctx, _broadcast_source(ctx, start))
            return first is not None and dims_equal(first, length - 1)
    return False


def _reversed_input(ctx: Context, x: str):
    """``x`` [T, B, I] as the time reversal of a value: (that value's name, whether it must
    be permuted (1, 0, 2) to be [T, B, I]), or None."""
    perm = ctx.made(x, Op.permute)
    if perm is not None and perm.spec.perm == (1, 0, 2):
        flip = ctx.made(perm.inputs[0], Op.gather)
        if flip is not None and flip.spec.axis == 1 and \
                _reverses(ctx, flip.inputs[1], ctx.type(x).shape[0]):
            return flip.inputs[0], True
    flip = ctx.made(x, Op.gather)
    if flip is not None and flip.spec.axis == 0 and \
            _reverses(ctx, flip.inputs[1], ctx.type(x).shape[0]):
        return flip.inputs[0], False
    return None


def reversal_rule(node: Node, ctx: Context):
    """reverse_time(lstm(reverse_time(x))) -> lstm[reverse](x)"""
    if node.spec.axis != 0:
        return NoMatch("not a gather on the time axis")
    inner = _lstm_of(ctx, node.inputs[0])
    if inner is None or inner.spec != Lstm():
        return NoMatch("not over a single-use one-layer forward lstm")
    if not _reverses(ctx, node.inputs[1], node.type.shape[0]):
        return NoMatch("the index does not reverse the time axis")
    source = _reversed_input(ctx, inner.inputs[0])
    if source is None:
        return NoMatch("the lstm does not read a time-reversed input")
    x, permute = source
    emit = ctx.emitter(node)
    if permute:
        x = emit(Op.permute, Permute((1, 0, 2)), x)
    return emit.finish(emit(Op.lstm, Lstm(reverse=True), x, *inner.inputs[1:]))


RULES = (
    Rule(Op.concat, lstm_rule),           # concat(h_0 .. h_{T-1}) of unrolled steps -> lstm(x)
    Rule(Op.concat, bidirectional_rule),  # concat(lstm(x), lstm[reverse](x), 2) -> lstm[bi](x)
    Rule(Op.lstm, stack_rule),            # lstm(lstm(x, cells A), cells B) -> lstm(x, A + B)
    Rule(Op.gather, reversal_rule),       # flip(lstm(flip(x))) -> lstm[reverse](x)
)
