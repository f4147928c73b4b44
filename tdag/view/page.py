"""The program as one self-contained HTML page: ``tdag show FILE -o graph.html``.

The page embeds the program as compact JSON (a column per field, repeated strings in one
table) and a hand-written script (``page.js``, no network): the controllers and each TDAG as
frames, module scopes as collapsible groups (collapsed, so a 32-layer model opens at once),
nodes coloured by their share of the flops or bytes, a click for shape, dtype, provenance and
cost, a search by name, op or scope. Symbolic sizes are evaluated for the colours: at the
values given, and at 1 for the others (the page says which). Given a memory report
(``tdag.memory``), a third colouring shows the tensors live at the peak, by their bytes, and
outlines the node right after which the peak is reached.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x: ops.exp(x) * x, tdag.TensorSpec(("b", 8)))
>>> html = page_html(prog, title="demo")
>>> html.startswith("<!DOCTYPE html>"), "<script src" in html, "<link" in html
(True, False, False)
"""
from __future__ import annotations

import html as html_text
import json
from importlib import resources

from tdag.ir.graph import TDAG
from tdag.ir.printer import format_step
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.symbols import Dim, free_symbols, symbol
from tdag.refine.cost.report import cost
from tdag.refine.memory import MemoryReport
from tdag.view.facts import TensorFacts, graph_facts

CHUNK = 100  # the most tensors a group shows as its own boxes; more go in sub-groups
_COST_COLUMNS = ("flops", "matmul_flops", "bytes_read", "bytes_written", "fused_bytes")


def write_page(prog: Program | TDAG, path: str, title: str = "",
               memory: MemoryReport | None = None, **sizes: int) -> int:
    """Write the page of ``prog`` to ``path``; returns its size in bytes."""
    text = page_html(prog, title or path, memory, **sizes).encode()
    with open(path, "wb") as f:
        f.write(text)
    return len(text)


def page_html(prog: Program | TDAG, title: str = "tdag program",
              memory: MemoryReport | None = None, **sizes: int) -> str:
    """The page of ``prog`` as one HTML string; ``sizes`` evaluate symbolic dims."""
    data = page_data(prog, title, memory, **sizes)
    # "</" would end the script element early; JSON's escape keeps the string the same
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return _TEMPLATE.format(title=html_text.escape(title), css=_asset("page.css"),
                            data=blob, js=_asset("page.js"))


def page_data(prog: Program | TDAG, title: str = "", memory: MemoryReport | None = None,
              **sizes: int) -> dict:
    """What the page shows, as JSON-ready data (see page.js for how it reads it); with
    ``memory`` (``tdag.memory(prog)``), the peak and the bytes each row holds at it."""
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    report = cost(prog)
    strings = _Strings()
    numbers = _Numbers(sizes)
    names = list(prog.graphs)
    facts = [graph_facts(g, prog.graphs[g], report) for g in names]
    graphs = [_graph_data(rows, strings, numbers) for rows in facts]
    total = report.total
    data = {"title": title, "strings": strings.table,
            "total": {"flops": numbers(total.flops), "bytes": numbers(total.bytes)},
            "sizes": numbers.used, "program": _block_data(prog.main, names),
            "graphs": [dict(name=n, **g) for n, g in zip(names, graphs)]}
    if memory is not None:
        _add_memory(data, facts, memory, numbers)
    return data


def _add_memory(data: dict, facts: list, memory: MemoryReport, numbers: "_Numbers") -> None:
    """The peak (``memory``: its bytes, the node after which it is reached) and, per row, the
    bytes of its storage live at the peak. The report names the tensors of the program as
    ``to_torch`` runs it (lowered); a row matches by its TDAG and name, a program input or
    state entry by name, and ``unmatched`` counts the live tensors no row shows (a kernel's
    own value)."""
    live = {(x.graph, x.name): x.bytes for x in memory.live_at_peak}
    shown, at = set(), None
    peak_graph, _, peak_node = memory.peak_at.partition(":")
    for gi, (graph, rows) in enumerate(zip(data["graphs"], facts)):
        column = []
        for i, row in enumerate(rows):
            key = next((k for k in ((row.graph, row.name), ("", row.name)) if k in live), None)
            shown.add(key)
            column.append(0 if key is None else numbers(live[key]))
            if (row.graph, row.name) == (peak_graph, peak_node) and row.kind == "node":
                at = [gi, i]
        graph["nodes"]["live"] = column
    unmatched = len(set(live) - shown)
    data["total"]["memory"] = numbers(memory.peak)
    data["memory"] = {"peak": numbers(memory.peak), "label": memory.peak_at, "at": at,
                      "unmatched": unmatched}


def _graph_data(rows: list[TensorFacts], strings: "_Strings", numbers: "_Numbers") -> dict:
    scopes, scope_of = _display_scopes(rows)
    row_scope = [scope_of[r.scope] for r in rows]
    _chunk(scopes, row_scope)
    index = {r.name: i for i, r in enumerate(rows)}
    nodes: dict = {"name": [r.name for r in rows],
                   "op": [strings(r.op) for r in rows],
                   "type": [strings(str(r.type)) for r in rows],
                   "scope": row_scope,
                   "prov": [strings(r.provenance) for r in rows],
                   "in": [[index[n] for n in r.inputs] for r in rows]}
    for column in _COST_COLUMNS:
        nodes[column] = [numbers(getattr(r.figures, column)) for r in rows]
    return {"scopes": scopes, "nodes": nodes}


def _display_scopes(rows: list[TensorFacts]) -> tuple[dict, dict]:
    """The scope tree as the page shows it: a scope with no tensors of its own and one child
    is drawn as that child (``model.layers`` rather than ``model`` holding ``layers``).
    Returns the tree as columns (label, parent; the root first) and each scope path's index."""
    children: dict[str, list[str]] = {"": []}
    own: dict[str, int] = {}
    for row in rows:
        own[row.scope] = own.get(row.scope, 0) + 1
        _add_path(row.scope, children)
    labels, parents, index = [""], [-1], {"": 0}

    def visit(path: str, parent: int, prefix: str) -> None:
        label = prefix + path.rsplit(".", 1)[-1]
        kids = children[path]
        if not own.get(path) and len(kids) == 1:
            visit(kids[0], parent, label + ".")
            return
        index[path] = len(labels)
        labels.append(label)
        parents.append(parent)
        for kid in kids:
            visit(kid, index[path], "")

    for kid in children[""]:
        visit(kid, 0, "")
    return {"label": labels, "parent": parents}, index


def _chunk(scopes: dict, row_scope: list[int]) -> None:
    """A scope with more than CHUNK tensors of its own (a program with no module scopes)
    holds them in groups of CHUNK, "tensors 1-100", ..., in order: no group draws thousands
    of boxes at once. Rewrites ``row_scope`` and extends the tree ``scopes`` in place."""
    own: dict[int, list[int]] = {}
    for row, scope in enumerate(row_scope):
        own.setdefault(scope, []).append(row)
    for scope, members in own.items():
        if len(members) <= CHUNK:
            continue
        for start in range(0, len(members), CHUNK):
            part = members[start:start + CHUNK]
            scopes["label"].append(f"tensors {start + 1}-{start + len(part)}")
            scopes["parent"].append(scope)
            for row in part:
                row_scope[row] = len(scopes["label"]) - 1


def _add_path(path: str, children: dict) -> None:
    """Record ``path`` and its ancestors in the tree ``children`` (path -> child paths, in
    the order first seen)."""
    if path in children:
        return
    parent = path.rsplit(".", 1)[0] if "." in path else ""
    _add_path(parent, children)
    children[parent].append(path)
    children[path] = []


def _block_data(block: Block, names: list[str]) -> list:
    """The controllers of ``block``: a header line each (as the printer writes it), the
    called TDAG's index for a Call, the nested blocks of an If or a Loop."""
    steps = []
    for step in block.steps:
        entry = {"head": format_step(step, 0)[0]}
        if isinstance(step, Call):
            entry["graph"] = names.index(step.graph)
        elif isinstance(step, If):
            entry["blocks"] = [["then", _block_data(step.then_branch, names)],
                               ["else", _block_data(step.else_branch, names)]]
        elif isinstance(step, Loop):
            entry["blocks"] = [["body", _block_data(step.body, names)]]
        steps.append(entry)
    return steps


class _Strings:
    """A table of the distinct strings (ops, types, provenance): each is written once."""

    def __init__(self):
        self.table: list[str] = []
        self._index: dict[str, int] = {}

    def __call__(self, text: str) -> int:
        if text not in self._index:
            self._index[text] = len(self.table)
            self.table.append(text)
        return self._index[text]


class _Numbers:
    """Cost figures as plain numbers: symbols at the sizes given, the others at 1 (``used``
    records every value taken, for the page to say)."""

    def __init__(self, sizes: dict[str, int]):
        self.sizes = dict(sizes)
        self.used: dict[str, int] = {}

    def __call__(self, value: Dim) -> int | float:
        if isinstance(value, int):
            return value
        for name in sorted(free_symbols(value)):
            self.used[name] = self.sizes.setdefault(name, 1)
        number = value.subs({symbol(k): v for k, v in self.sizes.items()})
        return int(number) if number.is_Integer else float(number)


def _asset(name: str) -> str:
    return resources.files("tdag.view").joinpath(name).read_text(encoding="utf-8")


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<header id="bar">
  <strong id="title"></strong>
  <label>colour by <select id="colour"><option value="flops">flops</option>
    <option value="bytes">bytes</option>
    <option value="memory">memory at the peak</option></select></label>
  <input id="search" type="search" placeholder="search a node: name, op or scope (Enter)">
  <span id="found"></span>
  <button id="zoomout" title="zoom out">&minus;</button>
  <button id="zoomin" title="zoom in">+</button>
  <span id="sizes"></span>
</header>
<main id="view"><svg id="canvas" xmlns="http://www.w3.org/2000/svg"></svg></main>
<aside id="panel"><p>Click a node or a group.</p></aside>
<pre id="selftest" hidden></pre>
<script id="program" type="application/json">{data}</script>
<script>
{js}
</script>
</body>
</html>
"""

__all__ = ["page_data", "page_html", "write_page"]
