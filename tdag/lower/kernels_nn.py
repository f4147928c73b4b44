"""Kernels for normalisation, softmax, attention and activations (see ``kernels.py``).

Flops count what the primitive decomposition costs per element, so lowering never changes
``tdag.cost(prog).flops`` by more than the fused kernel really saves (memory traffic).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tdag.deinops.primitive import Cost, NoSpec, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.op import Op
from tdag.ir.symbols import dims_equal, format_dim, is_static, product
from tdag.ir.types import DType, TensorType


def _same_shape(op: str, t: TensorType, shape, dtype) -> None:
    if t.dtype is not dtype or len(t.shape) != len(shape) or \
            not all(dims_equal(a, b) for a, b in zip(t.shape, shape)):
        raise ShapeError(f"{op}: operand {t} should be {dtype.value}"
                         f"[{','.join(format_dim(d) for d in shape)}]")


def _float_input(op: str, x: TensorType) -> None:
    if not x.dtype.is_float:
        raise ShapeError(f"{op}: needs a float input, got {x}")


def _per_element(flops_per_element: int):
    def cost(spec, ins, out: TensorType) -> Cost:
        return traffic(ins, out, flops_per_element * ins[0].numel)
    return cost


# -- softmax ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Softmax:
    axis: int


def _softmax_shape(spec: Softmax, ins):
    (x,) = ins
    _float_input("softmax", x)
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"softmax: axis {spec.axis} out of range for {x}")
    return x


# max, subtract, exp, sum, divide: five per element, as the decomposition
primitive(Op.softmax, Softmax, 1, _softmax_shape,
          lambda s, xs, r: torch.softmax(xs[0], s.axis), _per_element(5),
          "exp/reduce/reciprocal chain makes five passes over memory; softmax makes one")
primitive(Op.log_softmax, Softmax, 1, _softmax_shape,
          lambda s, xs, r: torch.log_softmax(xs[0], s.axis), _per_element(5),
          "x - max - log(sum(exp)) makes five passes over memory; log_softmax makes one")


# -- normalisations ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LayerNorm:
    """Normalise over the trailing ``count`` axes; optional weight and bias of that shape."""

    count: int
    eps: float


def _trailing_norm_shape(name: str):
    """Shape rule of a norm over the trailing ``spec.count`` axes with optional affine
    operands of exactly those axes' shape (layer_norm, rms_norm)."""
    def rule(spec, ins):
        x = ins[0]
        _float_input(name, x)
        if not 1 <= spec.count <= x.rank:
            raise ShapeError(f"{name}: {spec.count} trailing axes of {x}")
        for t in ins[1:]:
            _same_shape(name, t, x.shape[x.rank - spec.count:], x.dtype)
        return x
    return rule


_layer_norm_shape = _trailing_norm_shape("layer_norm")


def _layer_norm_eval(spec: LayerNorm, xs, resolve):
    x = xs[0]
    w = xs[1] if len(xs) > 1 else None
    b = xs[2] if len(xs) > 2 else None
    return F.layer_norm(x, x.shape[x.dim() - spec.count:], w, b, spec.eps)


# mean (2), centre, square, sum, divide, add eps, rsqrt, scale: about 8 per element
primitive(Op.layer_norm, LayerNorm, range(1, 4), _layer_norm_shape, _layer_norm_eval,
          _per_element(8), "mean/variance/rsqrt chain reads the input several times")


@dataclass(frozen=True, slots=True)
class RMSNorm:
    """``x / sqrt(mean(x^2) + eps) [* weight]`` over the trailing ``count`` axes."""

    count: int
    eps: float


_rms_norm_shape = _trailing_norm_shape("rms_norm")


def _rms_norm_eval(spec: RMSNorm, xs, resolve):
    x = xs[0]
    w = xs[1] if len(xs) > 1 else None
    return F.rms_norm(x, x.shape[x.dim() - spec.count:], w, spec.eps)


primitive(Op.rms_norm, RMSNorm, range(1, 3), _rms_norm_shape, _rms_norm_eval,
          _per_element(5), "square/mean/rsqrt chain reads the input several times")


@dataclass(frozen=True, slots=True)
class GroupNorm:
    """Normalise ``x[N,C,*]`` over groups of ``C/groups`` channels and all trailing axes;
    optional per-channel weight and bias (both or neither)."""

    groups: int
    eps: float


def _group_norm_shape(spec: GroupNorm, ins):
    x = ins[0]
    _float_input("group_norm", x)
    if x.rank < 2 or spec.groups < 1 or (is_static(x.shape[1]) and x.shape[1] % spec.groups):
        raise ShapeError(f"group_norm: {spec.groups} groups do not divide the channels of {x}")
    if len(ins) == 2:
        raise ShapeError("group_norm: give both weight and bias, or neither")
    for t in ins[1:]:
        _same_shape("group_norm", t, (x.shape[1],), x.dtype)
    return x


def _group_norm_eval(spec: GroupNorm, xs, resolve):
    w, b = (xs[1], xs[2]) if len(xs) == 3 else (None, None)
    return F.group_norm(xs[0], spec.groups, w, b, spec.eps)


primitive(Op.group_norm, GroupNorm, range(1, 4), _group_norm_shape, _group_norm_eval,
          _per_element(8), "ungroup + mean/variance chain reads the input several times")


@dataclass(frozen=True, slots=True)
class BatchNorm:
    """Inference batch norm of ``x[N,C,*]`` with given mean and variance per channel:
    ``(x - mean) / sqrt(var + eps) [* weight] [+ bias]``."""

    eps: float


def _batch_norm_shape(spec: BatchNorm, ins):
    x = ins[0]
    _float_input("batch_norm", x)
    if x.rank < 2:
        raise ShapeError(f"batch_norm: needs a channel axis, got {x}")
    for t in ins[1:]:
        _same_shape("batch_norm", t, (x.shape[1],), x.dtype)
    return x


def _batch_norm_eval(spec: BatchNorm, xs, resolve):
    w = xs[3] if len(xs) > 3 else None
    b = xs[4] if len(xs) > 4 else None
    return F.batch_norm(xs[0], xs[1], xs[2], w, b, False, 0.0, spec.eps)


primitive(Op.batch_norm, BatchNorm, range(3, 6), _batch_norm_shape, _batch_norm_eval,
          _per_element(4), "broadcast subtract/scale/shift chain makes several passes")


# -- attention --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Attention:
    """``softmax(q @ k^T * scale + mask) @ v`` with q[...,L,E], k[...,S,E], v[...,S,Ev].
    A bool mask keeps where True; a float mask is added; ``causal`` keeps ``s <= l``."""

    scale: float
    causal: bool = False


def _attention_shape(spec: Attention, ins):
    q, k, v = ins[:3]
    _float_input("attention", q)
    if not (q.rank == k.rank == v.rank >= 2) or q.dtype is not k.dtype or k.dtype is not v.dtype:
        raise ShapeError(f"attention: q {q}, k {k}, v {v} differ in rank or dtype")
    batch = q.shape[:-2]
    for t in (k, v):
        if not all(dims_equal(a, b) for a, b in zip(batch, t.shape[:-2])):
            raise ShapeError(f"attention: batch axes of {q} and {t} differ")
    if not dims_equal(q.shape[-1], k.shape[-1]) or not dims_equal(k.shape[-2], v.shape[-2]):
        raise ShapeError(f"attention: q {q}, k {k}, v {v} do not fit")
    if len(ins) == 4:
        mask = ins[3]
        if mask.dtype not in (DType.bool, q.dtype) or mask.rank > q.rank:
            raise ShapeError(f"attention: mask {mask} must be bool or {q.dtype.value}")
        want = batch + (q.shape[-2], k.shape[-2])
        for m, w in zip(reversed(mask.shape), reversed(want)):
            if not (dims_equal(m, w) or (is_static(m) and m == 1)):
                raise ShapeError(f"attention: mask {mask} does not broadcast to scores")
    return q.with_shape(q.shape[:-1] + v.shape[-1:])


def _attention_eval(spec: Attention, xs, resolve):
    mask = xs[3] if len(xs) == 4 else None
    return F.scaled_dot_product_attention(xs[0], xs[1], xs[2], attn_mask=mask,
                                          is_causal=spec.causal, scale=spec.scale)


def _attention_cost(spec: Attention, ins, out: TensorType) -> Cost:
    q, k, v = ins[:3]
    scores = product(q.shape[:-1] + (k.shape[-2],))  # [..., L, S]
    flops = 2 * scores * q.shape[-1] + 2 * scores * v.shape[-1] + 6 * scores
    return traffic(ins, out, flops)


primitive(Op.attention, Attention, range(3, 5), _attention_shape, _attention_eval,
          _attention_cost, "two contractions and a softmax materialise the score matrix; "
          "fused attention does not")


# -- recurrence -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Lstm:
    """Stacked LSTM layers, torch's gate order (i, f, g, o). Inputs: x[T, B, I]; for each
    layer and direction (forward first) w_ih[4H, I or D*H], w_hh[4H, H], b_ih[4H], b_hh[4H];
    then h0[B, H] for each layer and direction, then c0[B, H] likewise (D = 2 when
    ``bidirectional``). The output is the last layer's hidden state at every step,
    [T, B, D*H]; ``reverse`` runs a one-direction stack from the last step to the first.
    One layer in one direction is x, w_ih, w_hh, b_ih, b_hh, h0, c0."""

    reverse: bool = False
    layers: int = 1
    bidirectional: bool = False

    @property
    def cells(self) -> int:
        """Layers times directions: how many weight quadruples and initial states."""
        return self.layers * (2 if self.bidirectional else 1)


def lstm_parts(spec: Lstm, ins: list) -> tuple:
    """``(x, [(w_ih, w_hh, b_ih, b_hh) per cell], [h0 per cell], [c0 per cell])``."""
    n = spec.cells
    weights = [tuple(ins[1 + 4 * k:5 + 4 * k]) for k in range(n)]
    return ins[0], weights, list(ins[1 + 4 * n:1 + 5 * n]), list(ins[1 + 5 * n:1 + 6 * n])


def _lstm_shape(spec: Lstm, ins):
    if spec.layers < 1 or (spec.reverse and spec.bidirectional) or \
            len(ins) != 1 + 6 * spec.cells:
        raise ShapeError(f"lstm: {spec} takes 1 + 6 * {spec.cells} operands, got {len(ins)}")
    x, weights, h0s, c0s = lstm_parts(spec, ins)
    _float_input("lstm", x)
    hidden = h0s[0].shape[-1]
    if x.rank != 3 or not is_static(hidden):
        raise ShapeError(f"lstm: x must be [T, B, I] with a static hidden size, got {x}")
    t, b, size = x.shape
    directions = 2 if spec.bidirectional else 1
    for k, (w_ih, w_hh, b_ih, b_hh) in enumerate(weights):
        width = size if k < directions else directions * hidden
        want = [(w_ih, (4 * hidden, width)), (w_hh, (4 * hidden, hidden)),
                (b_ih, (4 * hidden,)), (b_hh, (4 * hidden,)), (h0s[k], (b, hidden)),
                (c0s[k], (b, hidden))]
        for tensor, shape in want:
            _same_shape("lstm", tensor, shape, x.dtype)
    return x.with_shape((t, b, directions * hidden))


def _lstm_eval(spec: Lstm, xs, resolve):
    x, weights, h0s, c0s = lstm_parts(spec, xs)
    if spec.reverse:
        x = x.flip(0)
    flat = [w for cell in weights for w in cell]
    out = torch.lstm(x, (torch.stack(h0s), torch.stack(c0s)), flat, True, spec.layers, 0.0,
                     False, spec.bidirectional, False)[0]
    return out.flip(0) if spec.reverse else out


def _lstm_cost(spec: Lstm, ins, out: TensorType) -> Cost:
    x, weights, h0s, _ = lstm_parts(spec, ins)
    steps = product(x.shape[:2])  # T * B rows
    flops = sum(2 * steps * (product(w_ih.shape) + product(w_hh.shape))
                for w_ih, w_hh, _, _ in weights)
    return traffic(ins, out, flops + 12 * spec.cells * product(x.shape[:2] + h0s[0].shape[-1:]))


primitive(Op.lstm, Lstm, range(7, 1 << 12), _lstm_shape, _lstm_eval, _lstm_cost,
          "an unrolled recurrence is a dozen small ops per step; the LSTM kernel loops in C++")


# -- activations ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Gelu:
    approximate: str = "none"  # or "tanh"


def _float_unary(op: str):
    def rule(spec, ins):
        _float_input(op, ins[0])
        if op == "gelu" and spec.approximate not in ("none", "tanh"):
            raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', not {spec.approximate!r}")
        return ins[0]
    return rule


primitive(Op.gelu, Gelu, 1, _float_unary("gelu"),
          lambda s, xs, r: F.gelu(xs[0], approximate=s.approximate), _per_element(5),
          "x * (1 + erf(x/sqrt 2)) / 2 is five elementwise passes")
primitive(Op.silu, NoSpec, 1, _float_unary("silu"), lambda s, xs, r: F.silu(xs[0]),
          _per_element(5), "x / (1 + exp(-x)) is five elementwise passes")
primitive(Op.sigmoid, NoSpec, 1, _float_unary("sigmoid"), lambda s, xs, r: torch.sigmoid(xs[0]),
          _per_element(4), "1 / (1 + exp(-x)) is four elementwise passes")
primitive(Op.relu, NoSpec, 1, lambda s, ins: ins[0], lambda s, xs, r: torch.relu(xs[0]),
          _per_element(1), "(x + |x|) / 2 or where(x > 0, x, 0) is several passes")



@dataclass(frozen=True, slots=True)
class Clamp:
    """``min(max(x, lo), hi)`` propagating nan (torch.clamp); None leaves a side open."""

    lo: float | None = None
    hi: float | None = None


def _clamp_eval(spec: Clamp, xs, resolve):
    return torch.clamp(xs[0], spec.lo, spec.hi)


primitive(Op.clamp, Clamp, 1, lambda s, ins: ins[0], _clamp_eval, _per_element(2),
          "max/min with nan checks are two compares and two selects per bound")
primitive(Op.hardswish, NoSpec, 1, _float_unary("hardswish"),
          lambda s, xs, r: F.hardswish(xs[0]), _per_element(4),
          "x * clamp(x + 3, 0, 6) / 6 is four elementwise passes")
