"""Convolutions: einsum over windows -> conv;  folds of an einsum -> conv_transpose;
windows contracted with a cotangent over batch and positions -> conv_weight_grad.

    einsum(reshape?(unfold+(pad?(x))), reshape?(w))   -> conv(x', w')
    fold+(reshape?(einsum(reshape?(x), reshape?(w)))) -> conv_transpose(x', w')
    fold+(reshape?(multiply(x, w)))                   -> conv_transpose(x', w') (depthwise)
    einsum(reshape?(unfold+(pad?(x))), reshape?(dy))  -> conv_weight_grad(dy', x')

Each einsum letter is classified by where it comes from (a window axis of x, a kernel
offset, x's channels or batch, one of w's axes, a group split) and whether it is summed, so
the layout is free (NCHW, NHWC, any order): x' and w' are permutes of x and w into torch's
layout and the result is reshaped and permuted back into the einsum's layout.
"""
from __future__ import annotations

import string

from tdag.lower.kernels.contraction import Conv, ConvTranspose, parse_equation
from tdag.lower.kernels.conv_grad import ConvWeightGrad
from tdag.lower.kernels.layout import Reshape
from tdag.deinops.extent import Slice
from tdag.deinops.movement import Permute
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.rewrite import Context, Emitter, NoMatch, Rule
from tdag.ir.symbols import as_dim, dims_equal, is_static
from tdag.lower.match import is_unit, reshape_groups, trace_axes
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


def _windowed(node: Node, ctx: Context):
    """(output letters, letter sizes, [(x letters, windows of x, other letters, other
    operand)] for each operand that is windows of x) of a float two-operand einsum."""
    if len(node.inputs) != 2 or not node.type.dtype.is_float:
        return None
    (la, lb), lo = parse_equation(node.spec.equation)
    sizes = {c: d for labels, n in ((la, node.inputs[0]), (lb, node.inputs[1]))
             for c, d in zip(labels, ctx.type(n).shape)}
    pairs = [(lx, win, lw, wn) for (lx, xn), (lw, wn) in
             (((la, node.inputs[0]), (lb, node.inputs[1])),
              ((lb, node.inputs[1]), (la, node.inputs[0])))
             if (win := windows_of(ctx, xn)) is not None]
    return lo, sizes, pairs


def conv_rule(node: Node, ctx: Context):
    """einsum(windows of x, w) -> conv(x', w') in any layout"""
    found = _windowed(node, ctx)
    if found is None:
        return NoMatch("not a float contraction of two operands")
    lo, sizes, pairs = found
    reason = "no operand is windows of x (unfolds, maybe of a pad)"
    for lx, win, lw, wn in pairs:
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
    return node is not None and node.op in (Op.einsum, Op.multiply)


def _broadcast_source(ctx: Context, name: str) -> str:
    """``name`` before a broadcast (repeat, or the expand kernel it lowers to)."""
    node = ctx.producer(name)
    return node.inputs[0] if node is not None and node.op in (Op.repeat, Op.expand) else name


def _letters(ctx: Context, node: Node):
    """``((la, lb), lo, operands)``: an einsum's equation, or a broadcast product
    ``multiply(a, b)`` (expands seen through) read as an einsum that sums nothing (a
    depthwise convolution's input gradient has no channel to sum); None for a product of
    operands of other ranks."""
    if node.op is Op.einsum:
        return (*parse_equation(node.spec.equation), node.inputs)
    out = node.type.shape
    operands = tuple(_broadcast_source(ctx, n) for n in node.inputs)
    shapes = [ctx.type(n).shape for n in operands]
    if any(len(shape) != len(out) for shape in shapes) or len(out) > 26:
        return None
    lo = string.ascii_letters[:len(out)]
    fresh = iter(string.ascii_letters[len(out):])
    la, lb = ("".join(lo[i] if dims_equal(d, out[i]) and not is_unit(d) else next(fresh)
                      for i, d in enumerate(shape)) for shape in shapes)  # units: no role
    return (la, lb), lo, operands


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
    if node is None or node.op not in (Op.einsum, Op.multiply) or len(node.inputs) != 2:
        return None
    einsum, letters = node, _letters(ctx, node)
    ly = letters and _y_letters(einsum, letters[1], merge)  # Y axis -> einsum letters
    if ly is None:
        return None
    (la, lb), lo, (a, b) = letters
    for (lx, xn), (lw, wn) in (((la, a), (lb, b)), ((lb, b), (la, a))):
        x, ax = split_of(ctx, xn)
        w, aw = split_of(ctx, wn)
        roles = _transpose_classify(lx, ax, lw, aw, ly, window_axes, kernel_axes, ctx,
                                    einsum, letters)
        if roles is not None and roles["groups_letter"] == "depthwise" and \
                not _depthwise_weight(ctx.type(w), roles):
            continue
        if roles is not None:
            return x, w, roles, ly
    return None


def _y_letters(einsum: Node, lo: str, merge) -> list | None:
    """The letters each Y axis merges, less size-1 ones merged with a real axis."""
    if merge is None:
        return [(c,) for c in lo]
    if merge.op is Op.group:
        s = merge.spec
        return [(c,) for c in lo[:s.axis]] + [tuple(lo[s.axis:s.axis + s.count])] + \
            [(c,) for c in lo[s.axis + s.count:]]
    groups = reshape_groups(einsum.type.shape, merge.type.shape)
    if groups is None or any(len(outs) != 1 for _, outs in groups):
        return None
    shape = einsum.type.shape
    return [tuple(lo[i] for i in ins if len(ins) == 1 or not is_unit(shape[i])) or
            tuple(lo[i] for i in ins) for ins, _ in groups]


def _transpose_classify(lx, ax, lw, aw, ly, window_axes, kernel_axes, ctx, einsum, letters):
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
        if len(ly[i]) == 1 and ly[i][0] in x_of and ly[i][0] not in w_of:
            a = x_of[ly[i][0]]
            if a.kind != "src" or a.parts != 1 or roles["batch"] is not None:
                return None
            roles["batch"] = (a.axis, i)
        elif len(ly[i]) == 1 and _depthwise(ly[i][0], x_of, w_of, roles, i, ctx, einsum,
                                            letters):
            continue
        elif all(c in w_of for c in ly[i]) and len(ly[i]) in (1, 2):
            if not _out_channels(ly[i], x_of, w_of, roles, i, ctx, einsum, letters):
                return None
        else:
            return None
    contracted = [c for c in lx if c in w_of and all(c not in y for y in ly) and
                  x_of[c].kind != "unit"]
    if roles["groups_letter"] == "depthwise":
        return roles if not contracted and roles["cout_w"] is not None else None
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


def _depthwise(c, x_of, w_of, roles, y_axis, ctx, einsum, letters) -> bool:
    """A channel both sides keep, one per group (a depthwise convolution's input gradient):
    x's channels and one axis of w, which reshapes to [C, 1, *K]."""
    a, w = x_of.get(c), w_of.get(c)
    if a is None or w is None or a.kind != "src" or w.kind != "src" or a.parts != 1 or \
            w.parts != 1 or roles["cout_w"] is not None:
        return False
    size = _letter_size(c, ctx, einsum, letters)
    if not is_static(size):
        return False
    roles["channel"], roles["cout_y"] = a.axis, y_axis
    roles["cin_w"] = roles["cout_w"] = w.axis  # w reshapes to [C, 1, *K]
    roles["groups"], roles["groups_letter"] = int(size), "depthwise"
    return True


def _depthwise_weight(w, roles) -> bool:
    """A reshape of [C, 1, *K] (one output channel per group): the channels, then the
    kernel axes in x's order, every other axis of size 1."""
    used = [roles["cin_w"]] + [k for _, k, _ in sorted(roles["spatial"])]
    return used == sorted(used) and \
        all(is_unit(d) for i, d in enumerate(w.shape) if i not in used)


def _letter_size(c, ctx, einsum, letters):
    (la, lb), _, (a, b) = letters
    return dict(zip(la + lb, tuple(ctx.type(a).shape) + tuple(ctx.type(b).shape)))[c]


def _out_channels(letters, x_of, w_of, roles, y_axis, ctx, einsum, ein_letters) -> bool:
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
    size = _letter_size(g, ctx, einsum, ein_letters)
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
    if roles["groups_letter"] == "depthwise":
        kernel = tuple(ctx.type(w).shape[s[1]] for s in by_x)
        wp = emit(Op.reshape, Reshape((ctx.type(w).shape[roles["cin_w"]], 1) + kernel), w)
    else:
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


def weight_grad_rule(node: Node, ctx: Context):
    """einsum(windows of x, dy) summed over batch and positions -> conv_weight_grad(dy', x')"""
    found = _windowed(node, ctx)
    if found is None:
        return NoMatch("not a float contraction of two operands")
    lo, sizes, pairs = found
    for lx, win, ld, dn in pairs:
        dy, dy_axes = split_of(ctx, dn)
        r = _grad_roles(lx, win, ld, dy_axes, lo, sizes)
        if r is not None:
            return _emit_weight_grad(node, ctx, win, dy, r, lo)
    return NoMatch("not windows of x contracted with a cotangent over batch and positions, "
                   "keeping channels and kernel offsets")


class _GradRoles:
    """Axes of x and dy in a weight gradient, and a layout key per output letter."""

    def __init__(self):
        self.batch = None     # (x axis, dy axis)
        self.channel = None   # x axis of the input channels
        self.cout = None      # dy axis of the output channels
        self.groups, self.grouped = 1, False
        self.spatial = {}     # x axis -> dy axis of its window positions
        self.kernel = set()   # x axes whose kernel offsets are kept
        self.letters = {}     # output letter -> ("g",) ("co",) ("ci",) or ("ker", x axis)


def _grad_roles(lx: str, win, ld: str, dy_axes: tuple, lo: str, sizes) -> _GradRoles | None:
    r, d_of = _GradRoles(), dict(zip(ld, dy_axes))
    for c, a in zip(lx, win.axes):
        d, kept = d_of.get(c), c in lo
        if a.kind == "win" and d is not None and d.kind == "src" and d.parts == 1 and not kept:
            r.spatial[a.axis] = d.axis
        elif a.kind == "ker" and d is None and kept:
            r.kernel.add(a.axis)
            r.letters[c] = ("ker", a.axis)
        elif a.kind == "src" and a.parts == 1 and d is not None and d.kind == "src" and \
                d.parts == 1 and not kept and r.batch is None:
            r.batch = (a.axis, d.axis)
        elif a.kind == "src" and a.part == a.parts - 1 and d is None and kept and \
                r.channel in (None, a.axis):
            r.channel = a.axis
            r.letters[c] = ("ci",)
        elif a.kind == "src" and a.parts == 2 and a.part == 0 and d is not None and \
                d.kind == "src" and d.parts == 2 and d.part == 0 and kept:
            r.groups, r.grouped = sizes[c], True
            r.letters[c] = ("g",)
        elif a.kind == "unit" and (d is None or d.kind == "unit"):
            r.letters[c] = ("unit", c)
        else:
            return None
    for c, d in zip(ld, dy_axes):
        if c in lx:
            continue
        if d.kind == "unit":
            r.letters[c] = ("unit", c)
            continue
        if c not in lo or d.kind != "src" or d.part != d.parts - 1 or r.cout is not None:
            return None
        r.cout = d.axis
        r.letters[c] = ("co",)
    ok = None not in (r.batch, r.channel, r.cout) and set(lo) <= set(r.letters) and \
        1 <= len(r.spatial) <= 3 and set(r.spatial) == set(win.unfolds) >= r.kernel and \
        all(win.unfolds[a].size == 1 for a in set(r.spatial) - r.kernel) and \
        is_static(r.groups)  # a kernel offset of size 1 may show as a unit axis
    return r if ok else None


def _emit_weight_grad(node: Node, ctx: Context, win, dy: str, r: _GradRoles, lo: str):
    spatial = sorted(r.spatial)
    source, padding = symmetric_padding(win, spatial, ctx.type(win.source).rank)
    specs = [win.unfolds[a] for a in spatial]
    emit = ctx.emitter(node)
    x = _arrange(emit, ctx, source, [r.batch[0], r.channel] + spatial)
    d = _arrange(emit, ctx, dy, [r.batch[1], r.cout] + [r.spatial[a] for a in spatial])
    spec = ConvWeightGrad(tuple(s.size for s in specs), tuple(s.step for s in specs), padding,
                          tuple(s.dilation for s in specs), int(r.groups))
    out = emit(Op.conv_weight_grad, spec, d, x)
    layout = ([("g",)] if r.grouped else []) + [("co",), ("ci",)] + \
        [("ker", a) for a in spatial if a in r.kernel] + \
        [r.letters[c] for c in lo if r.letters[c][0] == "unit"]
    size = {r.letters[c]: n for c, n in zip(lo, node.type.shape)}
    target = tuple(size[key] for key in layout)
    if tuple(ctx.type(out).shape) != target:
        out = emit(Op.reshape, Reshape(target), out)
    return emit.finish(_arrange(emit, ctx, out, [layout.index(r.letters[c]) for c in lo]))


# channels per block of onnxruntime's NCHWc layout with AVX-512 (8 with AVX2, which 16
# fills): a piece of other widths stays in NCHW, its Conv and the sum unfused (8 + 24
# channels into a 3x3 conv took 1.26x the concatenation's time), so only whole blocks split
NCHWC_BLOCK = 16


def concat_split_rule(node: Node, ctx: Context, wide: bool = True):
    """conv(concat(a, b, ... on channels), w, bias) of one group -> conv(a, w[:, :Ca], bias)
    + conv(b, w[:, Ca:Ca+Cb]) + ...: a convolution is linear in its input channels; ``wide``:
    kernels wider than 1x1 too.

    Each piece's convolution reads the piece where it lies, so the joined copy is neither
    written nor read: the UNet block's 1x1 join (16 + 32 channels to 16 at 64x64) wrote and
    read 3 MB for a 1 MB result; split, its torch module runs 6-7% faster (each call timed
    right after an eager one), and onnxruntime fuses each sum into the next Conv and keeps
    the pieces in its blocked layout, where the Concat needs them back in NCHW and reordered
    again (UNetBlock(16) on [4, 16, 64, 64]: 2.25 -> 1.78 ms). Only where the concatenation
    has no other reader (else it is written anyway), each piece fills whole NCHWc blocks, and
    the weight has no other reader (else a file would hold it twice). The torch module
    splits 1x1 kernels alone (``split_concat_1x1``): its 3x3 convolutions of 32 and 64
    channels took 1.03-1.05x the joined one's time split."""
    x, w = node.inputs[:2]
    cat = ctx.made(x, Op.concat)
    if cat is None or cat.spec.axis != 1 or not ctx.single_use(x) or node.spec.groups != 1:
        return NoMatch("not a one-group convolution of a concatenation on channels")
    if not wide and any(k != 1 for k in ctx.type(w).shape[2:]):
        return NoMatch("a kernel wider than 1x1")
    widths = [ctx.type(piece).shape[1] for piece in cat.inputs]
    if not all(is_static(c) and c % NCHWC_BLOCK == 0 for c in widths) or \
            len(ctx.readers(w)) != 1:
        return NoMatch("a piece that does not fill NCHWc blocks, or a weight read elsewhere")
    emit, total, start = ctx.emitter(node), None, 0
    for i, (piece, width) in enumerate(zip(cat.inputs, widths)):
        part = emit(Op.slice, Slice((1,), (start,), (start + width,), (1,)), w)
        term = emit(Op.conv, node.spec, piece, part, *node.inputs[2:3 if i == 0 else 2])
        total = term if total is None else emit(Op.add, None, total, term)
        start += width
    return emit.finish(total)


def concat_split_1x1_rule(node: Node, ctx: Context):
    """``concat_split_rule`` of a 1x1 kernel alone (the torch module's)."""
    return concat_split_rule(node, ctx, wide=False)


RULES = (
    Rule(Op.einsum, conv_rule),           # einsum(windows of x, w) -> conv(x', w')
    Rule(Op.einsum, weight_grad_rule),    # einsum(windows of x, dy) -> conv_weight_grad(dy', x')
    Rule(Op.fold, conv_transpose_rule),   # fold+(einsum(x, w)) -> conv_transpose(x', w')
    Rule(Op.slice, crop_rule),            # slice(conv_transpose(x, w), p, L - p) -> padding p
)
FUSE_RULES = (
    Rule(Op.add, conv_bias_rule),  # conv(x, w) + bcast(b over channels) -> conv(x, w, b)
)


# after the bias has joined its convolution (FUSE_RULES' fixed point), so that it goes to
# the first piece's call
SPLIT_RULES = (
    Rule(Op.conv, concat_split_rule),  # conv(concat(a, b), w) -> conv(a, w1) + conv(b, w2)
)
SPLIT_1X1_RULES = (Rule(Op.conv, concat_split_1x1_rule),)
