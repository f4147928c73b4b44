"""Which nodes torch runs as views in the generated code, by a model of strides.

A view shares its input's storage: it costs nothing and keeps that storage alive. The op's
record says which ops the torch emitter runs as views and what strides torch gives them
(``record(op).view``): permute, squeeze, unsqueeze, slice, select, expand and unfold always
are; a reshape (``flatten``, ``unflatten``, ``reshape``) only where torch's own rule (ATen's
``computeStride``) finds strides for it, and copies otherwise (a reshape of a permuted
tensor). Strides are computed on concrete sizes: the given ones, or a
probe value for each symbol (the decision is the same for every size but a degenerate 1).
A value the code computes channels-last (a 4-d input it copies so, or an op's result on
such values: ``tdag.reify.torch.layout``) has (N, C, H, W) sizes on (N, H, W, C) strides,
and a 3-d one (N, C, W) sizes on (N, W, C) strides.
"""
from __future__ import annotations

from tdag.deinops.strides import Strides, contiguous
from tdag.ir.graph import TDAG
from tdag.ir.record import record
from tdag.ir.symbols import evaluate


class Views:
    """The views of one TDAG: ``base(name)`` is the name whose storage a view node shares."""

    def __init__(self, graph: TDAG, sizes: dict, channels_last: frozenset = frozenset()):
        self.sizes, self.channels_last = sizes, channels_last
        self.strides: dict[str, Strides] = {}
        self.shapes: dict[str, tuple] = {}
        self.base: dict[str, str] = {}
        self._evaluated: dict[tuple, tuple] = {}  # a shape -> its sizes (a 7B step: ~40 shapes)
        for value in graph.inputs:
            self._fresh(value.name, value.type.shape)
        for name, weight in graph.weights.items():
            self._fresh(name, weight.type.shape)
        for node in graph.nodes:
            self._node(node)

    def is_contiguous(self, name: str) -> bool:
        """torch's ``is_contiguous``: row-major strides, size-1 axes' strides ignored."""
        shape, strides = self.shapes[name], self.strides[name]
        want = contiguous(shape)
        return all(d == 1 or s == w for d, s, w in zip(shape, strides, want))

    def _concrete(self, shape) -> tuple:
        if shape not in self._evaluated:
            self._evaluated[shape] = tuple(evaluate(d, self.sizes) for d in shape)
        return self._evaluated[shape]

    def _fresh(self, name: str, shape) -> None:
        self.shapes[name] = self._concrete(shape)
        self.strides[name] = self._made(name, self.shapes[name])

    def _made(self, name: str, shape: tuple) -> Strides:
        """The strides of a tensor made anew: channels-last where the code makes it so."""
        if name in self.channels_last and len(shape) == 4:
            n, h, w, c = contiguous((shape[0], shape[2], shape[3], shape[1]))
            return (n, c, h, w)
        if name in self.channels_last and len(shape) == 3:  # a 1-d convolution's (N, W, C)
            n, w, c = contiguous((shape[0], shape[2], shape[1]))
            return (n, c, w)
        return contiguous(shape)

    def _node(self, node) -> None:
        out = self._concrete(node.type.shape)
        strides, rule = None, record(node.op).view
        if node.inputs and node.inputs[0] in self.strides:
            src = node.inputs[0]
            shape, old = self.shapes[src], self.strides[src]
            if rule is not None:
                strides = rule(node.spec, shape, old, out)
        if strides is None or len(strides) != len(out):
            made = self._made(node.name, out) if rule is None else contiguous(out)
            self.shapes[node.name], self.strides[node.name] = out, made
            return
        self.shapes[node.name], self.strides[node.name] = out, strides
        self.base[node.name] = self.base.get(node.inputs[0], node.inputs[0])


__all__ = ["Views"]
