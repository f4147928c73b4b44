"""to_onnx writes one ONNX op for three idioms tdag spells with primitives
(tdag/reify/onnx/shortcuts.py): a mean over symbolic sizes, a size read at run time, a
Gather with negative indices; each checked on onnxruntime."""
from __future__ import annotations

import collections

import numpy as np
import torch
from onnx import TensorProto, helper

import tdag
from tdag import ops

from support.guards import assert_close, run_onnx


def _ops(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def test_mean_over_symbolic_sizes_is_one_global_average_pool():
    spec = tdag.TensorSpec(("b", 3, "h", "w"))
    prog = tdag.trace(lambda x: ops.mean(ops.relu(x), (2, 3), keepdim=True), spec)
    model = tdag.to_onnx(prog)
    assert _ops(model) == {"Relu": 1, "GlobalAveragePool": 1}
    for shape in ((2, 3, 5, 7), (1, 3, 4, 1)):
        x = torch.randn(shape)
        assert_close(run_onnx(model, x), tdag.run(prog, x), f"mean {shape}")


def test_mean_without_kept_axes_is_reduce_mean():
    prog = tdag.trace(lambda x: ops.mean(x, (1,)), tdag.TensorSpec(("b", "n")))
    model = tdag.to_onnx(prog)
    assert _ops(model) == {"ReduceMean": 1}
    x = torch.randn(3, 5)
    assert_close(run_onnx(model, x), tdag.run(prog, x), "mean")


def test_a_gather_wrapping_negative_indices_is_one_gather():
    """ONNX's Gather takes i in [-n, n); the importer's wrap of it is not written back."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "i"], ["y"], axis=0)], "g",
        [helper.make_tensor_value_info("i", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", 4])],
        [helper.make_tensor("table", TensorProto.FLOAT, [6, 4],
                            np.arange(24, dtype=np.float32))])
    prog = tdag.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    model = tdag.to_onnx(prog)
    assert _ops(model) == {"Gather": 1}
    i = torch.tensor([[-6, -1, 0], [5, 2, -3]])
    assert_close(run_onnx(model, i), tdag.run(prog, i), "gather")
