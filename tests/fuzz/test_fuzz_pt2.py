""".pt2 archives rewritten with hostile members: tdag.from_torch raises only TdagErrors and
never runs anything from the file (no pickle, no symbolic-size Python, no library, no
compiler)."""
from __future__ import annotations

import pytest

from . import pt2_cases
from .harness import Case, record

QUICK = pytest.param(False, id="quick")
LONG = pytest.param(True, id="long", marks=pytest.mark.fuzz)


def test_rezipped_seeds_load(pool, dirs, seeds_dir):
    """The seeds, rewritten by the suite's own zip writer with nothing changed, still load:
    else every zip-level case would only test the writer."""
    cases = []
    for name, path in pt2_cases.seeds(seeds_dir / "pt2-recheck", long=True).items():
        blob = pt2_cases.rezip(pt2_cases.members(path.read_bytes()))
        for label, data in (("as saved", path.read_bytes()), ("rezipped", blob)):
            file, marker = dirs.write("pt2-seed", "model.pt2", data)
            cases.append(Case("pt2-seed", f"{name} {label}", "pt2_path", str(file), marker))
    results = pool.run(cases)
    assert all(r.outcome == "ok" for r in results), "\n".join(r.brief() for r in results)


@pytest.mark.parametrize("long", [QUICK, LONG])
def test_pt2_mutants(pool, dirs, summary, seeds_dir, long):
    cases = pt2_cases.cases(dirs, seeds_dir / f"pt2-{long}", seed=22 if long else 21,
                            long=long)
    record(summary, "pt2-long" if long else "pt2", pool.run(cases))
