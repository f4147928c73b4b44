"""One example per kernel: its op, spec and operands' shapes (``CASES``), and the random
operands of an example (``draw_inputs``).

tests/lower/test_decompose.py lowers each kernel's composition back to the kernel and checks
it against the kernel's evaluator; tests/refine/test_kernel_vjps.py differentiates each
kernel through its composition.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

import tdag
from tdag.ir.op import Op
from tdag.ir.record import NoSpec
from tdag.deinops.fft import FftNorm
from tdag.ir.types import DType
from tdag.lower.kernels.activations import (Clamp, Elu, Gelu, LeakyRelu, LogSumExp, NanToNum,
                                            Rounding, Shrink, Softmax, Softplus)
from tdag.lower.kernels.contraction import Conv, ConvTranspose, Einsum
from tdag.lower.kernels.conv_grad import ConvWeightGrad
from tdag.lower.kernels.fft import FftOfReal
from tdag.lower.kernels.layout import Concat, Expand, Reshape
from tdag.lower.kernels.ml import Normalize, SvmScores, TreeSum
from tdag.lower.kernels.ml_classifiers import LinearClassify, SvmLabel
from tdag.lower.kernels.norms import (BatchNorm, GroupNorm, LayerNorm, RMSNorm, Variance,
                                      VectorNorm)
from tdag.lower.kernels.optim import AdamWUpdate
from tdag.lower.kernels.qlinear import QLinearConv, QLinearMatMul
from tdag.lower.kernels.quant import (
    ConvInteger,
    Dequantize,
    DynamicQuantize,
    MatMulInteger,
    Quantize,
)
from tdag.lower.kernels.scans import CumExtreme, LogCumSumExp
from tdag.lower.kernels.sequence import Attention, Lstm
from tdag.lower.kernels.sorting import Along, Arg, SearchSorted, TopK
from tdag.lower.kernels.windows import Pool, Resize
from tdag.lower.kernels.writes import BincountSized, EmbeddingBag, Histc, WriteSlice
from tdag.ops.linalg.kernels import Ldl, Side, Triangle, TriangularSolve


@dataclass(frozen=True)
class Case:
    """A kernel op, its spec and its operands' shapes (float32 unless ``dtypes`` says; a
    str axis is symbolic, drawn as ``SYMBOLIC``); ``positive`` lists operands drawn positive
    (a variance); ``ints`` an integer operand's (low, high) draw where the default range is
    no valid input (ldl_solve's 1-based pivots); ``xfail`` says why lowering does not give
    the kernel back exactly."""

    op: Op
    spec: object
    shapes: tuple
    dtypes: dict = field(default_factory=dict)
    positive: tuple = ()
    ints: dict = field(default_factory=dict)
    id: str = ""
    xfail: str = ""

    def specs(self):
        return [tdag.TensorSpec(s, self.dtypes.get(i, "float32"))
                for i, s in enumerate(self.shapes)]


def _lstm_shapes(x, hidden, cells_in):
    """x, then (w_ih, w_hh, b_ih, b_hh) per cell with the given input widths, then h0s, c0s."""
    t, b, _ = x
    weights = [s for width in cells_in
               for s in ((4 * hidden, width), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,))]
    states = [(b, hidden)] * (2 * len(cells_in))
    return (x, *weights, *states)


# what lowering gives back instead of the kernel, for the examples marked xfail
_EXPAND_UNIT = ("expand_rule drops a broadcast size-1 source axis and puts it back with a "
                "reshape: reshape(x, (1, 4, 1)) + expand, where Expand broadcasts x[4, 1] in place")
_STATIC_CAUSAL = ("with static lengths simplify folds the iota causal mask into a constant, so "
                  "lowering gives attention(q, k, v, const mask, causal=False)")
_LINEAR_AS_NEAREST = ("where a linear resize's floor index equals the nearest index "
                      "(4 -> 7: 0,0,1,2,2,3,4), nearest_rule claims that gather first and "
                      "linear_rule no longer sees a pair of gathers")
_SCALES = ("nearest_rule tries the size-derived step before torch's explicit scale; both give "
           "the same index here, so the kernel comes back with scales=None")
_SORTED_ONLY = ("the rules take a row's positions from a sort only (in range, each once); an "
                "index given as an input stays the flat gather or scatter")

# the linear-algebra kernels are emitted by the front end, never found by lowering
_EMITTED = ("the front end emits the kernel; lowering leaves its unrolled composition as is "
            "(tdag/ops/linalg/kernels.py says why)")

SYMBOLIC = 5
_BAG = {1: "int64", 2: "int64"}  # embedding_bag's indices and offsets (drawn 0: valid)
_INTS = {"int8": (-128, 128), "uint8": (0, 256), "int32": (-1000, 1000),  # drawn in range
         "int64": (0, 1)}  # node tables: every index 0, a one-node tree that is its own leaf

CASES = [
    Case(Op.softmax, Softmax(1), ((2, 5, 3),)),
    Case(Op.softmax, Softmax(2), ((2, 5, 3),)),
    Case(Op.log_softmax, Softmax(0), ((4, 6),)),
    Case(Op.log_softmax, Softmax(1), ((4, 6),)),
    Case(Op.gelu, Gelu("none"), ((3, 4),)),
    Case(Op.gelu, Gelu("tanh"), ((3, 4),)),
    Case(Op.softmax_backward, Softmax(1), ((2, 5, 3),) * 2),
    Case(Op.softmax_backward, Softmax(0), (("b", 6),) * 2),
    Case(Op.gelu_backward, Gelu("none"), ((3, 4),) * 2),
    Case(Op.gelu_backward, Gelu("tanh"), (("b", 4),) * 2),
    Case(Op.layer_norm_backward, LayerNorm(1, 1e-5), ((2, 3, 8),) * 2),
    Case(Op.layer_norm_backward, LayerNorm(2, 1e-6), ((2, 3, 8),) * 2),
    Case(Op.rms_norm_backward, RMSNorm(1, 1e-6), ((2, 3, 8),) * 2),
    Case(Op.rms_norm_backward, RMSNorm(2, 1e-5), (("b", 3, 8),) * 2),
    Case(Op.relu_backward, NoSpec(), ((3, 4),) * 2),
    Case(Op.clamp_backward, Clamp(0.0, 6.0), ((3, 4),) * 2),
    Case(Op.clamp_backward, Clamp(-0.5, None), (("b", 4),) * 2),
    Case(Op.silu_backward, NoSpec(), ((3, 4),) * 2),
    Case(Op.max_pool_backward, Pool((3, 3), (2, 2), (1, 1), (1, 1)), ((2, 3, 4, 4), (2, 3, 8, 8))),
    Case(Op.batch_norm_backward, BatchNorm(1e-3), ((2, 3, 4, 4), (3,), (3,)), positive=(1,)),
    Case(Op.batch_norm_backward, BatchNorm(1e-5), (("b", 3, 5), (3,), (3,)), positive=(1,)),
    Case(Op.max_pool_backward, Pool((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1)),
         (("b", 2, 2, 2, 2), ("b", 2, 4, 4, 4))),
    Case(Op.silu, NoSpec(), ((3, 4),)),
    Case(Op.sigmoid, NoSpec(), ((3, 4),)),
    Case(Op.relu, NoSpec(), ((3, 4),)),
    Case(Op.clamp, Clamp(-1.0, 2.0), ((3, 4),)),
    Case(Op.maximum, NoSpec(), ((3, 4), (3, 4))),
    Case(Op.minimum, NoSpec(), (("b", 4), ("b", 4))),
    Case(Op.clamp, Clamp(None, 1.5), ((3, 4),)),
    Case(Op.clamp, Clamp(-0.5, None), ((3, 4),)),
    Case(Op.hardswish, NoSpec(), ((3, 4),)),
    Case(Op.abs, NoSpec(), ((3, 4),)),
    Case(Op.leaky_relu, LeakyRelu(0.2), ((3, 4),)),
    Case(Op.elu, Elu(0.5), (("b", 4),)),
    Case(Op.elu, Elu(1.6732632, 1.050701), ((3, 4),), id="selu"),  # as float32 holds them
    Case(Op.elu, Elu(0.5, 1.0, 2.0), ((3, 4),), id="celu"),
    Case(Op.elu, Elu(0.7, 2.0, 0.5), ((3, 4),), id="scaled"),
    Case(Op.shrink, Shrink(0.3, soft=False), ((3, 4),)),
    Case(Op.shrink, Shrink(0.5, soft=True), (("b", 4),)),
    Case(Op.hardsigmoid, NoSpec(), ((3, 4),)),
    Case(Op.softplus, Softplus(2.0, 3.0), ((3, 4),)),
    Case(Op.mish, NoSpec(), ((3, 4),)),
    Case(Op.logsigmoid, NoSpec(), ((3, 4),)),
    Case(Op.rounding, Rounding("floor"), ((3, 4),)),
    Case(Op.rounding, Rounding("ceil"), (("b", 4),)),
    Case(Op.rounding, Rounding("half_even"), ((3, 4),)),
    Case(Op.log1p, NoSpec(), ((3, 4),), positive=(0,)),
    Case(Op.expm1, NoSpec(), (("b", 4),)),
    Case(Op.logaddexp, NoSpec(), ((3, 4), (3, 4))),
    Case(Op.atan2, NoSpec(), (("b", 4), ("b", 4))),
    Case(Op.hypot, NoSpec(), ((3, 4), (3, 4))),
    Case(Op.nan_to_num, NanToNum(0.0, 3.4028235e38, -3.4028235e38), (("b", 4),)),
    Case(Op.nan_to_num, NanToNum(1.5, 100.0, -7.0), ((3, 4),), id="values"),
    Case(Op.logsumexp, LogSumExp((1,)), ((3, 4),)),
    Case(Op.logsumexp, LogSumExp((0, 2), True), ((2, 3, 4),)),
    Case(Op.var, Variance((1,)), ((3, 4),)),
    Case(Op.var, Variance((0, 2), 0, True), ((2, 3, 4),)),
    Case(Op.vector_norm, VectorNorm(2.0, (1,)), ((3, 4),)),
    Case(Op.vector_norm, VectorNorm(2.0, (0, 2), True), ((2, 3, 4),)),
    Case(Op.layer_norm, LayerNorm(1, 1e-5), ((2, 3, 8), (8,), (8,))),
    Case(Op.layer_norm, LayerNorm(1, 1e-5), ((2, 3, 8), (8,)), id="weight only"),
    Case(Op.layer_norm, LayerNorm(2, 1e-6), ((2, 3, 8),)),
    Case(Op.rms_norm, RMSNorm(1, 1e-6), ((2, 8), (8,))),
    Case(Op.rms_norm, RMSNorm(2, 1e-5), ((2, 3, 8),)),
    Case(Op.group_norm, GroupNorm(2, 1e-5), ((2, 4, 5, 5), (4,), (4,))),
    Case(Op.group_norm, GroupNorm(4, 1e-5), ((2, 4, 6),)),
    Case(Op.batch_norm, BatchNorm(1e-5), ((2, 3, 4, 4), (3,), (3,), (3,), (3,)), positive=(2,)),
    Case(Op.batch_norm, BatchNorm(1e-3), ((2, 3, 5), (3,), (3,)), positive=(2,)),
    Case(Op.einsum, Einsum("ij,jk->ik"), ((3, 4), (4, 5))),
    Case(Op.einsum, Einsum("bij,bjk->bik"), ((2, 3, 4), (2, 4, 5))),
    Case(Op.einsum, Einsum("ij,kj->ik"), ((3, 4), (5, 4), (5,)), id="linear"),
    Case(Op.einsum, Einsum("bhld,bhsd->bhls"), ((2, 3, 4, 8), (2, 3, 5, 8))),
    Case(Op.conv, Conv((1, 1), (1, 1), (1, 1)), ((1, 3, 6, 6), (4, 3, 3, 3), (4,))),
    Case(Op.conv, Conv((2,), (0,), (1,)), ((2, 3, 9), (4, 3, 3))),
    Case(Op.conv, Conv((1, 1), (0, 0), (2, 2), 2), ((1, 4, 7, 7), (6, 2, 3, 3))),
    Case(Op.conv_transpose, ConvTranspose((2, 2), (1, 1), (1, 1), (1, 1)),
         ((1, 4, 5, 5), (4, 3, 3, 3), (3,))),
    Case(Op.conv_transpose, ConvTranspose((2,), (0,), (0,), (1,)), ((2, 3, 6), (3, 2, 4))),
    Case(Op.conv_weight_grad, ConvWeightGrad((3, 3), (2, 2), (1, 1), (1, 1)),
         ((2, 4, 5, 5), (2, 3, 9, 9))),
    Case(Op.conv_weight_grad, ConvWeightGrad((3,), (1,), (0,), (2,), 2),
         (("b", 6, 5), ("b", 4, 9))),
    Case(Op.adamw_update, AdamWUpdate(1e-3, 0.9, 0.999, 1e-8, 1e-2), ((4, 5),) * 4 + ((),),
         positive=(3, 4)),
    Case(Op.adamw_update, AdamWUpdate(0.1, 0.8, 0.95, 1e-6, 0.0), (("b", 3),) * 4 + ((),),
         positive=(3, 4), id="no weight decay"),
    Case(Op.reshape, Reshape((6, 4)), ((2, 3, 4),)),
    Case(Op.reshape, Reshape((2, 12)), ((2, 3, 4),)),
    Case(Op.expand, Expand((3, 4, 5)), ((4, 1),), xfail=_EXPAND_UNIT),
    Case(Op.expand, Expand((2, 3, 4)), ((2, 1, 4),)),
    Case(Op.concat, Concat(1), ((2, 3), (2, 4))),
    Case(Op.concat, Concat(0), ((1, 3), (2, 3), (3, 3))),
    Case(Op.quantize, Quantize(DType.i8), (("b", 5), (), ()), dtypes={2: "int8"}),
    Case(Op.quantize, Quantize(DType.u8, 1), ((2, 3, 4), (3,), (3,)), dtypes={2: "uint8"},
         positive=(1,)),
    Case(Op.quantize, Quantize(DType.u8), ((2, 3), ()), positive=(1,), id="no zero point"),
    Case(Op.dequantize, Dequantize(), ((4, 5), (), ()), dtypes={0: "int8", 2: "int8"}),
    Case(Op.dequantize, Dequantize(0), ((3, 5), (3,), (3,)), dtypes={0: "uint8", 2: "uint8"}),
    Case(Op.dequantize, Dequantize(), ((8,), (1,), ()), dtypes={0: "int32", 2: "int32"},
         id="i32 bias"),
    Case(Op.matmul_integer, MatMulInteger(True, True), (("b", 3, 8), (8, 5), (), ()),
         dtypes={0: "uint8", 1: "int8", 2: "uint8", 3: "int8"}),
    Case(Op.matmul_integer, MatMulInteger(False, True), ((4, 8), (8, 5), (5,)),
         dtypes={0: "int8", 1: "int8", 2: "int8"}, id="per column"),
    Case(Op.conv_integer, ConvInteger((1, 1), (1, 1), (1, 1), 1, True, True),
         ((2, 3, 6, 6), (4, 3, 3, 3), (), ()),
         dtypes={0: "uint8", 1: "int8", 2: "uint8", 3: "int8"}),
    Case(Op.conv_integer, ConvInteger((2, 2), (0, 0), (1, 1), 2), ((1, 4, 7, 7), (2, 2, 2, 2)),
         dtypes={0: "int8", 1: "int8"}, id="grouped, no zero points"),
    *[Case(Op.dynamic_quantize, DynamicQuantize(part), ((3, 5),), id=f"part {part}")
      for part in range(3)],
    Case(Op.qlinear_conv, QLinearConv((1, 1), (1, 1), (1, 1), 1, True),
         ((2, 3, 6, 6), (), (), (4, 3, 3, 3), (4,), (), (), (), (4,)), positive=(1, 4, 6),
         dtypes={0: "uint8", 2: "uint8", 3: "int8", 5: "int8", 7: "uint8", 8: "int32"}),
    Case(Op.qlinear_conv, QLinearConv((2, 2), (0, 0), (1, 1), 2), ((1, 4, 7, 7), (), (),
         (2, 2, 2, 2), (), (), (), ()), positive=(1, 4, 6),
         dtypes={0: "int8", 2: "int8", 3: "int8", 5: "int8", 7: "int8"}, id="grouped"),
    Case(Op.qlinear_matmul, QLinearMatMul(), (("b", 3, 8), (), (), (8, 5), (5,), (5,), (), ()),
         positive=(1, 4, 6), dtypes={0: "uint8", 2: "uint8", 3: "int8", 5: "int8", 7: "uint8"}),
    Case(Op.tree_sum, TreeSum(2), ((3, 4), (5,), (5,), (5,), (5,), (2,), (5, 3)),
         dtypes={1: "int64", 3: "int64", 4: "int64", 5: "int64"}),
    Case(Op.tree_sum, TreeSum(3, ("BRANCH_LEQ", "BRANCH_GT"), True),
         ((3, 4), (5,), (5,), (5,), (5,), (2,), (5, 3), (5,), (5,), (5,)),
         dtypes={1: "int64", 3: "int64", 4: "int64", 5: "int64", 7: "bool", 8: "bool",
                 9: "bool"}, id="modes and NaN"),
    *[Case(Op.normalize_rows, Normalize(norm), ((4, 5),), id=norm)
      for norm in ("MAX", "L1", "L2")],
    *[Case(Op.svm_scores, SvmScores(kernel, *params, wide),
           ((4, 3), (5, 3), (5, 2 if wide else 1), (2 if wide else 1,)),
           id=f"{kernel} {'pairs' if wide else 'target'}")
      for kernel, params, wide in (("RBF", (0.5, 0.0, 0.0), True),
                                   ("POLY", (0.5, 0.25, 3.0), False),
                                   ("SIGMOID", (0.5, 0.25, 0.0), True),
                                   ("LINEAR", (0.0, 0.0, 0.0), True))],
    Case(Op.svm_label, SvmLabel((1, 3, 5, 7)), (("b", 6),), id="four classes"),
    Case(Op.svm_label, SvmLabel((0, 1)), (("b", 1),), id="binary"),
    *[Case(Op.linear_classifier, spec, (("b", 3), (3, 4), (4,)), id=name)
      for name, spec in (("label", LinearClassify(labels=(7, 3, 5, 1))),
                         ("softmax", LinearClassify("SOFTMAX")),
                         ("logistic", LinearClassify("LOGISTIC")))],
    Case(Op.attention, Attention(0.5), ((2, 4, 8), (2, 6, 8), (2, 6, 8))),
    Case(Op.attention, Attention(0.25, causal=True), ((2, "l", 8), (2, "l", 8), (2, "l", 4))),
    Case(Op.attention, Attention(0.25, causal=True), ((2, "l", 8), (2, "s", 8), (2, "s", 4))),
    Case(Op.attention, Attention(0.25, causal=True), ((2, 2, 5, 8), (2, 2, 5, 8), (2, 2, 5, 4)),
         id="static causal", xfail=_STATIC_CAUSAL),
    Case(Op.attention, Attention(0.5), ((2, 4, 8), (2, 6, 8), (2, 6, 8), (4, 6)),
         dtypes={3: "bool"}, id="bool mask"),
    Case(Op.attention, Attention(0.5), ((2, 4, 8), (2, 6, 8), (2, 6, 8), (2, 4, 6)),
         id="float mask"),
    Case(Op.lstm, Lstm(), _lstm_shapes((5, 2, 3), 4, [3])),
    Case(Op.lstm, Lstm(reverse=True), _lstm_shapes((5, 2, 3), 4, [3])),
    Case(Op.lstm, Lstm(bidirectional=True), _lstm_shapes((4, 2, 3), 4, [3, 3])),
    Case(Op.lstm, Lstm(layers=2), _lstm_shapes((4, 2, 3), 4, [3, 4])),
    Case(Op.max_pool, Pool((2, 2), (2, 2), (0, 0), (1, 1)), ((1, 2, 6, 6),)),
    Case(Op.max_pool, Pool((3,), (2,), (1,), (1,)), ((2, 3, 9),)),
    Case(Op.max_pool, Pool((3, 3), (2, 2), (1, 1), (1, 1)), ((1, 2, 7, 7),),
         dtypes={0: "int8"}, id="int8, padded with -128"),
    Case(Op.avg_pool, Pool((2, 2), (2, 2), (0, 0), (1, 1)), ((1, 2, 6, 6),)),
    Case(Op.avg_pool, Pool((3, 3), (2, 2), (1, 1), (1, 1), exclude_pad=True), ((1, 2, 7, 7),)),
    Case(Op.resize, Resize("nearest", (8, 8)), ((1, 2, 4, 4),)),
    Case(Op.resize, Resize("linear", (8, 8)), ((1, 2, 4, 4),)),
    Case(Op.resize, Resize("linear", (8, 8), align_corners=True), ((1, 2, 4, 4),)),
    Case(Op.resize, Resize("linear", (7,)), ((1, 2, 4),)),
    Case(Op.resize, Resize("linear", (6, 7)), ((1, 2, 4, 5),), xfail=_LINEAR_AS_NEAREST),
    Case(Op.resize, Resize("linear", (7, 7), align_corners=True), ((1, 2, 4, 4),),
         xfail=_LINEAR_AS_NEAREST),
    Case(Op.resize, Resize("nearest", (10,), scales=(2.5,)), ((1, 2, 4),), xfail=_SCALES),
    Case(Op.topk, TopK(1, 3, True), ((2, 9, 4),)),
    Case(Op.topk, TopK(0, 7, False), ((7,),), id="the sorted values"),
    Case(Op.topk, TopK(1, 3, False, True), ((2, 9, 4),), id="positions"),
    Case(Op.topk, TopK(1, 5, True), ((2, 5),), id="the sorted values"),
    Case(Op.argmax, Arg(1), ((3, 8),)),
    Case(Op.argmin, Arg(0), ((8, 3),)),
    Case(Op.argmax, Arg(1), ((3, 8),), dtypes={0: "int64"}),
    Case(Op.cum_extreme, CumExtreme(1, "max"), ((3, 8),)),
    Case(Op.cum_extreme, CumExtreme(0, "min", True), ((8, 3),), id="positions"),
    Case(Op.cum_extreme, CumExtreme(1, "max", True), ((3, 8),), dtypes={0: "int32"},
         id="integer positions"),
    Case(Op.bincount, NoSpec(), ((6,), (20,)), dtypes={0: "int32", 1: "int64"}),
    Case(Op.bincount_sized, BincountSized("u0"), ((20,),), dtypes={0: "int64"}),
    Case(Op.histc, Histc(8, -2.0, 2.0), ((5, 6),)),
    Case(Op.histc, Histc(4, 0.0, 3.0), (("n",),), id="experts"),
    Case(Op.bincount_sized, BincountSized("u0", 5), (("n",),), dtypes={0: "int64"},
         id="minlength"),
    Case(Op.write_slice, WriteSlice(1, 2), ((3, 6, 4), (3, 1, 4))),
    Case(Op.write_slice, WriteSlice(0, 0), ((5, 2), (3, 2)), id="leading run"),
    Case(Op.grouped_mm, NoSpec(), ((7, 4), (3, 4, 5), (3,)), dtypes={2: "int32"}),
    Case(Op.searchsorted, SearchSorted(), ((9,), (3, 5))),
    Case(Op.searchsorted, SearchSorted(True), ((2, 9), (2, 4)), id="batched boundaries"),
    Case(Op.take_along, Along(1), ((3, 6), (3, 6)), dtypes={1: "int64"}, xfail=_SORTED_ONLY),
    Case(Op.put_along, Along(1), ((3, 6), (3, 6), (3, 6)), dtypes={1: "int64"},
         xfail=_SORTED_ONLY),
    Case(Op.logcumsumexp, LogCumSumExp(1), ((3, 8),)),
    Case(Op.logcumsumexp, LogCumSumExp(0, True), ((8, 3),)),
    Case(Op.fft_of_real, FftOfReal(1, 8), ((3, 8),)),
    Case(Op.fft_of_real, FftOfReal(0, 7, FftNorm.ortho), ((7, 2),), id="odd length"),
    Case(Op.embedding_bag, EmbeddingBag("sum"), ((7, 3), (9,), (4,)), dtypes=_BAG),
    Case(Op.embedding_bag, EmbeddingBag("mean", True, 0), ((7, 3), (9,), (4,)), dtypes=_BAG,
         id="last offset, padding"),
    Case(Op.embedding_bag, EmbeddingBag("max"), ((7, 3), ("n",), ("b",)), dtypes=_BAG),
    Case(Op.embedding_bag, EmbeddingBag("sum"), ((7, 3), (9,), (4,), (9,)), dtypes=_BAG,
         id="per-sample weights"),
    # random operands: Cholesky of a positive 1x1, eigh of a 1x1 and SVD of a column, where
    # the vectors' signs are LAPACK's too (tests/lower/test_linalg_kernels.py: larger ones)
    Case(Op.linalg_inv, NoSpec(), ((2, 4, 4),), xfail=_EMITTED),
    Case(Op.linalg_solve, Side(), ((2, 4, 4), (2, 4, 3)), xfail=_EMITTED),
    Case(Op.linalg_solve, Side(False), ((4, 4), (3, 4)), xfail=_EMITTED),
    Case(Op.linalg_cholesky, Triangle(), ((3, 1, 1),), positive=(0,), xfail=_EMITTED),
    Case(Op.linalg_det, NoSpec(), ((2, 4, 4),), xfail=_EMITTED),
    Case(Op.linalg_slogdet, NoSpec(), ((2, 4, 4),), xfail=_EMITTED),
    Case(Op.linalg_eigh, Triangle(True), ((3, 1, 1),), xfail=_EMITTED),
    Case(Op.linalg_svd, NoSpec(), ((2, 3, 1),), xfail=_EMITTED),
    Case(Op.linalg_qr, NoSpec(), ((2, 5, 3),), xfail=_EMITTED),
    Case(Op.linalg_solve_triangular, TriangularSolve(True, False, True), ((4, 4), (3, 4)),
         xfail=_EMITTED),
    Case(Op.linalg_eig, NoSpec(), ((2, 4, 4),), xfail=_EMITTED),
    Case(Op.linalg_ldl_factor, Ldl(), ((2, 4, 4),), xfail=_EMITTED),
    Case(Op.linalg_ldl_solve, Ldl(), ((4, 4), (4,), (4, 2)), dtypes={1: "int32"},
         ints={1: (1, 5)}, xfail=_EMITTED),  # pivots: 1x1 blocks, any interchange
]

# kernels whose composition gives their result up to an implementation-defined order and
# phase (eig: torch's docs say so), so neither it nor its gradient equals the evaluator's
# entry by entry (tests/ops/test_eig_composition.py checks it gauge-free)
GAUGE_FREE = frozenset({Op.linalg_eig})


def case_id(case: Case) -> str:
    shapes = "x".join(str(list(s)) for s in case.shapes)
    return f"{case.op.value}-{case.id or case.spec}-{shapes}"


def draw_inputs(case: Case) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(zlib.crc32(case_id(case).encode()))
    out = []
    for i, spec in enumerate(case.specs()):
        shape = [SYMBOLIC if isinstance(d, str) else d for d in spec.shape]
        if spec.dtype in _INTS:
            low, high = case.ints.get(i, _INTS[spec.dtype])
            x = torch.randint(low, high, shape, generator=gen)
            out.append(x.to(getattr(torch, spec.dtype)))
        elif spec.dtype == "bool":
            mask = torch.rand(shape, generator=gen) > 0.3
            mask[..., 0] = True  # every query sees a key: the kernel's fully masked rows are
            out.append(mask)     # tested by the safe-softmax tests
        else:
            x = torch.randn(shape, generator=gen)
            out.append(x.abs() + 0.1 if i in case.positive else x)
    return out
