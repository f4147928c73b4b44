"""tdag.parse on mutated program texts and on token soup (hypothesis): only TdagErrors."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from . import text_cases
from .harness import MARK, Case, record

QUICK = pytest.param(False, id="quick")
LONG = pytest.param(True, id="long", marks=pytest.mark.fuzz)


@pytest.mark.parametrize("long", [QUICK, LONG])
def test_text_mutants(pool, summary, fuzz_out, long):
    cases = text_cases.cases(seed=32 if long else 31, long=long, marker_dir=fuzz_out)
    record(summary, "text-long" if long else "text", pool.run(cases))


# -- hypothesis: strategies over tokens and over mutations of real texts ------------------------

def _collect(strategy, n: int) -> list:
    """``n`` examples of ``strategy``, the same on every run (derandomized, no database)."""
    found = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example):
        found.append(example)

    collect()
    return found


_HEAD = "tdag main(%x: f32[b,3]) {"
_PROGRAM = "program(%x: f32[b,3]) {\n  %o = call main(%x)\n  return %o\n}"


def _wrap(lines: list[str], how: str) -> str:
    body = "\n".join("  " + line for line in lines)
    if how == "tdag":
        return f"{_HEAD}\n{body}\n  return %x\n}}\n"
    if how == "both":
        return f"{_HEAD}\n{body}\n  return %x\n}}\n\n{_PROGRAM}\n"
    if how == "program":
        return f"{_HEAD}\n  return %x\n}}\n\nprogram(%x: f32[b,3]) {{\n{body}\n}}\n"
    return body


def token_texts(vocab: list[str]):
    """(label, text): lines of tokens of real texts, hostile tokens and short random text."""
    token = st.sampled_from(vocab) | st.text(max_size=4)
    line = st.lists(token, max_size=12).map(" ".join)
    how = st.sampled_from(("none", "tdag", "program", "both"))
    return st.builds(lambda lines, h: (f"hypothesis: token lines ({h})", _wrap(lines, h)),
                     st.lists(line, max_size=10), how)


def mutated_texts(texts: dict[str, str]):
    """(label, text): a real text under 1 to 4 of text_cases' mutations."""
    def mutate(name: str, seed: int, stack: int) -> tuple[str, str]:
        label, text = text_cases.mutants(texts[name], random.Random(seed), MARK, stack)
        return f"hypothesis: {name}: {label}", text
    return st.builds(mutate, st.sampled_from(sorted(texts)), st.integers(0, 2**32 - 1),
                     st.integers(1, 4))


@pytest.mark.parametrize("long", [QUICK, LONG])
def test_text_hypothesis(pool, summary, fuzz_out, long):
    texts = {name: str(p) for name, p in text_cases.programs(long=False).items()}
    vocab = sorted({m.group() for t in texts.values() for m in text_cases._tokens(t)}
                   | set(text_cases.HOSTILE_TOKENS))
    n = 3000 if long else 150
    examples = _collect(token_texts(vocab), n) + _collect(mutated_texts(texts), n)
    cases = []
    distinct: dict[str, str] = {}
    for label, text in examples:
        distinct.setdefault(text, label)
    for i, (text, label) in enumerate(distinct.items()):
        marker = str(fuzz_out / f"text-hypothesis-{long}-{i}-EXECUTED")
        cases.append(Case("text", label, "text", text.replace(MARK, marker), marker))
    record(summary, "text-hyp-long" if long else "text-hyp", pool.run(cases))
