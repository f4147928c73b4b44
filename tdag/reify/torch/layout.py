"""Channels-last layout for the 2-d convolutions of an inference TDAG.

torch's CPU convolutions (oneDNN) compute channels-last: on (N, C, H, W) tensors they
reorder the input and the result on every call, and a depthwise convolution runs several
times slower so. A conv whose weight is stored channels-last (``memory_format=
torch.channels_last``) and whose input is channels-last returns its result in that layout,
and the elementwise ops, pools, interpolations, concatenations and convs after it keep it:
MobileNet-v2's module runs in about half the time, a UNet block's in two thirds, ResNet's
some 10% faster (one thread). The values are the same; only strides differ.

The generated method therefore copies channels-last, once at its start, each 4-d input a
conv's input is computed from, and returns a (N, C, H, W) copy of each 4-d output computed
from such a conv (``Tensor.contiguous``); ``tdag.memory`` replays both copies and the
strides (``ChannelsLast``). A weight is stored so only where every node of its TDAG that
reads it is a 2-d conv reading it as its weight: a training step's parameters are read by
their gradients and the optimizer too, and keep their layout. Inputs the code writes over
(``consumed_inputs``) are not copied.

A 1-d convolution oneDNN runs (``_rt.conv1d``) returns (N, C, W) on (N, W, C) storage, its
channels-last; the elementwise ops, pads and slices after it keep that layout, the next 1-d
convolution reads it without a reorder, and a transpose to (N, W, C) (an audio encoder's
frames) views it. So the 3-d inputs such a convolution's input is computed from are copied
so at the start, and a 3-d output computed from one is returned as an (N, C, W) copy. An
input of (N, C, W) storage computed inside (a group norm's result) is copied inside the
convolution's call, a scratch ``tdag.memory`` does not count.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.record import Trait, has
from tdag.ir.rewrite import Context
from tdag.lower.kernels.contraction import onednn_conv
from tdag.refine.dataflow import live_names
from tdag.refine.memory.walk import ChannelsLast


@dataclass(frozen=True, slots=True)
class Layout:
    """One TDAG's channels-last plan: the weights stored so, the inputs copied so at the
    method's start, every value that may be channels-last, and the outputs copied back."""

    weights: frozenset
    inputs: frozenset
    values: frozenset
    outputs: frozenset

    @property
    def replay(self) -> ChannelsLast:
        """What ``tdag.memory``'s replay needs of the plan."""
        return ChannelsLast(self.inputs, self.outputs, self.values)


def layout(graph: TDAG, owned: frozenset = frozenset()) -> Layout:
    """The channels-last plan of ``graph``; ``owned``: the inputs its code writes over."""
    weights = _conv_weights(graph)
    convs = [n for n in graph.nodes if _conv2d(n) and n.inputs[1] in weights]
    ctx = Context(graph)
    rows = [n for n in graph.nodes if _conv1d(n) and onednn_conv(n, ctx)]
    if not convs and not rows:
        return Layout(frozenset(), frozenset(), frozenset(), frozenset())
    inputs = _copied_inputs(graph, owned, convs, 4) | _copied_inputs(graph, owned, rows, 3)
    values, conv_names = set(inputs), {n.name for n in convs}
    row_names = {n.name for n in rows}
    for node in graph.nodes:
        if node.name in conv_names or node.name in row_names or \
                values.intersection(node.inputs) and (node.type.rank != 3 or _keeps_rows(node)):
            values.add(node.name)
    ranks = {n.name: n.type.rank for n in graph.nodes} | {v.name: v.type.rank for v in graph.inputs}
    outputs = frozenset(o for o in graph.outputs if o in values and ranks[o] in (3, 4))
    return Layout(weights, inputs, frozenset(values), outputs)


def _copied_inputs(graph: TDAG, owned: frozenset, convs: list, rank: int) -> frozenset:
    """The float inputs of rank ``rank`` that the inputs of ``convs`` are computed from by ops
    that keep the axes: not through a permute or a reshape (an (N, H, W, C) image permuted
    for its conv is not copied)."""
    if not convs:
        return frozenset()
    keeps = _keeps_axes if rank == 4 else _keeps_rows
    stop = {n.name for n in graph.nodes if n.type.rank != rank or not keeps(n)}
    return frozenset(v.name for v in graph.inputs if v.name not in owned and
                     v.type.rank == rank and v.type.dtype.is_float) & \
        live_names(graph, [n.inputs[0] for n in convs], stop)


def channels_last_weights(prog: Program) -> frozenset[str]:
    """The weights (by name) the module of ``prog`` stores channels-last: those of the TDAGs'
    plans that no TDAG reads otherwise (its conv still returns channels-last on a
    channels-last input, so its plan holds either way)."""
    planned, read = set(), set()
    for graph in prog.graphs.values():
        mine = layout(graph).weights
        planned |= mine
        reads = [n for node in graph.nodes for n in node.inputs] + list(graph.outputs)
        read |= {n for n in reads if n in graph.weights} - mine
    return frozenset(planned - read)


def _conv_weights(graph: TDAG) -> frozenset:
    """The 4-d weights of ``graph`` that only 2-d convs read, each as its weight."""
    conv, other = set(), {n for n in graph.outputs if n in graph.weights}
    for node in graph.nodes:
        for position, name in enumerate(node.inputs):
            if name in graph.weights:
                use = conv if _conv2d(node) and position == 1 else other
                use.add(name)
    return frozenset(n for n in conv - other if graph.weights[n].type.rank == 4)


def _keeps_axes(node) -> bool:
    """Whether ``node`` keeps the (N, C, H, W) axes where they are (elementwise ops, pads and
    slices, norms: a channels-last operand gives it a channels-last result); a conv's result
    is channels-last whatever its input."""
    return node.type.rank == 4 and not _conv2d(node) and \
        (not has(node.op, Trait.MOVEMENT) or node.op in (Op.pad, Op.slice))


def _keeps_rows(node) -> bool:
    """Whether the 3-d ``node`` keeps an (N, W, C) stored operand's layout: elementwise ops,
    pads and slices do (torch's elementwise kernels follow their operand's strides); a norm
    does not (F.group_norm returns (N, C, W) storage, which the next ``_rt.conv1d`` copies
    to (N, W, C) inside its call)."""
    return node.op is not Op.conv and (has(node.op, Trait.ELEMENTWISE) or
                                       node.op in (Op.pad, Op.slice))


def _conv2d(node) -> bool:
    return node.op is Op.conv and len(node.spec.stride) == 2


def _conv1d(node) -> bool:
    return node.op is Op.conv and len(node.spec.stride) == 1


__all__ = ["Layout", "channels_last_weights", "layout"]
