""".tdag files, damaged and edited past their checksum: tdag.load raises only TdagErrors."""
from __future__ import annotations

import pytest

from . import tdag_cases
from .harness import Case, record

QUICK = pytest.param(False, id="quick")
LONG = pytest.param(True, id="long", marks=pytest.mark.fuzz)


def test_checksum_recomputed_like_tdag(pool, dirs, seeds_dir):
    """A file rewritten by the suite, with nothing changed but the checksum recomputed, still
    loads: else every 'checksum redone' case would stop at the integrity check."""
    cases = []
    for name, path in tdag_cases.seeds(seeds_dir / "recheck", long=False).items():
        folder = dirs.new("tdag-seed")
        metadata, tensors = tdag_cases.read(path)
        tdag_cases.write(folder / "m.tdag", metadata, tensors)
        cases.append(Case("tdag-seed", name, "tdag_path", str(folder / "m.tdag")))
    results = pool.run(cases)
    assert all(r.outcome == "ok" for r in results), "\n".join(r.brief() for r in results)


@pytest.mark.parametrize("long", [QUICK, LONG])
def test_tdag_mutants(pool, dirs, summary, seeds_dir, long):
    folder = seeds_dir / ("long" if long else "quick")
    cases = tdag_cases.cases(dirs, folder, seed=12 if long else 11, long=long)
    record(summary, "tdag-long" if long else "tdag", pool.run(cases))
