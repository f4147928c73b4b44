"""to_onnx writes one ONNX op for three idioms tdag spells with primitives
(tdag/reify/onnx/shortcuts.py): a mean over symbolic sizes, a size read at run time, a
Gather with negative indices; a residual sum that a layer norm reads as Sum, which
onnxruntime leaves out of its slower SkipLayerNormalization; a conv of a concat as the sum
of its parts' convs. Each checked on onnxruntime against eager or tdag.run."""
from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

import tdag
from tdag import ops

from support.guards import assert_close, run_onnx
from support.targets import capture


def _ops(model) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def _optimised_ops(model: onnx.ModelProto, path, level) -> collections.Counter:
    """The op types of ``model`` after onnxruntime's optimiser at ``level``."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return _ops(onnx.load(str(path)))


def _eager(model, *args):
    with torch.no_grad():
        return model(*args)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within 1e-5 of ``want``'s largest magnitude (issue 25's bound)."""
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)


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


class Residual(nn.Module):
    """A post-norm block (BERT's: the sum of a projection and its input normalised) and
    the pre-norm final norm (GPT-2's ln_f, whose sum another add reads as well)."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.proj, self.post, self.final = nn.Linear(d, d), nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        h = self.post(self.proj(x) + x)
        s = h + self.proj(h)
        return self.final(s) + s


def test_a_sum_a_layer_norm_reads_is_sum_not_add(tmp_path):
    """onnxruntime rewrites Add -> LayerNormalization into SkipLayerNormalization, 4-7x
    slower on its CPU provider; Sum is the same addition, left as it is."""
    torch.manual_seed(0)
    model, x = Residual(), torch.randn(2, 5, 16)
    onnx_model = tdag.to_onnx(capture(model.eval(), (x,)))
    readers = collections.defaultdict(set)
    for n in onnx_model.graph.node:
        for i in n.input:
            readers[i].add(n.op_type)
    normalised = {n.op_type for n in onnx_model.graph.node
                  if "LayerNormalization" in readers[n.output[0]]}
    assert normalised == {"Sum"} and _ops(onnx_model)["Sum"] == 2
    _close(run_onnx(onnx_model, x), _eager(model, x))
    fused = _optimised_ops(onnx_model, tmp_path / "opt.onnx",
                           ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert "SkipLayerNormalization" not in fused and fused["LayerNormalization"] == 2, fused


class Skip(nn.Module):
    """A U-Net's skip connection: the input and an upsampled path joined, then a conv."""

    def __init__(self, c: int, kernel: int, parts: int):
        super().__init__()
        self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.fuse = nn.Conv2d(parts * c, c, kernel, padding=kernel // 2)
        self.parts = parts

    def forward(self, x):
        up = F.interpolate(self.down(x), scale_factor=2.0, mode="nearest")
        joined = torch.cat([x, up, x * 2.0][:self.parts], dim=1)
        return self.fuse(joined)


@pytest.mark.parametrize("kernel,parts", [(1, 2), (3, 3)])
def test_a_conv_of_a_concat_is_a_sum_of_convs(kernel, parts, tmp_path):
    """No Concat is written: each part's Conv by its slice of the weight, summed; after
    onnxruntime's layout optimiser no Concat or extra reorder is left either."""
    torch.manual_seed(0)
    model, x = Skip(16, kernel, parts), torch.randn(2, 16, 12, 12)
    onnx_model = tdag.to_onnx(capture(model.eval(), (x,)))
    assert "Concat" not in _ops(onnx_model) and _ops(onnx_model)["Conv"] == 1 + parts
    assert "fuse.weight" not in {i.name for i in onnx_model.graph.initializer}
    _close(run_onnx(onnx_model, x), _eager(model, x))
    fused = _optimised_ops(onnx_model, tmp_path / "opt.onnx",
                           ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert "Concat" not in fused and "Add" not in fused, fused


@pytest.mark.parametrize("width,shared", [(16, True), (8, False)])
def test_a_concat_stays_where_the_parts_convs_would_cost_more(width, shared):
    """Where the joined tensor is needed anyway (read elsewhere too), or where a part's
    channels do not fill onnxruntime's NCHWc blocks of 16 (its Conv would run unfused)."""
    torch.manual_seed(0)
    conv, x = nn.Conv2d(2 * width, 4, 1), torch.randn(2, width, 6, 6)

    def fn(x):
        joined = torch.cat([x, x.relu()], dim=1)
        return (conv(joined), joined) if shared else conv(joined)

    onnx_model = tdag.to_onnx(capture(fn, (x,)))
    assert _ops(onnx_model)["Concat"] == 1 and _ops(onnx_model)["Conv"] == 1
    got, want = run_onnx(onnx_model, x), _eager(fn, x)
    if not shared:
        got, want = (got,), (want,)
    for g, w in zip(got, want):
        _close(g, w)
