"""Convolutions and padding modes as compositions of primitives.

conv           = pad + unfold (one per spatial axis) + multiply + reduce-sum
conv_transpose = multiply + reduce-sum (over input channels) + fold (one per axis) + slice
torch_pad      = pad (constant) or gathers / slices + concat (reflect, replicate, circular)

Groups split the channel axis with ungroup, so one contraction serves every group count.
"""
from __future__ import annotations

from typing import Sequence

from tdag.ops import arrays
from tdag.ops import core, creation
from tdag.ops.tensor import Tensor
from tdag.ops.nn.util import channel_view, ntuple, static_dims
from tdag.errors import ShapeError
from tdag.ir.symbols import as_dim, is_static

__all__ = ["conv", "conv_transpose", "torch_pad"]


# -- conv -------------------------------------------------------------------------------------


def conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
         dilation=1, groups: int = 1) -> Tensor:
    """``torch.nn.functional.conv{1,2,3}d``: x (N, C, *S) or unbatched (C, *S), weight
    (O, C/groups, *K); padding an int, a tuple, ``'same'`` or ``'valid'``.

    >>> import tdag
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x, w: ops.conv(x, w, padding=1),
    ...                   tdag.TensorSpec(("b", 3, 8, 8)), tdag.TensorSpec((4, 3, 3, 3)))
    >>> [str(t) for t in prog.graph.output_types]
    ['f32[b,4,8,8]']
    """
    d = weight.ndim - 2
    x, unbatched = _batched(x, d, "conv")
    kernel = static_dims(weight, range(2, weight.ndim), "conv kernel")
    stride, dilation = ntuple(stride, d, "conv stride"), ntuple(dilation, d, "conv dilation")
    _check_groups(x.shape[1], weight.shape[1] * groups, groups, "conv")
    widths = _conv_padding(padding, kernel, stride, dilation)
    x = core.pad(x, [(0, 0), (0, 0)] + widths)
    for i in range(d):  # each unfold appends its window axis last: (N, C, *O, *K)
        x = core.unfold(x, 2 + i, kernel[i], stride[i], dilation[i])
    out = _contract(x, weight, groups, d)
    return _finish(out, bias, unbatched)


def _batched(x: Tensor, d: int, what: str) -> tuple[Tensor, bool]:
    """(N, C, *S) from x, adding N for an unbatched (C, *S) input as torch does."""
    if x.ndim == d + 1:
        return core.unsqueeze(x, 0), True
    if x.ndim != d + 2:
        raise ShapeError(f"{what}: a {d}-d weight needs x of rank {d + 1} or {d + 2}, "
                         f"got {x.type}")
    return x, False


def _check_groups(channels, expected, groups: int, what: str) -> None:
    if groups < 1 or not core.dims_equal(channels, expected):
        raise ShapeError(f"{what}: {channels} input channels do not match the weight "
                         f"({expected} = groups {groups} x weight channels)")


def _conv_padding(padding, kernel: tuple, stride: tuple, dilation: tuple) -> list[tuple]:
    """(before, after) per spatial axis; 'same' puts the odd pixel after, as torch does."""
    if padding == "valid":
        return [(0, 0)] * len(kernel)
    if padding == "same":
        if any(s != 1 for s in stride):
            raise ShapeError("conv: padding='same' needs stride 1 (as in torch)")
        totals = [dl * (k - 1) for k, dl in zip(kernel, dilation)]
        return [(t // 2, t - t // 2) for t in totals]
    return [(p, p) for p in ntuple(padding, len(kernel), "conv padding")]


def _contract(windows: Tensor, weight: Tensor, groups: int, d: int) -> Tensor:
    """out[n, g, o, *O] = sum over (c, *K) of windows[n, g, c, *O, *K] * weight[g, o, c, *K]."""
    x = core.ungroup(windows, 1, (groups, weight.shape[1]))    # (N, g, Cg, *O, *K)
    x = core.unsqueeze(x, 2)                                   # (N, g, 1, Cg, *O, *K)
    w = core.ungroup(weight, 0, (groups, -1))                  # (g, Og, Cg, *K)
    w = core.unsqueeze(w, (0,) + tuple(range(4, 4 + d)))      # (1, g, Og, Cg, *1, *K)
    summed = core.sum(core.mul(x, w), (3,) + tuple(range(4 + d, 4 + 2 * d)))
    return core.group(summed, 1, 2)                            # (N, O, *O)


def _finish(out: Tensor, bias: Tensor | None, unbatched: bool) -> Tensor:
    if bias is not None:
        out = core.add(out, channel_view(bias, out))
    return core.squeeze(out, 0) if unbatched else out


# -- conv_transpose ---------------------------------------------------------------------------


def conv_transpose(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                   output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """``torch.nn.functional.conv_transpose{1,2,3}d``: x (N, C, *S), weight
    (C, O/groups, *K). Every input pixel scatters a weighted kernel (fold overlap-adds the
    windows), then ``padding`` is cropped from both ends."""
    d = weight.ndim - 2
    x, unbatched = _batched(x, d, "conv_transpose")
    kernel = static_dims(weight, range(2, weight.ndim), "conv_transpose kernel")
    stride, dilation = ntuple(stride, d, "stride"), ntuple(dilation, d, "dilation")
    padding, extra = ntuple(padding, d, "padding"), ntuple(output_padding, d, "output_padding")
    _check_groups(x.shape[1], weight.shape[0], groups, "conv_transpose")
    for s, dl, e in zip(stride, dilation, extra):
        if e >= max(s, dl):  # torch's rule: the extra cells must be reachable by a window
            raise ShapeError(f"conv_transpose: output_padding {e} must be smaller than "
                             f"stride {s} or dilation {dl}")
    y = _scatter_kernels(x, weight, groups, d)                 # (N, O, *S, *K)
    for i in reversed(range(d)):  # fold the last axis first: its kernel axis is the last one
        full = as_dim((y.shape[2 + i] - 1) * stride[i] + dilation[i] * (kernel[i] - 1) + 1
                      + extra[i])
        y = core.fold(y, 2 + i, full, stride[i], dilation[i])
    for i in range(d):
        length = as_dim(y.shape[2 + i] - 2 * padding[i])
        if is_static(length) and length <= 0:
            raise ShapeError(f"conv_transpose: padding {padding[i]} leaves no output on "
                             f"spatial axis {i}")
        y = core.slice(y, 2 + i, padding[i], as_dim(padding[i] + length))
    return _finish(y, bias, unbatched)


def _scatter_kernels(x: Tensor, weight: Tensor, groups: int, d: int) -> Tensor:
    """y[n, g, o, *S, *K] = sum over c of x[n, g, c, *S] * weight[g, c, o, *K]."""
    per_group = weight.shape[0] if groups == 1 else as_dim(weight.shape[0] // groups)
    x = core.ungroup(x, 1, (groups, per_group))                # (N, g, Cg, *S)
    x = core.unsqueeze(x, (3,) + tuple(range(4 + d, 4 + 2 * d)))  # (N, g, Cg, 1, *S, *1)
    w = core.ungroup(weight, 0, (groups, per_group))           # (g, Cg, Og, *K)
    w = core.unsqueeze(w, (0,) + tuple(range(4, 4 + d)))      # (1, g, Cg, Og, *1, *K)
    y = core.sum(core.mul(x, w), 2)                            # (N, g, Og, *S, *K)
    return core.group(y, 1, 2)


# -- padding modes ----------------------------------------------------------------------------


def torch_pad(x: Tensor, pad: Sequence[int], mode: str = "constant",
              value: float | None = None) -> Tensor:
    """``torch.nn.functional.pad``: ``pad`` is torch's flat list, last axis first
    ``(left, right, top, bottom, ...)``; negative widths crop in constant mode."""
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ShapeError(f"torch_pad: {len(pad)} pad values for {x.type}")
    widths = [(0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        widths[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1])
    if mode == "constant":
        return core.pad(x, widths, 0.0 if value is None else value)
    if mode not in _MODES:
        raise ShapeError(f"torch_pad: unknown mode {mode!r}")
    if value:
        raise ShapeError(f"torch_pad: a fill value only applies to mode='constant', not {mode!r}")
    for axis, (lo, hi) in enumerate(widths):
        if lo < 0 or hi < 0:
            raise ShapeError(f"torch_pad: negative padding {pad} in mode {mode!r}")
        if lo or hi:
            x = _MODES[mode](x, axis, lo, hi)
    return x


def _reflect(x: Tensor, axis: int, lo: int, hi: int) -> Tensor:
    """Mirror without repeating the edge: [c b | a b c d | c b]."""
    length = x.shape[axis]
    if is_static(length) and max(lo, hi) >= length:
        raise ShapeError(f"torch_pad: reflect padding ({lo}, {hi}) must be smaller than "
                         f"the axis size {length}")
    parts = [core.gather(x, range(lo, 0, -1), axis, wrap=False)] if lo else []
    parts.append(x)
    if hi:  # indices length-2, length-3, ...: built from the axis size, which may be symbolic
        if is_static(length):
            index = range(length - 2, length - 2 - hi, -1)
        else:
            index = core.sub(core.sub(creation.size_tensor(x, (axis,), "i64"), 2),
                             creation.arange(0, hi, like=x))
        parts.append(core.gather(x, index, axis, wrap=False))
    return arrays.concat(parts, axis)


def _replicate(x: Tensor, axis: int, lo: int, hi: int) -> Tensor:
    """Repeat the edge value: [a a | a b c d | d d]."""
    length = x.shape[axis]
    first = core.slice(x, axis, 0, 1)
    last = core.slice(x, axis, as_dim(length - 1), length)
    parts = [core.repeat_axes(first, (axis,), (lo,))] if lo else []
    parts.append(x)
    if hi:
        parts.append(core.repeat_axes(last, (axis,), (hi,)))
    return arrays.concat(parts, axis)


def _circular(x: Tensor, axis: int, lo: int, hi: int) -> Tensor:
    """Wrap around: [c d | a b c d | a b]."""
    length = x.shape[axis]
    if is_static(length) and max(lo, hi) > length:
        raise ShapeError(f"torch_pad: circular padding ({lo}, {hi}) is larger than the axis "
                         f"size {length}")
    parts = [core.slice(x, axis, as_dim(length - lo), length)] if lo else []
    parts.append(x)
    if hi:
        parts.append(core.slice(x, axis, 0, hi))
    return arrays.concat(parts, axis)


_MODES = {"reflect": _reflect, "replicate": _replicate, "circular": _circular}
