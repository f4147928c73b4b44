"""``einsum``: an equation (einops style ``"b i d, b j d -> b i j"`` or torch style
``"bid,bjd->bij"``) parsed once into a recipe per operand ranks, then contracted left to
right, one multiply + reduce-sum per pair of operands, on an axis order that needs as few
permutes as it can.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

from tdag.errors import PatternError, TdagError
from tdag.ir.symbols import Dim, dims_equal, format_dim, is_static
from tdag.ops import core
from tdag.ops.einops import CACHE_SIZE, ELLIPSIS, check_unique, format_shape
from tdag.ops.tensor import Tensor


@dataclass(frozen=True, slots=True)
class EinsumRecipe:
    """An einsum equation for given operand ranks, with "..." expanded."""

    inputs: tuple  # per operand, its axis names in order; a name twice is a diagonal
    output: tuple  # the output's axis names in order


_TORCH_TERM = re.compile(r"[A-Za-z]*(\.\.\.)?[A-Za-z]*")


@lru_cache(maxsize=CACHE_SIZE)
def _einsum_recipe(equation: str, ndims: tuple) -> EinsumRecipe:
    lhs, arrow, rhs = equation.partition("->")
    if "->" in rhs:
        raise PatternError("more than one '->'")
    terms = [t.strip() for t in lhs.split(",")]
    if len(terms) != len(ndims):
        raise PatternError(f"{len(terms)} operands in the equation, {len(ndims)} tensors given")
    read = _einops_term if _einops_style(terms, ndims) else _torch_term
    parsed = [read(t) for t in terms]
    width = max([n - len(p) + 1 for p, n in zip(parsed, ndims) if ELLIPSIS in p], default=0)
    inputs = tuple(_expand_term(p, n, width, t) for p, n, t in zip(parsed, ndims, terms))
    if arrow:
        output = _expand_term(read(rhs.strip()), None, width, rhs.strip())
    elif read is _einops_term:
        raise PatternError("an einops-style equation needs '->'")
    else:  # torch's implicit output: "..." first, then letters seen once, sorted
        counts = Counter(n for names in inputs for n in names)
        output = tuple(f"{ELLIPSIS}{i}" for i in range(width)) + tuple(
            sorted(n for n, c in counts.items() if c == 1 and not n.startswith(ELLIPSIS)))
    check_unique(list(output), "in the output")
    known = {n for names in inputs for n in names}
    unknown = [n for n in output if n not in known]
    if unknown:
        raise PatternError(f"unknown axis {unknown[0]!r} in the output")
    return EinsumRecipe(inputs, output)


def _einops_style(terms: list[str], ndims: tuple) -> bool:
    """Einops style names axes with words split by spaces ("b i d"); torch style gives each
    axis one letter ("bid"). A lone word per operand is torch style unless only the einops
    reading fits the ranks ("batch, batch -> batch" on vectors)."""
    if any(not _TORCH_TERM.fullmatch(t) for t in terms):
        return True
    torch_fits = all(len(t.replace("...", "")) == n or ("..." in t and len(t) - 3 <= n)
                     for t, n in zip(terms, ndims))
    return not torch_fits and all(n == 1 and "..." not in t for t, n in zip(terms, ndims))


def _torch_term(term: str) -> list[str]:
    if not _TORCH_TERM.fullmatch(term):
        raise PatternError(f"torch-style term {term!r}: use single letters and one '...'")
    head, dots, tail = term.partition("...")
    return list(head) + ([ELLIPSIS] if dots else []) + list(tail)


def _einops_term(term: str) -> list[str]:
    if "(" in term or ")" in term:
        raise PatternError(f"einsum term {term!r}: einsum has no axis groups; use rearrange")
    names = term.replace("...", f" {ELLIPSIS} ").split()
    for name in names:
        if name != ELLIPSIS and not name.isidentifier():
            raise PatternError(f"einsum term {term!r}: {name!r} is not an axis name")
    if names.count(ELLIPSIS) > 1:
        raise PatternError(f"einsum term {term!r}: more than one '...'")
    return names


def _expand_term(names: list[str], ndim: int | None, width: int, term: str) -> tuple:
    """Replace "..." by the ellipsis axes, right-aligned as in numpy broadcasting."""
    if ELLIPSIS not in names:
        if ndim is not None and len(names) != ndim:
            raise PatternError(f"term {term!r} has {len(names)} axes, its tensor has rank {ndim}")
        return tuple(names)
    count = width if ndim is None else ndim - len(names) + 1
    if count < 0:
        raise PatternError(f"term {term!r} has {len(names) - 1} axes, its tensor has "
                           f"rank {ndim}")
    at = names.index(ELLIPSIS)
    ellipsis = [f"{ELLIPSIS}{width - count + i}" for i in range(count)]
    return tuple(names[:at] + ellipsis + names[at + 1:])


@lru_cache(maxsize=CACHE_SIZE)
def _einsum_sizes(recipe: EinsumRecipe, shapes: tuple) -> tuple:
    """The size of every axis; ellipsis axes broadcast (size 1 meets any size)."""
    sizes: dict[str, Dim] = {}
    for names, shape in zip(recipe.inputs, shapes):
        for name, dim in zip(names, shape):
            old = sizes.get(name, dim)
            if dims_equal(old, dim) or (name.startswith(ELLIPSIS) and _is_one(dim)):
                sizes[name] = old
            elif name.startswith(ELLIPSIS) and _is_one(old):
                sizes[name] = dim
            else:
                raise PatternError(f"axis {name!r} has sizes {format_dim(old)} and "
                                   f"{format_dim(dim)}")
    return tuple(sizes.items())


def _is_one(dim: Dim) -> bool:
    return is_static(dim) and dim == 1


def einsum(equation: str, *tensors: Tensor) -> Tensor:
    """Einstein summation as unsqueeze/permute + repeat + multiply + reduce-sum.

    Takes einops-style (``"b i d, b j d -> b i j"``, words as axis names) or torch-style
    (``"bid,bjd->bij"``) equations, ``...`` broadcasting and repeated indices (diagonals, on
    static axes). Operands are contracted left to right, one multiply per pair. The einops
    order ``einsum(x, y, equation)`` is accepted too.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda q, k: ops.einsum("b i d, b j d -> b i j", q, k),
    ...                   tdag.TensorSpec(("b", 4, 8)), tdag.TensorSpec(("b", 5, 8)))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[b,4,5]']
    """
    if not isinstance(equation, str) and tensors and isinstance(tensors[-1], str):
        equation, tensors = tensors[-1], (equation,) + tensors[:-1]
    bad = [t for t in tensors if not isinstance(t, Tensor)]
    if bad or not tensors:
        raise PatternError(f"einsum {equation!r}: expected traced tdag Tensors, got "
                           f"{[type(t).__name__ for t in tensors]}")
    shapes = tuple(t.shape for t in tensors)
    try:
        if not isinstance(equation, str):
            raise PatternError(f"the equation must be a str, got {type(equation).__name__}")
        recipe = _einsum_recipe(equation, tuple(len(s) for s in shapes))
        return _contract_all(list(tensors), recipe, dict(_einsum_sizes(recipe, shapes)))
    except TdagError as exc:
        raise PatternError(f"einsum {equation!r} on operand shapes "
                           f"{', '.join(format_shape(s) for s in shapes)}: {exc.args[0]}") from None


def _contract_all(tensors: list[Tensor], recipe: EinsumRecipe, sizes: dict) -> Tensor:
    operands = [_diagonal(t, list(names), sizes) for t, names in zip(tensors, recipe.inputs)]
    seen = [n for _, names in operands for n in names]
    target = recipe.output + tuple(dict.fromkeys(n for n in seen if n not in recipe.output))
    x, names = operands[0]
    for i in range(1, len(operands)):
        later = set(recipe.output).union(*(n for _, n in operands[i + 1:]))
        x, names = _contract(x, names, *operands[i], later, target, sizes)
    x, names = _sum_out(x, names, set(recipe.output))  # one operand: sum what is not output
    return core.permute(x, [names.index(n) for n in recipe.output])


def _diagonal(x: Tensor, names: list[str], sizes: dict) -> tuple[Tensor, tuple]:
    """Take the diagonal of each repeated index: the k copies of an axis of size n moved
    together and grouped into n**k, then sliced with step 1 + n + ... + n**(k-1)."""
    for name in dict.fromkeys(names):
        where = [i for i, n in enumerate(names) if n == name]
        if len(where) == 1:
            continue
        n, k, first = sizes[name], len(where), where[0]
        if not is_static(n):
            raise PatternError(f"repeated index {name!r} needs a static size, got "
                               f"{format_dim(n)}")
        rest = [i for i in range(len(names)) if i not in where[1:]]
        perm = rest[:first + 1] + where[1:] + rest[first + 1:]
        x = core.group(core.permute(x, perm), first, k)
        x = core.slice(x, first, 0, n ** k, sum(n ** j for j in range(k)))
        names = [names[i] for i in rest]
    return x, tuple(names)


def _contract(x: Tensor, xn: tuple, y: Tensor, yn: tuple, later: set, target: tuple,
              sizes: dict) -> tuple[Tensor, tuple]:
    """Multiply two operands on a common axis order, then sum the axes no longer needed."""
    desired = tuple(n for n in target if n in later and (n in xn or n in yn))
    order = _pair_order(xn, yn, desired)
    product_ = core.mul(_align(x, xn, order, sizes), _align(y, yn, order, sizes))
    return _sum_out(product_, order, later)


def _sum_out(x: Tensor, names: tuple, keep: set) -> tuple[Tensor, tuple]:
    drop = tuple(i for i, n in enumerate(names) if n not in keep)
    return core.reduce(x, "sum", drop), tuple(n for n in names if n in keep)


def _pair_order(xn: tuple, yn: tuple, desired: tuple) -> tuple:
    """An axis order for x * y that keeps x's order, y's order and the desired result order
    where they can all hold (no permute), dropping one constraint at a time where not."""
    universe = list(dict.fromkeys(desired + xn + yn))
    for chains in ((xn, yn, desired), (xn, yn), (xn, desired), (yn, desired), (xn,)):
        order = _topological(universe, chains)
        if order is not None:
            return order
    raise AssertionError("unreachable: x's own order has no cycle")


def _topological(universe: list[str], chains: tuple) -> tuple | None:
    """Order ``universe`` so that each chain's names come in its order, or None (a cycle);
    ties go to the earlier name in ``universe``."""
    after: dict[str, set] = {n: set() for n in universe}
    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            after[a].add(b)
    indegree = Counter(b for a in universe for b in after[a])
    ready = [n for n in universe if indegree[n] == 0]
    order: list[str] = []
    while ready:
        name = min(ready, key=universe.index)
        ready.remove(name)
        order.append(name)
        for b in after[name]:
            indegree[b] -= 1
            if indegree[b] == 0:
                ready.append(b)
    return tuple(order) if len(order) == len(universe) else None


def _align(x: Tensor, names: tuple, order: tuple, sizes: dict) -> Tensor:
    """Put ``x``'s axes in ``order``, insert the missing ones and broadcast them."""
    x = core.permute(x, [names.index(n) for n in order if n in names])
    x = core.unsqueeze(x, [i for i, n in enumerate(order) if n not in names])
    grow = [i for i, n in enumerate(order) if _is_one(x.shape[i]) and not _is_one(sizes[n])]
    return core.repeat_axes(x, grow, [sizes[order[i]] for i in grow]) if grow else x
