"""``tdag.cost`` by element type (tdag/refine/cost/dtypes.py): a dynamically quantized MLP's
integer matmuls are int8 MACs, M*K*N each, apart from its float flops; a float model has no
integer work; MatMulNBits' packed 4-bit weights are u8 bytes at their packed size and its
matmul float work. In the totals, the per-layer table and the JSON (``tdag cost --json``)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

import tdag
from tdag.cli import main
from tdag.ir.op import Op

from support.quantized_files import _export

SIZES = ((16, 32), (32, 8))  # the MLP's layers, (K, N)


def _mlp(tmp_path, quantized: bool):
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(*SIZES[0]), torch.nn.ReLU(),
                              torch.nn.Linear(*SIZES[1])).eval()
    path = tmp_path / "mlp.onnx"
    _export(mlp, (torch.randn(4, 16),), path, ["x"], ["y"], {"x": {0: "b"}, "y": {0: "b"}})
    if not quantized:
        return path
    out = tmp_path / "mlp_q.onnx"
    quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
    return out


def test_dynamic_mlp_matmul_integer_is_int8_macs(tmp_path):
    report = tdag.cost(tdag.from_onnx(_mlp(tmp_path, True))).evaluate(b=5)
    rows = [(report.node_info[k], f) for k, f in report.per_node.items()
            if f.int_macs != 0]
    assert sorted(info[0] for info, _ in rows) == [Op.matmul_integer.value] * 2
    assert sorted(f.int_macs for _, f in rows) == sorted(5 * k * n for k, n in SIZES)
    assert all(f.matmul_flops == 2 * f.int_macs for _, f in rows)
    macs = sum(5 * k * n for k, n in SIZES)
    assert report.int_macs == macs and report.float_flops == report.flops - 2 * macs > 0
    # the weights (and their two zero points) and the quantized activations are 8-bit traffic
    assert report.bytes_by_dtype["i8"] == sum(k * n for k, n in SIZES) + 2 == 770
    assert report.bytes_by_dtype["u8"] > 0
    assert sum(report.bytes_by_dtype.values()) == report.bytes
    table = report.table(by="op")
    assert "int MACs" in table and "i8 770" in table.splitlines()[0]


def test_float_model_has_no_integer_work(tmp_path):
    report = tdag.cost(tdag.from_onnx(_mlp(tmp_path, False))).evaluate(b=5)
    assert report.int_macs == 0 and report.float_flops == report.flops > 0
    assert set(report.bytes_by_dtype) == {"f32"}
    assert "int MACs" not in report.table()
    data = report.to_dict(by="op")
    assert all(r["int_macs"] == 0 for r in data["rows"]) and data["total"]["int_macs"] == 0


def test_cost_json_splits_work_and_bytes_by_dtype(tmp_path, capsys):
    path = _mlp(tmp_path, True)
    assert main(["cost", str(path), "--json", "--size", "b=3"]) == 0
    data = json.loads(capsys.readouterr().out)
    total = data["total"]
    assert total["int_macs"] == sum(3 * k * n for k, n in SIZES)
    assert total["float_flops"] == total["flops"] - 2 * total["int_macs"]
    assert sum(data["bytes_by_dtype"].values()) == total["bytes"]
    assert {"i8", "u8", "f32"} <= set(data["bytes_by_dtype"])


def test_matmul_nbits_weights_are_packed_u8_and_float_work():
    """MatMulNBits (int4, blocks of 16 along K): the packed weight is read as its u8 bytes,
    N*K/2, and the matmul of the dequantized weight is float work: no integer MACs."""
    n, k, block = 8, 32, 16
    rng = np.random.default_rng(0)
    packed = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = rng.random(n * k // block, dtype=np.float32)
    node = helper.make_node("MatMulNBits", ["a", "B", "scales"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=block)
    graph = helper.make_graph([node], "nbits",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
                              [numpy_helper.from_array(packed, "B"),
                               numpy_helper.from_array(scales, "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    report = tdag.cost(tdag.from_onnx(onnx.load_from_string(model.SerializeToString())))
    assert report.int_macs == 0 and report.matmul_flops == 2 * 2 * k * n
    assert report.bytes_by_dtype["u8"] == n * k // 2
