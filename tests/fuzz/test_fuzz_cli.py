"""The command line on a sample of the damaged files: ``python -m tdag show|cost|convert FILE``
in a fresh process exits non-zero with at most two lines on stderr and no traceback, or
succeeds; it never hangs and never runs anything from the file."""
from __future__ import annotations

import random

import pytest

from . import onnx_cases, pt2_cases, tdag_cases
from .harness import MARK, MARKER, Case, CaseDirs, record, run_cli_cases, truncations

QUICK = pytest.param(False, id="quick")
LONG = pytest.param(True, id="long", marks=pytest.mark.fuzz)
COMMANDS = ("show", "cost", "convert")


def _argv(command: str, path: str) -> tuple:
    if command == "convert":
        target = path.rsplit("/", 1)[0] + ("/out.onnx" if path.endswith(".tdag") else
                                           "/out.tdag")
        return ("convert", path, target)
    return (command, path)


def _onnx(dirs: CaseDirs, rng: random.Random, long: bool) -> list[tuple]:
    """(label, path[, must_refuse]) of damaged .onnx files."""
    models = onnx_cases.seeds(long=False)
    files = []
    for label, blob in truncations(models["squeezenet"].SerializeToString(), rng,
                                   2 if long else 1):
        path, _ = dirs.write("cli", "model.onnx", blob)
        files.append((f"onnx squeezenet {label}", str(path)))
    label, blob = onnx_cases.bad_utf8(models["mlp"], rng)
    path, _ = dirs.write("cli", "model.onnx", blob)
    files.append((f"onnx mlp {label}", str(path)))
    for name in ("shapes", "if", "loop") if long else ("shapes",):
        for _ in range(3 if long else 1):
            folder = dirs.new("cli")
            label, mutant = onnx_cases.structural(models[name], rng, str(folder / MARKER), 2)
            (folder / "model.onnx").write_bytes(mutant.SerializeToString())
            files.append((f"onnx {name} {label}", str(folder / "model.onnx")))
    wanted = ("parent ../", "NUL then") if not long else ("parent ../", "NUL", "absolute",
                                                          "symlink out", "huge offset")
    for case in onnx_cases.external_cases(dirs, rng, long=False):
        if any(case.mutation.startswith(f"external data: {w}") for w in wanted):
            files.append((case.mutation, case.arg, case.must_refuse))
    return files


def _tdag(dirs: CaseDirs, seeds_dir, rng: random.Random, long: bool) -> list[tuple]:
    seeds = tdag_cases.seeds(seeds_dir / "cli-tdag", long=False)
    files = []
    data = seeds["core"].read_bytes()
    for label, blob in truncations(data, rng, 1 if long else 0):
        path, _ = dirs.write("cli", "m.tdag", blob)
        files.append((f"tdag core {label}", str(path)))
    metadata, tensors = tdag_cases.read(seeds["core"])
    tables = tdag_cases.weight_tables(metadata, tensors, rng)
    edits = [("deep weight table", dict(metadata, **{tdag_cases.WEIGHTS: tables[-3]}))]
    for _ in range(3 if long else 1):
        label, text = tdag_cases.text_cases.mutants(metadata[tdag_cases.TEXT], rng, MARK, 2)
        edits.append((f"text: {label}", dict(metadata, **{tdag_cases.TEXT: text})))
    for label, md in edits:
        folder = dirs.new("cli")
        text = md[tdag_cases.TEXT].replace(MARK, str(folder / MARKER))
        tdag_cases.write(folder / "m.tdag", dict(md, **{tdag_cases.TEXT: text}), tensors)
        files.append((f"tdag core {label}, checksum redone", str(folder / "m.tdag")))
    return files


def _pt2(dirs: CaseDirs, seeds_dir, rng: random.Random, long: bool) -> list[tuple]:
    seed = pt2_cases.seeds(seeds_dir / "cli-pt2", long=False)["linear-dynamic"].read_bytes()
    files = []
    for label, blob in truncations(seed, rng, 1 if long else 0):
        path, _ = dirs.write("cli", "model.pt2", blob)
        files.append((f"pt2 {label}", str(path)))
    edits = [(0, None), (None, 3), (None, 7)] + ([(2, None), (None, 5), (None, 8), (None, 9),
                                                  (5, None), (None, 13)] if long else [])
    for json_how, zip_how in edits:
        folder = dirs.new("cli")
        marker = str(folder / MARKER)
        label, blob = pt2_cases.edited(seed, rng, marker, folder, json_how, zip_how)
        (folder / "model.pt2").write_bytes(blob)
        files.append((f"pt2 {label}", str(folder / "model.pt2")))
    return files


@pytest.mark.parametrize("long", [QUICK, LONG])
def test_cli_on_damaged_files(dirs, seeds_dir, summary, fuzz_out, long):
    rng = random.Random(42 if long else 41)
    files = _onnx(dirs, rng, long) + _tdag(dirs, seeds_dir, rng, long) + \
        _pt2(dirs, seeds_dir, rng, long)
    cases = []
    for i, (label, path, *refuse) in enumerate(files):
        marker = path.rsplit("/", 1)[0] + "/" + MARKER
        commands = COMMANDS if long else (COMMANDS[i % len(COMMANDS)],)
        for command in commands:
            cases.append(Case("cli", label, "cli", path, marker, must_refuse=bool(refuse and
                              refuse[0]), argv=_argv(command, path)))
    record(summary, "cli-long" if long else "cli", run_cli_cases(cases, fuzz_out))
