"""oneDNN's and MKL's float32 CPU products and oneDNN's 2-d convolutions, as the reified
torch code calls them (``_rt.linear``, ``_rt.conv1x1``, ``_rt.conv2d``): the weight prepacked
once into the library's blocked layout, and for oneDNN an activation applied inside the call
(a post-op).

Prepacking is most of the gain. On an AMD EPYC core oneDNN's inner product on a prepacked
weight runs the products of the benchmark's transformers at 99-104 GFLOP/s against the
83-95 of the MKL sgemm F.linear calls (a [128, 512] x [512, 2048] projection 2.71 against
3.25 ms). On an Intel Xeon core MKL's own prepacked sgemm (``cblas_sgemm_compute``, what
torch.compile's frozen graphs call) is faster still: see ``MKL_PACKED``. A convolution on a
prepacked weight skips the weight's reorder on every call (MobileNet-v2's 52 convolutions
11% faster). The packs are a cache beside the weights, not the weights:
``state_dict``, ``load_state_dict``, ``.to()`` and autograd see the module's own tensors.

A pack is made on the first call that can use it and kept in the module's ``_tdag_packs``
under its call's key, stamped with the weight's storage, version counter, shape and strides
and the function that packed it; a call whose weight no longer matches the stamp
(``load_state_dict``, an in-place update, another tensor) packs again. A write the version
counter does not see (through ``param.data``) is not seen: call ``module.tdag_unpack()``
after one. The packs hold a second copy of each packed weight; ``to_torch(prog,
prepack=False)`` keeps none.

The oneDNN calls are taken only where they compute what torch computes: float32 tensors on
the CPU, autograd not recording (oneDNN's ops have no derivative), outside
``torch.compile``/``torch.export`` and ``torch.jit.trace`` (which record torch's own ops:
a traced graph holding a pack could not be saved). Elsewhere the same call runs
``F.linear``/``F.conv2d`` and the activation. Under a dispatch mode (a MemTracker, a
FlopCounterMode: they read every result's storage, and a pack has none) the oneDNN call
reads the weight unpacked.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from tdag.lower.kernels.activations import gelu_tanh
from tdag.lower.kernels.norms import batch_norm_affine, eval_batch_norm

_AVAILABLE = torch.backends.mkldnn.is_available()
NO_POST = ("none", [], "")  # (oneDNN's post-op name, its scalars, its algorithm)
_LINEAR = torch.ops.mkldnn._linear_pointwise.default
_CONV = torch.ops.mkldnn._convolution_pointwise.default
_CHANNELS_LAST = torch.channels_last
_MKL_LINEAR = torch.ops.mkl._mkl_linear.default if torch._C.has_mkl else None


def _intel_cpu() -> bool:
    """Whether the CPU is Intel's (``vendor_id`` in /proc/cpuinfo; False where unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return "GenuineIntel" in line
    except OSError:
        pass
    return False


# MKL's prepacked sgemm computes what F.linear computes, bit for bit (the same kernels,
# without packing the weight on every call), and on an Intel Xeon (Sapphire Rapids) core it
# beats oneDNN's prepacked inner product from 128 input and 128 output features: the
# benchmark's transformers' modules ran 3-18% faster with it (an activation then applied by
# torch, in place), ConvNeXt's 4% with its [1024, 256] x [256, 64] product left to oneDNN (its
# 64 outputs: 355 against 320 us) and 7% slower without that exception; each call timed
# right after an eager one. On other CPUs it is not taken: on an AMD EPYC core, where MKL
# takes slower paths, oneDNN's product was the faster (the module's text).
MKL_PACKED = _MKL_LINEAR is not None and _intel_cpu()
MKL_MIN_FEATURES = 128

# The checks below run on every call: MobileNet-v2 makes 52 convolution calls of 30-45 us,
# of which the first form of these helpers took 7.5 us in Python; they take about 3 now
# (attribute reads ordered cheapest first, the 1x1 form chosen when the code is written).


def usable(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
           norm: tuple | None = None) -> bool:
    """Whether oneDNN's call computes this product as torch would (see the module's text);
    ``w`` has ``x``'s dtype (the op's type rule). ``norm``: a batch norm folded into it."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad
                                       for t in (x, w, bias, *(norm or ())[:4])):
        return False
    return _AVAILABLE and x.dtype is torch.float32 and x.is_cpu and \
        not torch.compiler.is_compiling() and not torch.jit.is_tracing()


def packed(packs: dict | None, key: str | None, w: torch.Tensor,
           pack: Callable[..., torch.Tensor], *args, also: tuple = ()) -> torch.Tensor:
    """The pack of ``w`` kept under ``key``, made by ``pack(w, *args)`` when there is none or
    ``w`` (or a tensor of ``also``, which the pack is made from too) changed since; ``w``
    itself where the module keeps no packs, under a dispatch mode (a MemTracker or
    FlopCounterMode reads every result's storage, and a pack has none), and for an inference
    tensor (it keeps no version counter to stamp)."""
    sources = (w, *also)
    if packs is None or torch._C._len_torch_dispatch_stack() or \
            any(t.is_inference() for t in sources):
        return w
    # the packing functions too: one library's pack handed to the other's call would be read
    # as a layout it is not (MKL's sgemm reading oneDNN's blocks crashes the process)
    stamp = (pack, *(a for a in args if callable(a)),
             *((t.data_ptr(), t._version, t.shape, t.stride()) for t in sources))
    kept = packs.get(key)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    made = pack(w, *args)
    # the sources' storages are held with the pack: freed, an address could come back as
    # another tensor's with the same version, shape and strides
    packs[key] = (stamp, made, [t.untyped_storage() for t in sources])
    return made


# -- a batch norm folded into the convolution before it -----------------------------------------
# ``norm`` = (mean, var, weight, bias, eps) of an eval-mode batch norm (weight and bias may be
# None) that alone reads a convolution's result: with packs, the convolution runs on its
# weight scaled per output channel and a shifted bias, packed once (one pass over the image
# fewer: MobileNet-v2's 52 norms took 15% of its module's time); without, the norm is
# written over the convolution's fresh result.

def _norm_sources(bias: torch.Tensor | None, norm: tuple) -> tuple:
    """The tensors a folded pack is made from besides the weight."""
    return tuple(t for t in (bias, *norm[:4]) if t is not None)


def _fold_norm(w: torch.Tensor, bias: torch.Tensor | None, norm: tuple,
               pack: Callable | None, *args) -> tuple:
    """(the weight with the norm folded in, packed by ``pack(w, *args)`` where given; the
    folded weight; the folded bias), in ``w``'s dtype and layout."""
    scale, shift = batch_norm_affine(*norm)
    if bias is not None:
        shift = shift + bias.double() * scale
    folded = (w.double() * scale.view((-1,) + (1,) * (w.dim() - 1))).to(w.dtype)
    return (pack(folded, *args) if pack else folded), folded, shift.to(w.dtype)


def _folded(packs: dict | None, key: str | None, w: torch.Tensor, bias: torch.Tensor | None,
            norm: tuple, pack: Callable | None, *args) -> tuple | None:
    """``_fold_norm``'s (packed, weight, bias), kept under ``key`` and stamped with every
    tensor it is made from; None where ``packed`` keeps no pack."""
    made = packed(packs, key, w, _fold_norm, bias, norm, pack, *args,
                  also=_norm_sources(bias, norm))
    return None if made is w else made


def batch_norm(y: torch.Tensor, norm: tuple | None, inplace: bool = False,
               axis: int = 1) -> torch.Tensor:
    """The eval-mode batch norm ``norm`` of ``y`` over ``axis`` (None: ``y``); ``inplace``
    writes it over ``y`` (a fresh result autograd does not record)."""
    if norm is None:
        return y
    if not inplace:
        return eval_batch_norm(y, *norm)
    scale, shift = batch_norm_affine(*norm)
    shape = [1] * y.dim()
    shape[axis] = -1
    return y.mul_(scale.to(y.dtype).view(shape)).add_(shift.to(y.dtype).view(shape))


def _rows(x: torch.Tensor) -> int:
    """The rows of the product of ``x`` (all but its last axis), at least 1."""
    return max(x.numel() // max(x.shape[-1], 1), 1)


def _pack_linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, _rows(x))


def _pack_mkl(w: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(w, rows)


def mkl_takes(shape) -> bool:
    """Whether a product on a weight of ``shape`` runs MKL's packed sgemm: ``MKL_PACKED`` and
    both of its widths at least ``MKL_MIN_FEATURES``."""
    return MKL_PACKED and shape[0] >= MKL_MIN_FEATURES and shape[1] >= MKL_MIN_FEATURES


def _mkl(w: torch.Tensor) -> bool:
    return mkl_takes(w.shape)


def _product_packing(x: torch.Tensor, w: torch.Tensor) -> tuple:
    """(the packing function, its arguments) of the product of ``x`` and ``w``."""
    return (_pack_mkl, _rows(x)) if _mkl(w) else (_pack_linear, x)


def _run_product(x: torch.Tensor, packed_w: torch.Tensor, w: torch.Tensor,
                 bias: torch.Tensor | None, post: tuple) -> torch.Tensor:
    """``F.linear(x, w, bias)`` then ``post`` on ``packed_w`` (``w`` packed, or ``w``): MKL's
    packed sgemm (``post`` then applied in place; F.linear's call where ``x`` has other rows
    than the pack was made for) or oneDNN's inner product with ``post`` inside."""
    if _mkl(w):
        y = _MKL_LINEAR(x, packed_w, w, bias, _rows(x))
        return activation(y, post, inplace=True)
    return _LINEAR(x, packed_w, bias, post[0], post[1], post[2])


def _packed_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                    packs: dict | None, key: str | None, post: tuple) -> torch.Tensor:
    """``F.linear(x, w, bias)`` then ``post`` on ``w`` packed under ``key``: MKL's packed
    sgemm where ``_mkl``, else oneDNN's inner product."""
    return _run_product(x, packed(packs, key, w, *_product_packing(x, w)), w, bias, post)


def _pack_conv(w, x, stride, padding, dilation, groups) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_convolution_weight(w, padding, stride, dilation, groups,
                                                        list(x.shape))


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
           packs: dict | None = None, key: str | None = None,
           post: tuple = NO_POST) -> torch.Tensor:
    """``F.linear(x, w, bias)`` then the activation ``post``, by MKL or oneDNN where it can."""
    if not usable(x, w, bias):
        return activation(F.linear(x, w, bias), post)
    return _packed_product(x, w, bias, packs, key, post)


def conv2d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: list,
           padding: list, dilation: list, groups: int, packs: dict | None = None,
           key: str | None = None, post: tuple = NO_POST,
           norm: tuple | None = None) -> torch.Tensor:
    """``F.conv2d``, the batch norm ``norm`` (mean, var, weight, bias, eps) and the activation
    ``post``, by oneDNN on a prepacked weight (``norm`` folded into it) where ``x`` is
    channels-last (the layout F.conv2d's result then has, and a prepacked call's always
    has); by F.conv2d elsewhere."""
    if not (usable(x, w, bias, norm) and _channels_last(x)):
        y = F.conv2d(x, w, bias, stride, padding, dilation, groups)
        return activation(batch_norm(y, norm), post)
    conv = (x, stride, padding, dilation, groups)
    if norm is None:
        w = packed(packs, key, w, _pack_conv, *conv)
    elif (kept := _folded(packs, key, w, bias, norm, _pack_conv, *conv)) is not None:
        w, _, bias = kept
    else:
        y = _CONV(x, w, bias, padding, stride, dilation, groups, *NO_POST)
        return activation(batch_norm(y, norm, inplace=True), post, inplace=True)
    return _CONV(x, w, bias, padding, stride, dilation, groups, post[0], post[1], post[2])


# A 1-d convolution runs as oneDNN's 2-d one of a single row, on a prepacked weight with its
# activation inside, its result (N, C, W) stored as (N, W, C): channels-last, which the next
# 1-d convolution reads without a reorder and which a transpose to (N, W, C) (an audio
# encoder's frames, Whisper's) views without a copy. F.conv1d on (N, C, W) tensors reorders
# the input and the result on every call: Whisper's two convolutions and GELUs at the
# benchmark's shapes took 1.93 ms against 1.11.
def conv1d(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, stride: list,
           padding: list, dilation: list, groups: int, packs: dict | None = None,
           key: str | None = None, post: tuple = NO_POST) -> torch.Tensor:
    """``F.conv1d`` then the activation ``post``, by oneDNN on a prepacked weight (a
    channels-last result, see above) where it can; by F.conv1d elsewhere."""
    if not usable(x, w, bias):
        return activation(F.conv1d(x, w, bias, stride, padding, dilation, groups), post)
    row = x.unsqueeze(2)  # (N, C, 1, W): the (N, W, C) storage of a result above is channels-last
    if not row.is_contiguous(memory_format=_CHANNELS_LAST):
        row = row.contiguous(memory_format=_CHANNELS_LAST)
    conv = (row, [1, *stride], [0, *padding], [1, *dilation], groups)
    w4 = packed(packs, key, w, _pack_conv1d, *conv)
    if w4 is w:
        w4 = w.unsqueeze(2)
    y = _CONV(row, w4, bias, conv[2], conv[1], conv[3], groups, post[0], post[1], post[2])
    return y.squeeze(2)


def _pack_conv1d(w, row, stride, padding, dilation, groups) -> torch.Tensor:
    return _pack_conv(w.unsqueeze(2), row, stride, padding, dilation, groups)


# A 1x1 convolution of a channels-last image is a product of its (N * H * W, C) rows, which
# MKL's or oneDNN's inner product runs faster than a convolution does: MobileNet-v2's
# nineteen 1x1 shapes take 2.39 ms as F.linear against 3.00 by aten's convolution. oneDNN's
# prepacked product is faster still from 2**21 multiply-adds, most where the rows are few
# and the weight is large (MKL packs it on every call): [16, 160] rows to 960 channels,
# 87 against 103 us in a loop that evicts the caches; MobileNet-v2's module 4% faster than
# with the threshold at 2**22, ResNet's 1.7% (each call timed right after an eager one).
POINTWISE_PACK_MACS = 2 ** 21


def conv1x1(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
            packs: dict | None = None, key: str | None = None,
            post: tuple = NO_POST, norm: tuple | None = None) -> torch.Tensor:
    """A 1x1 convolution of stride 1, no padding and one group (``conv2d`` of those) as a
    product of the image's rows: ``x``'s (N, H, W, C) view, which channels-last storage
    makes contiguous; the result's (N, C, H, W) view is channels-last in turn. ``norm`` as
    ``conv2d``'s."""
    if not (usable(x, w, bias, norm) and _channels_last(x)):
        return activation(batch_norm(F.conv2d(x, w, bias), norm), post)
    rows, w2 = x.permute(0, 2, 3, 1), w.flatten(1)
    large = x.numel() * w.shape[0] >= POINTWISE_PACK_MACS
    packing = _product_packing(rows, w2) if large else (None,)
    if norm is not None and (kept := _folded(packs, key, w2, bias, norm, *packing)):
        packed_w, w2, bias = kept
        y = _run_product(rows, packed_w, w2, bias, post) if large else \
            activation(F.linear(rows, w2, bias), post, inplace=True)
    elif norm is not None:  # no pack: the norm written over the product's fresh result
        y = batch_norm(F.linear(rows, w2, bias), norm, inplace=True, axis=-1)
        y = activation(y, post, inplace=True)
    elif large:
        y = _packed_product(rows, w2, bias, packs, key, post)
    else:  # its fresh result activated in place: no second tensor, as inside a call
        y = activation(F.linear(rows, w2, bias), post, inplace=True)
    return y.permute(0, 3, 1, 2)


def _channels_last(x: torch.Tensor) -> bool:
    """Channels-last and not also (N, C, H, W)-contiguous (as an image of one pixel, or an
    empty one, is)."""
    return x.is_contiguous(memory_format=_CHANNELS_LAST) and not x.is_contiguous()


def activation(y: torch.Tensor, post: tuple, inplace: bool = False) -> torch.Tensor:
    """The post-op ``post`` as torch's own op, where oneDNN's call is not taken; ``inplace``
    writes it over ``y`` (a fresh result autograd does not record)."""
    name, scalars, algorithm = post
    if name == "none":
        return y
    if name == "leaky_relu":
        return F.leaky_relu(y, scalars[0], inplace=inplace)
    if name == "swish":
        return F.silu(y, inplace=inplace)
    if name == "hardswish":
        return F.hardswish(y, inplace=inplace)
    if name == "gelu" and algorithm == "tanh":
        return gelu_tanh(y)
    if name == "gelu":
        gelu = torch.ops.aten.gelu_ if inplace else torch.ops.aten.gelu
        return gelu(y, approximate=algorithm or "none")
    raise ValueError(f"oneDNN post-op {name!r} has no torch equivalent here")


__all__ = ["NO_POST", "activation", "batch_norm", "conv1d", "conv1x1", "conv2d", "linear",
           "mkl_takes", "packed", "usable"]
