"""The command line on real files: .pt2 in, .tdag and .onnx out, errors as one line."""
from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import warnings
import zipfile

import onnx
import pytest
import torch
from onnx import TensorProto, helper

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


# -- bad inputs through the real command line: one line, status 1, no traceback ---------------

def _pt2_with_pickled_weight(folder):
    """A .pt2 whose weight is stored as a pickle (``use_pickle``): torch.export.load would
    unpickle it; tdag must refuse, in one line."""
    good = folder / "good.pt2"
    model = torch.nn.Linear(2, 2)
    torch.export.save(torch.export.export(model, (torch.ones(1, 2),)), str(good))
    path = folder / "pickled.pt2"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                for entry in config["config"].values():
                    entry["use_pickle"] = True
                data = json.dumps(config).encode()
            elif "/data/weights/weight_" in info.filename:
                data = pickle.dumps(_Exploit())
            dst.writestr(info, data)
    return path


class _Exploit:
    def __reduce__(self):
        return (print, ("pwned",))


def _unsupported_onnx(folder):
    """Three ops of a domain tdag does not know: the error lists three lines."""
    nodes = [helper.make_node(op, [a], [b], domain="acme.ops")
             for op, a, b in [("Foo", "x", "y"), ("Bar", "y", "z"), ("Baz", "z", "w")]]
    value = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])  # noqa: E731
    graph = helper.make_graph(nodes, "g", [value("x")], [value("w")])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("acme.ops", 1)]
    onnx.save(helper.make_model(graph, opset_imports=opsets), str(folder / "acme.onnx"))
    return folder / "acme.onnx"


def _not_protobuf(folder):
    path = folder / "junk.onnx"
    path.write_bytes(b"\xff\xfe junk")
    return path


def _directory(folder):
    path = folder / "model.onnx"
    path.mkdir()
    return path


def _unreadable(folder):
    path = folder / "locked.tdag"
    path.write_bytes(b"\x08\x07")
    path.chmod(0)
    return path


def _damaged_tdag(folder):
    path = folder / "damaged.tdag"
    tdag.save(tdag.trace(lambda x: x + 1, tdag.TensorSpec((3,))), path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    return path


def _empty_zip(folder):
    path = folder / "empty.pt2"
    zipfile.ZipFile(path, "w").close()
    return path


def _as_unprivileged() -> list[str] | None:
    """A command prefix under which chmod 0 makes a file unreadable: none needed but for root,
    which reads anything while it holds CAP_DAC_OVERRIDE; setpriv drops it."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    return [setpriv, "--bounding-set", "-dac_override,-dac_read_search"] if setpriv else None


# name -> (make the file in a folder, the command, words the message must hold)
BAD_INPUTS = {
    "pickled weight": (_pt2_with_pickled_weight, "show", "pickled.pt2"),
    "not protobuf": (_not_protobuf, "show", "junk.onnx"),
    "a directory": (_directory, "cost", "is a directory"),
    "unreadable": (_unreadable, "verify", "Permission denied"),
    "unsupported op": (_unsupported_onnx, "show", "Foo"),
    "damaged .tdag": (_damaged_tdag, "verify", "damaged"),
    "empty zip": (_empty_zip, "show", "empty.pt2"),
}


def _tdag(*argv, prefix=()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "tdag", *argv], capture_output=True,
                          text=True, timeout=300, cwd=REPO)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --debug goes through one code path whatever failed: two cases stand for all (each process
# spends seconds importing torch): a message that is a list, and an error with a cause
DEBUG_CASES = ["unsupported op", "pickled weight"]


@pytest.fixture(scope="module")
def bad_runs(tmp_path_factory):
    """(case, debug) -> the finished ``python -m tdag`` process, run side by side."""
    folder = tmp_path_factory.mktemp("bad")
    jobs = {}
    for name, (make, command, _) in BAD_INPUTS.items():
        path = str(make(folder))
        prefix = _as_unprivileged() if name == "unreadable" else []
        if prefix is not None:
            jobs[name, False] = [command, path], prefix
            if name in DEBUG_CASES:
                jobs[name, True] = [command, path, "--debug"], prefix
    workers = min(4, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {key: pool.submit(_tdag, *argv, prefix=prefix)
                   for key, (argv, prefix) in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_and_status_1(bad_runs, case):
    if (case, False) not in bad_runs:
        pytest.skip("running as root without setpriv: no file is unreadable")
    run = bad_runs[case, False]
    lines = run.stderr.splitlines()
    assert run.returncode == 1, run.stderr
    assert 1 <= len(lines) <= 2 and lines[0].startswith("tdag: error: "), run.stderr
    assert BAD_INPUTS[case][2] in lines[0] and "Traceback" not in run.stderr
    assert "internal error" not in run.stderr  # each is a failure tdag knows and names


@pytest.mark.parametrize("case", DEBUG_CASES)
def test_debug_shows_the_traceback(bad_runs, case):
    run = bad_runs[case, True]
    assert run.returncode == 1
    assert "Traceback (most recent call last)" in run.stderr


def test_a_list_shows_its_first_entry_and_a_count(bad_runs):
    brief, full = bad_runs["unsupported op", False], bad_runs["unsupported op", True]
    first, hint = brief.stderr.splitlines()
    assert "(Bar, Baz, Foo)" in first and "Bar" in first  # the first entry of the list, too
    assert hint == "(2 more: run with --debug for the full list)"
    assert all(f"  {op} (node" in full.stderr for op in ("Foo", "Bar", "Baz"))


# -- the boundary in process: whatever fails is reported, never raised ------------------------

@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.tdag"
    tdag.save(tdag.trace(lambda x: x * 2, tdag.TensorSpec((3,))), path)
    return str(path)


def _raise(exc):
    def fail(*args, **kwargs):
        raise exc
    return fail


def test_unexpected_exception_is_an_internal_error(small, monkeypatch, capsys):
    monkeypatch.setattr(tdag, "verify", _raise(ValueError("boom\nsecond line")))
    assert main(["verify", small]) == 1
    assert capsys.readouterr().err == ("tdag: error: internal error: ValueError: boom "
                                       "(run with --debug and report it)\n")


@pytest.mark.parametrize("argv", [["--debug", "verify"], ["verify", "--debug"]])
def test_debug_flag_before_or_after_the_command(small, monkeypatch, capsys, argv):
    monkeypatch.setattr(tdag, "verify", _raise(ValueError("boom\nsecond line")))
    assert main([*argv, small]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValueError: boom\nsecond line" in err


def test_error_location_stays_on_the_first_line(small, monkeypatch, capsys):
    error = tdag.ShapeError("add: bad shapes:\n  %x: f32[2]\n  %y: f32[3]", node="7")
    monkeypatch.setattr(tdag, "verify", _raise(error))
    assert main(["verify", small]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "tdag: error: add: bad shapes: %x: f32[2] [node %7]",
        "(1 more: run with --debug for the full list)"]


def test_unwritable_output_and_interrupt(small, tmp_path, monkeypatch, capsys):
    missing = tmp_path / "no" / "such" / "folder" / "out.tdag"
    assert main(["convert", small, str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No such file or directory" in err
    monkeypatch.setattr(tdag, "verify", _raise(KeyboardInterrupt()))
    assert main(["verify", small]) == 130
    assert capsys.readouterr().err == "tdag: interrupted\n"


def _long_chain(x):
    for _ in range(1000):
        x = x + 1.0
    return x


def test_closed_pipe_ends_quietly(tmp_path, monkeypatch, capsys):
    """`tdag show m.tdag | head`: the reader leaves; no error, and stdout now goes to
    /dev/null, so that Python's final flush does not report the broken pipe either."""
    path = tmp_path / "long.tdag"
    tdag.save(tdag.trace(_long_chain, tdag.TensorSpec((3,))), path)  # text > a pipe's buffer
    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as stdout:
        monkeypatch.setattr(sys, "stdout", stdout)
        assert main(["show", str(path)]) == 1
        stdout.write("more")
        stdout.flush()  # to /dev/null now: no BrokenPipeError
    assert capsys.readouterr().err == ""


def _noisy_failure(*args, **kwargs):
    logging.getLogger("torch.export").warning("a warning logged by torch")
    warnings.warn("a third-party warning", UserWarning, stacklevel=1)
    raise tdag.InvalidModelError("the real problem")


@pytest.mark.parametrize("debug", [False, True])
def test_third_party_noise_is_silenced_unless_debug(small, monkeypatch, capsys, caplog,
                                                    recwarn, debug):
    monkeypatch.setattr(tdag, "verify", _noisy_failure)
    assert main(["verify", small] + ["--debug"] * debug) == 1
    logged = [r.getMessage() for r in caplog.records]
    assert logged == (["a warning logged by torch"] if debug else [])
    assert [str(w.message) for w in recwarn] == (["a third-party warning"] if debug else [])
    if not debug:
        assert capsys.readouterr().err == "tdag: error: the real problem\n"


def test_usage_error_is_status_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["show"])
    assert info.value.code == 2
