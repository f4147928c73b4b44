"""Complex values in ONNX: each as its (real, imaginary) pair on a trailing axis of 2.

ONNX has complex element types but onnxruntime no kernel that computes on them; its DFT
takes and gives the pairs instead. to_onnx holds every complex value (c64[..., n]) as its
pair (f32[..., n, 2]): a complex weight is written as its pair (``graph.tensor_proto``),
``bitcast`` to or from the pair is the value itself, ``fft`` is ``DFT`` on it. The ops that
only move values index axes from the front and run on the pair as they are; arithmetic runs
on the parts.

A program whose inputs or outputs are complex is refused: its callers would have to know
the convention; the convention stays inside the graph. The arithmetic on pairs is in the
records' emitters (``tdag/deinops/pairs.py``).
"""
from __future__ import annotations

from typing import Callable

from tdag.errors import UnsupportedOpError
from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.types import TensorType

# ops whose records' emitters compute on the pairs themselves (tdag/deinops/pairs.py)
_PAIR_AWARE = frozenset({Op.fft, Op.fft_of_real, Op.bitcast, Op.multiply, Op.divide, Op.exp,
                         Op.permute, Op.where, Op.compare, Op.cast})
# ops that run on the pairs unchanged: every axis they name lies before the pair's
_ON_PAIRS = frozenset({Op.add, Op.neg, Op.reduce, Op.group, Op.ungroup, Op.squeeze,
                       Op.unsqueeze, Op.slice, Op.pad, Op.select, Op.repeat, Op.concat,
                       Op.reshape, Op.expand, Op.gather})


def touches_complex(node, cx) -> bool:
    return node.type.dtype.is_complex or any(cx.type(n).dtype.is_complex for n in node.inputs)


def refuse_complex_io(values) -> None:
    """A program's complex inputs and outputs (``(name, type)`` pairs) have no ONNX form
    onnxruntime computes on."""
    for name, t in values:
        if t.dtype.is_complex:
            raise UnsupportedOpError(
                f"to_onnx: %{name} is {t}, a complex input or output of the program; "
                "onnxruntime computes on no complex type: pass its (real, imaginary) pair "
                "instead (ops.view_as_real / view_as_complex at the boundary)", node=name)


def emit_complex(node, ins: list, cx, g, emit: Callable) -> str:
    """The ONNX nodes for ``node``, one of whose operands or whose result is complex."""
    if node.op in _PAIR_AWARE:
        return emit(node, ins, cx)
    if node.op is Op.unfold:  # it puts the window axis last, after the pair's: swap them
        rank = node.type.rank + 1
        out = emit(_paired(node), ins, _Paired(cx))
        return g.node("Transpose", [out], perm=[*range(rank - 2), rank - 1, rank - 2])
    if node.op in _ON_PAIRS or has(node.op, Trait.VIEW):
        return emit(_paired(node), ins, _Paired(cx))
    if has(node.op, Trait.KERNEL):  # a kernel's ONNX is its decomposition inlined: its
        return emit(node, ins, cx)  # own nodes take the pairs
    raise UnsupportedOpError(f"to_onnx: {node.op.value} of complex values has no form on "
                             "(real, imaginary) pairs in tdag", node=node.name,
                             origin=node.origin)


def _pair_type(t: TensorType) -> TensorType:
    return TensorType((*t.shape, 2), t.dtype.real) if t.dtype.is_complex else t


def _paired(node):
    return node.replace(type=_pair_type(node.type))


class _Paired:
    """An emitter's context in which complex values have their pairs' types."""

    def __init__(self, cx):
        self._cx = cx

    def type(self, name: str) -> TensorType:
        return _pair_type(self._cx.type(name))

    def __getattr__(self, attr):
        return getattr(self._cx, attr)


__all__ = ["emit_complex", "refuse_complex_io", "touches_complex"]
