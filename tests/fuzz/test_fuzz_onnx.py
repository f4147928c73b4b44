"""tdag.from_onnx on damaged and hostile ONNX models: never anything but a TdagError."""
from __future__ import annotations

import pytest

from . import onnx_cases
from .harness import Case, record

QUICK = pytest.param(False, id="quick")
LONG = pytest.param(True, id="long", marks=pytest.mark.fuzz)


def test_onnx_seeds_load(pool, dirs):
    """The seeds themselves load (or name the op tdag lacks): else the mutants test little."""
    cases = []
    for name, model in onnx_cases.seeds(long=True).items():
        path, marker = dirs.write("onnx-seed", "model.onnx", model.SerializeToString())
        cases.append(Case("onnx-seed", name, "onnx_path", str(path), marker))
    results = {r.case.mutation: r for r in pool.run(cases)}
    assert {n: r.outcome for n, r in results.items()} == {n: "ok" for n in results}, \
        "\n".join(r.brief() for r in results.values())


@pytest.mark.parametrize("long", [QUICK, LONG])
def test_onnx_mutants(pool, dirs, summary, long):
    cases = onnx_cases.cases(dirs, seed=2 if long else 1, long=long)
    record(summary, "onnx-long" if long else "onnx", pool.run(cases))
