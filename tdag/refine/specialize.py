"""``specialize``: a TDAG with some of its size symbols fixed to numbers.

A TDAG is polymorphic in its symbols: ``f32[b,n]`` runs at every ``b`` and ``n``. Fixing
``n = 1`` gives the TDAG that a caller with one-token inputs can call (a language model's
decode step, where the same weights serve a prefill of any length). Every place a Dim can
stand is substituted: input, weight and node types and the Dims inside node specs (slice
bounds, repeat sizes, iota lengths, ...); the result is verified.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import sympy

from tdag.ir.graph import TDAG, Value
from tdag.ir.symbols import Dim, as_dim, symbol
from tdag.ir.types import TensorType
from tdag.ir.verify import verify_tdag


def specialize(graph: TDAG, sizes: Mapping[str, int | Dim],
               name: str = "specialized") -> TDAG:
    """``graph`` with each symbol named in ``sizes`` replaced by its value: a number, or a
    size over other symbols.

    >>> import tdag
    >>> from tdag import ops
    >>> g = tdag.trace(lambda x: ops.sum(x, axis=1), tdag.TensorSpec(("b", "n"))).graph
    >>> [str(t) for t in specialize(g, {"n": 1}).output_types]
    ['f32[b]']
    """
    subs = {symbol(k): v for k, v in sizes.items()}

    def dim(d: Dim) -> Dim:
        return d if isinstance(d, int) else as_dim(d.subs(subs))

    def value(v):
        if isinstance(v, sympy.Expr):
            return dim(v)
        if isinstance(v, tuple):
            return tuple(value(x) for x in v)
        return v

    def spec(s):
        if not dataclasses.is_dataclass(s):
            return s
        return dataclasses.replace(s, **{f.name: value(getattr(s, f.name))
                                         for f in dataclasses.fields(s) if f.init})

    def type_(t: TensorType) -> TensorType:
        return t.with_shape(dim(d) for d in t.shape)

    result = graph.replace(
        inputs=tuple(Value(v.name, type_(v.type)) for v in graph.inputs),
        weights={k: dataclasses.replace(w, type=type_(w.type)) for k, w in graph.weights.items()},
        nodes=tuple(n.replace(spec=spec(n.spec), type=type_(n.type)) for n in graph.nodes))
    verify_tdag(result, name)
    return result
