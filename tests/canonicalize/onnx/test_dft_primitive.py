"""ONNX DFT and STFT import as the ``fft`` primitive (n log n), not as products with cos/sin
matrices (n^2); their values are checked in test_onnx_ops_new.py and by the conformance
cases (benchmarks/onnx_conformance.py --ops DFT,STFT)."""
from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto, helper

import tdag


def _model(op: str, inputs, **attrs):
    names = [name for name, _ in inputs]
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape))
              for name, v in inputs if v is not None and v.dtype == np.float32]
    consts = [helper.make_tensor(name, TensorProto.INT64, list(v.shape), v.flatten().tolist())
              for name, v in inputs if v is not None and v.dtype == np.int64]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", values, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, None)], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def test_dft_imports_as_the_fft_primitive():
    x = np.random.default_rng(0).standard_normal((2, 64, 1)).astype(np.float32)
    prog = tdag.from_onnx(_model("DFT", [("x", x), ("", None), ("axis", np.array(1))],
                                 onesided=1))
    ops = {n.op.value for n in prog.graph.nodes}
    assert "fft" in ops and "reduce" not in ops, ops
    got = tdag.run(prog, torch.from_numpy(x))
    ref = np.fft.rfft(x[..., 0], axis=1)
    np.testing.assert_allclose(got.numpy(), np.stack([ref.real, ref.imag], -1), atol=1e-4)


def test_stft_imports_as_the_fft_primitive():
    signal = np.random.default_rng(0).standard_normal((1, 32, 1)).astype(np.float32)
    prog = tdag.from_onnx(_model("STFT", [("signal", signal), ("step", np.array(4)),
                                          ("", None), ("length", np.array(8))], onesided=1))
    assert any(n.op.value == "fft" for n in prog.graph.nodes)
    assert tuple(tdag.run(prog, torch.from_numpy(signal)).shape) == (1, 7, 5, 2)
