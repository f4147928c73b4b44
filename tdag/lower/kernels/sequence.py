"""Sequence kernels: scaled dot-product attention, the rotary embedding the torch code writes
as one call (``rotary``), and the LSTM."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tdag import ops
from tdag.deinops.codegen import last_two
from tdag.lower.kernels.common import float_input, same_shape
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Refuse
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import Dim, as_dim, dims_equal, is_static, product
from tdag.ir.types import DType, TensorType
from tdag.ops.nn.recurrent import recurrent

# -- attention --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Attention:
    """``softmax(q @ k^T * scale + mask) @ v`` with q[...,L,E], k[...,S,E], v[...,S,Ev].
    A bool mask keeps where True; a float mask is added; ``causal`` keeps ``s <= l``."""

    scale: float
    causal: bool = False


def _attention_shape(spec: Attention, ins):
    q, k, v = ins[:3]
    float_input("attention", q)
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
    matmul = 2 * scores * q.shape[-1] + 2 * scores * v.shape[-1]  # q k^T, then p v
    return traffic(ins, out, matmul + 6 * scores, matmul)


def _attention_torch(node, a, code):
    mask = a[3] if len(a) == 4 else "None"
    return (f"F.scaled_dot_product_attention({a[0]}, {a[1]}, {a[2]}, attn_mask={mask}, "
            f"is_causal={node.spec.causal}, scale={node.spec.scale!r})")


def _sees_a_key_everywhere(cx, mask: str) -> bool:
    """Whether ``mask`` is a constant (made from positions alone, as transformers' causal
    and all-visible masks are) that keeps a key in every row: then no row is dead, and the
    safe softmax's test and select (a pass over the scores that onnxruntime cannot fold)
    are left out."""
    value = cx.constant(mask)
    if value is None:
        return False
    keeps = value if value.dtype == torch.bool else value > float("-inf")  # nan keeps none
    return bool(keeps.any(-1).all())


def _attention_onnx(node, ins, g, cx):
    """softmax(q k^T * scale + mask) v with the causal mask from Trilu."""
    q, k, v = ins[:3]
    q_type, k_type = cx.type(node.inputs[0]), cx.type(node.inputs[1])
    dtype, rank = q_type.dtype, q_type.rank
    scores = g.node("MatMul", [q, g.node("Transpose", [k], perm=last_two(rank))])
    scores = g.node("Mul", [scores, g.const(node.spec.scale, dtype)])
    neg_inf = g.const(float("-inf"), dtype)
    if node.spec.causal:
        square = (q_type.shape[-2], k_type.shape[-2])
        ones = g.filled(square, 1.0, dtype)
        keep = g.node("Cast", [g.node("Trilu", [ones], upper=0)], to=9)  # to bool
        scores = g.node("Where", [keep, scores, neg_inf])
    if len(ins) < 4:
        return g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
    mask = ins[3]
    boolean = cx.type(node.inputs[3]).dtype is DType.bool
    # a bool mask becomes an additive one: onnxruntime adds faster than it selects, and the
    # (small, broadcast) additive mask is made once for every layer that shares the mask
    additive = g.node("Where", [mask, g.const(0.0, dtype), neg_inf]) if boolean else mask
    scores = g.node("Add", [scores, additive])
    if not node.spec.causal and _sees_a_key_everywhere(cx, node.inputs[3]):
        return g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
    # torch's safe softmax: a row with every key masked attends to nothing (0, not nan).
    # Without a causal mask the test reads the (small, broadcast) mask, not the scores.
    if node.spec.causal:
        dead = g.node("Equal", [g.node("ReduceMax", [scores, g.const([-1])], keepdims=1),
                                neg_inf])
    elif boolean:
        keep = g.node("ReduceMax", [g.cast(mask, DType.f32), g.const([-1])], keepdims=1)
        dead = g.node("Equal", [keep, g.const(0.0, DType.f32)])
    else:
        dead = g.node("Equal", [g.node("ReduceMax", [mask, g.const([-1])], keepdims=1), neg_inf])
    probs, zero = g.node("Softmax", [scores], axis=-1), g.const(0.0, dtype)
    # rows are independent, so the dead rows may as well be zeroed after the product (their
    # nan stays in their own row), where the tensor is smaller when values are narrower
    # than the keys are many
    keys, width = k_type.shape[-2], cx.type(node.inputs[2]).shape[-1]
    if is_static(keys) and is_static(width) and width < keys:
        return g.node("Where", [dead, zero, g.node("MatMul", [probs, v])])
    return g.node("MatMul", [g.node("Where", [dead, zero, probs]), v])


def _attention_jax(node, a, cx):
    """The exact composition: ``jax.nn.dot_product_attention`` wants a (B, T, N, H) layout
    and its own masks, where this kernel takes any leading axes and a broadcast mask; a row
    whose every key is masked gives zeros, as torch's kernels give."""
    jnp = cx.jnp
    q, k, v = a[:3]
    scores = jnp.einsum("...le,...se->...ls", q, k) * node.spec.scale
    masks = [a[3]] if len(a) == 4 else []
    if node.spec.causal:  # keep s <= l, the top-left aligned lower triangle
        masks.append(jnp.tril(jnp.ones(scores.shape[-2:], bool)))
    for mask in masks:
        scores = jnp.where(mask, scores, -jnp.inf) if mask.dtype == bool else scores + mask
    weights = cx.nn.softmax(scores, axis=-1)
    if masks:  # a query that may see no key gets zeros, as torch's fused kernels give
        hidden = jnp.all(scores == -jnp.inf, axis=-1, keepdims=True)
        weights = jnp.where(hidden, jnp.zeros_like(weights), weights)
    return jnp.einsum("...ls,...sv->...lv", weights, v)


primitive(Op.attention, Attention, range(3, 5), _attention_shape, _attention_eval,
          _attention_cost, "two contractions and a softmax materialise the score matrix; "
          "fused attention does not",
          traits=Trait.KERNEL,
          batch=Refuse("reads q, k, v and a mask as [..., L, E] with their leading axes "
                       "broadcast together: strip the batch before lowering"),
          torch=_attention_torch, onnx=_attention_onnx, jax=_attention_jax,
          decompose=lambda s, q, k, v, *mask: ops.scaled_dot_product_attention(
              q, k, v, *mask, is_causal=s.causal, scale=s.scale))


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + cat(-x2, x1) * sin``, x1 and x2 the halves of ``x``'s last axis
    (transformers' ``apply_rotary_pos_emb``) with no intermediate tensor: x * cos, then each
    half of it adds its product in place (three passes where the composition makes six and
    three temporaries). Under autograd, the composition."""
    half = x.shape[-1] // 2
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out



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
    float_input("lstm", x)
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
            same_shape("lstm", tensor, shape, x.dtype)
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
    cells = 12 * spec.cells * product(x.shape[:2] + h0s[0].shape[-1:])
    return traffic(ins, out, flops + cells, matmul_flops=flops)  # the gates' products


def _stacked(states) -> str:
    """Per-cell [B, H] states as torch's [layers * directions, B, H]."""
    return f"{states[0]}[None]" if len(states) == 1 else f"torch.stack([{', '.join(states)}])"


def _lstm_torch(node, a, code):
    s = node.spec
    x, weights, h0s, c0s = lstm_parts(s, a)
    if s.reverse:
        x = f"{x}.flip(0)"
    flat = ", ".join(w for cell in weights for w in cell)
    out = (f"torch.lstm({x}, ({_stacked(h0s)}, {_stacked(c0s)}), ({flat}), True, {s.layers}, "
           f"0.0, False, {s.bidirectional}, False)[0]")
    return f"{out}.flip(0)" if s.reverse else out


def _lstm_workspace(spec: Lstm, ins, out: TensorType, contiguous) -> Dim:
    """What ``torch.lstm`` holds beside its output, in [B, H] states (measured with
    MemTracker): while layer l runs, the layer before's output, every finished cell's final
    h and c, the direction halves before their concatenation, a non-last layer's output and
    the running h and c; at the end every cell's h and c twice (then stacked into h_n, c_n,
    which ``[0]`` drops). Beside them the copies the emitted expression makes: a strided x
    made contiguous, ``x.flip(0)`` and the unflipped output for ``reverse``, and the h0/c0
    stacks."""
    x, _, h0s, _ = lstm_parts(spec, ins)
    steps, d, layers = x.shape[0], 2 if spec.bidirectional else 1, spec.layers
    halves = d * steps if d == 2 else 0
    phases = [(d * steps if k else 0) + 2 * d * k + halves +
              (d * steps if k < layers - 1 else 0) + 2 * d for k in range(layers)]
    states = max(phases + [4 * d * layers + halves]) * h0s[0].nbytes
    copies = 0 if contiguous[0] and not spec.reverse else x.nbytes
    if spec.reverse:
        copies += out.nbytes
    states_in = contiguous[1 + 4 * spec.cells:]  # torch.stack copies; one strided state too
    copies += (2 * spec.cells if spec.cells > 1 else states_in.count(False)) * h0s[0].nbytes
    return as_dim(states + copies)


def _lstm_onnx(node, ins, g, cx):
    """One ONNX LSTM per layer (both directions in one where bidirectional); ONNX orders
    the gates (i, o, f, c) where torch has (i, f, g, o)."""
    spec = node.spec
    x, weights, h0s, c0s = lstm_parts(spec, ins)
    hidden = int(node.type.shape[-1]) // (2 if spec.bidirectional else 1)
    order = g.const([k * hidden + j for k in (0, 3, 1, 2) for j in range(hidden)])
    gates = lambda t: g.node("Gather", [t, order], axis=0)  # noqa: E731
    stack = lambda ts: ts[0] if len(ts) == 1 else g.node("Concat", ts, axis=0)  # noqa: E731
    first = lambda t: g.node("Unsqueeze", [t, g.const([0])])  # noqa: E731
    directions = 2 if spec.bidirectional else 1
    for layer in range(spec.layers):
        cells = range(layer * directions, (layer + 1) * directions)
        w = stack([first(gates(weights[k][0])) for k in cells])
        r = stack([first(gates(weights[k][1])) for k in cells])
        b = stack([first(g.node("Concat", [gates(weights[k][2]), gates(weights[k][3])], axis=0))
                   for k in cells])
        h, c = (stack([first(states[k]) for k in cells]) for states in (h0s, c0s))
        direction = "bidirectional" if spec.bidirectional else \
            "reverse" if spec.reverse else "forward"
        y = g.node("LSTM", [x, w, r, b, "", h, c], hidden_size=hidden, direction=direction)
        if directions == 1:
            x = g.node("Squeeze", [y, g.const([1])])  # [T, 1, B, H] -> [T, B, H]
        else:  # [T, 2, B, H] -> [T, B, 2H], forward first as torch concatenates
            x = g.node("Reshape", [g.node("Transpose", [y], perm=[0, 2, 1, 3]),
                                   g.const([0, 0, -1])])
    return x


def _lstm_layer_jax(cx, x, weights, h, c, reverse: bool):
    """One layer in one direction as a ``lax.scan`` over time; the input projection of every
    step is one matmul before the loop. Gates in torch's order (i, f, g, o)."""
    jnp, nn = cx.jnp, cx.nn
    w_ih, w_hh, b_ih, b_hh = weights
    projected = jnp.einsum("tbi,gi->tbg", x, w_ih) + (b_ih + b_hh)

    def step(carry, x_t):
        h, c = carry
        i, f, g, o = jnp.split(x_t + h @ w_hh.T, 4, axis=-1)
        c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
        h = nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h

    # unrolled: XLA's CPU loop costs more per trip than a small cell's arithmetic
    unroll = min(x.shape[0], 16) or 1
    return cx.lax.scan(step, (h, c), projected, reverse=reverse, unroll=unroll)[1]


def _lstm_jax(node, a, cx):
    s = node.spec
    x, weights, h0s, c0s = lstm_parts(s, a)
    if s.reverse:
        x = cx.jnp.flip(x, 0)
    directions = 2 if s.bidirectional else 1
    for layer in range(s.layers):
        cells = range(layer * directions, (layer + 1) * directions)
        outs = [_lstm_layer_jax(cx, x, weights[k], h0s[k], c0s[k], reverse=k > cells[0])
                for k in cells]  # the second cell of a layer runs backward
        x = cx.jnp.concatenate(outs, axis=-1)  # forward first, as torch concatenates
    return cx.jnp.flip(x, 0) if s.reverse else x


def _lstm_decompose(spec: Lstm, *xs):
    x, weights, h0s, c0s = lstm_parts(spec, list(xs))
    return recurrent("lstm", x, weights, h0s, c0s, spec.layers, spec.bidirectional,
                     spec.reverse)[0]


primitive(Op.lstm, Lstm, range(7, 1 << 12), _lstm_shape, _lstm_eval, _lstm_cost,
          "an unrolled recurrence is a dozen small ops per step; the LSTM kernel loops in C++",
          traits=Trait.KERNEL,
          batch=Refuse("works on the framework's fixed [T, B, I] layout with [B, H] states: "
                       "strip the batch before lowering"),
          torch=_lstm_torch, onnx=_lstm_onnx, jax=_lstm_jax, decompose=_lstm_decompose,
          workspace=_lstm_workspace)
