"""Recurrent ATen ops (``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``), unrolled over time.

``from_torch`` captures ``nn.RNN``/``GRU``/``LSTM`` modules as loops instead
(``torch_recurrent``); these entries serve graphs that already hold the ATen ops (an
ExportedProgram or .pt2 made without tdag). A TDAG has no loops, so the sequence length must
be static; the input projection of every
step is one matmul over the whole sequence, and only the recurrent projection is per step.
torch's own decomposition unrolls the same way but takes seconds on a small model.
"""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten
from tdag.errors import UnsupportedOpError
from tdag.ir.symbols import is_static


def lstm_cell(gates, h, c):
    i, f, g, o = ops.chunk(gates, 4, -1)
    c = ops.add(ops.mul(ops.sigmoid(f), c), ops.mul(ops.sigmoid(i), ops.tanh(g)))
    return ops.mul(ops.sigmoid(o), ops.tanh(c)), c


def _run(x, h0, c0, weights, cell_kind, reverse):
    """One layer, one direction. x: [seq, batch, features]; returns outputs and final state."""
    w_ih, w_hh, b_ih, b_hh = weights
    projected = ops.linear(x, w_ih, b_ih)  # every step's input projection at once
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    h, c, outs = h0, c0, {}
    for t in steps:
        xt = ops.select(projected, 0, t)
        if cell_kind == "lstm":
            h, c = lstm_cell(ops.add(xt, ops.linear(h, w_hh, b_hh)), h, c)
        elif cell_kind == "gru":
            h = gru_cell(xt, ops.linear(h, w_hh, b_hh), h)
        else:
            pre = ops.add(xt, ops.linear(h, w_hh, b_hh))
            h = ops.tanh(pre) if cell_kind == "rnn_tanh" else ops.relu(pre)
        outs[t] = h
    return ops.stack([outs[t] for t in range(x.shape[0])], 0), h, c


def gru_cell(xt, ht, h):
    x_r, x_z, x_n = ops.chunk(xt, 3, -1)
    h_r, h_z, h_n = ops.chunk(ht, 3, -1)
    r, z = ops.sigmoid(ops.add(x_r, h_r)), ops.sigmoid(ops.add(x_z, h_z))
    n = ops.tanh(ops.add(x_n, ops.mul(r, h_n)))
    return ops.add(ops.mul(ops.sub(1.0, z), n), ops.mul(z, h))


def _stack_layers(kind, x, hx, params, has_biases, num_layers, train, bidirectional,
                  batch_first):
    if train:
        raise UnsupportedOpError(f"{kind} in training mode (dropout between layers): call "
                                 "module.eval()")
    if batch_first:
        x = ops.transpose(x, 0, 1)
    if not is_static(x.shape[0]):
        raise UnsupportedOpError(f"{kind} over a symbolic sequence length (a TDAG cannot "
                                 "loop; unrolling needs a static length)")
    per = 4 if has_biases else 2
    if len(params) != per * num_layers * (2 if bidirectional else 1):
        raise UnsupportedOpError(f"{kind} with projections (proj_size)")
    dirs = 2 if bidirectional else 1
    h_n, c_n = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w = list(params[per * k:per * k + per]) + [None, None] * (not has_biases)
            h0 = ops.select(hx[0], 0, k)
            c0 = ops.select(hx[1], 0, k) if kind == "lstm" else None
            out, h, c = _run(x, h0, c0, w, kind, reverse=d == 1)
            outs.append(out)
            h_n.append(h)
            c_n.append(c)
        x = ops.concat(outs, -1) if dirs == 2 else outs[0]
    out = ops.transpose(x, 0, 1) if batch_first else x
    return out, ops.stack(h_n, 0), (ops.stack(c_n, 0) if kind == "lstm" else None)


@aten("lstm.input")
def lstm(x, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _stack_layers("lstm", x, hx, params, has_biases, num_layers, train,
                         bidirectional, batch_first)


def _single_state(kind):
    def entry(x, hx, params, has_biases, num_layers, dropout, train, bidirectional,
              batch_first):
        out, h, _ = _stack_layers(kind, x, [hx], params, has_biases, num_layers, train,
                                  bidirectional, batch_first)
        return out, h
    aten(f"{kind}.input")(entry)


for _kind in ("gru", "rnn_tanh", "rnn_relu"):
    _single_state(_kind)
