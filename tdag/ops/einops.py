"""einops patterns as deinops: ``rearrange``, ``reduce`` and ``repeat`` (``einsum`` is in
``contraction.py``).

A pattern is parsed once into a frozen recipe (plain data, cached on pattern, op and rank),
specialised with the input shape in a second cache (the size of every axis), then emitted
as the primitives it stands for, each only where it does something:

    left ``()`` / ``1``  -> squeeze      left parentheses  -> ungroup
    axes only on the left -> reduce      a new axis order  -> permute
    right ``()`` / new axes -> unsqueeze (+ repeat)        right parentheses -> group

Neighbouring axes that travel together (``(h w)`` on both sides) are fused first, so that
``"b (h w) c -> (h w) c b"`` is one permute rather than ungroup + permute + group.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.rearrange(x, "b (h w) c -> b h w c", h=4),
...                   tdag.TensorSpec(("b", 16, 8)))
>>> [str(t) for t in prog.graph.output_types]
['f32[b,4,4,8]']
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

import sympy

from tdag.ops import arrays
from tdag.ops import core
from tdag.ops.tensor import Tensor
from tdag.deinops.reduce import ReduceKind
from tdag.errors import PatternError, ShapeError, TdagError
from tdag.ir.symbols import Dim, as_dim, dims_equal, format_dim, is_static, product

ELLIPSIS = "…"  # "..." as one name; expanded per rank into "…0", "…1", ...
REDUCTIONS = ("sum", "mean", "max", "min", "prod")
CACHE_SIZE = 512
REDUCERS = {"sum": core.sum, "mean": arrays.mean, "max": core.amax, "min": core.amin,
             "prod": core.prod}

# An Axis is a tuple of elementary names fused into one tensor axis, e.g. ("h", "w").
Axis = tuple


# -- parsing one side of a pattern ------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(\.\.\.|…)|(\w+)|([()])|(\S))")


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a pattern: per tensor axis, the elementary names written for it."""

    groups: tuple        # tuple[tuple[str, ...], ...]; () is a unit axis; ELLIPSIS is a name
    top_ellipsis: bool   # "..." written bare (one axis per ellipsis axis), not in parentheses
    anon: tuple          # ((name, size), ...): numeric axes such as the 2 in (h 2)

    @property
    def names(self) -> list[str]:
        return [n for g in self.groups for n in g]


def _parse_side(text: str, tag: str) -> Side:
    groups: list[tuple] = []
    anon: list[tuple[str, int]] = []
    open_group: list[str] | None = None
    top = False
    for ellipsis, word, paren, bad in _TOKEN.findall(text.strip()):
        if bad:
            raise PatternError(f"unexpected character {bad!r}")
        if paren == "(":
            if open_group is not None:
                raise PatternError("nested parentheses: axis groups are one level deep")
            open_group = []
        elif paren == ")":
            if open_group is None:
                raise PatternError("unbalanced parentheses: ')' without '('")
            groups.append(tuple(open_group))
            open_group = None
        else:
            name = ELLIPSIS if ellipsis else _axis_name(word, anon, tag)
            top = top or (ellipsis and open_group is None)
            if open_group is not None:
                open_group += [name] if name else []  # a 1 inside parentheses changes nothing
            else:
                groups.append((name,) if name else ())  # a bare 1 is a unit axis, as ()
    if open_group is not None:
        raise PatternError("unbalanced parentheses: '(' is never closed")
    side = Side(tuple(groups), bool(top), tuple(anon))
    check_unique(side.names, "on the left" if tag == "L" else "on the right")
    return side


def _axis_name(word: str, anon: list, tag: str) -> str:
    """The name of an axis token; numbers become unique anonymous names ('' for 1)."""
    if word.isdecimal():
        size = int(word)
        if size == 0:
            raise PatternError("an anonymous axis must have a positive size, got 0")
        if size == 1:
            return ""
        name = f"{size}@{tag}{len(anon)}"  # '@' keeps it apart from every user name
        anon.append((name, size))
        return name
    if not word.isidentifier():
        raise PatternError(f"invalid axis name {word!r}: use a Python identifier or a number")
    return word


def check_unique(names: list[str], where: str) -> None:
    """Refuse an axis name (or '...') written twice on one side."""
    repeated = [n for n, count in Counter(names).items() if count > 1]
    if repeated:
        what = "'...'" if repeated[0] == ELLIPSIS else f"axis {repeated[0]!r}"
        raise PatternError(f"{what} appears twice {where}")


def _show(name: str) -> str:
    return name.split("@")[0]


# -- the recipe: everything that depends on the pattern, the op and the rank ------------------


@dataclass(frozen=True, slots=True)
class Recipe:
    """The primitive steps of a pattern for one op and input rank; sizes are left open."""

    dims: tuple       # per input axis, its elementary names (the sizes are solved on it)
    new: tuple        # names only on the right (repeat): sized by keyword or number
    fixed: tuple      # ((anonymous name, size), ...)
    names: frozenset  # the names a keyword size may give
    squeeze: tuple    # input axes written () or 1
    splits: tuple     # ((axis, parts), ...), right to left: ungroup axis into parts (Axis each)
    reduce: tuple     # axes reduced away, after the splits
    perm: tuple       # permutation of the remaining axes
    unsqueeze: tuple  # output positions of unit and new axes
    repeat: tuple     # ((position, Axis), ...): new axes broadcast to their size
    groups: tuple     # ((axis, count), ...), left to right: merge count axes from axis


@lru_cache(maxsize=CACHE_SIZE)
def _recipe(pattern: str, op: str, ndim: int) -> Recipe:
    left_text, arrow, right_text = pattern.partition("->")
    if not arrow or "->" in right_text:
        raise PatternError("a pattern needs exactly one '->'")
    left, right = _parse_side(left_text, "L"), _parse_side(right_text, "R")
    ellipsis_axes = _ellipsis_axes(left, right, op, ndim)
    lhs, rhs = _expand(left, ellipsis_axes), _expand(right, ellipsis_axes)
    _check_axes(op, left, right)
    return _plan(lhs, rhs, left.anon + right.anon)


def _ellipsis_axes(left: Side, right: Side, op: str, ndim: int) -> tuple:
    """The names "…0", "…1", ... that "..." stands for at this rank."""
    has_left, has_right = ELLIPSIS in left.names, ELLIPSIS in right.names
    if has_right and not has_left:
        raise PatternError("'...' on the right but not on the left")
    if has_left and not left.top_ellipsis:
        raise PatternError("'...' inside parentheses on the left: its size is unknown")
    if has_left and not has_right and op != "reduce":
        raise PatternError(f"'...' on the left must also be on the right in {op}")
    named = len(left.groups) - has_left
    if ndim < named or (ndim != named and not has_left):
        expected = f"at least {named}" if has_left else str(named)
        raise PatternError(f"the left side has {expected} axes, the input has rank {ndim}")
    return tuple(f"{ELLIPSIS}{i}" for i in range(ndim - named))


def _expand(side: Side, ellipsis_axes: tuple) -> list[list[str]]:
    groups: list[list[str]] = []
    for group in side.groups:
        if group == (ELLIPSIS,) and side.top_ellipsis:
            groups += [[name] for name in ellipsis_axes]
        else:
            groups.append([n for name in group
                           for n in (ellipsis_axes if name == ELLIPSIS else (name,))])
    return groups


def _check_axes(op: str, left: Side, right: Side) -> None:
    """Which axes may appear on one side only: new ones in repeat, dropped ones in reduce."""
    only_left = [n for n in left.names if n not in right.names]
    only_right = [n for n in right.names if n not in left.names and n != ELLIPSIS]
    if op == "rearrange" and (left.anon or right.anon):
        size = (left.anon + right.anon)[0][1]
        raise PatternError(f"anonymous axis {size}: rearrange keeps every element; "
                           "use reduce or repeat")
    if op != "repeat" and only_right:
        raise PatternError(f"unknown axis {_show(only_right[0])!r} on the right")
    if op == "rearrange" and only_left:
        raise PatternError(f"axis {only_left[0]!r} is on the left only; use reduce to drop it")
    if op == "repeat" and only_left:
        raise PatternError(f"axis {_show(only_left[0])!r} on the left is missing on the "
                           "right; repeat cannot drop axes")


def _plan(lhs: list[list[str]], rhs: list[list[str]], anon: tuple) -> Recipe:
    flat_l, flat_r = [n for g in lhs for n in g], [n for g in rhs for n in g]
    only_left, only_right = set(flat_l) - set(flat_r), set(flat_r) - set(flat_l)
    left = [[(n,) for n in g] for g in lhs]
    right = [[(n,) for n in g] for g in rhs]
    _fuse(left, right, only_left, only_right)
    present = [g for g in left if g]
    split_axes = [a for g in present for a in g]
    kept = [a for a in split_axes if a[0] not in only_left]
    out_axes = [a for g in right for a in (g or [()])]  # () marks a unit axis
    added = [i for i, a in enumerate(out_axes) if not a or a[0] in only_right]
    return Recipe(
        dims=tuple(tuple(g) for g in lhs),
        new=tuple(n for n in flat_r if n in only_right),
        fixed=anon,
        names=frozenset(n for n in flat_l + flat_r if "@" not in n and ELLIPSIS not in n),
        squeeze=tuple(i for i, g in enumerate(left) if not g),
        splits=tuple((i, tuple(g)) for i, g in reversed(list(enumerate(present))) if len(g) > 1),
        reduce=tuple(i for i, a in enumerate(split_axes) if a[0] in only_left),
        perm=tuple(kept.index(a) for i, a in enumerate(out_axes) if i not in added),
        unsqueeze=tuple(added),
        repeat=tuple((i, out_axes[i]) for i in added if out_axes[i]),
        groups=tuple((i, len(g)) for i, g in enumerate(right) if len(g) > 1),
    )


def _fuse(left: list, right: list, only_left: set, only_right: set) -> None:
    """Fuse neighbours that stay neighbours: two kept axes adjacent, in order, in one group on
    both sides; two reduced axes in one left group; two new axes in one right group."""
    while _fuse_once(left, right, only_left, only_right):
        pass


def _fuse_once(left: list, right: list, only_left: set, only_right: set) -> bool:
    for group in left:
        for i in range(len(group) - 1):
            p, q = group[i], group[i + 1]
            if (p[0] in only_left and q[0] in only_left) or _fuse_pair(right, p, q):
                group[i:i + 2] = [p + q]
                return True
    for group in right:
        for i in range(len(group) - 1):
            p, q = group[i], group[i + 1]
            if p[0] in only_right and q[0] in only_right:
                group[i:i + 2] = [p + q]
                return True
    return False


def _fuse_pair(groups: list, p: Axis, q: Axis) -> bool:
    for group in groups:
        for i in range(len(group) - 1):
            if group[i] == p and group[i + 1] == q:
                group[i:i + 2] = [p + q]
                return True
    return False


# -- specialising on a shape -----------------------------------------------------------------


@lru_cache(maxsize=CACHE_SIZE)
def _solve(recipe: Recipe, shape: tuple, lengths: tuple) -> tuple:
    """The size of every elementary axis, as ((name, Dim), ...)."""
    sizes: dict[str, Dim] = dict(recipe.fixed)
    for name, size in lengths:
        if name not in recipe.names:
            raise PatternError(f"a size is given for {name!r}, which is not in the pattern")
        sizes[name] = size
    for names, dim in zip(recipe.dims, shape):
        _solve_axis(names, dim, sizes)
    missing = [n for n in recipe.new if n not in sizes]
    if missing:
        raise PatternError(f"new axis {missing[0]!r} needs a size: pass {missing[0]}=...")
    return tuple(sizes.items())


def _solve_axis(names: tuple, dim: Dim, sizes: dict) -> None:
    unknown = [n for n in names if n not in sizes]
    known = product(sizes[n] for n in names if n in sizes)
    written = f"({' '.join(_show(n) for n in names)})" if len(names) != 1 else repr(_show(names[0]))
    if len(unknown) > 1:
        raise PatternError(f"cannot split an axis of size {format_dim(dim)} into {written}: "
                           f"give the sizes of all but one of {', '.join(unknown)}")
    if not unknown:
        if not dims_equal(known, dim):
            raise PatternError(f"axis {written} has size {format_dim(known)}, but the input "
                               f"axis has size {format_dim(dim)}")
        return
    sizes[unknown[0]] = _quotient(dim, known, written)


def _quotient(dim: Dim, known: Dim, written: str) -> Dim:
    if is_static(dim) and is_static(known):
        if known == 0 or dim % known:
            raise PatternError(f"an axis of size {dim} does not split into {written} "
                               f"({dim} is not a multiple of {known})")
        return dim // known
    quotient = as_dim(sympy.sympify(dim) / known)
    if not is_static(quotient) and quotient.is_integer is not True:
        raise PatternError(f"an axis of size {format_dim(dim)} does not split into {written} "
                           f"({format_dim(dim)} is not a known multiple of {format_dim(known)})")
    return quotient


def _size(name: str, value) -> Dim:
    """A keyword size: an int, a symbol name or a sympy expression, positive."""
    try:
        dim = as_dim(value)
    except ShapeError:
        raise PatternError(f"size of {name!r} is not a dimension: {value!r}") from None
    if is_static(dim) and dim < 1:
        raise PatternError(f"size of {name!r} must be positive, got {dim}")
    return dim


# -- emitting the primitives -----------------------------------------------------------------


def _emit(x: Tensor, recipe: Recipe, sizes: Mapping[str, Dim], reduction: str | None) -> Tensor:
    def size(axis: Axis) -> Dim:
        return product(sizes[n] for n in axis)

    x = core.squeeze(x, recipe.squeeze)
    for axis, parts in recipe.splits:  # right to left, so earlier positions stay valid
        x = core.ungroup(x, axis, [size(p) for p in parts])
    if recipe.reduce:
        x = REDUCERS[reduction](x, recipe.reduce)
    x = core.permute(x, recipe.perm)
    x = core.unsqueeze(x, recipe.unsqueeze)
    grow = [(i, size(a)) for i, a in recipe.repeat if not (is_static(size(a)) and size(a) == 1)]
    if grow:
        x = core.repeat_axes(x, [i for i, _ in grow], [s for _, s in grow])
    for axis, count in recipe.groups:  # left to right: groups before are one axis each
        x = core.group(x, axis, count)
    return x


def _transform(x: Tensor, pattern: str, op: str, reduction: str | None,
               axes_lengths: Mapping) -> Tensor:
    if not isinstance(x, Tensor):
        raise PatternError(f"{op} {pattern!r}: expected a traced tdag Tensor, "
                           f"got {type(x).__name__}")
    try:
        if not isinstance(pattern, str):
            raise PatternError(f"the pattern must be a str, got {type(pattern).__name__}")
        if op == "reduce" and reduction not in REDUCTIONS:
            raise PatternError(f"unknown reduction {reduction!r}; use one of {REDUCTIONS}")
        lengths = tuple(sorted((k, _size(k, v)) for k, v in axes_lengths.items()))
        recipe = _recipe(pattern, op, x.ndim)
        return _emit(x, recipe, dict(_solve(recipe, x.shape, lengths)), reduction)
    except TdagError as exc:  # a ShapeError from a node is a pattern that misfits too
        sizes = "".join(f", {k}={v}" for k, v in axes_lengths.items())
        raise PatternError(f"{op} {pattern!r} on input shape {format_shape(x.shape)}{sizes}: "
                           f"{exc.args[0]}") from None


def format_shape(shape) -> str:
    """A shape as an error message writes it: ``[b,3,16]``."""
    return "[" + ",".join(format_dim(d) for d in shape) + "]"


def rearrange(x: Tensor, pattern: str, **axes_lengths) -> Tensor:
    """Reorder, split and merge axes (einops ``rearrange``); every element is kept.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.rearrange(x, "b c h w -> b h w c"),
    ...                   tdag.TensorSpec((2, 3, 4, 5)))
    >>> [n.op.value for n in prog.graph.nodes]
    ['permute']
    """
    return _transform(x, pattern, "rearrange", None, axes_lengths)


def reduce(x: Tensor, pattern: str, reduction: str, **axes_lengths) -> Tensor:
    """Rearrange and reduce the axes missing on the right with sum/mean/max/min/prod.

    >>> import tdag
    >>> from tdag import ops
    >>> pool = lambda x: ops.einops_reduce(x, "b c (h 2) (w 2) -> b c h w", "max")
    >>> prog = tdag.trace(pool, tdag.TensorSpec(("b", 3, 8, 8)))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[b,3,4,4]']
    """
    return _transform(x, pattern, "reduce", reduction, axes_lengths)


def reduce_or_pattern(x: Tensor, kind, axes=None, keepdim: bool = False,
                      **axes_lengths) -> Tensor:
    """``tdag.ops.reduce``: the primitive's call ``reduce(x, "sum", axes)``, or einops' call
    ``reduce(x, "a b -> a", "sum")`` when the second argument is a pattern (einops users
    keep their code; ``einops_reduce`` is the pattern form alone).

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: (ops.reduce(x, "sum", 1), ops.reduce(x, "a b -> a", "max")),
    ...                   tdag.TensorSpec((2, 3)))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[2]', 'f32[2]']
    """
    if isinstance(kind, str) and "->" in kind:
        reduction = axes if axes is not None else axes_lengths.pop("reduction", None)
        if reduction is None or keepdim:
            raise PatternError(f"reduce(x, {kind!r}, ...): an einops pattern takes a "
                               f"reduction and no keepdim: reduce(x, {kind!r}, \"sum\")")
        return reduce(x, kind, reduction, **axes_lengths)
    if axes_lengths:
        raise PatternError(f"reduce(x, {kind!r}, ...): axis lengths "
                           f"({', '.join(axes_lengths)}) go with an einops pattern, as in "
                           f"reduce(x, \"a (b 2) -> a b\", \"max\"); the primitive's call is "
                           f"reduce(x, \"sum\", axes)")
    if isinstance(kind, str) and kind not in {k.value for k in ReduceKind}:
        raise PatternError(f"reduce(x, {kind!r}, ...): expected a reduction "
                           f"({', '.join(k.value for k in ReduceKind)}) with axes, or an "
                           f"einops pattern with a reduction: reduce(x, \"a b -> a\", \"sum\")")
    return core.reduce(x, kind, axes, keepdim)


def repeat(x: Tensor, pattern: str, **axes_lengths) -> Tensor:
    """Rearrange and broadcast new axes (einops ``repeat``); new axes need a size.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.repeat(x, "h w -> (h 2) w c", c=3),
    ...                   tdag.TensorSpec((4, 5)))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[8,5,3]']
    """
    return _transform(x, pattern, "repeat", None, axes_lengths)
