"""Inputs sized to hang: text whose dims sympy would never finish evaluating, and models whose
huge axes a per-window Python loop would walk cell by cell.

Each case runs under a generous alarm (a hang fails the test instead of stalling the suite);
nothing here asserts a time.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import safetensors
import safetensors.torch
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

from support.guards import deadline

import tdag
from tdag import ops
from tdag.cli import main
from tdag.errors import FileFormatError, ShapeError, TdagError
from tdag.ir import serialize




def _one_input(dim: str) -> str:
    return f"tdag main(%x: f32[{dim}]) {{\n  return %x\n}}\n"


# -- dimension expressions: a bounded grammar -------------------------------------------------

BAD_DIMS = {
    "power tower": ("9**9**9", "exponent"),
    "power of a power": ("(b**2)**3", "exponent"),
    "big exponent": ("2**65", "exponent"),
    "symbolic exponent": ("2**b", "exponent"),
    "expansion": ("(a+b+c+d+e+f)**64", "terms"),
    "deep parens": ("1+" + "(" * 200 + "b" + ")" * 200, "nested"),
    "minus chain": ("-" * 200 + "b", "nested"),
    "long": ("+".join(["b"] * 6000), "longer than"),
    "long expansion": (f"({'n' * 3000}+{'m' * 3000})**2", "more than 10000 characters"),
    "mod of a sum": ("Mod(" + "+".join(f"x{i}" for i in range(17)) + ", 7)", "Mod takes"),
    "much work": ("+".join(f"Max(x{i},y{i})" for i in range(100)), "more than 256 terms"),
    "huge literal": ("9" * 5000, "int64"),
    "past int64": ("9223372036854775808", "not a size"),  # a uint64 literal, too big a size
    "uint64 overflow": ("18446744073709551616", "uint64"),
    "negative": ("-3", "not a size"),
    "negative expression": ("2-5", "not a size"),
    "too large": ("2**62", "not a size"),
    "fraction": ("3/2", "not an integer"),
    "division by zero": ("b/0", "zero"),
    "modulo by zero": ("Mod(b, 0)", "Modulo by zero"),
    "unknown function": ("exp(b)", "unexpected"),
}


@pytest.mark.parametrize("dim, why", BAD_DIMS.values(), ids=BAD_DIMS.keys())
def test_bad_dim_is_a_file_format_error(dim, why):
    with deadline(30), pytest.raises(FileFormatError) as info:
        tdag.parse(_one_input(dim))
    message = str(info.value)
    assert message.startswith("line 1: ") and why in message
    assert dim[:30] in message  # the expression (or its start) is named


@pytest.mark.parametrize("dim", ["floor(s/2)+1", "Max(2,b)", "Mod(b,2)", "ceiling(b/3)",
                                 "b**2+3*b", "(b+1)**16", "2**62-1", "b//2", "Min(a,b,c)"])
def test_good_dim_round_trips(dim):
    prog = tdag.parse(_one_input(dim))
    assert tdag.parse(str(prog)) == prog


def _save_with_text(tmp_path, edit) -> str:
    """A .tdag whose text form ``edit`` rewrote, with its checksum recomputed to match."""
    path = os.path.join(tmp_path, "m.tdag")
    prog = tdag.trace(lambda x: x * ops.param("w", torch.ones(4)), tdag.TensorSpec((4,)))
    tdag.save(prog, path)
    with safetensors.safe_open(path, framework="pt") as f:
        metadata = dict(f.metadata())
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    metadata["tdag.text"] = edit(metadata["tdag.text"])
    metadata["tdag.sha256"] = serialize._checksum(metadata, tensors)
    safetensors.torch.save_file(tensors, path, metadata=metadata)
    return path


def test_load_power_tower(tmp_path):
    path = _save_with_text(tmp_path, lambda text: text.replace("%x: f32[4]", "%x: f32[9**9**9]"))
    with deadline(30), pytest.raises(FileFormatError, match=r"line 1: dimension '9\*\*9\*\*9'"):
        tdag.load(path)


def test_load_deep_nesting_and_huge_literal(tmp_path):
    nested = "[" * 100 + "1.0" + "]" * 100
    path = _save_with_text(tmp_path, lambda text: text.replace(
        "return", f"const %deep: f32[1] = {nested}\n  return", 1))
    with deadline(30), pytest.raises(FileFormatError, match="nested deeper than 64"):
        tdag.load(path)
    path = _save_with_text(tmp_path, lambda text: text.replace(
        "return", f"const %big: i64[] = {'9' * 100}\n  return", 1))
    with deadline(30), pytest.raises(FileFormatError, match="fits neither int64 nor uint64"):
        tdag.load(path)


def test_int64_extremes_still_parse():
    text = "tdag main() {\n  const %lo: i64[2] = [-9223372036854775808, 9223372036854775807]\n" \
           "  return %lo\n}\n"
    prog = tdag.parse(text)
    value = prog.graph.weights["lo"].value
    assert value.tolist() == [-2**63, 2**63 - 1]
    assert tdag.parse(str(prog)) == prog


def test_deeply_nested_blocks():
    body = "%r = call negate(%x)\nreturn %r\n"
    for _ in range(100):
        body = f"%y = loop(%x, count=2) body(%i: i64[], %x: f32[4]) {{\n{body}}}\nreturn %y\n"
    text = "tdag negate(%a: f32[4]) {\n  %0: f32[4] = neg(%a)\n  return %0\n}\n" \
           f"program(%x: f32[4]) {{\n{body}}}\n"
    with deadline(30), pytest.raises(FileFormatError, match="blocks nested deeper than 64"):
        tdag.parse(text)


# -- pooling over huge axes: closed forms, never a loop per window ----------------------------

def _avg_pool_model(length: int, strides=(1,), ceil_mode=0) -> onnx.ModelProto:
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3], strides=list(strides),
                            pads=[1, 1], count_include_pad=0, ceil_mode=ceil_mode)
    graph = helper.make_graph(
        [node], "pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_avg_pool_over_2_40_cells():
    length = 2**40
    with deadline(60):
        prog = tdag.from_onnx(_avg_pool_model(length))
        report = tdag.cost(prog)
    assert [str(t) for t in prog.graph.output_types] == [f"f32[1,1,{length}]"]
    assert report.total.flops >= 3 * length  # the window sums, at least
    # the divisor is traced from a few edge counts, not held as a 2**40-element const
    assert all(w.value is None or w.value.numel() <= 4 for w in prog.graph.weights.values())


def test_cost_command_on_a_2_40_cell_file(tmp_path, capsys):
    path = os.path.join(tmp_path, "pool.onnx")
    onnx.save(_avg_pool_model(2**40), path)
    with deadline(60):
        assert main(["cost", path]) == 0
    assert "total" in capsys.readouterr().out


@pytest.mark.parametrize("length, strides, ceil_mode", [(10, (1,), 0), (5000, (1,), 0),
                                                        (5001, (2,), 1), (4, (2,), 1)])
def test_avg_pool_matches_onnxruntime(length, strides, ceil_mode):
    model = _avg_pool_model(length, strides, ceil_mode)
    x = np.random.default_rng(0).standard_normal((1, 1, length)).astype(np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = torch.from_numpy(session.run(None, {"x": x})[0])
    prog = tdag.from_onnx(model)
    got = tdag.run(prog, torch.from_numpy(x))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel, stride, padding, ceil_mode", [
    (3, 1, 1, False), (4, 3, 2, True), (5, 2, 2, True), (2, 2, 0, True)])
def test_long_avg_pool_matches_torch(kernel, stride, padding, ceil_mode):
    """Past 4096 windows the divisor is traced (a k-filled vector plus its edge counts)."""
    x = torch.randn(1, 2, 9001, 3)  # odd: in ceil mode the last stride-2 window is partial
    expected = F.avg_pool2d(x, (kernel, 3), (stride, 1), (padding, 1), ceil_mode, False)
    prog = tdag.trace(lambda x: ops.avg_pool(x, (kernel, 3), (stride, 1), (padding, 1),
                                             ceil_mode, False), tdag.TensorSpec(tuple(x.shape)))
    torch.testing.assert_close(tdag.run(prog, x), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("build", [
    lambda x: ops.adaptive_avg_pool(x, 3),
    lambda x: ops.adaptive_max_pool(x, 2**40 - 1),
    lambda x: ops.interpolate(x, size=2**40),
], ids=["adaptive-avg", "adaptive-max", "interpolate"])
def test_huge_tables_are_a_shape_error(build):
    with deadline(60), pytest.raises(ShapeError, match="table of"):
        tdag.trace(build, tdag.TensorSpec((1, 1, 2**40)))


def test_huge_torch_avg_pool_traces():
    with deadline(60):
        prog = tdag.trace(lambda x: ops.avg_pool(x, 3, 2, 1, True, False),
                          tdag.TensorSpec((1, 1, 2**40)))
        assert tdag.cost(prog).total.flops > 0
    with pytest.raises(TdagError):  # a table past the limit: padding as wide as the axis
        tdag.trace(lambda x: ops.avg_pool(x, 2**30, 1, 2**29, False, False),
                   tdag.TensorSpec((1, 1, 2**40)))
