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


def usable(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether oneDNN's call computes this product as torch would (see the module's text);
    ``w`` has ``x``'s dtype (the op's type rule)."""
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or
                                    (bias is not None and bias.requires_grad)):
        return False
    return _AVAILABLE and x.dtype is torch.float32 and x.is_cpu and \
        not torch.compiler.is_compiling() and not torch.jit.is_tracing()


def packed(packs: dict | None, key: str | None, w: torch.Tensor,
           pack: Callable[..., torch.Tensor], *args) -> torch.Tensor:
    """The pack of ``w`` kept under ``key``, made by ``pack(w, *args)`` when there is none or
    ``w`` changed since; ``w`` itself where the module keeps no packs, under a dispatch mode
    (a MemTracker or FlopCounterMode reads every result's storage, and a pack has none), and
    for an inference tensor (it keeps no version counter to stamp)."""
    if packs is None or torch._C._len_torch_dispatch_stack() or w.is_inference():
        return w
    # the packing function too: one library's pack handed to the other's call would be read
    # as a layout it is not (MKL's sgemm reading oneDNN's blocks crashes the process)
    stamp = (w.data_ptr(), w._version, w.shape, w.stride(), pack)
    kept = packs.get(key)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    made = pack(w, *args)
    # the weight's storage is held with its pack: freed, its address could come back as
    # another weight's with the same version, shape and strides
    packs[key] = (stamp, made, w.untyped_storage())
    return made


def _rows(x: torch.Tensor) -> int:
    """The rows of the product of ``x`` (all but its last axis), at least 1."""
    return max(x.numel() // max(x.shape[-1], 1), 1)


def _pack_linear(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(w, _rows(x))


def _pack_mkl(w: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(w, rows)


def _packed_product(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None,
                    packs: dict | None, key: str | None, post: tuple) -> torch.Tensor:
    """``F.linear(x, w, bias)`` then ``post`` on ``w`` packed under ``key``: MKL's packed
    sgemm where ``MKL_PACKED`` and both widths reach ``MKL_MIN_FEATURES`` (``post`` then
    applied in place), else oneDNN's inner product with ``post`` inside. MKL's call runs
    F.linear's where ``x`` has other rows than the pack was made for."""
    if MKL_PACKED and w.shape[0] >= MKL_MIN_FEATURES and w.shape[1] >= MKL_MIN_FEATURES:
        rows = _rows(x)
        y = _MKL_LINEAR(x, packed(packs, key, w, _pack_mkl, rows), w, bias, rows)
        return activation(y, post, inplace=True)
    return _LINEAR(x, packed(packs, key, w, _pack_linear, x), bias, post[0], post[1], post[2])


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
           key: str | None = None, post: tuple = NO_POST) -> torch.Tensor:
    """``F.conv2d`` then the activation ``post``, by oneDNN on a prepacked weight where ``x``
    is channels-last (the layout F.conv2d's result then has, and a prepacked call's always
    has); by F.conv2d elsewhere."""
    if not (usable(x, w, bias) and _channels_last(x)):
        return activation(F.conv2d(x, w, bias, stride, padding, dilation, groups), post)
    w = packed(packs, key, w, _pack_conv, x, stride, padding, dilation, groups)
    return _CONV(x, w, bias, padding, stride, dilation, groups, post[0], post[1], post[2])


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
            post: tuple = NO_POST) -> torch.Tensor:
    """A 1x1 convolution of stride 1, no padding and one group (``conv2d`` of those) as a
    product of the image's rows: ``x``'s (N, H, W, C) view, which channels-last storage
    makes contiguous; the result's (N, C, H, W) view is channels-last in turn."""
    if not (usable(x, w, bias) and _channels_last(x)):
        return activation(F.conv2d(x, w, bias), post)
    rows, w2 = x.permute(0, 2, 3, 1), w.flatten(1)
    if x.numel() * w.shape[0] >= POINTWISE_PACK_MACS:
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
    name, _, algorithm = post
    if name == "none":
        return y
    if name == "swish":
        return F.silu(y, inplace=inplace)
    if name == "hardswish":
        return F.hardswish(y, inplace=inplace)
    if name == "gelu":
        gelu = torch.ops.aten.gelu_ if inplace else torch.ops.aten.gelu
        return gelu(y, approximate=algorithm or "none")
    raise ValueError(f"oneDNN post-op {name!r} has no torch equivalent here")


__all__ = ["NO_POST", "activation", "conv1x1", "conv2d", "linear", "packed", "usable"]
