"""torch.logaddexp, torch.atan2, torch.hypot and torch.nan_to_num lower to one kernel each:
logaddexp's composition (max(a, b) + log1p(exp(-|a - b|)), the equal infinities kept) is
sixteen passes and four bool tensors, atan2's (atan(y / x), the quadrant's shift and the
limits of 0/0 and inf/inf) sixteen, hypot's (scaled by the larger magnitude, inf beside a
nan) twelve, nan_to_num's three tests and selects six. The reified module calls the torch
function (bit for bit); ONNX, which has none of them, runs a composition (logaddexp's tail
log1p(e) as log(u) - ((u - 1) - e) / u, u = 1 + e: a tail of 1e-9 keeps its digits where
log(1 + e) would give 0); jax jnp.logaddexp, arctan2, hypot and nan_to_num. Checked on
every pair of nan, +-inf, -0.0, 0, the largest floats and others, then random values,
through tdag.run of the lowered program, to_torch, onnxruntime and to_jax (float32: 1e-6
relative)."""
from __future__ import annotations

import importlib.util

import numpy as np
import onnxruntime as ort
import pytest
import torch

import tdag
import tdag.lower
from tdag.ir.op import Op

from support.torch_models import Fn

_SPECIAL = [float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-7, -20.0, 20.0, 3e38,
            -3e38, 88.0, -88.0, 0.5]


def _pair() -> tuple[torch.Tensor, torch.Tensor]:
    """Every special value beside every other, then random ones."""
    special = torch.tensor(_SPECIAL)
    a, b = torch.meshgrid(special, special, indexing="ij")
    noise = torch.randn(2, 64, generator=torch.Generator().manual_seed(0)) * 10
    return torch.cat([a.reshape(-1), noise[0]]), torch.cat([b.reshape(-1), noise[1]])


FUNCTIONS = {  # name: (the function of a and b, the kernel)
    "logaddexp": (torch.logaddexp, Op.logaddexp),
    "atan2": (torch.atan2, Op.atan2),
    "hypot": (torch.hypot, Op.hypot),
    "nan_to_num": (lambda a, b: torch.nan_to_num(a), Op.nan_to_num),
    "nan_to_num-values": (lambda a, b: torch.nan_to_num(a, 1.5, 100.0, -7.0), Op.nan_to_num),
}


def _close(got, want: torch.Tensor, rtol: float, what: str) -> None:
    got = torch.as_tensor(np.asarray(got))
    if rtol == 0:
        assert torch.equal(got.nan_to_num(0.125), want.nan_to_num(0.125)), what
        assert torch.equal(got.isnan(), want.isnan()), what
        return
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol * 1e-3, equal_nan=True,
                               msg=what)


@pytest.fixture(scope="module", params=sorted(FUNCTIONS))
def case(request):
    fn, op = FUNCTIONS[request.param]
    a, b = _pair()
    return tdag.from_torch(Fn(fn), (a, b)), fn, op, a, b


def test_one_kernel_and_torchs_values(case):
    prog, fn, op, a, b = case
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes] == [op], low
    want = fn(a, b)
    _close(tdag.run(low, a, b), want, 0, "tdag.run")
    _close(tdag.run(prog, a, b), want, 1e-6, "the composition")
    module = tdag.to_torch(prog)
    assert f"torch.{op.value}(" in module.code or f"torch.{op.value}_(" in module.code
    _close(module(a, b), want, 0, "to_torch")


def test_onnxruntime_and_jax(case):
    prog, fn, _, a, b = case
    want = fn(a, b)
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    feeds = dict(zip((i.name for i in session.get_inputs()), (a.numpy(), b.numpy())))
    _close(session.run(None, feeds)[0], want, 1e-6, "onnxruntime")
    if importlib.util.find_spec("jax"):
        _close(tdag.to_jax(prog)(a.numpy(), b.numpy()), want, 1e-6, "jax")


def test_logaddexp_keeps_a_small_tail_in_onnx():
    """log(exp(0) + exp(-20)) = 2.06e-9: Log(1 + Exp(-20)) would give 0; and the exporter's
    log(exp(a) + exp(b)) is inf past 88 and -inf below -104."""
    a = torch.tensor([0.0, 0.0, 0.0, 100.0, -200.0, 1e-8])
    b = torch.tensor([-20.0, -30.0, -5.0, 99.0, -201.0, -1e-8])
    model = tdag.to_onnx(tdag.from_torch(Fn(torch.logaddexp), (a, b)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, dict(zip((i.name for i in session.get_inputs()),
                                     (a.numpy(), b.numpy()))))[0]
    torch.testing.assert_close(torch.from_numpy(got), torch.logaddexp(a, b), rtol=1e-6, atol=0)


def test_atan2s_composition_takes_the_limits_c_does():
    """atan(y / x) alone is nan at (0, 0) and (inf, inf) and loses -0.0's sign; the
    composition (what tdag.run of an unlowered program and the ONNX file compute) gives C's
    atan2 there: +-0 or +-pi for two zeros, +-pi/4 or +-3pi/4 for two infinities, pi/2 for
    (1, -0.0), zeros' signs kept."""
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), -float("inf")])
    y, x = (t.reshape(-1) for t in torch.meshgrid(special, special, indexing="ij"))
    prog = tdag.from_torch(Fn(torch.atan2), (y, x))
    got, want = tdag.run(prog, y, x), torch.atan2(y, x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    assert torch.equal(torch.signbit(got), torch.signbit(want))
