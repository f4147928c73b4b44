"""The command line on real files: .pt2 in, .tdag and .onnx out, errors as one line."""
from __future__ import annotations

import onnx
import pytest
import torch

import tdag
from tdag.cli import main
from tdag.models import tiny_vit


@pytest.fixture(scope="module")
def pt2(tmp_path_factory):
    model, args = tiny_vit()
    path = tmp_path_factory.mktemp("cli") / "vit.pt2"
    torch.export.save(torch.export.export(model, args), str(path))
    return path, model, args


def test_show_verify_and_cost(pt2, capsys):
    path, _, _ = pt2
    assert main(["verify", str(path)]) == 0
    assert "ok:" in capsys.readouterr().out
    assert main(["show", str(path)]) == 0
    assert "aten.linear @ blocks.0.attn.qkv" in capsys.readouterr().out
    assert main(["cost", str(path), "--by", "scope"]) == 0
    out = capsys.readouterr().out
    assert "blocks" in out and "total" in out


def test_convert_and_extract(pt2, tmp_path):
    path, model, (images,) = pt2
    saved = tmp_path / "vit.tdag"
    assert main(["convert", str(path), str(saved)]) == 0
    with torch.no_grad():
        torch.testing.assert_close(tdag.run(tdag.load(str(saved)), images), model(images),
                                   rtol=1e-4, atol=1e-5)
    onnx_path = tmp_path / "vit.onnx"
    assert main(["convert", str(saved), str(onnx_path)]) == 0
    onnx.checker.check_model(onnx.load(str(onnx_path)), full_check=True)
    block = tmp_path / "block.tdag"
    assert main(["extract", str(saved), "--scope", "blocks.1", "-o", str(block)]) == 0
    tdag.verify(tdag.load(str(block)))


@pytest.mark.parametrize("argv, message", [
    (["show", "missing.tdag"], "no such file"),
    (["cost", __file__], "expected a .tdag, a .pt2 or an .onnx"),
])
def test_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_damaged_file_is_a_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.tdag"
    bad.write_bytes(b"not a tdag file at all")
    assert main(["verify", str(bad)]) == 1
    assert "tdag: error:" in capsys.readouterr().err
