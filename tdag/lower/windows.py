"""Axis provenance for windowed ops: which source axis (or window, or kernel offset of a
source axis, or part of a split source axis) each axis of a value shows.

``windows_of`` walks ``reshape? <- unfold+ <- pad? <- x`` (a convolution's or a pool's input);
``split_of`` walks ``reshape? <- w`` (a convolution weight split into groups). Splits are read
exactly from ungroup specs, so size-1 groups or channels are never confused.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.ir.op import Op
from tdag.ir.rewrite import Context
from tdag.ir.symbols import is_static
from tdag.lower.match import is_unit, reshape_groups
from tdag.lower.movement import RESHAPES


@dataclass(frozen=True)
class Ax:
    """``kind``: "src" (an axis of the source), "win" (window positions along a source
    axis), "ker" (offsets inside the window), "unit" (an inserted size-1 axis). A split
    source axis shows as ``parts`` axes, ``part`` 0 the major one."""

    kind: str
    axis: int = -1
    part: int = 0
    parts: int = 1


@dataclass(frozen=True)
class Windows:
    source: str        # x, before any pad
    pad: object        # the pad node, or None
    unfolds: dict      # source axis -> Unfold spec
    axes: tuple        # Ax per axis of the traced value


def windows_of(ctx: Context, name: str) -> Windows | None:
    """``name`` as (a reshape of) unfolds of (a pad of) a source, else None."""
    node = ctx.producer(name)
    reshape = None
    if node is not None and node.op in RESHAPES:
        reshape, name, node = node, node.inputs[0], ctx.producer(node.inputs[0])
    chain = []
    while node is not None and node.op is Op.unfold:
        chain.append(node)
        name, node = node.inputs[0], ctx.producer(node.inputs[0])
    if not chain:
        return None
    pad = None
    if node is not None and node.op is Op.pad:
        pad, name = node, node.inputs[0]
    axes = [Ax("src", i) for i in range(ctx.type(name).rank)]
    unfolds = {}
    for u in reversed(chain):
        a = axes[u.spec.axis]
        if a.kind != "src" or a.axis in unfolds:
            return None
        axes[u.spec.axis] = Ax("win", a.axis)
        axes.append(Ax("ker", a.axis))
        unfolds[a.axis] = u.spec
    if reshape is not None:
        axes = through_reshape(ctx, reshape, axes)
        if axes is None:
            return None
    return Windows(name, pad, unfolds, tuple(axes))


def split_of(ctx: Context, name: str) -> tuple[str, tuple]:
    """``name`` as (a reshape of) a source: ``(source, Ax per axis)``."""
    node = ctx.producer(name)
    if node is not None and node.op in RESHAPES:
        src = node.inputs[0]
        axes = through_reshape(ctx, node, [Ax("src", i) for i in range(ctx.type(src).rank)])
        if axes is not None:
            return src, tuple(axes)
    return name, tuple(Ax("src", i) for i in range(ctx.type(name).rank))


def through_reshape(ctx: Context, node, axes: list) -> list | None:
    """The descriptors after a reshape-like ``node``; None if it merges real axes."""
    spec = node.spec
    if node.op is Op.ungroup:
        a = axes[spec.axis]
        if a.kind != "src" or a.parts != 1:
            return None
        n = len(spec.sizes)
        return axes[:spec.axis] + [Ax("src", a.axis, k, n) for k in range(n)] + axes[spec.axis + 1:]
    if node.op is Op.unsqueeze:
        it = iter(axes)
        return [Ax("unit") if i in spec.axes else next(it) for i in range(node.type.rank)]
    if node.op is Op.squeeze:
        if any(axes[a].kind != "unit" for a in spec.axes):
            return None
        return [a for i, a in enumerate(axes) if i not in spec.axes]
    return _by_shapes(ctx.type(node.inputs[0]).shape, node.type.shape, axes)


def _by_shapes(src, dst, axes: list) -> list | None:
    groups = reshape_groups(src, dst)
    if groups is None:
        return None
    out = [None] * len(dst)
    for ins, outs in groups:
        real_in = [i for i in ins if not is_unit(src[i])]
        real_out = [o for o in outs if not is_unit(dst[o])]
        if any(axes[i].kind != "unit" for i in ins if i not in real_in):
            return None
        if len(real_in) > 1 or (real_out and not real_in):
            return None
        for o in outs:
            out[o] = Ax("unit")
        if not real_in:
            continue
        a = axes[real_in[0]]
        if len(real_out) == 1:
            out[real_out[0]] = a
        elif a.kind == "src" and a.parts == 1:
            for k, o in enumerate(real_out):
                out[o] = Ax("src", a.axis, k, len(real_out))
        else:
            return None
    return out


def symmetric_padding(win: Windows, spatial, rank: int, value: float = 0.0):
    """(source to read, padding per spatial axis): the pad folds into the kernel when it
    pads only spatial axes, symmetrically, with ``value`` and static widths; else it stays."""
    zeros = tuple(0 for _ in spatial)
    if win.pad is None:
        return win.source, zeros
    widths = win.pad.spec.widths
    foldable = win.pad.spec.value == value and \
        all(is_static(lo) and is_static(hi) for lo, hi in widths) and \
        all(widths[i] == (0, 0) for i in range(rank) if i not in spatial) and \
        all(widths[i][0] == widths[i][1] for i in spatial)
    if not foldable:
        return win.pad.name, zeros
    return win.source, tuple(int(widths[i][0]) for i in spatial)
