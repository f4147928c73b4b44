"""``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM`` captured as one node each, then converted to Loops.

torch.export specialises the sequence length of the recurrent modules (their ATen kernels
unroll), and unrolling makes the Program grow with the example's length. So while tdag
captures a model, each recurrent submodule's ``forward`` calls the custom op
``tdag::recurrent`` instead: its fake kernel gives symbolic output shapes, its real kernel is
torch's own (``torch._VF.lstm`` ...), and its weights are operands, so they stay parameters
under their state-dict names. The converter (``torch_control``) turns that node into one
``Loop`` per layer and direction whose body calls the cell's TDAG; the loop runs as many times
as the sequence is long, a symbol when the length is dynamic.
"""
from __future__ import annotations

import contextlib
import operator
import types
from typing import Iterator, List

import torch
from torch import nn

from tdag import ops
from tdag.ops.nn.recurrent import gru_cell, lstm_cell
from tdag.canonicalize.common.segments import Boundary
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.errors import UnsupportedOpError
from tdag.ir.graph import TDAG, Value
from tdag.ir.program import Block, Call, Loop
from tdag.ir.types import DType, TensorType

_MODES = ("LSTM", "GRU", "RNN_TANH", "RNN_RELU")


@torch.library.custom_op("tdag::recurrent", mutates_args=())
def _recurrent(x: torch.Tensor, hx: List[torch.Tensor], weights: List[torch.Tensor],
               mode: str, num_layers: int, bidirectional: bool, batch_first: bool,
               has_biases: bool) -> List[torch.Tensor]:
    """``[output, h_n]`` (and ``c_n`` for an LSTM) as the module computes them."""
    args = (weights, has_biases, num_layers, 0.0, False, bidirectional, batch_first)
    if mode == "LSTM":
        return list(torch._VF.lstm(x, hx, *args))
    run = {"GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh, "RNN_RELU": torch._VF.rnn_relu}
    return list(run[mode](x, hx[0], *args))


@_recurrent.register_fake
def _recurrent_fake(x, hx, weights, mode, num_layers, bidirectional, batch_first, has_biases):
    # the output's width is the last state's (proj_size when the LSTM projects)
    width = (2 if bidirectional else 1) * hx[0].shape[-1]
    return [x.new_empty((*x.shape[:2], width))] + [h.new_empty(h.shape) for h in hx]


RECURRENT = torch.ops.tdag.recurrent.default


# -- capture --------------------------------------------------------------------------------


def _forward(self: nn.RNNBase, x, hx=None):
    """``nn.RNNBase.forward`` as one ``tdag::recurrent`` call (dropout off: eval mode)."""
    if isinstance(x, nn.utils.rnn.PackedSequence):
        raise UnsupportedOpError(f"{type(self).__name__} on a PackedSequence: tdag takes "
                                 "padded sequences (pad_packed_sequence first)")
    lstm = self.mode == "LSTM"
    unbatched = x.dim() == 2
    if unbatched:
        x = x.unsqueeze(0 if self.batch_first else 1)
    directions = 2 if self.bidirectional else 1
    batch = x.shape[0] if self.batch_first else x.shape[1]
    if hx is None:
        h0 = x.new_zeros(self.num_layers * directions, batch, self.proj_size or self.hidden_size)
        states = [h0, x.new_zeros(self.num_layers * directions, batch, self.hidden_size)] \
            if lstm else [h0]
    else:
        states = list(hx) if lstm else [hx]
        states = [h.unsqueeze(1) for h in states] if unbatched else states
    weights = [getattr(self, name) for name in self._flat_weights_names]
    out, *final = torch.ops.tdag.recurrent(x, states, weights, self.mode, self.num_layers,
                                           self.bidirectional, self.batch_first, self.bias)
    if unbatched:
        out, final = out.squeeze(0 if self.batch_first else 1), [h.squeeze(1) for h in final]
    return (out, tuple(final)) if lstm else (out, final[0])


@contextlib.contextmanager
def recurrent_as_ops(module: nn.Module) -> Iterator[None]:
    """While capturing, each recurrent submodule runs as one ``tdag::recurrent`` node. A
    module in training mode with dropout keeps its own forward (tdag refuses it later)."""
    patched = [m for m in module.modules() if isinstance(m, nn.RNNBase) and m.mode in _MODES
               and not (m.training and m.dropout > 0) and "forward" not in vars(m)]
    for m in patched:
        m.forward = types.MethodType(_forward, m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


def has_recurrence(module) -> bool:
    return isinstance(module, nn.Module) and \
        any(isinstance(m, nn.RNNBase) for m in module.modules())


# -- conversion ---------------------------------------------------------------------------


def convert_recurrent(seg, node) -> None:
    """The ``tdag::recurrent`` node ``node`` as Loops in the segmenting converter ``seg``:
    per layer, a segment computes the layer's input and initial states, then one Loop per
    direction runs the cell; the next segment joins the directions."""
    mode, layers, bidirectional, batch_first, has_biases = node.args[3:8]
    weights = [seg.value(w) for w in node.args[2]]
    directions = 2 if bidirectional else 1
    per = len(weights) // (layers * directions)
    origin = seg._origin(node)
    x = None  # the layer's input [B, T, I]: the module's, then the previous layer's output
    finals: list = [[] for _ in node.args[1]]
    for layer in range(layers):
        with seg.builder.active(), seg.builder.scope(origin):
            # read through env: closing a segment turns its values into Boundaries
            if x is None:
                x = seg.read(seg.tensor(seg.value(node.args[0])))
                x = x if batch_first else ops.transpose(x, 0, 1)
            hx = [seg.read(seg.tensor(seg.value(h))) for h in node.args[1]]
            starts = [[ops.select(h, 0, layer * directions + d) for h in hx]
                      for d in range(directions)]
            # the reverse direction runs forwards over the reversed sequence: every loop
            # body is then the same cell, and lowering needs to know only the forward one
            xs = [x, _flip(x, 1)] if bidirectional else [x]
        bounds = seg.close(xs + [s for d in starts for s in d])
        xbs, states = bounds[:directions], bounds[directions:]
        outs = []
        for d in range(directions):
            cell = layer * directions + d
            own = weights[per * cell:per * (cell + 1)]
            carried = states[d * len(hx):(d + 1) * len(hx)]
            seq, last = _loop(seg, node, mode, has_biases, own, xbs[d], carried)
            outs.append(seq)
            for k, h in enumerate(last):
                finals[k].append(h)
        with seg.builder.active(), seg.builder.scope(origin):
            pieces = [seg.read(outs[0])] + [_flip(seg.read(o), 0) for o in outs[1:]]
            x = ops.transpose(ops.concat(pieces, -1) if bidirectional else pieces[0], 0, 1)
    with seg.builder.active(), seg.builder.scope(origin):
        out = x if batch_first else ops.transpose(x, 0, 1)
        # final states nobody reads stay unread: a later segment reading them would keep
        # the loop from lowering to a kernel that does not return them
        read = {u.args[1] for u in node.users if u.target is operator.getitem and u.users}
        result = [out] + [ops.stack([seg.read(h) for h in hs], 0) if k + 1 in read else None
                          for k, hs in enumerate(finals)]
    seg.env[node] = tuple(result)


def _flip(x: Tensor, axis: int) -> Tensor:
    """``x`` with its time ``axis`` reversed (the reverse direction's input and output)."""
    last = ops.sub(ops.size_tensor(x, (axis,), "i64"), 1)
    return ops.gather(x, ops.sub(last, ops.iota(x.shape[axis], "i64", x.builder)), axis,
                      wrap=False)


def _loop(seg, node, mode: str, has_biases: bool, weights, x: Boundary, states):
    """One layer in one direction: a Loop over the time axis of ``x`` [B, T, I] carrying
    ``states`` (h, and c for an LSTM), scanning h. Returns the scanned Boundary [T, B, H] and
    the final states. ``x`` is carried batch first, as the states are: passes that move the
    batch axis (strip_batch) need every carried value to hold it at one place."""
    name = seg.graph_name(f"{seg.prefix}{node.name}_cell")
    seg.graphs[name] = _cell_graph(seg, node, mode, has_biases, weights, x.type,
                                   [s.type for s in states])
    prefix = f"{seg.prefix}{node.name}_"
    index = Value(seg.block_name(prefix + "t"), TensorType((), DType.i64))
    ins = [Value(seg.block_name(f"{prefix}h{k}"), s.type) for k, s in enumerate(states)]
    xin = Value(seg.block_name(prefix + "x"), x.type)
    outs = [seg.block_name(f"{prefix}h{k}_next") for k in range(len(states))]
    scan = seg.block_name(prefix + "y")
    body = Block((index, *ins, xin),
                 (Call(name, (index.name, *(v.name for v in ins), xin.name),
                       (*outs, scan)),),
                 (*outs, xin.name, scan))
    finals = [seg.block_name(f"{prefix}h{k}_last") for k in range(len(states))]
    seq = seg.block_name(prefix + "seq")
    seg.steps.append(Loop((*(s.name for s in states), x.name), body,
                          (*finals, seg.block_name(prefix + "xs"), seq),
                          count=x.type.shape[1], scanned=1))
    hidden = states[0].type
    steps = x.type.shape[1]
    return Boundary(seq, hidden.with_shape((steps,) + hidden.shape)), \
        [Boundary(f, s.type) for f, s in zip(finals, states)]


def _cell_graph(seg, node, mode, has_biases, weights, x_type, state_types) -> TDAG:
    """The cell's TDAG: ``(t, h[, c], x) -> (h'[, c'], h')``, reading step ``t`` of ``x``
    and the cell's weights under their own names."""
    b = Builder()
    with b.active(), b.scope(seg._origin(node)):
        t = b.input("t", TensorType((), DType.i64))
        states = [b.input(f"h{k}", s) for k, s in enumerate(state_types)]
        x = b.input("x", x_type)
        w = [b.weight(v.name, v.kind, v.value, v.type) for v in weights]
        xt = ops.gather(x, t, 1, wrap=False)
        w_ih, w_hh = w[0], w[1]
        b_ih, b_hh = (w[2], w[3]) if has_biases else (None, None)
        gi, gh = ops.linear(xt, w_ih, b_ih), ops.linear(states[0], w_hh, b_hh)
        if mode == "LSTM":
            h, c = lstm_cell(ops.add(gi, gh), states[0], states[1])
            if len(w) > (4 if has_biases else 2):  # proj_size: h is projected
                h = ops.linear(h, w[-1])
            new = [h, c]
        elif mode == "GRU":
            new = [gru_cell(gi, gh, states[0])]
        else:
            pre = ops.add(gi, gh)
            new = [ops.tanh(pre) if mode == "RNN_TANH" else ops.relu(pre)]
        return b.build(new + [new[0]])

