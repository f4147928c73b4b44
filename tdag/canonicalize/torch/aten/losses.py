"""Loss ops that reach the graph whole: torch's chunked linear + cross-entropy.

``F.linear_cross_entropy`` with chunking options calls torch_nn custom ops that compute the
loss (and, for training, its gradients) batch chunk by chunk to save memory. The forward
value is the plain composition: logits = linear(input), then weighted negative
log-likelihood of the targets, with ``ignore_index`` rows left out.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.indexing import gather
from tdag.canonicalize.torch.aten.registry import aten
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType


def _per_row(x, linear_weight, target, linear_bias, weight, ignore_index):
    """(loss per row, weight per row): input [B, F], target [B]; ignored rows weigh 0."""
    logp = ops.log_softmax(ops.linear(x, linear_weight, linear_bias), -1)
    kept = ops.ne(target, ignore_index)
    safe = ops.where(kept, ops.cast(target, DType.i64), 0)
    picked = ops.squeeze(gather(logp, 1, ops.unsqueeze(safe, 1)), 1)
    w = ops.gather(weight, safe, 0) if weight is not None else ops.full(safe.shape, 1.0,
                                                                        logp.dtype, like=x)
    w = ops.where(kept, w, 0.0)
    return ops.neg(ops.mul(picked, w)), w


@aten("torch_nn::_linear_cross_entropy_batch_chunked")
def linear_cross_entropy(x, linear_weight, target, linear_bias, weight, reduction,
                         ignore_index, label_smoothing, *options):
    """(loss, and three gradients that only training computes: not produced)."""
    if label_smoothing:
        raise UnsupportedOpError("chunked linear_cross_entropy with label smoothing")
    loss, w = _per_row(x, linear_weight, target, linear_bias, weight, ignore_index)
    total = ops.sum(loss)
    loss = ops.div(total, ops.sum(w)) if reduction == "mean" else total
    return loss, None, None, None


@aten("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def linear_cross_entropy_rows(x, linear_weight, target, linear_bias, weight, ignore_index,
                              *options):
    return _per_row(x, linear_weight, target, linear_bias, weight, ignore_index)[0]
