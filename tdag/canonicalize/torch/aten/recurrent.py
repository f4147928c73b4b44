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
from tdag.ops.nn.recurrent import recurrent


class _Cells:
    """Cell k's initial state ``state[k]``, selected when the stack reads it (so the nodes
    keep the order they were always emitted in)."""

    def __init__(self, state):
        self.state = state

    def __getitem__(self, k: int):
        return ops.select(self.state, 0, k)


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
    weights = [list(params[per * k:per * k + per]) + [None, None] * (not has_biases)
               for k in range(num_layers * dirs)]
    c0s = _Cells(hx[1]) if kind == "lstm" else None
    x, h_n, c_n = recurrent(kind, x, weights, _Cells(hx[0]), c0s, num_layers, bidirectional)
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
