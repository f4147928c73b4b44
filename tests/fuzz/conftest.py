"""Session fixtures of the fuzz suite: the output folder, the worker pool, the summary.

The output folder is ``$TDAG_FUZZ_OUT`` when set (kept), else a pytest temporary folder; it
holds ``summary.txt`` / ``summary.json`` (counts per target and outcome, and the smallest
reproduction of each kind of failure), the worker logs and the files of every case that did
not end ``ok`` or ``clean``. The counts are printed at the end of the run.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .harness import CaseDirs, Pool, Summary

_SUMMARY: list[Summary] = []


@pytest.fixture(scope="session")
def fuzz_out(tmp_path_factory) -> Path:
    if os.environ.get("TDAG_FUZZ_OUT"):
        out = Path(os.environ["TDAG_FUZZ_OUT"]).resolve()
        for old in ("cases", "repro", "worker-cwd"):  # a previous run's, never anything else
            shutil.rmtree(out / old, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        return out
    return tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="session")
def summary(fuzz_out) -> Summary:
    s = Summary(fuzz_out)
    _SUMMARY.append(s)
    return s


@pytest.fixture(scope="session")
def pool(fuzz_out):
    p = Pool(fuzz_out)
    yield p
    p.close()


@pytest.fixture(scope="session")
def dirs(fuzz_out) -> CaseDirs:
    return CaseDirs(fuzz_out)


@pytest.fixture(scope="session")
def seeds_dir(tmp_path_factory) -> Path:
    """Valid seed files (.pt2, .tdag, .onnx) built once per session."""
    return tmp_path_factory.mktemp("fuzz-seeds")


def pytest_terminal_summary(terminalreporter):
    for s in _SUMMARY:
        if s.counts:
            terminalreporter.section("tdag fuzz: outcomes per target")
            terminalreporter.write_line(s.report())
            terminalreporter.write_line(f"(written to {s.out / 'summary.txt'})")
