"""``MemoryReport``: the peak of a run, what is live at it, and the curve over the schedule.

Bytes are the storages the reified torch module holds (``walk``): parameters and state
included, as torch's ``MemTracker`` counts them. With every size bound the figures are ints;
otherwise they are expressions in the free sizes, and ``peak`` is the ``Max`` of the events
that peak at some point of a probe grid (each free size 1, 64 or 4096).
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

import sympy

from tdag.errors import ShapeError
from tdag.ir.symbols import Dim, format_dim
from tdag.refine.memory.heap import Storage
from tdag.refine.memory.kinds import KINDS
from tdag.refine.memory.walk import Event

GRID = (1, 64, 4096)


@dataclass(frozen=True, slots=True)
class Live:
    """A tensor live at the peak: its storage's bytes and what made it."""

    name: str
    bytes: Dim
    kind: str
    node: str
    scope: str
    graph: str


@dataclass(frozen=True, slots=True)
class PhasePeak:
    """The highest point within one phase of a training step, and the bytes by kind there."""

    peak: Dim
    at: str
    by_kind: dict


@dataclass(frozen=True)
class MemoryReport:
    """The memory a program needs as its reified torch module runs it.

    peak          bytes at the highest point (an expression where sizes are free)
    by_kind       kind -> bytes live at the peak (``tdag.refine.memory.kinds``)
    live_at_peak  the tensors live at the peak, largest first
    peak_at       the scheduled node (``graph:node``) right after which the peak is reached
    peak_phase    the phase of that node: forward, recompute, backward or optimizer
    phases        phase -> its own highest point (``PhasePeak``), in schedule order: a
                  training step's forward+backward peak beside its optimizer's
    """

    peak: Dim
    by_kind: dict
    live_at_peak: tuple
    peak_at: str
    events: tuple
    sizes: dict
    peak_phase: str = "forward"
    phases: dict = field(default_factory=dict)

    def timeline(self) -> list[tuple[str, Dim]]:
        """(``graph:node``, bytes live right after it) for every scheduled node, in order."""
        return [(e.label, _value(e.total, self.sizes)) for e in self.events]

    def by_scope(self, depth: int = 2) -> dict[str, Dim]:
        """Bytes live at the peak per module scope, cut to ``depth`` dotted parts."""
        out: dict[str, Dim] = {}
        for live in self.live_at_peak:
            key = ".".join(live.scope.split(".")[:depth]) if live.scope else f"({live.kind})"
            out[key] = out.get(key, 0) + live.bytes
        return out

    def table(self, top: int = 15) -> str:
        """The peak, its split by kind and by scope, and the largest tensors live at it."""
        lines = [f"peak: {_bytes(self.peak)} after {self.peak_at} ({self.peak_phase})", "",
                 "by kind at the peak:"]
        lines += [f"  {k:<12} {_bytes(v):>12}" for k, v in self.by_kind.items()]
        if len(self.phases) > 1:
            lines += ["", "peak by phase:"]
            lines += [f"  {k:<12} {_bytes(p.peak):>12}  after {p.at}"
                      for k, p in self.phases.items()]
        lines += ["", "by scope at the peak:"]
        scopes = sorted(self.by_scope().items(), key=lambda kv: -_key(kv[1]))
        width = max([len(k) for k, _ in scopes] + [5])
        lines += [f"  {k:<{width}} {_bytes(v):>12}" for k, v in scopes]
        lines += ["", f"largest tensors live at the peak ({len(self.live_at_peak)} in all):"]
        rows = [(x.name, _bytes(x.bytes), x.kind, x.scope or "-") for x in self.live_at_peak[:top]]
        widths = [max(len(r[i]) for r in rows + [("name", "bytes", "kind", "scope")])
                  for i in range(4)]
        for row in [("name", "bytes", "kind", "scope")] + rows:
            lines.append("  " + "  ".join(f"{c:<{w}}" if i != 1 else f"{c:>{w}}"
                                          for i, (c, w) in enumerate(zip(row, widths))))
        return "\n".join(lines)

    def to_json(self) -> str:
        """The report as JSON (schema ``tdag.memory/1``); expressions as strings."""
        return json.dumps(self.to_dict())

    def to_dict(self) -> dict:
        return {"schema": "tdag.memory/1", "sizes": dict(self.sizes),
                "peak": _plain(self.peak), "peak_at": self.peak_at,
                "peak_phase": self.peak_phase,
                "by_kind": {k: _plain(v) for k, v in self.by_kind.items()},
                "phases": {k: {"peak": _plain(p.peak), "at": p.at,
                               "by_kind": {n: _plain(v) for n, v in p.by_kind.items()}}
                           for k, p in self.phases.items()},
                "live_at_peak": [{"name": x.name, "bytes": _plain(x.bytes), "kind": x.kind,
                                  "node": x.node, "scope": x.scope, "graph": x.graph}
                                 for x in self.live_at_peak],
                "timeline": [[label, _plain(v)] for label, v in self.timeline()]}


def build(events: list[Event], storages: list[Storage], captured: dict,
          peaks: dict[str, tuple[int, Dim]], sizes: dict) -> MemoryReport:
    """The report of one replay, given the peak events (``""`` the whole run's, else per
    phase: index and bytes) and the storages live at each."""
    def lives(index):
        return sorted((Live(s.name, s.bytes, s.kind, s.node, s.scope, s.graph)
                       for s in (storages[i] for i in captured[index])),
                      key=lambda x: -_key(x.bytes))
    index, peak = peaks[""]
    top = lives(index)
    phases = {name: PhasePeak(value, events[i].label, _by_kind(lives(i)))
              for name, (i, value) in peaks.items() if name}
    return MemoryReport(peak, _by_kind(top), tuple(top), events[index].label, tuple(events),
                        dict(sizes), events[index].phase, phases)


def _by_kind(lives: list[Live]) -> dict:
    by_kind = {}
    for kind in KINDS:
        parts = [x.bytes for x in lives if x.kind == kind]
        if parts:
            by_kind[kind] = _simplify(sum(parts))
    return by_kind


def peaks_of(events: list[Event], free: list[str], sizes: dict) -> dict[str, tuple[int, Dim]]:
    """The peak event of the run (key ``""``) and of each phase, in schedule order:
    (its index, its bytes)."""
    groups: dict[str, list[int]] = {"": list(range(len(events)))}
    for i, event in enumerate(events):
        groups.setdefault(event.phase, []).append(i)
    return {name: peak_of([events[i] for i in group], free, sizes, group)
            for name, group in groups.items()}


def peak_of(events: list[Event], free: list[str], sizes: dict,
            indexes: list[int] | None = None) -> tuple[int, Dim]:
    """(index of the peak event, the peak): exact where every size is bound, else the Max
    of the events that are highest at some point of the probe grid. ``indexes`` are the
    events' places in the whole run (their own order when not given)."""
    indexes = indexes or list(range(len(events)))
    if not free:
        values = [e.total.at(sizes) for e in events]
        index = max(range(len(values)), key=values.__getitem__)
        return indexes[index], values[index]
    winners: list[int] = []
    for point in _probes(len(free)):
        probe = dict(sizes, **dict(zip(free, point)))
        values = [e.total.at(probe) for e in events]
        best = max(range(len(values)), key=values.__getitem__)
        if best not in winners:
            winners.append(best)
    exprs = list(dict.fromkeys(events[i].total.expr() for i in winners))
    return indexes[winners[-1]], exprs[0] if len(exprs) == 1 else sympy.Max(*exprs)


def _probes(count: int):
    """The points of ``count`` free sizes at which ``peak_of`` compares the events: every
    point of the grid for up to ``_FULL_GRID`` sizes; past that (a model routing tokens to
    eight experts has a size per expert: 3^8 points of thousands of events) the grid's
    diagonal and each size alone at either end, the others at the other: 3 + 2n points."""
    if count <= _FULL_GRID:
        yield from itertools.product(GRID, repeat=count)
        return
    low, high = GRID[0], GRID[-1]
    yield from ((value,) * count for value in GRID)
    for k in range(count):
        yield tuple(high if i == k else low for i in range(count))
        yield tuple(low if i == k else high for i in range(count))


_FULL_GRID = 4  # sizes: 81 points


def _simplify(value: Dim) -> Dim:
    if isinstance(value, sympy.Expr):
        value = sympy.expand(value)
        return int(value) if value.is_Integer else value
    return value


def _value(total, sizes: dict) -> Dim:
    try:
        return total.at(sizes)
    except ShapeError:  # a free size: the expression
        return total.expr()


def _key(value: Dim) -> float:
    return float(value) if isinstance(value, int) or getattr(value, "is_number", False) \
        else float(value.subs({s: GRID[-1] for s in value.free_symbols}))


def _plain(value: Dim):
    return int(value) if isinstance(value, int) or getattr(value, "is_Integer", False) \
        else str(value)


def _bytes(value: Dim) -> str:
    """Bytes with a binary unit; an expression as it is."""
    if not (isinstance(value, int) or getattr(value, "is_Integer", False)):
        return format_dim(value) if value.is_polynomial() else str(value)
    value = int(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


__all__ = ["Live", "MemoryReport", "PhasePeak", "build", "peak_of", "peaks_of"]
