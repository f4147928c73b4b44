"""The lowering pipeline: the named passes and the default order ``lower`` runs them in."""
from __future__ import annotations

from typing import Sequence

from tdag.ir.program import Program
from tdag.lower import (
    activations,
    attention,
    backward,
    cnn_backward,
    contraction,
    conv,
    experts,
    fft,
    fold,
    ml,
    movement,
    norms,
    optim,
    pool,
    quant,
    recurrent,
    resize,
    scans,
    softmax,
    two_operand,
    sorting,
    writes,
)
from tdag.refine.join_calls import join_calls
from tdag.lower.passes import Pass, register_default, rule_pass, run_passes
from tdag.lower.recurrent_loop import lower_recurrent_loops
from tdag.refine.simplify import PIPELINE as SIMPLIFY
from tdag.refine.simplify import PassManager

PASSES: dict[str, Pass] = {
    # fold constants (masks, positions), merge common subexpressions, drop dead code: work
    # the source model repeats on every call is done once here
    "simplify": PassManager(SIMPLIFY),
    # before the others take the compositions apart: Q/DQ and MatMulInteger stay integer ops
    "quant": rule_pass(*quant.RULES),
    # before the movement rules take the stack of the update's three results apart
    "optim": rule_pass(*optim.RULES),
    # a forest's walk, before its gathers and selects become movement kernels; an embedding
    # bag, before bincount takes its count of the offsets
    "ml": rule_pass(*ml.RULES, *writes.BAG_RULES),
    # before contraction makes the product of gathered expert matrices an einsum
    "experts": rule_pass(*experts.RULES),
    "contraction": rule_pass(*contraction.RULES),
    # the input gradients of relu, clamp, silu, max pooling and batch norm, while the forward
    # masks they read are still compositions (before activations and pool make them kernels)
    "cnn_backward": rule_pass(*cnn_backward.RULES),
    "activations": rule_pass(*activations.RULES),
    # the input gradients of softmax and gelu, before softmax's rule takes their exp apart
    "backward": rule_pass(*backward.RULES),
    "softmax": rule_pass(*softmax.RULES),
    # logaddexp and atan2, whose compositions hold the kernels the activations pass makes
    "two_operand": rule_pass(*two_operand.RULES),
    # the n log n family: sorts, scans, scatters, a real signal's full spectrum
    "sorting": rule_pass(*sorting.RULES, *scans.RULES, *writes.RULES, *fft.RULES),
    "norms": rule_pass(*norms.RULES),
    # torch.var and torch.linalg.vector_norm, once the norms' rules have read the
    # compositions they hold
    "variance": rule_pass(*norms.VARIANCE_RULES),
    "vector_norm": rule_pass(*norms.VECTOR_NORM_RULES),
    "conv": rule_pass(*conv.RULES),
    "pool": rule_pass(*pool.RULES),
    "resize": rule_pass(*resize.RULES),
    "attention": rule_pass(*attention.RULES),
    "movement": rule_pass(*movement.RULES),
    "recurrent": rule_pass(*recurrent.RULES),
    # Program level: a Loop running an LSTM cell (from_torch's nn.LSTM) -> a kernel call
    "recurrent_loops": lower_recurrent_loops,
    # Program level: neighbouring calls as one TDAG, so the passes above see across them
    "join_calls": join_calls,
    "fuse": rule_pass(*contraction.FUSE_RULES, *conv.FUSE_RULES, *norms.AFFINE_RULES),
    # FINAL: a convolution of a concatenation as a sum over its pieces (any kernel, for the
    # ONNX file; 1x1 alone, for the torch module)
    "split_concat": rule_pass(*conv.SPLIT_RULES),
    "split_concat_1x1": rule_pass(*conv.SPLIT_1X1_RULES),
    # FINAL: batch norms and channel scales into fixed conv / linear weights, exact cast
    # chains, nodes of weights alone into consts (a deployment optimiser's folds)
    "fold": fold.FOLD,
    # the same on consts alone: to_torch's module keeps its parameters and buffers
    "fold_consts": fold.FOLD_CONSTS,
}

DEFAULT = ("simplify", "quant", "optim", "ml", "experts", "contraction", "cnn_backward",
           "activations", "backward", "softmax", "two_operand", "sorting", "norms", "variance",
           "vector_norm", "conv", "pool", "resize", "attention", "movement", "fuse",
           "recurrent", "recurrent_loops", "join_calls")
# after DEFAULT's fixed point, so that no rule (an LSTM's, a quantized kernel's template)
# finds its weights already folded
FINAL = ("split_concat", "fold")


register_default(PASSES, DEFAULT)


def lower(prog: Program, passes: Sequence[str] = DEFAULT, check: bool = False,
          final: Sequence[str] = FINAL) -> Program:
    """Replace recognised patterns by kernels, running ``passes`` to a fixed point, then
    ``final`` to its own.

    The result is a valid Program with the same outputs under ``tdag.run``."""
    prog = run_passes(prog, passes, PASSES, check=check)
    return run_passes(prog, final, PASSES, check=check) if final else prog
