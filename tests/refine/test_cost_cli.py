"""``tdag cost`` on .pt2, .onnx and .tdag files: every form of the command, the JSON schema
field by field, CSV against JSON; lowered bytes against unfused ones; causal useful flops; a
meta-device Llama against FlopCounterMode."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import warnings

import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import tdag
from tdag.cli import main
from tdag.refine.cost import table as cost_table
from tdag.refine.cost import roofline

from support import torch_models as M


class Tiny(nn.Module):
    """A conv stem, then causal self-attention over the pixels: scopes, a conv and a causal
    mask built from aranges."""

    def __init__(self, c=4, d=8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.proj = nn.Linear(c, 3 * d)
        self.out = nn.Linear(d, 2)

    def forward(self, x):
        h = F.relu(self.stem(x)).flatten(2).transpose(1, 2)        # [b, 16, c]
        q, k, v = self.proj(h).chunk(3, -1)
        s = torch.arange(h.shape[1])
        causal = s[:, None] >= s[None, :]
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        return self.out(att).mean(1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same model as .pt2 and .tdag (torch.export), and .onnx (torch.onnx's exporter:
    node names hold the module paths, ``/stem/Conv``), the .onnx with a symbolic batch."""
    folder = tmp_path_factory.mktemp("cost_cli")
    model, x = Tiny().eval(), torch.randn(2, 3, 4, 4)
    pt2 = folder / "tiny.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(pt2))
    assert main(["convert", str(pt2), str(folder / "tiny.tdag")]) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(folder / "tiny.onnx"), dynamo=False,
                          input_names=["x"], output_names=["y"], opset_version=17,
                          dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return {kind: str(folder / f"tiny.{kind}") for kind in ("pt2", "tdag", "onnx")}


def run(capsys, *argv) -> str:
    assert main(["cost", *argv]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out


def table_rows(text: str) -> list[list[str]]:
    """The rows under the dashed line, split on runs of two spaces or more; the first cell keeps
    its indentation (a scope's depth)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if set(line) == {"-"}) + 1
    rows = []
    for line in lines[start:]:
        cells = re.split(r" {2,}", line.strip())
        rows.append([line[:len(line) - len(line.lstrip())] + cells[0]] + cells[1:])
    return rows


KINDS = ("pt2", "onnx", "tdag")


@pytest.mark.parametrize("kind", KINDS)
def test_default_is_the_layer_tree_with_lowered_bytes(files, kind, capsys):
    out = run(capsys, files[kind])
    assert out.startswith("bytes: as the lowered program moves them; unfused ")
    header = out.splitlines()[1]
    for column in ("flops", "matmul flops", "bytes read", "bytes written", "flops/byte",
                   "% flops"):
        assert column in header
    rows = table_rows(out)
    assert rows[-1][0] == "total"
    names = [r[0].strip() for r in rows]  # module paths (ONNX: from node names), in order
    assert names[:3] == ["stem", "proj", "out"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("by", ["op", "scope", "node"])
def test_by(files, kind, by, capsys):
    out = run(capsys, files[kind], "--by", by, "--size", "batch=2")
    header = out.splitlines()[1]
    assert header.startswith(by)
    rows = table_rows(out)
    assert rows[-1][0] == "total" and len(rows) > 2
    if by == "node":  # %name op @ scope
        assert any(r[0].endswith(" conv @ stem") for r in rows)
    if by == "op":  # (torch.onnx's decomposed attention does not lower to one kernel yet)
        kernels = {"conv", "einsum"} | ({"attention"} if kind != "onnx" else set())
        assert kernels <= {r[0].strip() for r in rows}


@pytest.mark.parametrize("kind", KINDS)
def test_depth_size_device_forms(files, kind, capsys):
    shallow = table_rows(run(capsys, files[kind], "--depth", "1"))
    assert all(not r[0].startswith("  ") for r in shallow)
    data = json.loads(run(capsys, files[kind], "--json", "--size", "batch=3"))
    assert data["sizes"] in ({"batch": 3}, {})  # a static export has no batch symbol
    assert all(isinstance(data["total"][k], int) for k in ("flops", "bytes", "unfused_bytes"))
    for argv in (["--device", "h100-sxm"], ["--device", "local:quick"],
                 ["--peak-tflops", "2", "--bandwidth-gbs", "50"]):
        out = run(capsys, files[kind], *argv, "--size", "batch=2")
        assert "est. time" in out.splitlines()[2] and out.splitlines()[1].startswith("device:")
        assert table_rows(out)[-1][-1] in ("compute", "memory", "overhead")


@pytest.mark.parametrize("kind", KINDS)
def test_plot(files, kind, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "roofline.png"
    run(capsys, files[kind], "--device", "a100-80gb-sxm", "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


# -- the JSON schema, the CSV -------------------------------------------------------------------

TOP = {"schema", "by", "depth", "sort", "sizes", "lowered", "device", "rows", "total",
       "bytes_by_dtype"}
NUMBER = (int, float)


def check_row(row: dict, with_device: bool) -> None:
    assert set(row) == set(cost_table.ROW_KEYS)
    assert isinstance(row["name"], str) and isinstance(row["path"], str)
    assert isinstance(row["depth"], int) and row["depth"] >= 0
    for key in ("flops", "matmul_flops", "useful_flops", "masked_flops", "int_macs",
                "float_flops", "bytes_read", "bytes_written", "bytes", "unfused_bytes",
                "fused_bytes"):
        assert isinstance(row[key], int) and row[key] >= 0, key
    assert row["float_flops"] == row["flops"] - 2 * row["int_macs"]
    assert row["bytes"] == row["bytes_read"] + row["bytes_written"]
    assert row["useful_flops"] == row["flops"] - row["masked_flops"]
    assert row["matmul_flops"] <= row["flops"]
    if row["bytes"]:
        assert row["intensity"] == pytest.approx(row["flops"] / row["bytes"])
    else:
        assert row["intensity"] is None
    for key in ("flops_share", "bytes_share"):
        assert row[key] is None or 0 <= row[key] <= 100.0 + 1e-9
    if with_device:
        assert isinstance(row["time_s"], float) and row["time_s"] >= 0
        assert row["bound"] in ("compute", "memory", "overhead", None)
    else:
        assert row["time_s"] is None and row["bound"] is None


@pytest.mark.parametrize("kind", KINDS)
def test_json_schema_field_by_field(files, kind, capsys):
    data = json.loads(run(capsys, files[kind], "--json", "--device", "h100-sxm", "--depth", "2",
                          "--size", "batch=2"))
    assert set(data) == TOP
    assert data["schema"] == "tdag.cost/1" == cost_table.SCHEMA
    assert (data["by"], data["depth"], data["sort"], data["lowered"]) == ("layer", 2, None, True)
    device = data["device"]
    assert set(device) == {"name", "peak_flops", "bandwidth", "launch", "source"}
    assert device["name"] == "h100-sxm" and device["peak_flops"]["bf16"] == 989.4e12
    assert device["bandwidth"] == 3.35e12 and device["launch"] == 0
    assert "datasheet" in device["source"]
    for row in data["rows"]:
        check_row(row, with_device=True)
        assert 1 <= row["depth"] <= 2
    total = data["total"]
    check_row(total, with_device=True)
    assert (total["name"], total["depth"], total["flops_share"]) == ("total", 0, 100.0)
    top = [r for r in data["rows"] if r["depth"] == 1]  # the tree's first level covers it all
    for key in ("flops", "bytes", "unfused_bytes", "masked_flops"):
        assert sum(r[key] for r in top) == total[key], key
    assert sum(r["time_s"] for r in top) == pytest.approx(total["time_s"])
    assert json.loads(run(capsys, files[kind], "--json"))["device"] is None
    if kind == "onnx":  # a symbolic batch: no estimate until it is bound
        unbound = json.loads(run(capsys, files[kind], "--json", "--device", "l4"))
        assert unbound["total"]["time_s"] is None and "batch" in unbound["total"]["flops"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("by", ["layer", "op"])
def test_csv_matches_json(files, kind, by, capsys):
    argv = [files[kind], "--by", by, "--sort", "bytes", "--size", "batch=2"]
    data = json.loads(run(capsys, *argv, "--json"))
    rows = list(csv.DictReader(io.StringIO(run(capsys, *argv, "--csv"))))
    assert len(rows) == len(data["rows"]) + 1
    for got, want in zip(rows, data["rows"] + [data["total"]]):
        assert list(got) == list(cost_table.ROW_KEYS)
        for key, value in want.items():
            text = got[key]
            if value is None:
                assert text == ""
            elif isinstance(value, float):
                assert float(text) == pytest.approx(value)
            else:
                assert text == str(value), key
    shares = [r["bytes_share"] for r in data["rows"]]
    assert shares == sorted(shares, reverse=True)  # sorted by bytes


def test_symbolic_figures_stay_strings_until_bound():
    prog = tdag.trace(lambda x: tdag.ops.exp(x), tdag.TensorSpec(("b", 4)))
    report = tdag.cost(prog)
    assert report.to_dict(by="op")["total"]["flops"] == "4*b"
    assert report.to_dict(by="op", sizes={"b": 3})["total"]["flops"] == 12


def test_python_m_tdag_cost_is_quiet_when_piped(files):
    done = subprocess.run([sys.executable, "-m", "tdag", "cost", files["tdag"], "--by", "op"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("total")
    for bar in ("tdag: loading", "tdag: lowering", "tdag: costing"):  # no progress on a pipe
        assert bar not in done.stderr


def test_progress_shows_on_a_terminal(files, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["cost", files["tdag"], "--by", "op"]) == 0
    err = capsys.readouterr().err
    assert "tdag: loading tiny.tdag" in err and "tdag: costing" in err


@pytest.mark.parametrize("argv, message", [
    (["--plot", "x.png"], "--plot needs a device"),
    (["--peak-tflops", "1"], "both --peak-tflops and --bandwidth-gbs"),
    (["--device", "abacus"], "unknown device 'abacus'"),
    (["--size", "batch"], "--size takes NAME=INT"),
])
def test_bad_cost_arguments_are_one_line(files, argv, message, capsys):
    assert main(["cost", files["tdag"], *argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


# -- the figures ----------------------------------------------------------------------------------

def test_lowered_bytes_are_below_unfused_on_a_conv_model():
    model, x = M.CNN().eval(), torch.randn(2, 3, 16, 16)
    report = tdag.cost(tdag.from_torch(model, (x,)))
    assert report.lowered and report.bytes < report.unfused_bytes / 4
    stem = report.scopes.find("stem").total  # conv 3->8, 3x3, pad 1: input, weight, bias, output
    assert stem.bytes == (2 * 3 * 16 * 16 + 8 * 3 * 9 + 8 + 2 * 8 * 16 * 16) * 4
    assert stem.unfused_bytes > 9 * stem.bytes  # the im2col windows, written and read
    for table in (report.per_node, report.per_op, report.per_graph):  # every figure lands once
        for field in ("flops", "bytes", "unfused_bytes", "fused_bytes"):
            assert sum(getattr(f, field) for f in table.values()) == getattr(report, field)
    conv = report.per_op["conv"]  # the kernel's row carries its primitives' unfused traffic
    assert conv.unfused_bytes > 9 * conv.bytes
    unlowered = tdag.cost(tdag.from_torch(model, (x,)), lowered=False)
    assert unlowered.matmul_flops == report.matmul_flops
    assert unlowered.unfused_bytes == report.unfused_bytes


def test_squeezenet_headline_bytes_leave_out_im2col(capsys):
    """onnx's light SqueezeNet (no module paths in its node names: the nodes as they run)."""
    path = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                        "light_squeezenet.onnx")
    data = json.loads(run(capsys, path, "--json"))
    total = data["total"]
    assert total["unfused_bytes"] > 8e9 > 1e8 > total["bytes"]  # 8.7 GB of im2col windows
    convs = [r for r in data["rows"] if r["op"] == "conv"]
    assert len(convs) == 26 and all(r["name"] == f"%{r['path'].split('%')[1]} conv"
                                    for r in convs)
    assert sum(r["matmul_flops"] for r in convs) == total["matmul_flops"]


def _score_value_flops(b, heads, length, e):
    return 2 * 2 * b * heads * length * length * e


@pytest.mark.parametrize("length", [16, 7])
def test_causal_flops_are_about_half_the_dense_attention_flops(length):
    """Causal attention over ``length`` tokens: a masked kernel does (L+1)/(2L) of the
    score and value products."""
    def attend(q, k, v):
        s = torch.arange(q.shape[-2])
        return F.scaled_dot_product_attention(q, k, v, attn_mask=s[:, None] >= s[None, :])

    q = torch.randn(2, 4, length, 8)
    report = tdag.cost(tdag.from_torch(_Fn(attend), (q, q, q)))
    dense = _score_value_flops(2, 4, length, 8)
    assert report.matmul_flops == dense
    assert report.useful_matmul_flops == dense * (length + 1) // (2 * length)
    assert report.useful_flops == report.flops - report.masked_flops
    assert 0.5 <= report.useful_matmul_flops / dense <= 0.6
    unmasked = tdag.cost(tdag.from_torch(_Fn(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v)), (q, q, q)))
    assert unmasked.masked_flops == 0


def test_is_causal_and_a_decoder_mask_count_as_causal():
    q = torch.randn(1, 2, 6, 4)
    report = tdag.cost(tdag.from_torch(_Fn(lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True)), (q, q, q)))
    assert report.useful_matmul_flops == _score_value_flops(1, 2, 6, 4) * 7 // 12
    # causal & padding (tests/support/torch_models.Decoder): the causal share is still skipped
    model = M.Decoder().eval()
    ids = torch.randint(0, 64, (2, 7))
    decoder = tdag.cost(tdag.from_torch(model, (ids, M.attention_mask(2, 7))))
    attention = decoder.per_op["attention"]
    assert attention.masked_flops == attention.matmul_flops * 3 // 7  # 21 of 49 masked


class _Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def test_tiny_meta_llama_matches_flop_counter():
    """A Llama built on the meta device (no weights allocated), captured at a sequence of 32:
    tdag's matmul flops are FlopCounterMode's; the causal mask halves the attention part."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        intermediate_size=160, vocab_size=128, use_cache=False, attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.zeros(1, 32, dtype=torch.long, device="meta")
    exported = torch.export.export(model, (ids,))  # eager masking calls .item() on meta
    with FlopCounterMode(display=False) as counter:
        exported.module()(ids)
    report = tdag.cost(tdag.from_torch(exported))
    assert report.matmul_flops == counter.get_total_flops()
    attention = _score_value_flops(1, 4, 32, 16) * 2  # two layers
    assert report.masked_flops == attention * 31 // 64


def test_roofline_estimate_is_the_larger_of_compute_and_memory_time():
    dev = roofline.custom(peak_tflops=1, bandwidth_gbs=100)  # ridge: 10 flops per byte
    fig = tdag.refine.Figures(flops=10**9, bytes_read=10**6, bytes_written=0)
    assert roofline.estimate(fig, None, dev) == (pytest.approx(1e-3), "compute")
    slow = tdag.refine.Figures(flops=10**6, bytes_read=10**9)
    assert roofline.estimate(slow, None, dev) == (pytest.approx(1e-2), "memory")
    # a row of two kernels: each at its own roofline, one after the other
    t, bound = roofline.estimate(fig + slow, [(fig, "f32"), (slow, "f32")], dev)
    assert t == pytest.approx(1e-3 + 1e-2) and bound == "memory"
    for dev in roofline.DEVICES.values():
        assert dev.bandwidth > 0 and min(dev.peak_flops.values()) > 0 and dev.source
        assert math.isfinite(dev.ridge("bf16"))


def test_launch_cost_counts_once_per_working_kernel():
    """Each kernel that does work pays the device's launch cost (a view pays nothing); a row
    whose launches outweigh its compute and memory time is overhead-bound."""
    dev = roofline.custom(peak_tflops=1, bandwidth_gbs=100, launch_us=5)
    tiny = tdag.refine.Figures(flops=1000, bytes_read=800)
    view = tdag.refine.Figures()
    t, bound = roofline.estimate(tiny + tiny, [(tiny, "f32"), (tiny, "f32"), (view, "f32")], dev)
    assert t == pytest.approx(2 * (5e-6 + 8e-9)) and bound == "overhead"
    big = tdag.refine.Figures(flops=10**9, bytes_read=10**6)
    assert roofline.estimate(big, None, dev) == (pytest.approx(1e-3 + 5e-6), "compute")
    with pytest.raises(tdag.TdagError, match="launch cost"):
        roofline.custom(1, 100, launch_us=-1)


def test_local_measurement_is_cached():
    first = roofline.device("local:quick")
    assert roofline.device("local:quick") is first
    assert first.peak("f32") > 1e8 and first.bandwidth > 1e8  # any machine beats these
    assert 0 < first.launch < 1e-3  # one small op: microseconds
    assert "measured" in first.source
