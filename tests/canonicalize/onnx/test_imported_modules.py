"""The torch module of an imported file: its initializers are the module's parameters, under
their own names where nn.Module allows them, and it differentiates as the model it came
from (their gradients computed too, none NaN where the model's are finite)."""
from __future__ import annotations

import math

import torch
from onnx import TensorProto, helper, numpy_helper

import tdag
from support.guards import run_onnx


def _gelu_new_file():
    """GPT-2's tanh GELU as onnxslim writes it: the cube's exponent and every coefficient an
    initializer of one float (the Constant nodes the legacy exporter wrote)."""
    consts = {"three": 3.0, "c": 0.044715, "k": math.sqrt(2 / math.pi), "one": 1.0, "h": 0.5}
    nodes = [helper.make_node("Pow", ["x", "three"], ["cube"]),
             helper.make_node("Mul", ["cube", "c"], ["scaled"]),
             helper.make_node("Add", ["x", "scaled"], ["inner"]),
             helper.make_node("Mul", ["inner", "k"], ["arg"]),
             helper.make_node("Tanh", ["arg"], ["t"]),
             helper.make_node("Add", ["t", "one"], ["t1"]),
             helper.make_node("Mul", ["x", "h"], ["hx"]),
             helper.make_node("Mul", ["hx", "t1"], ["y"])]
    graph = helper.make_graph(
        nodes, "gelu_new", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor(name, TensorProto.FLOAT, [], [value])
         for name, value in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_power_by_a_one_float_initializer_is_a_number():
    """Pow's exponent given as an initializer of one float is that number: the module does
    not learn it, so no gradient x^3 log(x) (NaN for every negative x) is computed for it,
    and the other coefficients' and the input's gradients are torch's."""
    model = _gelu_new_file()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    module = tdag.to_torch(tdag.from_onnx(model))
    xg = x.clone().requires_grad_()
    got = module(xg)
    torch.testing.assert_close(got.detach(), run_onnx(model, x), rtol=1e-5, atol=1e-6)
    got.sum().backward()
    reference = x.clone().requires_grad_()
    torch.nn.functional.gelu(reference, approximate="tanh").sum().backward()
    torch.testing.assert_close(xg.grad, reference.grad, rtol=1e-5, atol=1e-6)
    grads = {name: p.grad for name, p in module.named_parameters()}
    assert "three" not in grads and all(bool(torch.isfinite(g).all()) for g in grads.values())


def test_initializers_named_as_module_attributes_get_a_name_of_their_own():
    """Initializers called ``half``, ``float``, ``code`` and ``half_``: nn.Module refuses the
    first three (and ``module.half`` is the method), so they are ``half_``, ``float_``,
    ``code_``, and the file's ``half_`` gets another name; each is read as itself (the
    product is 1 * 2 * 3 * 4)."""
    names = ["half", "float", "code", "half_"]
    values = [torch.full((3,), float(i + 1)) for i in range(len(names))]
    nodes, last = [], "x"
    for i, name in enumerate(names):
        nodes.append(helper.make_node("Mul", [last, name], [f"m{i}"]))
        last = f"m{i}"
    graph = helper.make_graph(
        nodes, "names", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info(last, TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(v.numpy(), n) for n, v in zip(names, values)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    module = tdag.to_torch(tdag.from_onnx(model), lower=False)
    params = dict(module.named_parameters())
    assert len(params) == 4 and {"code_", "float_", "half_"} <= set(params)
    assert callable(module.half) and isinstance(module.code, str)
    x = torch.randn(2, 3)
    torch.testing.assert_close(module(x).detach(), x * 24)
    torch.testing.assert_close(module(x).detach(), run_onnx(model, x))
