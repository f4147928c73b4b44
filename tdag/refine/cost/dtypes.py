"""A quantized model's work and traffic by element type, for ``tdag.cost``.

- **int_macs** ("int8 MACs"): the multiply-accumulates of contractions over integer operands,
  M*K*N for an [M,K]x[K,N] product: ``matmul_integer``, ``conv_integer``, ``qlinear_conv``,
  ``qlinear_matmul`` (8-bit operands summed in i32), or such a product left a composition
  (an i32 multiply-and-sum). Their ``flops`` and ``matmul_flops`` are ``2 * int_macs``, as a
  float contraction's. A float model has none.
- **float_flops** = flops - 2 * int_macs: every other op's work, float math and the
  per-element integer ops around the products (casts, zero points, requantization).
- **bytes_by_dtype**: the lowered traffic (``bytes``) by the element type of the tensor
  moved: each op's output by its type, its inputs by theirs; an op that reads part of an
  input (a gather of rows) counts what it reads as its first input's type. Views move nothing.

Sub-byte weights: ONNX INT4/UINT4 tensors are read one value a byte, as i8/u8
(``tdag/canonicalize/onnx/load.py``), so their bytes count twice their size on file, and the
program cannot tell them from 8-bit ones. MatMulNBits' weights stay packed u8 (two 4-bit
values a byte, their true size) and are unpacked to float before a float matmul: that matmul
is float work.
"""
from __future__ import annotations

import sympy

from tdag.ir.program import Program
from tdag.ir.record import REGISTRY, Trait, ops_with
from tdag.ir.symbols import Dim, as_dim


def int_macs(matmul_flops: Dim, node, in_types) -> Dim:
    """A contraction's multiply-accumulates where it multiplies integers, else 0."""
    if matmul_flops == 0 or (node.type.dtype.is_float and all(t.dtype.is_float
                                                              for t in in_types)):
        return 0
    return matmul_flops // 2 if isinstance(matmul_flops, int) else as_dim(matmul_flops / 2)


def bytes_by_dtype(prog: Program, calls: dict) -> dict:
    """dtype name -> the bytes of tensors of that type ``prog`` moves, its TDAGs run
    ``calls[name]`` times."""
    terms: dict = {}
    views = ops_with(Trait.VIEW)
    for gname, times in calls.items():
        graph = prog.graphs[gname]
        types = graph.types()
        for node in graph.nodes:
            if node.op in views:
                continue
            ins = tuple(types[n] for n in node.inputs)
            cost = REGISTRY[node.op].cost(node.spec, ins, node.type)
            parts = [(node.type.dtype, cost.bytes_written)]
            if as_dim(sum((t.nbytes for t in ins), 0)) == cost.bytes_read:
                parts += [(t.dtype, t.nbytes) for t in ins]
            elif ins:
                parts.append((ins[0].dtype, cost.bytes_read))
            for dtype, nbytes in parts:
                terms.setdefault(dtype.value, []).append(as_dim(nbytes * times))
    sums = {k: as_dim(sympy.Add(*v)) if any(not isinstance(t, int) for t in v) else sum(v)
            for k, v in terms.items()}
    return {k: v for k, v in sums.items() if v != 0}
