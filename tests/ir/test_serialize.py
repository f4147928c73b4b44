"""The .tdag file: save -> load -> run is bit-identical, shared weights are stored once,
damaged files raise FileFormatError, a failed save leaves the old file intact, and the next
save removes what a killed one left behind."""
from __future__ import annotations

import json
import os
import random
import stat
import subprocess
import sys
import time

import pytest
import safetensors
import safetensors.torch
import torch
from support.io_programs import (control_inputs, control_program, core_inputs, core_program,
                         dtype_program, tiny_program)

import tdag
from tdag import FileFormatError, Program, ops
from tdag.ir import serialize
from tdag.ir.graph import TDAG, Node, Value, Weight
from tdag.ir.op import Op
from tdag.ir.program import Block, Call
from tdag.ir.serialize import load, save
from tdag.ir.types import DType, TensorKind, TensorType


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes: stricter than torch.equal (nan payloads, -0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = (t.contiguous().reshape(-1).view(torch.uint8) for t in (a, b))
    return torch.equal(a, b)


def assert_weights_identical(a: Program, b: Program) -> None:
    for gname, graph in a.graphs.items():
        for name, weight in graph.weights.items():
            assert same_bits(weight.value, b.graphs[gname].weights[name].value), name
    for name, weight in a.state.items():
        assert same_bits(weight.value, b.state[name].value), name


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


CASES = [
    (tiny_program, lambda: (torch.randn(4, 3),)),
    (core_program, core_inputs),
    (dtype_program, lambda: (torch.randn(2, 3),)),
]


@pytest.mark.parametrize("make,inputs", CASES, ids=["tiny", "core", "dtypes"])
def test_save_load_run_is_bit_identical(tmp_path, make, inputs):
    prog, args = make(), inputs()
    path = tmp_path / "m.tdag"
    save(prog, path)
    back = load(path)
    assert back == prog
    assert str(back) == str(prog)
    assert_weights_identical(prog, back)
    tdag.verify(back)
    for a, b in zip(as_tuple(tdag.run(prog, *args)), as_tuple(tdag.run(back, *args))):
        assert a.dtype == b.dtype and torch.equal(a, b)


def test_dtypes_program_covers_the_common_dtypes():
    dtypes = {w.value.dtype for w in dtype_program().graph.weights.values()}
    assert {torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool} <= dtypes


def test_control_flow_program_with_state(tmp_path):
    prog = control_program()
    save(prog, tmp_path / "c.tdag")
    back = load(tmp_path / "c.tdag")
    assert back == prog and str(back) == str(prog)
    assert_weights_identical(prog, back)
    (outs_a, state_a) = tdag.run(prog, *control_inputs(), return_state=True)
    (outs_b, state_b) = tdag.run(back, *control_inputs(), return_state=True)
    for a, b in zip(outs_a, outs_b):
        assert torch.equal(a, b)
    assert torch.equal(state_a["kv"], state_b["kv"])


def test_saving_again_gives_the_same_content(tmp_path):
    # safetensors orders the metadata map freely, so compare contents, not bytes
    save(dtype_program(), tmp_path / "a.tdag")
    save(load(tmp_path / "a.tdag"), tmp_path / "b.tdag")
    metadata = []
    for name in ("a.tdag", "b.tdag"):
        with safetensors.safe_open(tmp_path / name, framework="pt") as f:
            metadata.append(f.metadata())
    assert metadata[0] == metadata[1]  # the same text, weight table and sha256 of the data


def test_special_float_bits_survive(tmp_path):
    nan_payload = torch.tensor([0x7FC1, -0x01FF], dtype=torch.int16).view(torch.float16)
    values = torch.cat([nan_payload, torch.tensor([-0.0, float("inf"), 6e-8]).half(),
                        torch.zeros(20, dtype=torch.float16)])
    prog = tdag.trace(lambda x: x * ops.param("w", values), tdag.TensorSpec((25,), "f16"))
    save(prog, tmp_path / "m.tdag")
    assert same_bits(load(tmp_path / "m.tdag").graph.weights["w"].value, values)


def test_shape_only_program_saves_types_only(tmp_path):
    def fn(x):
        return ops.matmul(x, ops.param("w", torch.empty(3, 5, device="meta")))
    prog = tdag.trace(fn, tdag.TensorSpec(("b", 3)))
    assert prog.graph.weights["w"].value is None
    save(prog, tmp_path / "meta.tdag")
    with safetensors.safe_open(tmp_path / "meta.tdag", framework="pt") as f:
        assert list(f.keys()) == []
    back = load(tmp_path / "meta.tdag")
    assert back == prog and back.graph.weights["w"].value is None


def _adder(weight: Weight) -> TDAG:
    t = TensorType((3,), DType.f32)
    node = Node("y", Op.add, ("x", "w"), tdag.deinops.NoSpec(), t)
    return TDAG((Value("x", t),), {"w": weight}, (node,), ("y",))


def _multi_graph_program(values: dict, state_value: torch.Tensor) -> Program:
    t = TensorType((3,), DType.f32)
    graphs = {g: _adder(Weight(TensorKind.parameter, t, v)) for g, v in values.items()}
    steps = tuple(Call(g, ("x",), (f"y_{g}",)) for g in graphs)
    main = Block((Value("x", t),), steps, tuple(f"y_{g}" for g in graphs))
    return Program(graphs, main, {"w": Weight(TensorKind.buffer, t, state_value)})


def test_weights_shared_by_name_are_stored_once(tmp_path):
    shared, other = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])
    prog = _multi_graph_program({"a": shared, "b": shared.clone(), "c": other}, shared)
    save(prog, tmp_path / "m.tdag")
    with safetensors.safe_open(tmp_path / "m.tdag", framework="pt") as f:
        assert sorted(f.keys()) == ["c/w", "w"]
    back = load(tmp_path / "m.tdag")
    assert_weights_identical(prog, back)
    x = torch.zeros(3)
    assert [torch.equal(a, b) for a, b in zip(tdag.run(prog, x), tdag.run(back, x))] == [True] * 3


def test_views_of_one_storage_and_strided_weights_save(tmp_path):
    base = torch.arange(12.0).reshape(4, 3)
    prog = _multi_graph_program({"a": base[0], "b": base[1], "c": base.t()[0][:3]}, base[2])
    save(prog, tmp_path / "m.tdag")
    assert_weights_identical(prog, load(tmp_path / "m.tdag"))


# -- damaged files ----------------------------------------------------------------------------

@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "m.tdag"
    save(dtype_program(), path)
    return path, path.read_bytes()


def assert_rejected(path, match: str | None = None) -> FileFormatError:
    with pytest.raises(FileFormatError, match=match) as info:
        load(path)
    error = info.value
    # no chained traceback from safetensors or json
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)
    assert len(str(error)) < 600
    return error


def test_truncated_files_are_rejected(saved):
    path, data = saved
    for n in sorted({0, 1, 7, 8, 9, 64, len(data) // 2, len(data) - 100, len(data) - 1}):
        path.write_bytes(data[:n])
        assert_rejected(path)


def test_every_flipped_byte_is_caught(saved):
    path, data = saved
    for i in range(0, len(data), 3):
        damaged = bytearray(data)
        damaged[i] ^= 0xFF
        path.write_bytes(bytes(damaged))
        assert_rejected(path)


def test_flipped_weight_byte_fails_the_checksum(saved):
    path, data = saved
    damaged = bytearray(data)
    damaged[-5] ^= 0x01  # inside the last tensor's bytes: the file still parses
    path.write_bytes(bytes(damaged))
    assert_rejected(path, "checksum")


@pytest.mark.parametrize("content", [b"", b"\x00" * 8, b"junk", b"\xff" * 64,
                                     random.Random(0).randbytes(4096)])
def test_junk_is_rejected(tmp_path, content):
    path = tmp_path / "junk.tdag"
    path.write_bytes(content)
    assert_rejected(path)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {"format": "onnx"}])
def test_other_safetensors_files_are_not_tdag_files(tmp_path, metadata):
    path = tmp_path / "weights.safetensors"
    safetensors.torch.save_file({"w": torch.zeros(2)}, path, metadata=metadata)
    assert_rejected(path, "not a tdag file")


def test_unknown_version_is_rejected_clearly(tmp_path, monkeypatch):
    monkeypatch.setattr(serialize, "VERSION", "99")
    save(tiny_program(), tmp_path / "future.tdag")
    monkeypatch.undo()
    assert_rejected(tmp_path / "future.tdag", r"version '99' is not supported")


def test_missing_file_and_directory_are_rejected(tmp_path):
    assert_rejected(tmp_path / "nope.tdag", "no such file")
    assert_rejected(tmp_path, "no such file")


def _forge(path, text: str, table: dict | str, tensors: dict) -> None:
    """A file with a valid checksum but a hand-written text and weight table."""
    metadata = {"format": "tdag", "tdag.version": serialize.VERSION, "tdag.text": text,
                "tdag.weights": table if isinstance(table, str) else json.dumps(table)}
    metadata["tdag.sha256"] = serialize._checksum(metadata, tensors)
    safetensors.torch.save_file(tensors, path, metadata=metadata)


def test_weight_table_cannot_point_outside_the_file(tmp_path):
    text = str(tiny_program())
    path = tmp_path / "forged.tdag"
    _forge(path, text, {"graphs": {"main": {"w": "../../etc/passwd"}}, "state": {}},
           {"w": torch.ones(3)})
    assert_rejected(path, "does not hold")
    _forge(path, text, {"graphs": {"main": {"w": "w"}}, "state": {}}, {"w": torch.ones(4)})
    assert_rejected(path, "declared f32")
    packed = torch.zeros(3, dtype=torch.float4_e2m1fn_x2)  # two 4-bit floats a byte
    _forge(path, text, {"graphs": {"main": {"w": "w"}}}, {"w": packed})
    assert_rejected(path, "unsupported dtype")
    _forge(path, text, ["not", "a", "table"], {})
    assert_rejected(path, "weight table")
    _forge(path, text.replace("reduce[sum]", "reduce[avg]"), {}, {})
    assert_rejected(path, "line 10")


def test_a_forged_program_that_does_not_verify_is_rejected(tmp_path):
    """The checksum catches damage, not a file written to deceive: load verifies too."""
    path = tmp_path / "forged.tdag"
    text = str(tiny_program()).replace("multiply(%2, %5)", "multiply(%2, %9)")  # dangling
    assert "%9)" in text
    _forge(path, text, {"graphs": {"main": {"w": "w"}}, "state": {}}, {"w": torch.ones(3)})
    assert_rejected(path, "malformed")
    deep = '{"graphs": ' + '{"a": ' * 100_000 + "{}" + "}" * 100_001  # past json's recursion
    _forge(path, str(tiny_program()), deep, {"w": torch.ones(3)})
    assert_rejected(path, "damaged weight table")


# -- atomic save ------------------------------------------------------------------------------

def _failing_save_file(exc):
    real = safetensors.torch.save_file

    def fake(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:  # half-written, then the "disk" fails
            f.truncate(os.path.getsize(filename) // 2)
        raise exc
    return fake


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_save_leaves_the_old_file(saved, monkeypatch, exc):
    path, data = saved
    monkeypatch.setattr(safetensors.torch, "save_file", _failing_save_file(exc))
    with pytest.raises(type(exc)):
        save(core_program(), path)
    monkeypatch.undo()
    assert path.read_bytes() == data
    assert load(path) == dtype_program()
    assert os.listdir(path.parent) == [path.name]  # no temp file left behind


def test_failed_rename_leaves_the_old_file(saved, monkeypatch):
    path, data = saved

    def broken_replace(src, dst):
        raise OSError("rename failed")
    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="rename failed"):
        save(core_program(), path)
    monkeypatch.undo()
    assert path.read_bytes() == data
    assert os.listdir(path.parent) == [path.name]


# -- leftovers of interrupted saves -----------------------------------------------------------

def _leftover(folder, name: str, age_s: float = 3600, as_dir: bool = True):
    """A temporary folder (or an older tdag's temporary file) as a killed save leaves it."""
    leftover = folder / f".{name}.{os.urandom(8).hex()}.tmp"
    if as_dir:
        leftover.mkdir()
        (leftover / ".tmpAbC123").write_bytes(b"\0" * 1024)  # safetensors' half-written file
    else:
        leftover.write_bytes(b"")
    then = time.time() - age_s
    os.utime(leftover, (then, then))
    return leftover


@pytest.mark.skipif(not hasattr(os, "O_DIRECTORY"), reason="flock: POSIX only")
def test_save_removes_what_killed_saves_left(tmp_path):
    stale = [_leftover(tmp_path, "m.tdag"), _leftover(tmp_path, "m.tdag", as_dir=False)]
    kept = [_leftover(tmp_path, "other.tdag"),            # another target's
            _leftover(tmp_path, "m.tdag", age_s=-3600),   # younger than the save
            tmp_path / ".m.tdag.notours.tmp"]             # not a name save() makes
    kept[2].write_bytes(b"x")
    with serialize._scratch_folder(str(tmp_path), "m.tdag") as live:  # a save in progress
        os.utime(live, (0, 0))
        save(tiny_program(), tmp_path / "m.tdag")
        assert os.path.isdir(live)
    assert load(tmp_path / "m.tdag") == tiny_program()
    assert not any(p.exists() for p in stale)
    assert all(p.exists() for p in kept)
    assert not os.path.exists(live)  # a save removes its own folder
    assert sorted(os.listdir(tmp_path)) == sorted(["m.tdag"] + [p.name for p in kept])


_HOLD_LOCK = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not hasattr(os, "O_DIRECTORY"), reason="flock: POSIX only")
def test_a_live_writers_folder_stays_until_it_is_killed(tmp_path):
    folder = _leftover(tmp_path, "m.tdag")
    writer = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(folder)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "locked"
        save(tiny_program(), tmp_path / "m.tdag")
        assert folder.is_dir()  # its writer lives: left alone
    finally:
        writer.kill()  # SIGKILL: no cleanup of its own; the kernel drops the lock
        writer.wait()
        writer.stdout.close()
    save(tiny_program(), tmp_path / "m.tdag")
    assert os.listdir(tmp_path) == ["m.tdag"]


def test_saved_file_mode_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        save(tiny_program(), tmp_path / "m.tdag")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "m.tdag").st_mode) == 0o640
