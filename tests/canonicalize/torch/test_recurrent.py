"""nn.RNN / nn.GRU / nn.LSTM as Loop controllers over a symbolic sequence length: the Program
runs, reifies to torch and to ONNX, and matches eager at any length; its size does not depend
on the length it was captured at."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from support.guards import run_onnx

import tdag
import tdag.lower
from tdag.errors import UnsupportedOpError
from tdag.lower.kernels.sequence import Lstm
from tdag.ir.program import Call, Loop

LENGTHS = (3, 9, 40)
SEQ = torch.export.Dim("seq")


class Wrapped(nn.Module):
    """The recurrent module, with initial states as inputs when ``states`` is set."""

    def __init__(self, rnn: nn.RNNBase, states: bool = False):
        super().__init__()
        self.rnn, self.states = rnn, states

    def forward(self, x, *hx):
        out, final = self.rnn(x, (hx if len(hx) > 1 else hx[0]) if hx else None)
        finals = final if isinstance(final, tuple) else (final,)
        return (out, *finals)


CASES = {
    "gru": lambda: nn.GRU(4, 6, num_layers=2),
    "gru_batch_first_states": lambda: nn.GRU(4, 6, num_layers=2, batch_first=True),
    "lstm_bidirectional_batch_first": lambda: nn.LSTM(4, 6, num_layers=2, batch_first=True,
                                                      bidirectional=True),
    "lstm_bidirectional_states": lambda: nn.LSTM(4, 6, num_layers=2, bidirectional=True),
    "lstm_proj": lambda: nn.LSTM(4, 6, num_layers=2, proj_size=3),
    "lstm_no_bias": lambda: nn.LSTM(4, 5, bias=False),
    "rnn_relu": lambda: nn.RNN(4, 5, num_layers=2, nonlinearity="relu"),
    "rnn_tanh_bidirectional": lambda: nn.RNN(4, 5, bidirectional=True, batch_first=True),
}


def _inputs(rnn: nn.RNNBase, length: int, states: bool, batch: int = 3):
    x = torch.randn(batch, length, 4) if rnn.batch_first else torch.randn(length, batch, 4)
    if not states:
        return (x,)
    cells = rnn.num_layers * (2 if rnn.bidirectional else 1)
    h0 = torch.randn(cells, batch, rnn.proj_size or rnn.hidden_size)
    if rnn.mode != "LSTM":
        return (x, h0)
    return (x, h0, torch.randn(cells, batch, rnn.hidden_size))


def _capture(model: Wrapped, length: int):
    args = _inputs(model.rnn, length, model.states)
    # forward(x, *hx): the states are one (var-positional) argument
    shapes = ({1 if model.rnn.batch_first else 0: SEQ},)
    shapes += ((None,) * (len(args) - 1),) if len(args) > 1 else ()
    return tdag.from_torch(model, args, dynamic_shapes=shapes)


def _close(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g, w.detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_recurrence_runs_any_length(case):
    torch.manual_seed(0)
    model = Wrapped(CASES[case](), states="states" in case).eval()
    prog = _capture(model, 5)
    tdag.verify(prog)
    assert any(isinstance(s, Loop) for s in prog.main.steps)
    assert f"rnn.weight_hh_l{model.rnn.num_layers - 1}" in \
        {w for g in prog.graphs.values() for w in g.weights}
    module, onnx_model = tdag.to_torch(prog), tdag.to_onnx(prog)
    for length in LENGTHS:
        args = _inputs(model.rnn, length, model.states)
        with torch.no_grad():
            want = model(*args)
            _close(tdag.run(prog, *args), want)
            _close(module(*args), want)
        _close(run_onnx(onnx_model, *args), want)


@pytest.mark.parametrize("case", ["gru", "lstm_bidirectional_batch_first", "lstm_proj"])
def test_program_size_does_not_grow_with_the_length(case):
    model = Wrapped(CASES[case]()).eval()
    assert _capture(model, 5).num_nodes == _capture(model, 23).num_nodes


def test_gru_captured_at_five_runs_at_nine():
    torch.manual_seed(0)
    model = Wrapped(nn.GRU(4, 6, num_layers=2)).eval()
    prog = _capture(model, 5)
    x = torch.randn(9, 3, 4)
    with torch.no_grad():
        want = model(x)
    out = tdag.to_torch(prog)(x)
    assert out[0].shape == (9, 3, 6)
    _close(out, want)


def test_unbatched_input():
    torch.manual_seed(0)
    model = Wrapped(nn.LSTM(4, 6)).eval()
    prog = tdag.from_torch(model, (torch.randn(5, 4),), dynamic_shapes=({0: SEQ},))
    x = torch.randn(7, 4)
    with torch.no_grad():
        _close(tdag.to_torch(prog)(x), model(x))


class Packed(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 6)

    def forward(self, x):
        packed = nn.utils.rnn.pack_padded_sequence(x, [x.shape[0]] * x.shape[1])
        return self.rnn(packed)[1]


def test_packed_sequences_are_refused():
    with pytest.raises(UnsupportedOpError, match="PackedSequence"):
        tdag.from_torch(Packed().eval(), (torch.randn(5, 3, 4),))


def test_lstm_loops_lower_to_one_fused_kernel_and_gru_loops_stay_loops():
    torch.manual_seed(0)
    lstm = Wrapped(nn.LSTM(4, 6, num_layers=2, bidirectional=True, batch_first=True)).eval()
    lstm_prog = _capture(lstm, 5)
    lowered = tdag.lower.lower(lstm_prog)
    tdag.verify(lowered)
    # c_n is read (Wrapped returns it), which the kernel does not give: those loops stay
    assert any(isinstance(s, Loop) for s in lowered.main.steps)
    tagger = _Tagger().eval()
    prog = tdag.from_torch(tagger, (torch.randint(0, 20, (2, 5)),),
                           dynamic_shapes=({1: SEQ},))
    lowered = tdag.lower.lower(prog)
    # the four loops (two layers, two directions) join into torch's one stacked call
    assert [type(s) for s in lowered.main.steps] == [Call]
    (kernel,) = [n for g in lowered.graphs.values() for n in g.nodes if n.op.value == "lstm"]
    assert kernel.spec == Lstm(layers=2, bidirectional=True)
    assert "torch.lstm(" in tdag.to_torch(prog).code
    tokens = torch.randint(0, 20, (2, 11))
    with torch.no_grad():
        _close((tdag.to_torch(prog)(tokens),), (tagger(tokens),))
        _close((run_onnx(tdag.to_onnx(prog), tokens),), (tagger(tokens),))
    gru = Wrapped(nn.GRU(4, 6)).eval()
    assert any(isinstance(s, Loop) for s in tdag.lower.lower(_capture(gru, 5)).main.steps)


class _Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(20, 4)
        self.lstm = nn.LSTM(4, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.out = nn.Linear(12, 3)

    def forward(self, tokens):
        return self.out(self.lstm(self.embed(tokens))[0])


@pytest.mark.parametrize("length", [None, 6])
def test_a_reverse_lstm_is_one_reverse_kernel(length):
    """At a static length the time reversal is a const index, at a symbolic one a ramp."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.rnn = nn.LSTM(4, 5, bidirectional=True)

    class Out(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = model.rnn

        def forward(self, x):
            return self.rnn(x)[0]
    out = Out().eval()
    shapes = None if length else ({0: SEQ},)
    prog = tdag.from_torch(out, (torch.randn(length or 5, 2, 4),), dynamic_shapes=shapes)
    lowered = tdag.lower.lower(prog)
    (kernel,) = [n for g in lowered.graphs.values() for n in g.nodes if n.op.value == "lstm"]
    assert kernel.spec == Lstm(bidirectional=True)
    x = torch.randn(length or 8, 2, 4)
    with torch.no_grad():
        _close((tdag.run(lowered, x),), (out(x),))


def test_an_lstm_without_biases_is_fused_too():
    torch.manual_seed(0)
    model = nn.LSTM(4, 5, num_layers=2, bias=False).eval()
    prog = tdag.from_torch(_First(model), (torch.randn(5, 2, 4),), dynamic_shapes=({0: SEQ},))
    module = tdag.to_torch(prog)
    assert "torch.lstm(" in module.code
    x = torch.randn(12, 2, 4)
    with torch.no_grad():
        _close((module(x),), (model(x)[0],))
        _close((run_onnx(tdag.to_onnx(prog), x),), (model(x)[0],))


class _First(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]
