"""``tdag cost FILE --memory``: the table, the JSON report against ``tdag.memory``, the
curve drawn with ``--plot``, sizes bound with ``--size``, and the errors a user can hit."""
from __future__ import annotations

import json

import pytest

import tdag
from tdag import ops
from tdag.cli import main


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory):
    """A symbolic-batch MLP saved as .tdag: peak ``2048*b + 262144`` bytes (the relu is
    written over the product)."""
    prog = tdag.trace(lambda x, w: ops.relu(x @ w), tdag.TensorSpec(("b", 256)),
                      tdag.TensorSpec((256, 256)))
    path = tmp_path_factory.mktemp("memory") / "mlp.tdag"
    tdag.save(prog, str(path))
    return str(path), prog


def test_table_names_the_peak_and_its_parts(mlp_file, capsys):
    path, _ = mlp_file
    assert main(["cost", path, "--memory", "--size", "b=64"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("peak: 384.0 KiB after ")  # 2048*64 + 262144 bytes
    assert "by kind at the peak:" in out and "largest tensors live at the peak" in out


def test_symbolic_peak_without_sizes(mlp_file, capsys):
    path, _ = mlp_file
    assert main(["cost", path, "--memory"]) == 0
    assert capsys.readouterr().out.startswith("peak: 2048*b+262144 after ")


def test_json_is_the_report(mlp_file, capsys):
    path, prog = mlp_file
    assert main(["cost", path, "--memory", "--json", "--size", "b=8"]) == 0
    data = json.loads(capsys.readouterr().out)
    report = tdag.memory(prog, b=8)
    assert data["schema"] == "tdag.memory/1" and data["sizes"] == {"b": 8}
    assert data["peak"] == report.peak == 2048 * 8 + 262144
    assert data["by_kind"] == report.by_kind
    assert [row[1] for row in data["timeline"]] == [v for _, v in report.timeline()]
    assert max(row[1] for row in data["timeline"]) == data["peak"]


def test_plot_writes_a_png(mlp_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _ = mlp_file
    png = tmp_path / "memory.png"
    assert main(["cost", path, "--memory", "--size", "b=4", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().err


def test_plot_needs_every_size(mlp_file, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path, _ = mlp_file
    assert main(["cost", path, "--memory", "--plot", str(tmp_path / "m.png")]) == 1
    assert "--size" in capsys.readouterr().err
