"""The harness classifies outcomes right, and its payloads are live: torch's own loader,
without tdag's checks, does run them (so a clean pass means tdag stopped them)."""
from __future__ import annotations

import random

import pytest

from . import pt2_cases
from .harness import MARKER, Case

EXPECTED = {"ok": "ok", "clean": "clean", "escape": "escape", "malformed": "malformed",
            "hang": "hang", "stuck": "hang", "crash": "escape", "write": "executed"}


def test_outcomes_are_classified(pool, dirs):
    cases = []
    for what in EXPECTED:
        marker = str(dirs.new("canary") / MARKER)
        cases.append(Case("canary", what, f"canary_{what}", marker, marker))
    folder = dirs.new("canary")
    cases.append(Case("canary", "leak", "canary_ok", "", str(folder / MARKER), must_refuse=True))
    results = pool.run(cases, alarm=1.0, grace=3.0)
    got = {r.case.mutation: r.outcome for r in results}
    assert got == dict(EXPECTED, leak="leaked"), "\n".join(r.brief() for r in results)
    after = pool.run([Case("canary", "ok", "canary_ok", "")])  # workers restarted after a kill
    assert after[0].outcome == "ok", after[0].brief()


EDITS = [  # (json edit, zip edit, what): see pt2_cases.json_edit and zip_edit
    (0, None, "Python in a symbolic size"), (None, 3, "a pickled weight"),
    (None, 5, "pickled sample inputs"), (None, 6, "a legacy pickled constants file"),
    # AOTInductor's loader starts a Python subprocess first: ~20 s a case
    pytest.param(None, 7, "an AOTInductor library", marks=pytest.mark.fuzz),
    pytest.param(None, 8, "AOTInductor compiler flags", marks=pytest.mark.fuzz),
]


@pytest.mark.parametrize("json_how,zip_how,what", EDITS)
def test_payloads_run_under_torch_loader(pool, dirs, seeds_dir, json_how, zip_how, what):
    seed = seeds_dir / "pt2-canary" / "linear-dynamic.pt2"
    if not seed.exists():
        pt2_cases.seeds(seeds_dir / "pt2-canary", long=False)
    folder = dirs.new("canary")
    marker = str(folder / MARKER)
    label, blob = pt2_cases.edited(seed.read_bytes(), random.Random(0), marker, folder,
                                   json_how, zip_how)
    (folder / "model.pt2").write_bytes(blob)
    case = Case("canary", f"{what}: {label}", "canary_torch_export_load",
                str(folder / "model.pt2"), marker)
    result = pool.run([case], alarm=90.0)[0]
    assert result.outcome == "executed", result.brief()
