"""complex32 (torch.chalf, tdag's c32): a pair of float16s, from torch through every target.

torch's CPU kernels compute complex32 in few ops (casts, add, neg, multiply, where, eq/ne and
the ops that move values); tdag takes c32 where torch does and refuses it by name where torch
has no kernel. The casts and the ops that move values are exact, and so is the arithmetic
torch has: torch multiplies in float32 and rounds once, and to_onnx does the same on the
float16 pairs; so each target is compared with eager bit for bit. JAX has no complex32.

Each case is one op on the complex values: onnxruntime's CPU runs a chain of float16
arithmetic in float32 without rounding between the ops (a plain float16 program too), so a
chain may differ from torch's by an ulp there.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import tdag
from tdag import ops
from tdag.ir.parser import parse
from support.guards import run_onnx

F = torch.nn.functional
IDX = torch.tensor([2, 0, 1, 2])

# special values: signed zeros, the largest float16 (65504), a tie at the float16 spacing
# (2049), a subnormal, values whose square overflows float16 (|x| >= 256); for the casts also
# values past float16's range, infinities and NaN
FINITE = [0.0, -0.0, 65504.0, 2049.0, 1e-7, 300.0, -299.0]
SPECIAL = FINITE + [65520.0, 1e6, float("inf"), -float("inf"), float("nan")]


def _inputs(seed: int = 0, special=tuple(SPECIAL)) -> torch.Tensor:
    """A [4, 6] float32 with random values at several scales, then the special ones."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 6, generator=g) * torch.tensor([1.0, 10.0, 300.0, 1e-3])[:, None]
    x.view(-1)[:len(special)] = torch.tensor(special)
    return x


def _pairs(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(x) if x.is_complex() else x


def _half(x: torch.Tensor) -> torch.Tensor:
    """x's values as a complex32, each row's neighbours a (real, imaginary) pair."""
    return torch.view_as_complex(x.half().reshape(*x.shape[:-1], -1, 2))


# each module takes float32 (or complex32) and returns a real tensor, complex32 as its pairs
CASTS = {
    "f32-c32": lambda x: x.chalf(),
    "f64-c32": lambda x: x.double().chalf(),
    "i64-c32": lambda x: x.clamp(-1e4, 1e4).nan_to_num().long().chalf(),
    "c32-c64": lambda x: x.chalf().to(torch.complex64),
    "c64-c32": lambda x: torch.view_as_complex(x.reshape(4, 3, 2)).to(torch.complex32),
    "c32-f32": lambda x: _half(x).float(),
    "c32-f16": lambda x: _half(x).real,
    "c32-i32": lambda x: _half(x.nan_to_num().clamp(-1e4, 1e4)).real.int(),
    "pair-c32-pair": lambda x: torch.view_as_real(_half(x)),
}
ARITHMETIC = {
    "neg": lambda x: -_half(x),
    "add": lambda x: _half(x) + _half(x.flip(0)),
    "sub": lambda x: _half(x) - _half(x.flip(1)),
    "mul": lambda x: _half(x) * _half(x.flip(0)),
    "mul-scalar": lambda x: _half(x) * (1 + 2j),
    "conj": lambda x: _half(x).conj().resolve_conj(),
    "where": lambda x: torch.where(x[:, :3] > 0, _half(x), -_half(x)),
    "eq": lambda x: _half(x) == _half(x.flip(0)),
    "permute": lambda x: _half(x).t(),
    "cat": lambda x: torch.cat([_half(x), _half(x.flip(0))], 1),
    "pad": lambda x: F.pad(_half(x), (1, 2)),
    "slice": lambda x: _half(x)[1:, ::2],
    "reshape": lambda x: _half(x).reshape(2, 6),
    "expand": lambda x: _half(x)[None].expand(2, 4, 3),
    "unfold": lambda x: _half(x).unfold(1, 2, 1),
    "index_select": lambda x: _half(x).index_select(0, IDX),
    "abs": lambda x: _half(x).abs(),
}


class _Module(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return _pairs(self.fn(x))


def _capture(module, x) -> tdag.Program:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "ComplexHalf support is experimental"
        return tdag.from_torch(module, (x,))


def _assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Equal dtype, shape and bits (-0.0 is not 0.0), NaN where eager has NaN (of any sign
    and payload)."""
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape)
    if want.dtype is torch.bool:
        assert torch.equal(got, want), what
        return
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan), (what, got, want)
    assert torch.equal(got[~nan].view(torch.uint8), want[~nan].view(torch.uint8)), \
        (what, got, want)


def _every_target(fn, x) -> None:
    module = _Module(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = module(x)
    prog = _capture(module, x)
    for what, got in (("run", tdag.run(prog, x)), ("to_torch", tdag.to_torch(prog)(x)),
                      ("to_onnx", run_onnx(tdag.to_onnx(prog), x))):
        _assert_same_bits(got.contiguous(), want.contiguous(), what)


@pytest.mark.parametrize("name", CASTS)
def test_casts_to_and_from_complex32_are_exact_on_every_target(name):
    _every_target(CASTS[name], _inputs())


@pytest.mark.parametrize("name", ARITHMETIC)
def test_what_torch_computes_in_complex32_matches_it_bit_for_bit(name):
    """Finite values: at an infinite part torch's add multiplies by alpha = 1 + 0i (inf * 0
    is NaN) and its abs is hypot (inf where a part is inf and the other NaN). No -0.0 in a
    cat: tdag.run adds the padded pieces (0.0 + -0.0 is 0.0)."""
    special = [v for v in FINITE if str(v) != "-0.0"] if name == "cat" else FINITE
    for seed in range(3):
        _every_target(ARITHMETIC[name], _inputs(seed, tuple(special)))


def test_products_past_float16s_range_round_once_as_torch_does():
    """(300 + 299i)^2 = 599 + 179400i: 300 * 300 overflows float16, their difference does
    not; torch multiplies in float32 and rounds once, and so does to_onnx's graph."""
    x = torch.tensor([[300.0, 299.0, 250.0, -251.0, 1.0, 2.0]] * 4)
    _every_target(lambda x: _half(x) * _half(x), x)


def test_complex32_inputs_and_outputs_run_on_torch_and_are_refused_by_onnx():
    class Square(torch.nn.Module):
        def forward(self, z):
            return z * z + z

    z = _half(_inputs()).clone()  # not a view: torch.export replays an input's view
    prog = _capture(Square(), z)
    assert prog.main.inputs[0].type.dtype is tdag.DType.c32
    want = _pairs(Square()(z))
    for what, got in (("run", tdag.run(prog, z)), ("to_torch", tdag.to_torch(prog)(z))):
        _assert_same_bits(_pairs(got), want, what)
    with pytest.raises(tdag.UnsupportedOpError, match="c32.*complex input or output"):
        tdag.to_onnx(prog)


# what torch has no complex32 kernel for on CPU, and the tdag op that names the refusal
REFUSED = {
    "sum": ("reduce", lambda z: z.sum(0)),
    "exp": ("exp", lambda z: z.exp()),
    "div": ("divide", lambda z: z / z),
    "fft": ("fft", lambda z: torch.fft.fft(z)),
    "angle": ("angle", lambda z: z.angle()),
    "matmul": ("reduce", lambda z: z @ z.t()),  # the contraction's sum
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_torch_refuses_on_complex32_is_refused_by_name(name):
    op, fn = REFUSED[name]
    module, z = _Module(fn), _half(_inputs()).clone()
    with warnings.catch_warnings(), pytest.raises((NotImplementedError, RuntimeError)):
        warnings.simplefilter("ignore")
        module(z)
    with pytest.raises(tdag.TdagError, match=rf"{op}: .*complex32"):
        _capture(module, z)


def _c32_program() -> tdag.Program:
    """A c32 input times a c32 const, plus a c32 parameter (stored, not printed)."""
    const = torch.complex(torch.tensor([1.5, -0.0, 65504.0]), torch.tensor([2.0, 1e-7, -3.0]))
    param = _half(_inputs())[0]

    def fn(z):
        return ops.add(ops.mul(z, ops.const(const.chalf())), ops.param("w", param))

    return tdag.trace(fn, tdag.TensorSpec((3,), "complex32"))


def test_a_complex32_program_prints_parses_and_saves(tmp_path):
    prog = _c32_program()
    text = str(prog)
    assert "c32[3]" in text and "complex(" not in text  # the const's values as pairs
    parsed = parse(text)
    assert parsed == prog and str(parsed) == text
    path = tmp_path / "c32.tdag"
    tdag.save(prog, path)
    loaded = tdag.load(path)
    assert loaded == prog
    z = _half(_inputs())[1]
    _assert_same_bits(_pairs(tdag.run(loaded, z)), _pairs(tdag.run(prog, z)), "load")
    for name, weight in prog.graphs["main"].weights.items():
        got = loaded.graphs["main"].weights[name].value
        _assert_same_bits(_pairs(got), _pairs(weight.value), f"load {name}")
        if weight.kind is tdag.TensorKind.const:
            got = parsed.graphs["main"].weights[name].value
            _assert_same_bits(_pairs(got), _pairs(weight.value), f"parse {name}")


def test_to_jax_refuses_complex32_by_name():
    pytest.importorskip("jax")
    prog = _capture(_Module(CASTS["f32-c32"]), _inputs())
    with pytest.raises(tdag.UnsupportedOpError, match="c32.*JAX has no complex32"):
        tdag.to_jax(prog)
