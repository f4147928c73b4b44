"""Convolutions: einsum over windows -> conv;  folds of an einsum -> conv_transpose.

    einsum(reshape?(unfold+(pad?(x))), reshape?(w))   -> conv(x', w')
    fold+(reshape?(einsum(reshape?(x), reshape?(w)))) -> conv_transpose(x', w')

Each einsum letter is classified by where it comes from (a window axis of x, a kernel
offset, x's channels or batch, one of w's axes, a group split) and whether it is summed, so
the layout is free (NCHW, NHWC, any order): x' and w' are permutes of x and w into torch's
layout and the result is reshaped and permuted back into the einsum's layout.
"""
from __future__ import annotations

from tdag.lower.kernels.contraction import Conv, ConvTranspose, parse_equation
from tdag.lower.kernels.layout import Reshape
from tdag.deinops.movement import Permute
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, Emitter, NoMatch, Rule
from tdag.ir.symbols import as_dim, is_static
from tdag.lower.match import reshape_groups, trace_axes
from tdag.lower.windows import split_of, symmetric_padding, windows_of


class _Roles:
    """Letters of an einsum classified for a convolution (None fields: absent)."""

    def __init__(self):
        self.batch = None      # x axis
        self.channel = None    # x axis (whole, or split into (group, per-group))
        self.groups = 1
        self.group_letter = None
        self.spatial = {}      # x axis -> (window letter, kernel letter, w axis)
        self.cin_w = None      # w axis of the input channels (per group)
        self.cout_w = None     # w axis of the output channels (per group when split)
        self.letters = {}      # letter -> role key for the output


def _classify(lx: str, ax: tuple, lw: str, aw: tuple, lo: str, sizes: dict) -> _Roles | None:
    """Roles of the letters of ``einsum(X, W)`` with X's axes ``ax`` and W's axes ``aw``."""
    r = _Roles()
    w_of = {c: a for c, a in zip(lw, aw)}
    windows = {}
    for c, a in zip(lx, ax):
        w = w_of.get(c)
        kept = c in lo
        if a.kind == "win" and w is None and kept:
            windows[a.axis] = c
            r.letters[c] = ("win", a.axis)
        elif a.kind == "ker" and w is not None and w.kind == "src" and w.parts == 1 and not kept:
            r.spatial.setdefault(a.axis, [None, None, None])
            r.spatial[a.axis][1:] = [c, w.axis]
        elif a.kind == "unit" and w is None:
            r.letters[c] = ("unit", c)
        elif a.kind == "src" and a.parts == 1 and w is None and kept and r.batch is None:
            r.batch = a.axis
            r.letters[c] = ("n",)
        elif a.kind == "src" and w is not None and w.kind == "src" and not kept and \
                a.parts == 1 and w.parts == 1 and r.channel is None:
            r.channel, r.cin_w = a.axis, w.axis
        elif a.kind == "src" and a.parts == 2 and a.part == 1 and w is not None and \
                w.kind == "src" and w.parts == 1 and not kept:
            if r.channel not in (None, a.axis):
                return None
            r.channel, r.cin_w = a.axis, w.axis
        elif a.kind == "src" and a.parts == 2 and a.part == 0 and w is not None and \
                w.kind == "src" and w.parts == 2 and w.part == 0 and kept:
            r.groups, r.group_letter = sizes[c], c
            r.letters[c] = ("g",)
        else:
            return None
    for c, w in zip(lw, aw):
        if c in lx:
            continue
        if c not in lo or w.kind != "src" or w.parts != (2 if r.group_letter else 1) or \
                (w.parts == 2 and w.part != 1) or r.cout_w is not None:
            return None
        r.cout_w = w.axis
        r.letters[c] = ("og",) if r.group_letter else ("co",)
    for axis, c in windows.items():
        if axis not in r.spatial:
            return None
        r.spatial[axis][0] = c
    ok = r.channel is not None and r.cout_w is not None and 1 <= len(r.spatial) <= 3 and \
        all(None not in v for v in r.spatial.values()) and is_static(r.groups)
    return r if ok else None


def _arrange(emit: Emitter, ctx: Context, name: str, perm) -> str:
    perm = tuple(perm)
    return name if perm == tuple(range(len(perm))) else emit(Op.permute, Permute(perm), name)


def _restore(emit: Emitter, ctx: Context, out: str, r: _Roles, spatial, lo: str, shape) -> str:
    """Reshape and permute a [N, Co, *S] kernel result into the einsum's output layout."""
    layout = ([("n",)] if r.batch is not None else []) + \
        ([("g",), ("og",)] if r.group_letter else [("co",)]) + [("win", a) for a in spatial]
    layout += [r.letters[c] for c in lo if r.letters[c][0] == "unit"]
    size = {r.letters[c]: d for c, d in zip(lo, shape)}
    target = tuple(size[key] for key in layout)
    if tuple(ctx.type(out).shape) != target:
        out = emit(Op.reshape, Reshape(target), out)
    return _arrange(emit, ctx, out, [layout.index(r.letters[c]) for c in lo])


def conv_rule(node: Node, ctx: Context):
    """einsum(windows of x, w) -> conv(x', w') in any layout"""
    if len(node.inputs) != 2 or not node.type.dtype.is_float:
        return NoMatch("not a float contraction of two operands")
    (la, lb), lo = parse_equation(node.spec.equation)
    sizes = {c: d for labels, n in ((la, node.inputs[0]), (lb, node.inputs[1]))
             for c, d in zip(labels, ctx.type(n).shape)}
    reason = "no operand is windows of x (unfolds, maybe of a pad)"
    for (lx, xn), (lw, wn) in (((la, node.inputs[0]), (lb, node.inputs[1])),
                               ((lb, node.inputs[1]), (la, node.inputs[0]))):
        win = windows_of(ctx, xn)
        if win is None:
            continue
        w, w_axes = split_of(ctx, wn)
        r = _classify(lx, win.axes, lw, w_axes, lo, sizes)
        if r is None:
            reason = ("the axes are not a convolution's (batch, channels summed with the "
                      "weight's, windows, kernel offsets summed, output channels)")
            continue
        if ctx.type(w).rank != len(r.spatial) + 2:
            reason = f"the weight is not [Co, Ci, *kernel]: rank {ctx.type(w).rank}"
            continue
        return _emit_conv(node, ctx, win, w, r, lo)
    return NoMatch(reason)


def _emit_conv(node: Node, ctx: Context, win, w: str, r: _Roles, lo: str):
    spatial = sorted(r.spatial)
    rank = ctx.type(win.source).rank
    source, padding = symmetric_padding(win, spatial, rank)
    specs = [win.unfolds[a] for a in spatial]
    emit = ctx.emitter(node)
    x = _arrange(emit, ctx, source, ([r.batch] if r.batch is not None else []) + [r.channel] +
                 spatial)
    if r.batch is None:
        x = emit(Op.reshape, Reshape((1,) + tuple(ctx.type(x).shape)), x)
    wp = _arrange(emit, ctx, w, [r.cout_w, r.cin_w] + [r.spatial[a][2] for a in spatial])
    spec = Conv(tuple(s.step for s in specs), padding, tuple(s.dilation for s in specs),
                int(r.groups))
    out = emit(Op.conv, spec, x, wp)
    return emit.finish(_restore(emit, ctx, out, r, spatial, lo, node.type.shape))


def conv_transpose_rule(node: Node, ctx: Context):
    """fold+(reshape?(einsum(x, w))) -> conv_transpose(x', w')"""
    if ctx.made(node.inputs[0], Op.fold) is None and \
            not _feeds_from_einsum(ctx, node.inputs[0]):
        return NoMatch("not folds of a contraction")
    folds = []
    cur = node
    while cur is not None and cur.op is Op.fold:
        folds.append(cur)
        cur = ctx.producer(cur.inputs[0])
    folds.reverse()  # applied order
    base = folds[0].inputs[0]
    found = _transpose_roles(ctx, base, folds)
    if found is None:
        return NoMatch("not folds of a contraction")
    return _emit_conv_transpose(node, ctx, folds, *found)


def _feeds_from_einsum(ctx: Context, name: str) -> bool:
    node = ctx.producer(name)
    if node is not None and node.op in (Op.group, Op.reshape):
        node = ctx.producer(node.inputs[0])
    return node is not None and node.op is Op.einsum


def _transpose_roles(ctx: Context, base: str, folds):
    """For Y = base: which Y axes are windows (with their kernel axes), batch, channels."""
    rank = ctx.type(base).rank
    d = len(folds)
    kernel_axes = [rank - 1 - t for t in range(d)]
    window_axes = [f.spec.axis for f in folds]
    node = ctx.producer(base)
    merge = None
    if node is not None and node.op in (Op.group, Op.reshape):
        merge, node = node, ctx.producer(node.inputs[0])
    if node is None or node.op is not Op.einsum or len(node.inputs) != 2:
        return None
    einsum = node
    ly = _y_letters(ctx, einsum, merge)  # Y axis -> tuple of einsum letters
    if ly is None:
        return None
    (la, lb), lo = parse_equation(einsum.spec.equation)
    for (lx, xn), (lw, wn) in (((la, einsum.inputs[0]), (lb, einsum.inputs[1])),
                               ((lb, einsum.inputs[1]), (la, einsum.inputs[0]))):
        x, ax = split_of(ctx, xn)
        w, aw = split_of(ctx, wn)
        roles = _transpose_classify(lx, ax, lw, aw, ly, window_axes, kernel_axes, ctx, einsum)
        if roles is not None:
            return x, w, roles, ly
    return None


def _y_letters(ctx: Context, einsum: Node, merge) -> list | None:
    (_, _), lo = parse_equation(einsum.spec.equation)
    if merge is None:
        return [(c,) for c in lo]
    if merge.op is Op.group:
        s = merge.spec
        return [(c,) for c in lo[:s.axis]] + [tuple(lo[s.axis:s.axis + s.count])] + \
            [(c,) for c in lo[s.axis + s.count:]]
    groups = reshape_groups(einsum.type.shape, merge.type.shape)
    if groups is None or any(len(outs) != 1 for _, outs in groups):
        return None
    return [tuple(lo[i] for i in ins) for ins, _ in groups]


def _transpose_classify(lx, ax, lw, aw, ly, window_axes, kernel_axes, ctx, einsum):
    x_of = {c: a for c, a in zip(lx, ax)}
    w_of = {c: a for c, a in zip(lw, aw)}
    roles = {"spatial": [], "batch": None, "channel": None, "cin_w": None, "cout_w": None,
             "groups": 1, "groups_letter": None}
    for y_axis, k_axis in zip(window_axes, kernel_axes):
        (cw,), (ck,) = ly[y_axis], ly[k_axis]
        a, k = x_of.get(cw), w_of.get(ck)
        if a is None or a.kind != "src" or a.parts != 1 or cw in w_of or k is None or \
                k.kind != "src" or k.parts != 1 or ck in x_of:
            return None
        roles["spatial"].append((a.axis, k.axis, y_axis))
    others = [i for i in range(len(ly)) if i not in window_axes and i not in kernel_axes]
    for i in others:
        letters = ly[i]
        if len(letters) == 1 and letters[0] in x_of and letters[0] not in w_of:
            a = x_of[letters[0]]
            if a.kind != "src" or a.parts != 1 or roles["batch"] is not None:
                return None
            roles["batch"] = (a.axis, i)
        elif all(c in w_of for c in letters) and len(letters) in (1, 2):
            if not _out_channels(letters, x_of, w_of, roles, i, ctx, einsum):
                return None
        else:
            return None
    contracted = [c for c in lx if c in w_of and all(c not in y for y in ly)]
    if len(contracted) != 1 or roles["cout_w"] is None:
        return None
    a, w = x_of[contracted[0]], w_of[contracted[0]]
    g = roles["groups_letter"]
    if g is None:
        ok = a.kind == w.kind == "src" and a.parts == w.parts == 1
    else:  # channels split (g, C/g) on both sides, with the group letter the major part
        ok = a.kind == w.kind == "src" and a.parts == w.parts == 2 and a.part == w.part == 1 \
            and x_of[g].axis == a.axis and w_of[g].axis == w.axis
    if not ok:
        return None
    roles["channel"], roles["cin_w"] = a.axis, w.axis
    return roles


def _out_channels(letters, x_of, w_of, roles, y_axis, ctx, einsum) -> bool:
    """Y's output-channel axis: one w axis, or (group letter, per-group w axis)."""
    if roles["cout_w"] is not None:
        return False  # a second w-only axis kept: not a transposed convolution
    if len(letters) == 1:
        w = w_of[letters[0]]
        if letters[0] in x_of or w.kind != "src" or w.parts != 1:
            return False
        roles["cout_w"], roles["cout_y"], roles["groups_letter"] = w.axis, y_axis, None
        return True
    g, og = letters
    wg, wo = w_of[g], w_of[og]
    xg = x_of.get(g)
    if xg is None or og in x_of or xg.parts != 2 or xg.part != 0 or wg.parts != 2 or \
            wg.part != 0 or wo.parts != 1:
        return False
    (la, lb), _ = parse_equation(einsum.spec.equation)
    size = dict(zip(la + lb, tuple(ctx.type(einsum.inputs[0]).shape) +
                    tuple(ctx.type(einsum.inputs[1]).shape)))[g]
    if not is_static(size):
        return False
    roles["cout_w"], roles["cout_y"], roles["groups"], roles["groups_letter"] = \
        wo.axis, y_axis, int(size), g
    return True


def _emit_conv_transpose(node: Node, ctx: Context, folds, x: str, w: str, roles, ly):
    by_x = sorted(roles["spatial"])  # (x axis, w axis, y axis), in x's axis order
    emit = ctx.emitter(node)
    batch = roles["batch"]
    xp = _arrange(emit, ctx, x, ([batch[0]] if batch else []) + [roles["channel"]] +
                  [s[0] for s in by_x])
    if batch is None:
        xp = emit(Op.reshape, Reshape((1,) + tuple(ctx.type(xp).shape)), xp)
    wp = _arrange(emit, ctx, w, [roles["cin_w"], roles["cout_w"]] + [s[1] for s in by_x])
    fold_of = {f.spec.axis: f.spec for f in folds}
    stride, dilation, extra = [], [], []
    for x_axis, w_axis, y_axis in by_x:
        f = fold_of[y_axis]
        n, k = ctx.type(x).shape[x_axis], ctx.type(w).shape[w_axis]
        needed = as_dim((n - 1) * f.step + f.dilation * (k - 1) + 1)
        e = as_dim(f.length - needed)
        if not is_static(e) or e < 0 or e >= max(f.step, f.dilation):
            return NoMatch("output padding out of torch's range")
        stride.append(f.step)
        dilation.append(f.dilation)
        extra.append(int(e))
    spec = ConvTranspose(tuple(stride), (0,) * len(by_x), tuple(extra), tuple(dilation),
                         roles["groups"])
    out = emit(Op.conv_transpose, spec, xp, wp)
    # the root's axes: Y's axes without the kernel axes, windows now full length
    keep = range(len(ly) - len(folds))
    layout = (["n"] if batch else []) + ["co"] + [("s", s[2]) for s in by_x]
    key = {roles["cout_y"]: "co", **({batch[1]: "n"} if batch else {})}
    key.update({s[2]: ("s", s[2]) for s in by_x})
    if batch is None:
        out = emit(Op.reshape, Reshape(tuple(ctx.type(out).shape)[1:]), out)
    return emit.finish(_arrange(emit, ctx, out, [layout.index(key[i]) for i in keep]))


def crop_rule(node: Node, ctx: Context):
    """slice(conv_transpose(x, w, padding 0), p, L - p) on a spatial axis -> padding p"""
    if len(node.spec.axes) != 1 or node.spec.steps != (1,):
        return NoMatch("not a unit-step slice of one axis")
    ct = ctx.made(node.inputs[0], Op.conv_transpose)
    if ct is None or not ctx.single_use(node.inputs[0]) or node.spec.axes[0] < 2:
        return NoMatch("not a crop of a transposed convolution")
    i = node.spec.axes[0] - 2
    start, stop = node.spec.starts[0], node.spec.stops[0]
    length = ct.type.shape[node.spec.axes[0]]
    if not is_static(start) or ct.spec.padding[i] != 0 or \
            as_dim(length - stop) != start or start <= 0:
        return NoMatch("not a symmetric crop")
    padding = list(ct.spec.padding)
    padding[i] = int(start)
    spec = ConvTranspose(ct.spec.stride, tuple(padding), ct.spec.output_padding,
                         ct.spec.dilation, ct.spec.groups)
    emit = ctx.emitter(node)
    return emit.finish(emit(Op.conv_transpose, spec, *ct.inputs))


def conv_bias_rule(node: Node, ctx: Context):
    """conv(x, w) + bcast(b over channels) -> conv(x, w, b)"""
    for mine, other in (node.inputs, reversed(node.inputs)):
        kernel = ctx.producer(mine)
        if kernel is None or kernel.op not in (Op.conv, Op.conv_transpose) or \
                len(kernel.inputs) != 2 or not ctx.single_use(mine):
            continue
        src, mapping = trace_axes(ctx, other)
        if ctx.type(src).rank == 1 and [i for i, m in enumerate(mapping) if m is not None] == [1]:
            emit = ctx.emitter(node)
            return emit.finish(emit(kernel.op, kernel.spec, *kernel.inputs, src))
    return NoMatch("not a convolution plus a channel bias")


RULES = (
    Rule(Op.einsum, conv_rule),           # einsum(windows of x, w) -> conv(x', w')
    Rule(Op.fold, conv_transpose_rule),   # fold+(einsum(x, w)) -> conv_transpose(x', w')
    Rule(Op.slice, crop_rule),            # slice(conv_transpose(x, w), p, L - p) -> padding p
)
FUSE_RULES = (
    Rule(Op.add, conv_bias_rule),  # conv(x, w) + bcast(b over channels) -> conv(x, w, b)
)
