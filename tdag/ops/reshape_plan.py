"""Reshape planning: a reshape as runs of source axes paired with runs of target axes.

``core.reshape`` emits each pair as group / ungroup (squeeze / unsqueeze for size-1 axes);
lowering (``tdag.lower.match``) reads the same pairing to recognise a reshape in primitives.
Pure functions of shapes: nothing here emits a node.
"""
from __future__ import annotations

import sympy

from tdag.errors import ShapeError
from tdag.ir.symbols import as_dim, dims_equal, is_static, product


def resolve_wildcard(shape, target) -> tuple:
    """``target`` with its one ``-1`` (if any) solved from the element count of ``shape``."""
    if sum(1 for d in target if is_static(d) and d == -1) > 1:
        raise ShapeError(f"reshape: more than one -1 in {target}")
    if not any(is_static(d) and d == -1 for d in target):
        total, want = product(shape), product(target)
        if not dims_equal(total, want):
            raise ShapeError(f"reshape: cannot reshape {list(shape)} into {list(target)}")
        return target
    known = product(d for d in target if not (is_static(d) and d == -1))
    rest = as_dim(sympy.sympify(product(shape)) / known)
    if is_static(rest) is False and not rest.is_integer:
        raise ShapeError(f"reshape: cannot reshape {list(shape)} into {list(target)}")
    if is_static(product(shape)) and is_static(known) and (known == 0 or product(shape) % known):
        raise ShapeError(f"reshape: cannot reshape {list(shape)} into {list(target)}")
    return tuple(rest if (is_static(d) and d == -1) else d for d in target)


def reshape_segments(src, dst):
    """Pair runs of source axes with runs of target axes of equal product, or None."""
    segments, i, j = [], 0, 0
    while i < len(src) or j < len(dst):
        if i == len(src) or j == len(dst):
            rest_src, rest_dst = src[i:], dst[j:]
            if any(not (is_static(d) and d == 1) for d in rest_src + rest_dst):
                return None
            if segments:
                n_in, sizes = segments[-1]
                segments[-1] = (n_in + len(rest_src), sizes + tuple(rest_dst))
            else:
                segments.append((len(rest_src), tuple(rest_dst)))
            break
        n_in, n_out = 1, 1
        p_in, p_out = src[i], dst[j]
        while not dims_equal(p_in, p_out):
            if not (is_static(p_in) and is_static(p_out)):
                return None
            if p_in < p_out and i + n_in < len(src):
                p_in, n_in = p_in * src[i + n_in], n_in + 1
            elif p_out < p_in and j + n_out < len(dst):
                p_out, n_out = p_out * dst[j + n_out], n_out + 1
            else:
                return None
        segments.append((n_in, tuple(dst[j:j + n_out])))
        i, j = i + n_in, j + n_out
    return segments
