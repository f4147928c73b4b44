"""torch.linalg.vector_norm's 2-norm (Tensor.norm, F.normalize, cosine_similarity and
pairwise_distance call it) lowers to one kernel: square, sum and root were three passes (and
``|x|`` four more), the reified module calls torch.linalg.vector_norm as the original does
(bit for bit), the ONNX file holds ReduceL2 (an ONNX ReduceL2 file re-emits as itself), jax
jnp.linalg.vector_norm. Checked on random values and rows holding inf and nan, through
tdag.run of the lowered program, to_torch, onnxruntime and to_jax (float32: 1e-6 relative)."""
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

_OTHER = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(1))

FUNCTIONS = {  # name: (the torch function, the ONNX ops the file holds)
    "last-axis": (lambda x: torch.linalg.vector_norm(x, dim=-1), ["ReduceL2"]),
    "two-axes-keepdim": (lambda x: torch.linalg.vector_norm(x, dim=(0, 2), keepdim=True),
                         ["ReduceL2"]),
    "all": (lambda x: torch.linalg.vector_norm(x), ["ReduceL2"]),
    "tensor-norm": (lambda x: x.norm(dim=1), ["ReduceL2"]),
    "root-of-squares": (lambda x: (x * x).sum(-1).sqrt(), ["ReduceL2"]),
    "normalize": (lambda x: F.normalize(x, dim=-1), ["ReduceL2", "Clip", "Div"]),
    "cosine-similarity": (lambda x: F.cosine_similarity(x, _OTHER, dim=-1), None),
    "pairwise-distance": (lambda x: F.pairwise_distance(x, _OTHER), None),
}


def _values() -> torch.Tensor:
    x = torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(0)) * 3
    x[0, 1, 2], x[1, 2, 3], x[2, 3, 0] = float("inf"), float("nan"), -float("inf")
    return x


@pytest.fixture(scope="module", params=sorted(FUNCTIONS))
def case(request):
    fn, onnx_ops = FUNCTIONS[request.param]
    x = _values()
    return tdag.from_torch(Fn(fn), (x,)), fn, onnx_ops, x


def _close(got, want: torch.Tensor, rtol: float, what: str) -> None:
    torch.testing.assert_close(torch.as_tensor(np.asarray(got)), want, rtol=rtol, atol=rtol,
                               equal_nan=True, msg=what)


def test_one_vector_norm_kernel(case):
    prog, fn, _, x = case
    low = tdag.lower.lower(prog)
    norms = [n for n in low.graph.nodes if n.op is Op.vector_norm]
    assert len(norms) == 1 and norms[0].spec.ord == 2, low
    assert Op.pow not in {n.op for n in low.graph.nodes}, low  # no root left beside it
    want = fn(x)
    _close(tdag.run(low, x), want, 1e-6, "tdag.run")
    module = tdag.to_torch(prog)
    axes = norms[0].spec.axes
    if axes == tuple(range(x.dim() - len(axes), x.dim())):  # the innermost axes
        assert "torch.linalg.vector_norm(" in module.code
        _close(module(x), want, 0, "to_torch")  # the function torch's own calls
    else:  # a sum of squares (see below)
        assert "torch.linalg.vector_norm(" not in module.code
        _close(module(x), want, 1e-6, "to_torch")


def test_over_outer_axes_the_module_sums_squares():
    """torch.linalg.vector_norm is slow over axes that are not the innermost (a
    [16, 64, 56, 56] image's channels: 16 ms against 2.3 for sum(x * x).sqrt()): there the
    module sums the squares itself, within float32's rounding of torch's values."""
    x = _values()
    fn = lambda t: torch.linalg.vector_norm(t, dim=1)  # noqa: E731
    module = tdag.to_torch(tdag.from_torch(Fn(fn), (x,)))
    assert "torch.linalg.vector_norm(" not in module.code and ".square()" in module.code
    _close(module(x), fn(x), 1e-6, "to_torch")


def test_reduce_l2_on_onnxruntime(case):
    prog, fn, onnx_ops, x = case
    model = tdag.to_onnx(prog)
    ops = [n.op_type for n in model.graph.node]
    assert "ReduceL2" in ops and (onnx_ops is None or ops == onnx_ops), ops
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _close(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], fn(x), 1e-6,
           "onnxruntime")
    if importlib.util.find_spec("jax"):
        _close(tdag.to_jax(prog)(x.numpy()), fn(x), 1e-6, "jax")


def test_an_onnx_reduce_l2_file_re_emits_as_reduce_l2():
    from onnx import TensorProto, helper
    node = helper.make_node("ReduceL2", ["x", "axes"], ["y"], keepdims=0)
    graph = helper.make_graph(
        [node], "l2", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    prog = tdag.from_onnx(model)
    assert [n.op for n in tdag.lower.lower(prog).graph.nodes] == [Op.vector_norm]
    emitted = tdag.to_onnx(prog)
    assert [n.op_type for n in emitted.graph.node] == ["ReduceL2"]
    x = _values()
    want = torch.linalg.vector_norm(x, dim=1)
    session = ort.InferenceSession(emitted.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    _close(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0], want, 1e-6,
           "re-emitted")


def test_other_orders_stay_their_composition():
    """Only the 2-norm is matched: the 1-norm is |x| and a sum already (two kernels), a
    p-norm's powers stay elementwise; their values are torch's."""
    x = _values()
    for order in (1, 3, float("inf")):
        fn = lambda t: torch.linalg.vector_norm(t, order, dim=-1)  # noqa: E731
        prog = tdag.from_torch(Fn(fn), (x,))
        assert Op.vector_norm not in {n.op for n in tdag.lower.lower(prog).graph.nodes}
        _close(tdag.to_torch(prog)(x), fn(x), 1e-6, f"ord {order}")
