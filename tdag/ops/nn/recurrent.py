"""Recurrent layers (torch's LSTM, GRU and Elman RNN) unrolled over a static sequence length.

The one composition of a stacked recurrence: the ATen front end's ``lstm``/``gru``/``rnn_*``
entries and the lstm kernel's ``decompose`` both call ``recurrent``, and ``tdag.lower``
recognises an LSTM unrolled so as one lstm kernel. The input projection of every step is one
matmul over the whole sequence; only the recurrent projection is per step. Gates are in
torch's order: LSTM (i, f, g, o), GRU (r, z, n).
"""
from __future__ import annotations

from typing import Sequence

from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static
from tdag.ops import arrays, core
from tdag.ops.tensor import Tensor
from tdag.ops.nn.functional import relu, sigmoid

__all__ = ["gru_cell", "lstm_cell", "recurrent", "recurrent_layer"]

KINDS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def lstm_cell(gates: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM step from its pre-activation ``gates`` [.., 4H]: the new (h, c)."""
    i, f, g, o = arrays.chunk(gates, 4, -1)
    c = core.add(core.mul(sigmoid(f), c), core.mul(sigmoid(i), core.tanh(g)))
    return core.mul(sigmoid(o), core.tanh(c)), c


def gru_cell(xt: Tensor, ht: Tensor, h: Tensor) -> Tensor:
    """One GRU step from the input and recurrent projections ``xt``, ``ht`` [.., 3H]."""
    x_r, x_z, x_n = arrays.chunk(xt, 3, -1)
    h_r, h_z, h_n = arrays.chunk(ht, 3, -1)
    r, z = sigmoid(core.add(x_r, h_r)), sigmoid(core.add(x_z, h_z))
    n = core.tanh(core.add(x_n, core.mul(r, h_n)))
    return core.add(core.mul(core.sub(1.0, z), n), core.mul(z, h))


def recurrent_layer(x: Tensor, h0: Tensor, c0: Tensor | None, weights: Sequence,
                    kind: str = "lstm", reverse: bool = False):
    """One layer, one direction over x [T, B, I]: ``(outputs [T, B, H], h_T, c_T)``;
    ``weights`` are (w_ih, w_hh, b_ih, b_hh), the biases may be None."""
    w_ih, w_hh, b_ih, b_hh = weights
    projected = arrays.linear(x, w_ih, b_ih)  # every step's input projection at once
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    h, c, outs = h0, c0, {}
    for t in steps:
        xt = core.select(projected, 0, t)
        if kind == "lstm":
            h, c = lstm_cell(core.add(xt, arrays.linear(h, w_hh, b_hh)), h, c)
        elif kind == "gru":
            h = gru_cell(xt, arrays.linear(h, w_hh, b_hh), h)
        else:
            pre = core.add(xt, arrays.linear(h, w_hh, b_hh))
            h = core.tanh(pre) if kind == "rnn_tanh" else relu(pre)
        outs[t] = h
    return arrays.stack([outs[t] for t in range(x.shape[0])], 0), h, c


def recurrent(kind: str, x: Tensor, weights: Sequence, h0s: Sequence, c0s: Sequence | None = None,
              layers: int = 1, bidirectional: bool = False, reverse: bool = False):
    """A stack of ``layers`` recurrent layers over x [T, B, I] (T static):
    ``(output [T, B, D*H], [h_T per cell], [c_T per cell])``, a cell being a layer in one
    direction (forward first, D = 2 when ``bidirectional``). ``weights`` holds one
    (w_ih, w_hh, b_ih, b_hh) per cell, ``h0s`` (and ``c0s`` for an LSTM) one [B, H] state per
    cell. ``reverse`` runs every layer of a one-direction stack from the last step."""
    if kind not in KINDS:
        raise UnsupportedOpError(f"recurrent: kind {kind!r} is not one of {KINDS}")
    if not is_static(x.shape[0]):
        raise UnsupportedOpError(f"{kind} over a symbolic sequence length (a TDAG cannot "
                                 "loop; unrolling needs a static length)")
    dirs = 2 if bidirectional else 1
    h_n, c_n = [], []
    for layer in range(layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            h0 = h0s[k]
            c0 = c0s[k] if kind == "lstm" else None
            out, h, c = recurrent_layer(x, h0, c0, weights[k], kind, reverse=reverse or d == 1)
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        x = arrays.concat(outs, -1) if dirs == 2 else outs[0]
    return x, h_n, c_n
