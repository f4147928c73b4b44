"""Compositions for the NN ops torch cannot decompose (convolution, average pooling), used
until ``tdag.ops`` provides them (tdag/deinops/nn.py); signatures follow torch.nn.functional.

conv = pad + unfold (one per spatial axis) + multiply + reduce-sum, as the design says;
a transposed conv is a conv over the input spread out by the stride, with the kernel flipped.
"""
from __future__ import annotations

from tdag import ops
from tdag.ir.symbols import as_dim, floordiv, is_static


def _tuple(value, n: int) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    d = weight.ndim - 2
    stride, padding, dilation = _tuple(stride, d), _tuple(padding, d), _tuple(dilation, d)
    x = ops.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    for i in range(d):  # windows: [n, c, l1..ld, k1..kd]
        x = ops.unfold(x, 2 + i, weight.shape[2 + i], stride[i], dilation[i])
    c = x.shape[1]
    out_ch = weight.shape[0]
    x = ops.ungroup(x, 1, (groups, c // groups))                      # [n, g, c/g, L.., K..]
    x = ops.unsqueeze(x, 2)                                           # [n, g, 1, c/g, L.., K..]
    w = ops.ungroup(weight, 0, (groups, out_ch // groups))            # [g, o/g, c/g, K..]
    w = ops.unsqueeze(ops.unsqueeze(w, 0), tuple(range(4, 4 + d)))   # [1, g, o/g, c/g, 1.., K..]
    product = ops.mul(x, w)
    out = ops.sum(product, (3,) + tuple(range(4 + d, 4 + 2 * d)))     # [n, g, o/g, L..]
    out = ops.group(out, 1, 2)                                        # [n, o, L..]
    if bias is not None:
        out = ops.add(out, ops.reshape(bias, (out_ch,) + (1,) * d))
    return out


def _spread(x, axis: int, stride: int):
    """Insert stride-1 zeros between the elements of ``axis``."""
    if stride == 1:
        return x
    length = x.shape[axis]
    x = ops.unsqueeze(x, axis + 1)
    widths = [(0, 0)] * x.ndim
    widths[axis + 1] = (0, stride - 1)
    x = ops.group(ops.pad(x, widths), axis, 2)
    return ops.slice(x, axis, 0, as_dim((length - 1) * stride + 1))


def _flip(w, axis: int):
    n = w.shape[axis]
    return ops.gather(w, ops.sub(n - 1, ops.iota(n, "i64", w.builder)), axis)


def conv_transpose(x, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,
                   dilation=1):
    d = weight.ndim - 2
    stride, padding = _tuple(stride, d), _tuple(padding, d)
    output_padding, dilation = _tuple(output_padding, d), _tuple(dilation, d)
    for i in range(d):
        x = _spread(x, 2 + i, stride[i])
    widths = [(0, 0), (0, 0)]
    for i in range(d):
        edge = dilation[i] * (weight.shape[2 + i] - 1) - padding[i]
        widths.append((edge, edge + output_padding[i]))
    x = ops.pad(x, widths)
    # weight [c_in, o/g, K..] -> [o, c_in/g, K..], flipped in space
    c_in = weight.shape[0]
    w = ops.ungroup(weight, 0, (groups, c_in // groups))             # [g, c/g, o/g, K..]
    w = ops.group(ops.transpose(w, 1, 2), 0, 2)                       # [o, c/g, K..]
    for i in range(d):
        w = _flip(w, 2 + i)
    return conv(x, w, bias, 1, 0, dilation, groups)


def _pool_length(length, k, s, p, ceil_mode):
    if not ceil_mode:
        return floordiv(as_dim(length + 2 * p - k), s) + 1
    out = -(-(length + 2 * p - k) // s) + 1
    return out - 1 if (out - 1) * s >= length + p else out  # last window must start inside


def avg_pool(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
             divisor_override=None):
    d = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else x.ndim - 2
    kernel = _tuple(kernel_size, d)
    stride = _tuple(stride or kernel, d)
    padding = _tuple(padding, d)
    first = x.ndim - d
    widths = [(0, 0)] * first
    extra = []  # ceil_mode overhang, never counted in the divisor
    for i in range(d):
        length = x.shape[first + i]
        if ceil_mode and not is_static(length):
            raise NotImplementedError("ceil_mode pooling over a symbolic axis")
        n = _pool_length(length, kernel[i], stride[i], padding[i], ceil_mode)
        over = max(0, (n - 1) * stride[i] + kernel[i] - (length + 2 * padding[i])) \
            if ceil_mode else 0
        extra.append(over)
        widths.append((padding[i], padding[i] + over))
    total = _window_sum(ops.pad(x, widths), first, kernel, stride)
    if divisor_override:
        return ops.div(total, float(divisor_override))
    if count_include_pad and not any(extra):
        return ops.div(total, float(_prod(kernel)))
    ones = ops.full(tuple(x.shape[first:]), 1.0, x.dtype, like=x)
    count_widths = [(p, p + e) for p, e in zip(padding, extra)]
    if count_include_pad:  # padding counts, the ceil overhang does not
        ones = ops.pad(ones, [(p, p) for p in padding], 1.0)
        count_widths = [(0, e) for e in extra]
    counts = _window_sum(ops.pad(ones, count_widths), 0, kernel, stride)
    return ops.div(total, counts)


def _window_sum(x, first, kernel, stride):
    d = len(kernel)
    for i in range(d):
        x = ops.unfold(x, first + i, kernel[i], stride[i])
    return ops.sum(x, tuple(range(x.ndim - d, x.ndim)))


def _prod(values):
    out = 1
    for v in values:
        out *= v
    return out
