"""The cost report as rows: a readable table, plain data (JSON) and CSV.

Rows ``by``: "layer" (the module-scope tree, indented, in the order the model runs; ``depth``
cuts it; a program without module paths lists its nodes as they run), "op", "scope" (every
scope, flat), "node", "graph" or "step". The data of ``report.to_dict()`` (``tdag cost
--json``), schema ``tdag.cost/1``::

    {"schema": "tdag.cost/1",
     "by": "layer", "depth": 2 | null, "sort": "flops" | "bytes" | null,
     "sizes": {"batch": 8},            # the sizes bound; figures still symbolic are strings
     "lowered": true,                  # bytes are tdag.lower's program's (else op by op)
     "device": null | {"name", "peak_flops": {dtype: flops/s}, "bandwidth": bytes/s,
                       "launch": s per kernel, "source"},
     "rows": [ROW, ...],               # in table order
     "total": ROW,                     # name "total", depth 0
     "bytes_by_dtype": {"i8": ..., "f32": ...}}  # the lowered bytes by element type
    ROW = {"name", "path", "depth",    # path: the scope path (layer, scope), the op, the node
           "op", "scope",              # a node row's op and scope (else null)
           "flops", "matmul_flops", "useful_flops", "masked_flops",
           "int_macs", "float_flops",  # integer MACs, and flops - 2 * int_macs (cost/dtypes.py)
           "bytes_read", "bytes_written", "bytes", "unfused_bytes", "fused_bytes",
           "saved_bytes",              # forward values the backward reads (report.py)
           "intensity",                # flops per (lowered) byte; null when nothing moves
           "flops_share", "bytes_share",  # percent of the total
           "time_s", "bound"}          # with a device: the roofline estimate and what bounds
                                       # it, compute, memory or overhead (else null)

A figure is an int (or a float for ratios) once every size is bound, else a string holding
the expression (``"4096*batch"``). ``to_csv`` writes the same rows (total last), one column
per ROW key.
"""
from __future__ import annotations

import csv
import io

import sympy

from tdag.errors import TdagError
from tdag.ir.symbols import format_dim
from tdag.refine.cost import roofline

SCHEMA = "tdag.cost/1"
BY = ("layer", "op", "scope", "node", "graph", "step", "phase")
_PHASE_ORDER = {"forward": 0, "recompute": 1, "backward": 2, "optimizer": 3}  # as a step runs
ROW_KEYS = ("name", "path", "depth", "op", "scope", "flops", "matmul_flops", "useful_flops",
            "masked_flops", "int_macs", "float_flops", "bytes_read", "bytes_written", "bytes",
            "unfused_bytes", "fused_bytes", "saved_bytes", "intensity", "flops_share",
            "bytes_share", "time_s", "bound")


def to_dict(report, by: str = "layer", depth: int | None = None, sizes: dict | None = None,
            device: roofline.Device | None = None, sort: str | None = None) -> dict:
    """The rows of ``report`` as plain data (see the module docstring)."""
    sizes = dict(sizes or {})
    bound = report.evaluate(**sizes) if sizes else report
    rows = [_row(bound, r, device) for r in _rows(bound, by, depth)]
    if sort is not None:
        rows.sort(key=lambda r: _sort_key(r[sort]), reverse=True)
    total = _row(bound, _Row("total", "", 0, bound.total, None), device)
    for row in rows + [total]:
        row["flops_share"] = _share(row["flops"], total["flops"])
        row["bytes_share"] = _share(row["bytes"], total["bytes"])
    return {"schema": SCHEMA, "by": by, "depth": depth, "sort": sort, "sizes": sizes,
            "lowered": report.lowered, "device": device.to_dict() if device else None,
            "rows": rows, "total": total,
            "bytes_by_dtype": {k: _value(v) for k, v in bound.bytes_by_dtype.items()}}


def to_csv(data: dict) -> str:
    """``to_dict``'s rows and total as CSV."""
    out = io.StringIO()
    writer = csv.DictWriter(out, ROW_KEYS, lineterminator="\n")
    writer.writeheader()
    for row in data["rows"] + [data["total"]]:
        writer.writerow({k: "" if row[k] is None else row[k] for k in ROW_KEYS})
    return out.getvalue()


def format_table(report, by: str = "layer", depth: int | None = None, sizes: dict | None = None,
                 device: roofline.Device | None = None, sort: str | None = None) -> str:
    """``to_dict``'s data as an aligned text table under a line with the unfused and fused
    totals and the bytes by dtype (and the device); the total is the last line."""
    data = to_dict(report, by, depth, sizes, device, sort)
    if by in ("op", "node") or not report.scopes.children:  # views, folded primitives: idle
        data["rows"] = [r for r in data["rows"] if r["flops"] != 0 or r["bytes"] != 0]
    columns = [("flops", "flops"), ("matmul_flops", "matmul flops")]
    if data["total"]["masked_flops"] not in (0, "0"):
        columns.append(("useful_flops", "useful flops"))  # a causal kernel's
    if data["total"]["int_macs"] not in (0, "0"):  # a quantized model's integer products
        columns += [("int_macs", "int MACs"), ("float_flops", "float flops")]
    columns += [("bytes_read", "bytes read"), ("bytes_written", "bytes written")]
    if data["total"]["saved_bytes"] not in (0, "0"):  # a training program's activations
        columns.append(("saved_bytes", "saved for backward"))
    columns += [("intensity", "flops/byte"), ("flops_share", "% flops")]
    if sort == "bytes":
        columns.append(("bytes_share", "% bytes"))
    if device is not None:
        columns += [("time_s", "est. time"), ("bound", "bound")]
    cells = [[_cell(row, key) for key, _ in columns] for row in data["rows"] + [data["total"]]]
    names = [row["name"] for row in data["rows"]] + ["total"]
    widths = [max([len(title)] + [len(c[i]) for c in cells]) for i, (_, title) in
              enumerate(columns)]
    first = max([len(by)] + [len(n) for n in names])
    header = f"{by:<{first}}" + "".join(f"  {t:>{w}}" for (_, t), w in zip(columns, widths))
    total = data["total"]
    how = "as the lowered program moves them" if report.lowered else "op by op (not lowered)"
    lines = [f"bytes: {how}; unfused {_cell(total, 'unfused_bytes')}, "
             f"fused model {_cell(total, 'fused_bytes')}"]
    if data["bytes_by_dtype"]:
        lines[0] += "; by dtype " + ", ".join(
            f"{k} {_cell(data['bytes_by_dtype'], k)}" for k in data["bytes_by_dtype"])
    if device is not None:
        lines.append(f"device: {device.name} ({device.source})")
        if total["time_s"] is None:
            lines[-1] += "; bind every size (--size NAME=INT) for an estimate"
    lines += [header, "-" * len(header)]
    for name, row in zip(names, cells):
        lines.append(f"{name:<{first}}" + "".join(f"  {c:>{w}}" for c, w in zip(row, widths)))
    return "\n".join(lines)


def main_dtype(report) -> str:
    """The dtype most contractions run in (the roof a plot draws), f32 where none."""
    counts: dict = {}
    for key, fig in report.per_node.items():
        if fig.matmul_flops != 0:
            dtype = report.node_info[key][2]
            counts[dtype] = counts.get(dtype, 0) + 1
    return max(counts, key=counts.get) if counts else "f32"


# -- rows -------------------------------------------------------------------------------------

class _Row:
    """One row before formatting: its name, path, depth, figures and the per_node keys in it
    (None: estimate from the figures alone)."""

    __slots__ = ("name", "path", "depth", "figures", "keys", "op", "scope")

    def __init__(self, name, path, depth, figures, keys, op=None, scope=None):
        self.name, self.path, self.depth, self.figures, self.keys = name, path, depth, figures, keys
        self.op, self.scope = op, scope


def _rows(report, by: str, depth: int | None) -> list[_Row]:
    if by == "layer" and not report.scopes.children:  # no module paths: nodes as they run
        return [_node_row(report, g, n, 1) for g, n in report.per_node]
    if by == "layer":
        return _scope_rows(report, depth, tree=True)
    if by == "scope":
        rows = _scope_rows(report, depth, tree=False)
    elif by == "step":  # the program's order
        return [_Row(f"{s.label} (x{_text(s.trips)})" if s.trips != 1 else s.label, s.label, 0,
                     s.total, None) for s in report.steps]
    elif by == "op":
        rows = [_Row(op, op, 0, fig, [k for k, i in report.node_info.items() if i[0] == op])
                for op, fig in report.per_op.items()]
    elif by == "phase":  # forward, recompute, backward, optimizer: a training program's parts
        phases = sorted(report.per_phase, key=lambda ph: (_PHASE_ORDER.get(ph, 9), ph))
        rows = [_Row(ph, ph, 0, report.per_phase[ph],
                     [k for k, i in report.node_info.items() if i[3] == ph]) for ph in phases]
    elif by == "graph":
        rows = [_Row(g, g, 0, fig, [k for k in report.per_node if k[0] == g])
                for g, fig in report.per_graph.items()]
    elif by == "node":
        rows = [_node_row(report, g, n, 0) for g, n in report.per_node]
    else:
        raise TdagError(f"cost table: by must be one of {', '.join(BY)}, not {by!r}")
    return sorted(rows, key=lambda r: _sort_key(r.figures.flops), reverse=True)


def _node_row(report, graph: str, node: str, depth: int) -> _Row:
    """A node's row, named ``%15 conv @ stem`` (and its TDAG where there are several)."""
    op, scope = report.node_info[(graph, node)][:2]
    where = f"{graph}:" if len(report.per_graph) > 1 else ""
    name = f"{where}%{node} {op}" + (f" @ {scope}" if scope else "")
    return _Row(name, f"{graph}:%{node}", depth, report.per_node[(graph, node)],
                [(graph, node)], op, scope)


def _scope_rows(report, depth: int | None, tree: bool) -> list[_Row]:
    members: dict = {}
    for key, info in report.node_info.items():
        parts = info[1].split(".") if info[1] else []
        for i in range(len(parts) + 1):
            members.setdefault(".".join(parts[:i]), []).append(key)
    rows = []
    for d, scope in report.scopes.walk():
        if scope.path and (depth is None or d <= depth):
            name = ("  " * (d - 1) + scope.name) if tree else scope.path
            rows.append(_Row(name, scope.path, d, scope.total, members.get(scope.path, [])))
    own = report.scopes.own
    if rows and (own.flops != 0 or own.bytes != 0):  # ops outside every module (a mask)
        keys = [k for k, info in report.node_info.items() if not info[1]]
        rows.append(_Row("(no module)", "", 1, own, keys))
    return rows


def _row(report, row: _Row, device) -> dict:
    fig = row.figures
    out = {"name": row.name, "path": row.path, "depth": row.depth, "op": row.op,
           "scope": row.scope, "flops": _value(fig.flops), "matmul_flops": _value(fig.matmul_flops),
           "useful_flops": _value(fig.useful_flops), "masked_flops": _value(fig.masked_flops),
           "int_macs": _value(fig.int_macs), "float_flops": _value(fig.float_flops),
           "bytes_read": _value(fig.bytes_read), "bytes_written": _value(fig.bytes_written),
           "bytes": _value(fig.bytes), "unfused_bytes": _value(fig.unfused_bytes),
           "fused_bytes": _value(fig.fused_bytes), "saved_bytes": _value(fig.saved_bytes),
           "intensity": _value(fig.intensity),
           "flops_share": None, "bytes_share": None, "time_s": None, "bound": None}
    if device is not None:
        keys = list(report.per_node) if row.name == "total" and row.keys is None else row.keys
        parts = None if keys is None else \
            [(report.per_node[k], report.node_info[k][2]) for k in keys]
        out["time_s"], out["bound"] = roofline.estimate(fig, parts, device)
    return out


# -- values -----------------------------------------------------------------------------------

def _value(value):
    """An int or float where the value is a number, else the expression as a string."""
    if value is None or isinstance(value, (int, float)):
        return value
    if isinstance(value, sympy.Expr) and value.is_number:
        return int(value) if value.is_Integer else float(value)
    return _text(value)


def _text(value) -> str:
    if isinstance(value, sympy.Expr) and not value.is_polynomial():
        return str(value)
    return format_dim(value) if not isinstance(value, str) else value


def _share(part, whole):
    if isinstance(part, (int, float)) and isinstance(whole, (int, float)) and whole:
        return 100.0 * part / whole
    return None


def _sort_key(value) -> float:
    return float(value) if isinstance(value, (int, float)) else float("inf")


def _cell(row: dict, key: str) -> str:
    value = row[key]
    if value is None:
        return "-"
    if key == "time_s":
        return roofline.format_time(value)
    if key.endswith("_share"):
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if key == "intensity":
        return "-"  # a symbolic ratio does not fit a column; bind the sizes
    return value


__all__ = ["BY", "ROW_KEYS", "SCHEMA", "format_table", "main_dtype", "to_csv", "to_dict"]
