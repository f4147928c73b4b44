"""A Loop whose body is one LSTM cell -> a Call of the fused ``lstm`` kernel.

``from_torch`` turns ``nn.LSTM`` into one Loop per layer and direction (``torch_recurrent``);
run step by step, that is a dozen small kernels per time step. This Program-level pass
recognises the loop by data flow, after the per-TDAG passes have lowered the cell:

    loop(h0, c0, x[B, T, I], count=T, scanned=1) body(t, h, c, x):
        G = einsum(gather(x, t, axis=1), w_ih, b_ih) + einsum(h, w_hh, b_hh)
        c' = sigmoid(G[f]) * c + sigmoid(G[i]) * tanh(G[g]);  h' = sigmoid(G[o]) * tanh(c')
        -> (h', c', x, h')

and replaces it by a Call of a TDAG running ``lstm(x^T, w_ih, w_hh, b_ih, b_hh, h0, c0)``
over the (symbolic) length. A loop whose final cell state is read stays a loop: the kernel
returns the hidden states only. A loop that does not match stays a loop too.
"""
from __future__ import annotations

import torch

from tdag.ops.builder import Builder
from tdag.ops.core import select, transpose
from tdag.lower.kernels.contraction import parse_equation
from tdag.lower.kernels.sequence import Lstm
from tdag.ir.graph import TDAG
from tdag.ir.names import FreshNames
from tdag.ir.op import Op
from tdag.ir.program import (
    Block,
    Call,
    Loop,
    Program,
    nested_blocks,
    read_after,
    rewrite_blocks,
    with_blocks,
)
from tdag.ir.rewrite import Context
from tdag.ir.symbols import dims_equal, is_static
from tdag.lower.recurrent import match_cell_state, match_gates, match_hidden, is_linear_form


def lower_recurrent_loops(prog: Program) -> tuple[Program, bool]:
    """The pass: every LSTM-cell loop of every block becomes a kernel call."""
    return rewrite_blocks(prog, _block)


def _block(block: Block, graphs: dict, prog: Program) -> tuple[Block, bool]:
    steps, changed = [], False
    for k, step in enumerate(block.steps):
        call = _as_kernel(step, graphs, read_after(block, k, prog.state)) \
            if isinstance(step, Loop) else None
        if call is not None:
            step, changed = call, True
        elif nested_blocks(step):
            inner = [_block(b, graphs, prog) for b in nested_blocks(step)]
            step = with_blocks(step, [b for b, _ in inner])
            changed = changed or any(c for _, c in inner)
        steps.append(step)
    return Block(block.inputs, tuple(steps), block.outputs), changed


def _as_kernel(loop: Loop, graphs: dict, read: set) -> Call | None:
    """The Call replacing ``loop``, or None where it is not an LSTM-cell loop."""
    cell = _cell_of(loop, graphs)
    if cell is None:
        return None
    graph, weights = cell
    h_last, c_last, x_out, seq = loop.outputs
    if c_last in read or x_out in read:
        return None  # the kernel gives the hidden states only
    b = Builder()
    with b.active():
        h0, c0, x = (b.input(f"in{k}", v.type) for k, v in
                     enumerate(loop.body.inputs[1:4]))
        # the kernel always adds biases: zeros where the cell has none
        gates = graph.weights[weights[0]].type.shape[0]
        w = [b.weight(n, graph.weights[n].kind, graph.weights[n].value, graph.weights[n].type)
             if n is not None else b.const(torch.zeros(gates, dtype=x.dtype.torch))
             for n in weights]
        y = b.emit(Op.lstm, Lstm(), transpose(x, 0, 1), *w, h0, c0)
        outs, names = [], []
        if h_last in read:
            outs.append(select(y, 0, -1))
            names.append(h_last)
        if seq in read:
            outs.append(y)
            names.append(seq)
    name = FreshNames().fresh("lstm", avoid=graphs)
    graphs[name] = b.build(outs)
    return Call(name, loop.inputs, tuple(names))


def _cell_of(loop: Loop, graphs: dict):
    """``(cell TDAG, [w_ih, w_hh, b_ih, b_hh])`` when ``loop`` runs one LSTM cell over the
    time axis of its carried ``x``, else None."""
    body = loop.body
    if loop.cond is not None or loop.scanned != 1 or loop.count is None or \
            len(body.inputs) != 4 or len(body.steps) != 1 or not isinstance(body.steps[0], Call):
        return None
    call = body.steps[0]
    t, h, c, x = (v.name for v in body.inputs)
    if call.inputs != (t, h, c, x) or len(call.outputs) != 3 or \
            body.outputs != (*call.outputs[:2], x, call.outputs[2]) or \
            not dims_equal(body.inputs[3].type.shape[1], loop.count):
        return None
    graph = graphs[call.graph]
    weights = _match_cell(graph)
    return (graph, weights) if weights is not None else None


def _match_cell(graph: TDAG):
    """The weights of ``graph`` when it is ``(t, h, c, x) -> (h', c', h')``, one LSTM step
    reading ``x`` at ``t`` on axis 1."""
    t, h, c, x = (v.name for v in graph.inputs)
    h_out, c_out, again = graph.outputs
    ctx = Context(graph)
    found = match_hidden(ctx, h_out) if again == h_out else None
    if found is None or found[1] != c_out:
        return None
    cell = match_cell_state(ctx, c_out)
    hidden = ctx.type(h_out).shape[-1]
    if cell is None or cell[3] != c or not is_static(hidden):
        return None
    gates = match_gates(ctx, (cell[0], cell[1], cell[2], found[0]), hidden)
    pair = ctx.made(gates, Op.add) if gates is not None else None
    if pair is None:
        return None
    for xs, hs in (pair.inputs, pair.inputs[::-1]):
        xin, rec = ctx.made(xs, Op.einsum), ctx.made(hs, Op.einsum)
        if xin is None or rec is None or not _affine(xin) or not _affine(rec) or \
                rec.inputs[0] != h or len(xin.inputs) != len(rec.inputs):
            continue
        step = ctx.made(xin.inputs[0], Op.gather)
        if step is None or step.inputs != (x, t) or step.spec.axis != 1:
            continue
        biases = (xin.inputs[2], rec.inputs[2]) if len(xin.inputs) == 3 else (None, None)
        weights = (xin.inputs[1], rec.inputs[1], *biases)
        if all(n is None or n in graph.weights for n in weights):
            return weights
    return None


def _affine(node) -> bool:
    """x @ w.T, with or without a bias (an LSTM made with ``bias=False`` has none)."""
    if len(node.inputs) == 2:
        (la, lb), lo = parse_equation(node.spec.equation)
        return len(la) == 2 and len(lb) == 2 and la[1] == lb[1] and lo == la[0] + lb[0]
    return is_linear_form(node)


__all__ = ["lower_recurrent_loops"]
