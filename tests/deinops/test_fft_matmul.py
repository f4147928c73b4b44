"""The ``fft`` primitive's ONNX form at lengths ``fft_matmul.plan`` splits: the four-step
FFT in matmuls (two and three stages), every kind, norm and axis, on onnxruntime against
torch's FFT in float64. Tolerance: 2e-6 of the largest value in float32 (torch's own float32
FFT is 1-2e-7 off at these lengths, the matmuls 3-5e-7), 1e-12 in float64. Short lengths (ONNX's
DFT) are checked on the primitive's differential cases and the ONNX conformance cases."""
from __future__ import annotations

import pytest
import torch

import tdag
from support.guards import run_onnx
from tdag import ops
from tdag.deinops.fft_matmul import Plan, padded, plan

TOL = {torch.float32: 2e-6, torch.float64: 1e-12}
V = ops.view_as_real


def _torch_fn(kind: str, inverse: bool, n: int, axis: int, norm: str):
    if kind == "r2c":
        return lambda x: torch.view_as_real(torch.fft.rfft(x, dim=axis, norm=norm))
    if kind == "c2r":
        return lambda x: torch.fft.irfft(torch.view_as_complex(x), n=n, dim=axis, norm=norm)
    fn = torch.fft.ifft if inverse else torch.fft.fft
    return lambda x: torch.view_as_real(fn(torch.view_as_complex(x), dim=axis, norm=norm))


def _tdag_fn(kind: str, inverse: bool, n: int, axis: int, norm: str):
    if kind == "r2c":
        return lambda x: V(ops.fft(x, axis, norm=norm, kind="r2c"))
    return lambda x: V(ops.fft(ops.view_as_complex(x), axis, inverse, n, norm, kind)) \
        if kind == "c2c" else ops.fft(ops.view_as_complex(x), axis, True, n, norm, "c2r")


def _operand_shape(kind: str, n: int, axis: int, rows: int) -> tuple:
    length = n // 2 + 1 if kind == "c2r" else n
    shape = [rows, rows]
    shape.insert(axis, length)
    return tuple(shape) if kind == "r2c" else (*shape, 2)


CASES = [  # kind, inverse, n, axis, norm
    ("c2c", False, 1024, 2, "backward"),
    ("c2c", True, 256, 0, "ortho"),
    ("r2c", False, 1024, 2, "forward"),
    ("r2c", False, 96, 1, "backward"),
    ("c2r", True, 1024, 2, "backward"),
    ("c2r", True, 100, 0, "ortho"),
    ("c2r", True, 99, 1, "backward"),    # odd: no Nyquist frequency
    ("c2c", False, 8192, 2, "ortho"),     # three stages: 16 x 16 x 32
    ("r2c", False, 8192, 0, "backward"),
    ("c2r", True, 8192, 1, "forward"),
    ("c2c", True, 65536, 1, "backward"),  # 32 x 32 x 64
    ("r2c", False, 65536, 2, "ortho"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind,inverse,n,axis,norm", CASES)
def test_onnx_matches_torch_in_float64(kind, inverse, n, axis, norm, dtype):
    rows = 2 if n > 1024 else 3
    shape = _operand_shape(kind, n, axis, rows)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(n), dtype=dtype)
    spec = tdag.TensorSpec(shape, "float32" if dtype is torch.float32 else "float64")
    prog = tdag.trace(_tdag_fn(kind, inverse, n, axis, norm), spec)
    model = tdag.to_onnx(prog)
    assert "DFT" not in {node.op_type for node in model.graph.node}
    got = run_onnx(model, x)
    ref = _torch_fn(kind, inverse, n, axis, norm)(x.double())
    assert got.shape == ref.shape and got.dtype == dtype
    assert (got.double() - ref).abs().max() <= TOL[dtype] * ref.abs().max()


def test_a_symbolic_batch_runs_at_any_size():
    prog = tdag.trace(lambda x: V(ops.fft(x, 1, kind="r2c")), tdag.TensorSpec(("b", 256)))
    model = tdag.to_onnx(prog)
    for b in (1, 5):
        x = torch.randn(b, 256)
        ref = torch.view_as_real(torch.fft.rfft(x.double()))
        assert (run_onnx(model, x).double() - ref).abs().max() <= 2e-6 * ref.abs().max()


def test_plan_splits_near_the_square_root_or_cube_root_and_leaves_the_rest_to_dft():
    assert plan(1024) == Plan(32, 32, None)
    assert plan(2046) == Plan(33, 62, None)
    assert plan(65536) == Plan(32, 2048, Plan(32, 64, None))
    assert plan(12 * 509) == Plan(12, 509, None)  # the prime 509: one dense stage
    assert plan(4 * 4099) is None  # 4,099 points dense: 128 MB of constants
    assert padded(plan(1024), 513) == 544  # c2r's one-sided spectrum: 17 of 32 rows
    assert plan(32) is None  # short: ONNX's DFT
    assert plan(2 * 1031) is None  # 2 x a prime: no factor from 4


def test_short_and_prime_lengths_keep_onnx_dft():
    prog = tdag.trace(lambda x: V(ops.fft(x, 1, kind="r2c")), tdag.TensorSpec((2, 127)))
    assert "DFT" in {n.op_type for n in tdag.to_onnx(prog).graph.node}


def test_the_full_spectrum_of_a_real_signal_is_one_transform():
    """fft_of_real (torch.fft.fft of a real tensor, tdag/lower/kernels/fft.py) runs the
    four-step FFT on the real rows and keeps every frequency."""
    prog = tdag.trace(lambda x: V(ops.full_spectrum(ops.fft(x, 0, norm="ortho", kind="r2c"),
                                                    0, 256)), tdag.TensorSpec((256, 3)))
    model = tdag.to_onnx(prog)
    assert "DFT" not in {node.op_type for node in model.graph.node}
    x = torch.randn(256, 3)
    ref = torch.view_as_real(torch.fft.fft(x.double(), dim=0, norm="ortho"))
    assert (run_onnx(model, x).double() - ref).abs().max() <= 2e-6 * ref.abs().max()
