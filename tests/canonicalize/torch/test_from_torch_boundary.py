"""``from_torch`` is an API boundary: whatever torch.export or the converter raises reaches
the caller as a tdag error with a one-line message, the original kept as ``__cause__``."""
from __future__ import annotations

import json
import zipfile

import pytest
import torch

import tdag
from tdag.canonicalize.torch import export as torch_export
from tdag.errors import CaptureError, ConversionError


class BranchOnValue(torch.nn.Module):
    """Python control flow on a tensor's value: torch.export cannot capture it."""

    def forward(self, x):
        if x.sum() > 0:
            return x + 1
        return x - 1


def test_untraceable_model_is_a_capture_error():
    with pytest.raises(CaptureError) as info:
        tdag.from_torch(BranchOnValue(), (torch.ones(3),))
    message = str(info.value)
    assert message.startswith("torch.export could not capture the model: ")
    assert "data-dependent" in message and "\n" not in message
    assert isinstance(info.value.__cause__, RuntimeError)  # torch's own, for --debug
    assert "guard_or_false" in str(info.value.__cause__)   # its advice is kept there


def test_example_inputs_forward_does_not_take_are_a_capture_error():
    with pytest.raises(CaptureError, match="positional argument") as info:
        tdag.from_torch(torch.nn.Linear(3, 2), (torch.ones(1, 3), torch.ones(1)))
    assert isinstance(info.value.__cause__, TypeError)


@pytest.mark.parametrize("source", [42, lambda x: x + 1, None])
def test_a_source_that_is_not_a_model_is_refused(source):
    with pytest.raises(tdag.InvalidModelError, match="from_torch takes an nn.Module"):
        tdag.from_torch(source, (torch.ones(3),))


def test_pt2_whose_model_json_is_empty(tmp_path):
    good, bad = tmp_path / "good.pt2", tmp_path / "bad.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),)),
                      str(good))
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info, json.dumps({}) if info.filename.endswith("model.json") else data)
    with pytest.raises(tdag.FileFormatError) as info:
        tdag.from_torch(str(bad))
    assert "bad.pt2" in str(info.value) and "\n" not in str(info.value)


def _raising(exc):
    def fail(*args, **kwargs):
        raise exc
    return fail


def test_converter_failure_is_a_conversion_error(monkeypatch):
    bug = KeyError("w")
    monkeypatch.setattr(torch_export, "convert", _raising(bug))
    with pytest.raises(ConversionError) as info:
        tdag.from_torch(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
    assert str(info.value) == "tdag could not convert the exported program: KeyError: 'w'"
    assert info.value.__cause__ is bug


def test_tdag_errors_pass_unchanged(monkeypatch):
    error = tdag.UnsupportedOpError("2 unsupported op use(s) (a, b):\n  a\n  b")
    monkeypatch.setattr(torch_export, "convert", _raising(error))
    with pytest.raises(tdag.UnsupportedOpError) as info:
        tdag.from_torch(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
    assert info.value is error


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), MemoryError()])
def test_the_process_failing_is_not_relabelled(monkeypatch, exc):
    monkeypatch.setattr(torch_export, "capture", _raising(exc))
    with pytest.raises(type(exc)) as info:
        tdag.from_torch(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
    assert info.value is exc
