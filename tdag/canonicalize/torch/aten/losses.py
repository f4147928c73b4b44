"""Loss ops that reach the graph whole: cross-entropy and negative log-likelihood, and
torch's chunked linear + cross-entropy.

``F.cross_entropy`` exports as ``aten.cross_entropy_loss`` (a CompositeImplicitAutograd op
of the training IR) and ``F.nll_loss`` as ``aten.nll_loss_nd``; both are the composition
ATen's own kernels compute: the log-softmax over the class axis (1, or 0 for one sample),
the log-probability at each target picked out with its class weight, ``ignore_index``
targets weighing 0, and a mean that divides by the weights kept. Label smoothing adds the
mean over classes of the (weighted) negative log-probabilities; targets that are class
probabilities (a float target shaped as the input) weigh every class.

``F.linear_cross_entropy`` with chunking options calls torch_nn custom ops that compute the
loss (and, for training, its gradients) batch chunk by chunk to save memory. The forward
value is the plain composition: logits = linear(input), then the same negative
log-likelihood.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.indexing import gather
from tdag.canonicalize.torch.aten.registry import aten
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType

_MEAN, _SUM = 1, 2  # ATen's reduction enum; 0 is none


def _class_axis(x) -> int:
    return 1 if x.ndim >= 2 else 0


def _nll(logp, target, weight, ignore_index):
    """(loss, weight) at each target position: ``-weight[t] * logp[.., t, ..]`` along the
    class axis, both 0 where ``t == ignore_index``."""
    axis = _class_axis(logp)
    kept = ops.ne(target, ignore_index)
    safe = ops.where(kept, ops.cast(target, DType.i64), 0)
    picked = ops.squeeze(gather(logp, axis, ops.unsqueeze(safe, axis)), axis)
    w = ops.gather(weight, safe, 0) if weight is not None else ops.full(safe.shape, 1.0,
                                                                        logp.dtype, like=logp)
    w = ops.where(kept, w, 0.0)
    return ops.neg(ops.mul(picked, w)), w


def _reduced(loss, w, reduction: int):
    """ATen's reduction of a weighted loss: the mean divides by the weights kept."""
    if reduction == _MEAN:
        return ops.div(ops.sum(loss), ops.sum(w))
    return ops.sum(loss) if reduction == _SUM else loss


def _by_class(weight, x):
    """The class weights shaped to multiply ``x`` along its class axis."""
    shape = [1] * x.ndim
    shape[_class_axis(x)] = weight.shape[0]
    return ops.reshape(weight, tuple(shape))


@aten("nll_loss_nd", "nll_loss", "nll_loss2d")
def nll_loss(logp, target, weight=None, reduction=_MEAN, ignore_index=-100):
    return _reduced(*_nll(logp, target, weight, ignore_index), reduction)


@aten("cross_entropy_loss")
def cross_entropy(x, target, weight=None, reduction=_MEAN, ignore_index=-100,
                  label_smoothing=0.0):
    """ATen's ``cross_entropy_loss``: class indices, or class probabilities as the target."""
    logp = ops.log_softmax(x, _class_axis(x))
    if target.dtype.is_float:
        return _cross_entropy_probabilities(logp, target, weight, reduction, label_smoothing)
    loss, w = _nll(logp, target, weight, ignore_index)
    nll = _reduced(loss, w, reduction)
    if not label_smoothing:
        return nll
    # the smoothing term: the weighted sum over classes, 0 at ignored targets, reduced as
    # the nll (a mean divides by the same kept weights)
    spread = logp if weight is None else ops.mul(logp, _by_class(weight, logp))
    smooth = ops.where(ops.ne(target, ignore_index),
                       ops.neg(ops.sum(spread, _class_axis(logp))), 0.0)
    smooth = _reduced(smooth, w, reduction)
    classes = logp.shape[_class_axis(logp)]
    return ops.add(ops.mul(nll, 1 - label_smoothing),
                   ops.mul(smooth, label_smoothing / classes))


def _cross_entropy_probabilities(logp, target, weight, reduction: int, label_smoothing):
    """``-sum_c weight[c] * target[c] * logp[c]`` at each position; the mean is over the
    positions (not the weights), as ATen's."""
    axis = _class_axis(logp)
    if label_smoothing:
        target = ops.add(ops.mul(target, 1 - label_smoothing),
                         label_smoothing / logp.shape[axis])
    product = ops.mul(logp, target)
    if weight is not None:
        product = ops.mul(product, _by_class(weight, logp))
    loss = ops.neg(ops.sum(product, axis))
    if reduction == _MEAN:
        return ops.mean(loss)
    return ops.sum(loss) if reduction == _SUM else loss


def _per_row(x, linear_weight, target, linear_bias, weight, ignore_index):
    """(loss per row, weight per row): input [B, F], target [B]; ignored rows weigh 0."""
    logp = ops.log_softmax(ops.linear(x, linear_weight, linear_bias), -1)
    return _nll(logp, target, weight, ignore_index)


@aten("torch_nn::_linear_cross_entropy_batch_chunked")
def linear_cross_entropy(x, linear_weight, target, linear_bias, weight, reduction,
                         ignore_index, label_smoothing, *options):
    """(loss, and three gradients that only training computes: not produced)."""
    if label_smoothing:
        raise UnsupportedOpError("chunked linear_cross_entropy with label smoothing")
    loss, w = _per_row(x, linear_weight, target, linear_bias, weight, ignore_index)
    return _reduced(loss, w, _MEAN if reduction == "mean" else _SUM), None, None, None


@aten("torch_nn::_linear_cross_entropy_batch_chunked_no_reduction")
def linear_cross_entropy_rows(x, linear_weight, target, linear_bias, weight, ignore_index,
                              *options):
    return _per_row(x, linear_weight, target, linear_bias, weight, ignore_index)[0]
