"""|x| lowers to one kernel (torch.abs, ONNX Abs, jnp.abs) where tdag.ops.abs writes
where(x == 0, 0, x * sign(x)) (four torch calls, six ONNX nodes: its Sign wrapped for nan),
a signed integer's as x * sign(x). Checked bit for bit against torch.abs on -0.0, nan,
+-inf, the largest and smallest values (an integer's minimum wraps to itself in both) in
every float width and signed integer type, through to_torch, to_onnx on onnxruntime, to_jax
and tdag.run of the lowered program."""
from __future__ import annotations

import onnxruntime as ort
import pytest
import torch

import tdag
import tdag.lower
from tdag import ops
from tdag.ir.op import Op

from support.torch_models import Fn

FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64]


def _values(dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        special = [-0.0, 0.0, float("nan"), float("inf"), -float("inf"), info.max, info.min,
                   info.tiny, -info.tiny, -1.5, 2.25]
    else:
        info = torch.iinfo(dtype)
        special = [0, 1, -1, info.max, info.min, info.min + 1, -7]
    return torch.tensor(special, dtype=dtype).repeat(3, 1)


def _same(got, want: torch.Tensor, what: str) -> None:
    got = torch.as_tensor(got).to(want.dtype) if not isinstance(got, torch.Tensor) else got
    assert got.dtype == want.dtype, what
    # bit for bit: a -0.0 would pass an equality test
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}.get(want.element_size(), want.dtype)
    if want.dtype.is_floating_point:
        assert torch.equal(got.view(bits), want.view(bits)), (what, got, want)
    else:
        assert torch.equal(got, want), (what, got, want)


@pytest.mark.parametrize("dtype", FLOATS + INTS, ids=str)
def test_abs_is_one_kernel_exactly_torchs(dtype):
    x = _values(dtype)
    prog = tdag.from_torch(Fn(torch.abs), (x,))
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes] == [Op.abs], low
    want = torch.abs(x)
    _same(tdag.run(low, x), want, "tdag.run")
    module = tdag.to_torch(prog)
    assert "torch.abs(" in module.code and "sign" not in module.code, module.code
    _same(module(x), want, "to_torch")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64, *INTS],
                         ids=str)
def test_abs_is_onnx_abs_on_onnxruntime(dtype):
    x = _values(dtype)
    model = tdag.to_onnx(tdag.from_torch(Fn(torch.abs), (x,)))
    carried = ["Cast", "Abs", "Cast"] if dtype is torch.int16 else ["Abs"]  # int32 carries it
    assert [n.op_type for n in model.graph.node] == carried, model.graph.node
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    _same(torch.from_numpy(got), torch.abs(x), "onnxruntime")


def test_abs_on_jax():
    pytest.importorskip("jax")
    x = _values(torch.float32)
    fn = tdag.to_jax(tdag.from_torch(Fn(torch.abs), (x,)))
    _same(torch.from_numpy(__import__("numpy").asarray(fn(x.numpy()))), torch.abs(x), "jax")


def test_a_floats_x_times_sign_is_not_abs():
    """x * sign(x) keeps -0.0 for a float (torch.abs makes it +0.0): left alone."""
    prog = tdag.trace(lambda x: x * ops.sign(x), tdag.TensorSpec((3,)))
    assert Op.abs not in {n.op for n in tdag.lower.lower(prog).graph.nodes}


def test_abs_differentiates_as_torch_does():
    x = torch.tensor([-2.0, -0.0, 0.0, 3.0], requires_grad=True)
    module = tdag.to_torch(tdag.from_torch(Fn(torch.abs), (x.detach(),)))
    module(x).sum().backward()
    assert x.grad.tolist() == [-1.0, 0.0, 0.0, 1.0]
