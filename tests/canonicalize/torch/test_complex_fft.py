"""Complex values and the FFT from torch, through every target: Meta's complex rotary
embedding (Llama, Mistral), transformers' FNet, and torch.fft's functions with each norm;
the program's run, to_torch, to_jax and to_onnx (onnxruntime) against eager.

Tolerances: 1e-5 of the output's scale (float32 FFTs of length <= 16; to_onnx runs its
DFTs in float64, so it is no worse than torch's).
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import tdag
from tdag import ops
from support.guards import run_onnx

TOL = 1e-5


def _targets(prog, args) -> dict:
    """The program's outputs from tdag.run, to_torch, to_jax and to_onnx."""
    first = lambda r: r[0] if isinstance(r, (tuple, list)) else r  # noqa: E731
    jax_out = tdag.to_jax(prog)(*[a.numpy() for a in args])
    return {"run": first(tdag.run(prog, *args)), "torch": first(tdag.to_torch(prog)(*args)),
            "jax": torch.from_numpy(np.array(first(jax_out))),
            "onnx": first(run_onnx(tdag.to_onnx(prog), *args))}


def assert_targets_match(module, args, tol=TOL):
    ref = module(*args)
    ref = ref if isinstance(ref, torch.Tensor) else ref[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = tdag.from_torch(module, args)
    scale = max(ref.abs().max().item(), 1.0)
    for target, got in _targets(prog, args).items():
        err = (got.to(ref.dtype) - ref).abs().max().item()
        assert got.shape == ref.shape and err <= tol * scale, (target, err)
    return prog


class Rotary(torch.nn.Module):
    """Meta's reference rotary embedding (llama/model.py: apply_rotary_emb)."""

    def __init__(self, seq=8, head_dim=8):
        super().__init__()
        freqs = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(seq).float(), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        freqs = self.freqs_cis.view(1, x.shape[1], 1, xc.shape[-1])
        return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


def test_meta_rotary_embedding_runs_on_every_target():
    prog = assert_targets_match(Rotary().eval(), (torch.randn(2, 8, 3, 8),))
    assert any(t.dtype.value == "c64" for t in (n.type for n in prog.graph.nodes))


def test_fnet_runs_on_every_target():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.FNetConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                     intermediate_size=32, max_position_embeddings=16)
    model = transformers.FNetModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, ids):
            return self.model(ids).last_hidden_state

    prog = assert_targets_match(Hidden(), (torch.randint(0, 50, (2, 8)),), tol=1e-4)
    assert sum(n.op.value == "fft" for n in prog.graph.nodes) == 2  # fftn over 2 axes


@pytest.mark.slow
def test_autoformer_runs_on_every_target():
    """Autoformer's auto-correlation: rfft, a product with the conjugate, irfft."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.AutoformerConfig(
        prediction_length=4, context_length=8, lags_sequence=[1, 2], num_time_features=1,
        d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, moving_average=3)
    model = transformers.AutoformerModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, values, time_features, observed, future_time_features):
            return self.model(past_values=values, past_time_features=time_features,
                              past_observed_mask=observed,
                              future_time_features=future_time_features, return_dict=False)[0]

    args = (torch.randn(2, 10), torch.randn(2, 10, 1), torch.ones(2, 10), torch.randn(2, 4, 1))
    prog = assert_targets_match(Hidden(), args, tol=1e-4)
    assert any(n.op.value == "fft" for n in prog.graph.nodes)


def _pairs(t):
    return torch.view_as_real(t.resolve_conj())


FFTS = {
    "fft": lambda x, norm: _pairs(torch.fft.fft(x, norm=norm)),
    "ifft": lambda x, norm: _pairs(torch.fft.ifft(x, norm=norm)),
    "rfft": lambda x, norm: _pairs(torch.fft.rfft(x, norm=norm)),
    "irfft": lambda x, norm: torch.fft.irfft(torch.fft.rfft(x) * 1.5, n=8, norm=norm),
    "irfft-odd": lambda x, norm: torch.fft.irfft(torch.fft.rfft(x[:, :7]), n=7, norm=norm),
    "fft2": lambda x, norm: _pairs(torch.fft.fft2(x, norm=norm)),
    "rfftn": lambda x, norm: _pairs(torch.fft.rfftn(x, norm=norm)),
    "ifft-complex": lambda x, norm: _pairs(torch.fft.ifft(torch.complex(x, -x), norm=norm)),
    # a real signal's full spectrum is its r2c half and the mirrored conjugates (odd n too)
    "fft-odd": lambda x, norm: _pairs(torch.fft.fft(x[:, :7], norm=norm)),
    # zero-padded to a longer transform along two axes: the pad runs on ONNX's pairs too
    "fft2-padded": lambda x, norm: _pairs(torch.fft.fft2(x, s=(5, 10), norm=norm)),
}


class _Fn(torch.nn.Module):
    def __init__(self, fn, norm):
        super().__init__()
        self.fn, self.norm = fn, norm

    def forward(self, x):
        return self.fn(x, self.norm)


@pytest.mark.parametrize("norm", ["backward", "ortho", "forward"])
@pytest.mark.parametrize("name", sorted(FFTS))
def test_torch_fft_functions_match_on_every_target(name, norm):
    assert_targets_match(_Fn(FFTS[name], norm), (torch.randn(3, 8),))


COMPLEX_OPS = {
    "abs": lambda x: torch.fft.fft(x).abs(),
    "angle": lambda x: torch.complex(x, x.flip(1)).angle(),  # no value on the branch cut
    "conj": lambda x: _pairs(torch.fft.fft(x).conj()),
    "real+imag": lambda x: torch.fft.fft(x).real + torch.fft.fft(x).imag,
    "polar": lambda x: _pairs(torch.polar(x.abs(), x)),
    "complex-div": lambda x: _pairs(torch.complex(x, 2 * x) / torch.complex(x + 3, x)),
    "exp": lambda x: _pairs(torch.exp(torch.complex(x, 2 * x))),
    "sum": lambda x: _pairs(torch.fft.fft(x).sum(0)),
}


@pytest.mark.parametrize("name", sorted(COMPLEX_OPS))
def test_complex_ops_match_on_every_target(name):
    assert_targets_match(_Fn(lambda x, _: COMPLEX_OPS[name](x), None), (torch.randn(3, 8),))


def test_to_onnx_refuses_a_complex_output_naming_it():
    class Spectrum(torch.nn.Module):
        def forward(self, x):
            return torch.fft.fft(x)

    prog = tdag.from_torch(Spectrum(), (torch.randn(2, 8),))
    assert tdag.to_torch(prog)(torch.ones(2, 8)).dtype == torch.complex64
    with pytest.raises(tdag.UnsupportedOpError, match="complex input or output"):
        tdag.to_onnx(prog)


def test_arithmetic_outside_the_complex_set_is_refused():
    class Sine(torch.nn.Module):
        def forward(self, x):
            return torch.view_as_real(torch.sin(torch.fft.fft(x)))

    with pytest.raises(tdag.TdagError, match="sin: takes no complex operand"):
        tdag.from_torch(Sine(), (torch.randn(2, 8),))


def test_complex_weights_print_parse_save_and_load(tmp_path):
    angles = torch.rand(3, 4, dtype=torch.float64)
    freqs = torch.polar(torch.ones_like(angles), angles)
    prog = tdag.trace(lambda x: x * ops.const(freqs), tdag.TensorSpec((3, 4), "c128"))
    assert tdag.parse(str(prog)) == prog
    tdag.save(prog, tmp_path / "c.tdag")
    loaded = tdag.load(tmp_path / "c.tdag")
    x = torch.randn(3, 4, dtype=torch.complex128)
    assert torch.equal(tdag.run(loaded, x), x * freqs)


def test_to_onnx_before_opset_20_gives_dft_its_axis_as_an_attribute():
    module = _Fn(FFTS["irfft"], "ortho")
    x = torch.randn(3, 8)
    prog = tdag.from_torch(module, (x,))
    model = tdag.to_onnx(prog, opset=18)
    assert any(a.name == "axis" for n in model.graph.node if n.op_type == "DFT"
               for a in n.attribute)
    torch.testing.assert_close(run_onnx(model, x), module(x), rtol=1e-5, atol=1e-5)


class _Moduli(torch.nn.Module):
    def forward(self, re, im):
        return torch.hypot(re, im), torch.complex(re, im).abs()


def test_hypot_and_complex_abs_keep_extremes_as_torch():
    """Scaled by the larger part (no square overflows past 1.8e19 nor underflows), inf beside
    a nan, a subnormal modulus: equal to torch's hypot on every target."""
    inf, nan = float("inf"), float("nan")
    re = torch.tensor([3.0, 1e20, 1e-25, inf, inf, nan, 0.0, -0.0, -4.0, nan, 1e-40, -0.0])
    im = torch.tensor([4.0, 1e20, 1e-25, nan, 2.0, 1.0, 0.0, 0.0, 3.0, inf, 0.0, -0.0])
    module = _Moduli()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = tdag.from_torch(module, (re, im))
    want = module(re, im)
    outs = {"run": tdag.run(prog, re, im), "torch": tdag.to_torch(prog)(re, im),
            "onnx": run_onnx(tdag.to_onnx(prog), re, im)}
    for target, got in outs.items():
        for g, w in zip(got, want):
            g = torch.as_tensor(g)
            torch.testing.assert_close(g, w, rtol=2e-7, atol=0, equal_nan=True, msg=target)
            assert not g.signbit().any(), target  # a modulus of -0.0 is 0.0


class _Sgn(torch.nn.Module):
    def forward(self, re, im):
        return torch.view_as_real(torch.sgn(torch.complex(re, im)))


def test_sgn_of_complex_values_on_every_target():
    """z / |z|, 0 at 0, nan in both parts where z has an infinite part (torch's division)."""
    inf, nan = float("inf"), float("nan")
    re = torch.tensor([3.0, 0.0, inf, nan, 1e-30, -0.0, -2.0, 1e20])
    im = torch.tensor([4.0, 0.0, 0.0, 1.0, 1e-30, 0.0, 0.0, -1e20])
    module = _Sgn()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = tdag.from_torch(module, (re, im))
    want = module(re, im)
    for target, got in _targets(prog, (re, im)).items():
        torch.testing.assert_close(torch.as_tensor(got), want, rtol=1e-6, atol=1e-7,
                                   equal_nan=True, msg=target)
