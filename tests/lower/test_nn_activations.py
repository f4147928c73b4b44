"""torch.nn.functional's leaky_relu, elu (selu, celu: aten.elu's scales), hardshrink,
softshrink, hardsigmoid, softplus, mish and logsigmoid,
torch.floor, ceil and round, and torch.log1p and expm1 lower to one kernel each (tdag.ops
writes them as three to fourteen elementwise passes and bool tensors): the reified module
calls the torch function, the ONNX file holds the op of that name (LeakyRelu, Elu, Selu,
Celu, Shrink (its nan kept, which ONNX's makes 0),
HardSigmoid, Softplus, Mish, Floor, Ceil, Round; logsigmoid its composition; ONNX has no
log1p or expm1: Kahan's composition and tanh(x/2) (e^x + 1), accurate where the exporter's
Log(1 + x) loses every digit), jax its jax function. Rounding is checked bit for bit (-0.0
and halves to even included). Checked against torch eager on
random values and on nan, +-inf, -0.0, values by 0 and past softplus's threshold, through
tdag.run of the lowered program, to_torch, onnxruntime and to_jax (float32: 1e-6 relative,
onnxruntime's own formulas 1e-5)."""
from __future__ import annotations

import importlib.util

import numpy as np
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F

import tdag
import tdag.lower
from tdag.ir.op import Op

from support.torch_models import Fn

ACTIVATIONS = {  # name: (the torch function, the kernel, the ONNX op)
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), Op.leaky_relu, "LeakyRelu"),
    "leaky_relu-default": (F.leaky_relu, Op.leaky_relu, "LeakyRelu"),
    "elu": (F.elu, Op.elu, "Elu"),
    "elu-alpha": (lambda x: F.elu(x, 0.3), Op.elu, "Elu"),
    "selu": (F.selu, Op.elu, "Selu"),
    "selu-doubled": (lambda x: F.selu(x) * 2, Op.elu, "Selu"),
    "celu": (lambda x: F.celu(x, 0.3), Op.elu, "Celu"),
    "elu-scaled": (lambda x: torch.ops.aten.elu(x, 0.7, 2.0, 0.5), Op.elu, "Exp"),
    "hardshrink": (lambda x: F.hardshrink(x, 0.3), Op.shrink, "Where"),  # |x| <= l: 0
    "softshrink": (F.softshrink, Op.shrink, "Shrink"),
    "hardsigmoid": (F.hardsigmoid, Op.hardsigmoid, "HardSigmoid"),
    "softplus": (F.softplus, Op.softplus, "Softplus"),
    "softplus-beta": (lambda x: F.softplus(x, 2.0, 3.0), Op.softplus, "Softplus"),
    "mish": (F.mish, Op.mish, "Mish"),
    "logsigmoid": (F.logsigmoid, Op.logsigmoid, "Exp"),  # ONNX has none: the composition
    "floor": (torch.floor, Op.rounding, "Floor"),
    "ceil": (torch.ceil, Op.rounding, "Ceil"),
    "round": (torch.round, Op.rounding, "Round"),
    "log1p": (torch.log1p, Op.log1p, "Log"),
    "expm1": (torch.expm1, Op.expm1, "Tanh"),
}
EXACT = {"floor", "ceil", "round"}


def _values() -> torch.Tensor:
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e-7, -1e-7,
                            -3.0, 3.0, 2.9, 19.9, 20.1, 25.0, -25.0, 1e30, -1e30, 0.5, 1.5,
                            2.5, -0.5, -1.5, -2.5, 2.0 ** 23 + 1, -(2.0 ** 22) - 0.5, 0.49999997,
                            -0.49999997, 7.5, -7.5, 1.0000001, -1.0000001, 4.0, -4.0])
    return torch.cat([special, torch.randn(48, generator=torch.Generator().manual_seed(0)) * 4])


def _close(got, want: torch.Tensor, rtol: float, what: str) -> None:
    got = torch.as_tensor(np.asarray(got))
    if rtol == 0:  # bit for bit: -0.0 and nan's place included
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (what, got, want)
        return
    torch.testing.assert_close(got, want, rtol=rtol, atol=rtol, equal_nan=True, msg=what)


@pytest.fixture(scope="module", params=sorted(ACTIVATIONS))
def case(request):
    fn, op, onnx_op = ACTIVATIONS[request.param]
    x = _values().reshape(4, -1)
    return tdag.from_torch(Fn(fn), (x,)), fn, op, onnx_op, x, request.param in EXACT


def test_one_kernel_and_torchs_values(case):
    prog, fn, op, _, x, exact = case
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes] == [op], low
    want = fn(x)
    _close(tdag.run(low, x), want, 0 if exact else 1e-6, "tdag.run")
    module = tdag.to_torch(prog)
    calls = [line for line in module.code.split("def forward")[0].splitlines()[1:]
             if line.strip() and not line.strip().startswith(("del ", "return"))]
    assert len(calls) == 1 and ("F." in calls[0] or "torch." in calls[0]), module.code
    _close(module(x), want, 0, "to_torch")  # the same function


def test_the_onnx_op_on_onnxruntime(case):
    prog, fn, _, onnx_op, x, exact = case
    model = tdag.to_onnx(prog)
    assert onnx_op in [n.op_type for n in model.graph.node], model.graph.node
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _close(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], fn(x),
           0 if exact else 1e-5, "onnxruntime")


def test_jax(case):
    pytest.importorskip("jax")
    prog, fn, _, _, x, exact = case
    _close(tdag.to_jax(prog)(x.numpy()), fn(x), 0 if exact else 1e-5, "jax")


def test_in_place_when_the_operand_dies():
    """Under no_grad the module writes over a dying operand (inplace=True), as torch's own
    activations modules may; with autograd on it makes a new tensor and differentiates."""
    module = tdag.to_torch(tdag.from_torch(Fn(lambda x: F.leaky_relu(x * 2, 0.1)),
                                           (torch.randn(3, 4),)))
    assert "inplace=True" in module.code, module.code
    x = torch.randn(3, 4, requires_grad=True)
    module(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.where(x > 0, 2.0, 0.2).detach())


@pytest.mark.parametrize("axes,keepdim", [(-1, False), (1, True), ((0, 2), False)])
def test_logsumexp_is_one_kernel_with_torchs_infinities(axes, keepdim):
    """torch.logsumexp, ONNX ReduceLogSumExp, jax.nn.logsumexp: a row holding +inf gives +inf,
    an all -inf row -inf, a nan row nan (the composition's max shift masks an infinite max)."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(1)) * 30
    x[0, 1, :], x[1, 2, 3], x[2, 0, 1] = -float("inf"), float("inf"), float("nan")
    fn = lambda t: torch.logsumexp(t, axes, keepdim)  # noqa: E731
    prog = tdag.from_torch(Fn(fn), (x,))
    low = tdag.lower.lower(prog)
    assert [n.op for n in low.graph.nodes] == [Op.logsumexp], low
    want = fn(x)
    _close(tdag.to_torch(prog)(x), want, 0, "to_torch")
    _close(tdag.run(prog, x), want, 1e-6, "the composition")
    model = tdag.to_onnx(prog)
    assert [n.op_type for n in model.graph.node] == ["ReduceLogSumExp"], model.graph.node
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _close(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], want, 1e-5,
           "onnxruntime")
    if importlib.util.find_spec("jax"):
        _close(tdag.to_jax(prog)(x.numpy()), want, 1e-5, "jax")


@pytest.mark.parametrize("fn", [torch.log1p, torch.expm1], ids=["log1p", "expm1"])
def test_log1p_and_expm1_keep_their_digits_by_zero_in_onnx(fn):
    """Within 4 float32 ulp of torch over 1e-30 .. 1e30 either sign (zero's sign aside:
    onnxruntime's Where and Tanh make -0.0 +0.0)."""
    magnitudes = torch.logspace(-30, 30, 601)
    x = torch.cat([magnitudes, -magnitudes, torch.tensor([-0.0, 0.0, 0.4999, 0.5, -0.5,
                                                          -0.9999999, -1.0])])
    if fn is torch.log1p:
        x = x[x >= -1]
    model = tdag.to_onnx(tdag.from_torch(Fn(fn), (x,)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    want = fn(x.double())
    finite = want.isfinite() & (want.abs() < 3e38)
    ulp = (torch.nextafter(want.float().abs(), torch.tensor(float("inf"))) -
           want.float().abs()).double()
    assert ((got.double() - want).abs()[finite] <= 4 * ulp[finite]).all(), \
        x[finite][((got.double() - want).abs()[finite] > 4 * ulp[finite])]
    assert torch.equal(got[~finite], want[~finite].float())


@pytest.mark.parametrize("axes,correction,keepdim", [(-1, 1, False), ((1, 2), 0, True)])
def test_var_is_one_torch_var(axes, correction, keepdim):
    """torch.var's one pass (std: var, then its square root); ONNX has no variance op, so
    the file holds the composition; a nan or inf in a row makes it nan everywhere."""
    x = torch.randn(3, 4, 5, generator=torch.Generator().manual_seed(2)) * 10 + 3
    x[0, 1, 2], x[1, 0, 0] = float("nan"), float("inf")
    fn = lambda t: torch.var(t, axes, correction=correction, keepdim=keepdim)  # noqa: E731
    prog = tdag.from_torch(Fn(fn), (x,))
    assert [n.op for n in tdag.lower.lower(prog).graph.nodes] == [Op.var]
    want = fn(x)
    _close(tdag.to_torch(prog)(x), want, 0, "to_torch")
    _close(tdag.run(prog, x), want, 1e-5, "the composition")
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    _close(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], want, 1e-5,
           "onnxruntime")
    if importlib.util.find_spec("jax"):
        _close(tdag.to_jax(prog)(x.numpy()), want, 1e-5, "jax")


def test_a_hand_written_layer_norm_over_var_stays_a_layer_norm():
    """The variance rule runs after the norms' rules, which read var's composition."""
    fn = lambda t: (t - t.mean(-1, keepdim=True)) / torch.sqrt(  # noqa: E731
        t.var(-1, keepdim=True, unbiased=False) + 1e-5)
    prog = tdag.from_torch(Fn(fn), (torch.randn(2, 3, 8),))
    assert [n.op for n in tdag.lower.lower(prog).graph.nodes] == [Op.layer_norm]


def test_a_constant_wider_than_x_leaves_the_composition():
    """clamp(x + 3, 0, 6) / 6 with the 6 broadcast to [4, 5] over x [5] is not hardsigmoid(x)
    (its result is [4, 5]): no kernel, the same values."""
    from tdag import ops
    prog = tdag.trace(lambda x: ops.div(ops.clamp(ops.add(x, 3.0), 0.0, 6.0),
                                        ops.const(torch.full((4, 5), 6.0))), tdag.TensorSpec((5,)))
    low = tdag.lower.lower(prog)
    assert Op.hardsigmoid not in {n.op for n in low.graph.nodes}
    x = torch.randn(5)
    torch.testing.assert_close(tdag.to_torch(prog)(x), F.hardsigmoid(x).expand(4, 5))


JAX_ACTIVATIONS = {  # name: (jax.nn's function, its kernel)
    "elu": (lambda nn: nn.elu, Op.elu),
    "elu-alpha": (lambda nn: lambda x: nn.elu(x, 0.3), Op.elu),
    "selu": (lambda nn: nn.selu, Op.elu),
    "leaky_relu": (lambda nn: nn.leaky_relu, Op.leaky_relu),
}


@pytest.mark.parametrize("name", sorted(JAX_ACTIVATIONS))
def test_jax_nn_activations_lower_to_the_kernel(name):
    """jax.nn writes leaky_relu's test x >= 0 and guards expm1's argument with a second
    where (x > 0 ? 0 : x): the same functions, one kernel each."""
    jax = pytest.importorskip("jax")
    make, op = JAX_ACTIVATIONS[name]
    fn = make(jax.nn)
    x = _values().reshape(4, -1)
    prog = tdag.from_jax(fn, x.numpy())
    assert [n.op for n in tdag.lower.lower(prog).graph.nodes] == [op]
    want = torch.from_numpy(np.asarray(fn(x.numpy())))
    _close(tdag.to_torch(prog)(x), want, 1e-6, "to_torch")
    _close(tdag.run(tdag.lower.lower(prog), x), want, 1e-6, "tdag.run")


def _onnx_activation(op_type: str, **attrs):
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"], **attrs)], op_type,
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 20])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 20])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op_type,attrs,emitted_as", [
    ("Selu", {}, "Selu"), ("Selu", dict(alpha=1.5, gamma=0.5), "Selu"),
    ("Celu", {}, "Elu"),  # alpha 1: x / alpha is x
    ("Celu", dict(alpha=0.4), "Celu")])
def test_onnx_selu_and_celu_import_as_one_elu_and_emit_as_themselves(op_type, attrs,
                                                                     emitted_as):
    model = _onnx_activation(op_type, **attrs)
    prog = tdag.from_onnx(model)
    assert [n.op for n in tdag.lower.lower(prog).graph.nodes] == [Op.elu]
    x = _values()[:80].reshape(4, 20)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    _close(tdag.to_torch(prog)(x), want, 1e-6, "to_torch")
    emitted = tdag.to_onnx(prog)
    assert [n.op_type for n in emitted.graph.node] == [emitted_as]
    again = ort.InferenceSession(emitted.SerializeToString(), providers=["CPUExecutionProvider"])
    _close(again.run(None, {again.get_inputs()[0].name: x.numpy()})[0], want, 1e-6, "re-emitted")


def test_onnx_shrink_keeps_its_own_nan_rule():
    """ONNX's Shrink makes nan 0 ('otherwise 0'), torch's shrinks keep it: a Shrink file is
    not torch's softshrink, and its program answers as onnxruntime does."""
    model = _onnx_activation("Shrink", lambd=0.5, bias=0.5)
    prog = tdag.from_onnx(model)
    x = _values()[:80].reshape(4, 20)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = torch.from_numpy(session.run(None, {"x": x.numpy()})[0])
    assert want[0, 0] == 0 and x[0, 0].isnan()
    _close(tdag.to_torch(prog)(x), want, 0, "to_torch")
