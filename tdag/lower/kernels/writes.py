"""Write kernels: ``bincount``, a count of each position an index names, added to a target.

The composition is a scatter-add of ones into an integer target (torch's ``bincount`` and
``histc`` front ends, ``writes_per_row``); torch's ``index_add`` reads an expanded tensor
of ones as its source, where ``torch.bincount`` counts in one pass over the index. Integer
counts are exact in any order, and an integer target wraps the same whether the ones are
added one by one or their count at once, so the kernel is exact. A weighted scatter-add
stays the primitive: on CPU ``index_add`` of the weights is faster than a weighted
``bincount`` (which also sums f16 and integers in f64).
"""
from __future__ import annotations

import torch

from tdag.deinops.primitive import Cost, traffic
from tdag.deinops.primitive import primitive
from tdag.deinops.scatter import Scatter
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import NoSpec, Trait, record
from tdag.ir.types import DType
from tdag.lower.match import scalar
from tdag.ops import writes

_INDEX = (DType.i64, DType.i32)


def _shape(spec, ins):
    target, index = ins
    if target.rank != 1 or not target.dtype.is_integer or index.dtype not in _INDEX:
        raise ShapeError(f"bincount: an integer vector and an i64/i32 index, got {target}, "
                         f"{index}")
    return target


def _eval(spec, xs, resolve):
    target, index = xs
    counts = torch.bincount(index.reshape(-1), minlength=target.shape[0])
    return (target + counts).to(target.dtype)


def _cost(spec, ins, out) -> Cost:
    return traffic(ins, out, ins[1].numel)  # one increment per index entry


def _torch(node, a, code):
    counts = f"torch.bincount({a[1]}.reshape(-1), minlength={a[0]}.shape[0])"
    if code.ctx.type(node.inputs[0]).dtype is not DType.i64:
        counts = f"{counts}.to({a[0]}.dtype)"
    return counts if scalar(code.ctx, node.inputs[0]) == 0 else f"{a[0]} + {counts}"


def _onnx(node, ins, g, cx):
    """ONNX has no count op: the scatter-add of ones it stands for."""
    ones = g.node("Expand", [g.const(1, node.type.dtype), g.node("Shape", [ins[1]])])
    stand_in = node.replace(op=Op.scatter, spec=Scatter(0, "add"))
    return record(Op.scatter).onnx(stand_in, [*ins, ones], g, cx)


def _jax(node, a, cx):
    return a[0].at[a[1].reshape(-1)].add(1)


primitive(Op.bincount, NoSpec, 2, _shape, _eval, _cost,
          "index_add reads a source of ones as long as the index; bincount counts the index "
          "in one pass",
          traits=Trait.KERNEL, batch=Refuse("counts along its only axis"), torch=_torch,
          onnx=_onnx, jax=_jax,
          decompose=lambda s, target, index: writes.scatter(target, index, 1, 0, "add"))
