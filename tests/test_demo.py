"""The README's first command runs the demo (python -m tdag.demo): it passes its own checks
and leaves the files it names (the ONNX export, the page)."""
from __future__ import annotations

import onnx

from tdag import demo


def test_demo_passes_its_checks_and_writes_its_files(tmp_path, capsys):
    assert demo.main(str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and "FAIL" not in out
    onnx.checker.check_model(onnx.load(str(tmp_path / "tiny_vit.onnx")))
    page = (tmp_path / "graph.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "<script" in page
    assert 'src="http' not in page and 'href="http' not in page  # nothing fetched
