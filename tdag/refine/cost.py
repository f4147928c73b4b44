"""Cost analysis: flops and memory traffic per node, primitive, module scope, TDAG and Program.

Conventions:

- **flops** come from each primitive's cost rule: one per output element of an elementwise
  op, one per *input* element of a reduction or fold, none for movement; so multiply +
  reduce-sum of an [m,k]x[k,n] matmul is 2mkn.
- **matmul_flops** are the flops of contractions only (matmul, conv, einsum, attention), by
  the ``torch.utils.flop_counter`` convention (2*M*K*N; bias adds and softmax not counted):
  a multiply of broadcast operands feeding a reduce-sum (see ``fusion.contraction_flops``),
  and the ``matmul_flops`` that a kernel's cost rule reports (einsum, conv, attention).
- **bytes_read / bytes_written** (*unfused*): every primitive reads its inputs and writes its
  output once, as the reference interpreter does.
- **fused_read / fused_written** (*fused*): what a lowered, reified program moves; views are
  free and elementwise chains fuse into their producer (see ``fusion``). For one large matmul
  or convolution it is exactly inputs + weights + output.
- **intensity** is flops per byte moved (fused and unfused).

Control flow: a TDAG costs once per call; a Loop multiplies its body by its trip count
(``count``, or for a while loop the symbol the verifier names its scanned length with,
``trips_<first output>``); an If
counts its costlier branch in the Program totals, while per-node, per-scope and per-TDAG
figures include both branches. Symbolic dims stay symbolic: ``report.evaluate(b=8)``. A size
that only data decides (``nonzero``'s rows) is a fresh symbol in the figures too;
``report.bounds`` holds its upper bound where its op knows one, and ``report.upper_bound()``
puts every such size at its bound.

>>> import tdag
>>> from tdag import ops
>>> prog = tdag.trace(lambda x, w: ops.matmul(x, w), tdag.TensorSpec(("b", 64)),
...                   tdag.TensorSpec((64, 32)))
>>> report = tdag.cost(prog)
>>> str(report.matmul_flops), report.evaluate(b=2).fused_bytes
('4096*b', 8960)
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from tdag.ir.graph import TDAG
from tdag.ir.passes import gc_paused
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.record import REGISTRY, Trait
from tdag.ir.symbols import Dim, as_dim, format_dim, symbol
from tdag.ir.verify import trips_name
from tdag.refine.fusion import Sizes, contraction_flops, fused_traffic, view_accesses


@dataclass(frozen=True)
class Figures:
    """Cost figures of a node, a scope, a TDAG or a Program (each may be symbolic)."""

    flops: Dim = 0
    matmul_flops: Dim = 0
    bytes_read: Dim = 0
    bytes_written: Dim = 0
    fused_read: Dim = 0
    fused_written: Dim = 0

    @property
    def bytes(self) -> Dim:
        return as_dim(self.bytes_read + self.bytes_written)

    @property
    def fused_bytes(self) -> Dim:
        return as_dim(self.fused_read + self.fused_written)

    @property
    def intensity(self):
        """Flops per byte, unfused traffic."""
        return _ratio(self.flops, self.bytes)

    @property
    def fused_intensity(self):
        """Flops per byte, fused traffic."""
        return _ratio(self.flops, self.fused_bytes)

    def values(self) -> tuple:
        return (self.flops, self.matmul_flops, self.bytes_read, self.bytes_written,
                self.fused_read, self.fused_written)

    def scaled(self, factor: Dim) -> "Figures":
        if factor == 1:
            return self
        return Figures(*(as_dim(v * factor) for v in self.values()))

    def subs(self, sizes: dict) -> "Figures":
        return Figures(*(_subs(v, sizes) for v in self.values()))

    def __add__(self, other: "Figures") -> "Figures":
        return Figures(*(as_dim(a + b) for a, b in zip(self.values(), other.values())))


def _ratio(num: Dim, den: Dim):
    """num / den; None when nothing moves (a node fused into another's kernel)."""
    if den == 0:
        return None
    if isinstance(num, int) and isinstance(den, int):
        return num / den
    return sympy.cancel(sympy.sympify(num) / den)


def _subs(value: Dim, sizes: dict) -> Dim:
    if isinstance(value, int) or not sizes:
        return value
    return as_dim(value.subs({symbol(k): v for k, v in sizes.items()}))


class _Sum:
    """A running sum of Dims that stays linear in the number of terms.

    Adding sympy expressions one by one re-expands the whole sum each time; collecting
    coefficients per monomial and building the expression once keeps it cheap.
    """

    __slots__ = ("const", "terms")

    def __init__(self):
        self.const = 0
        self.terms: dict = {}

    def add(self, value: Dim, factor: Dim = 1) -> None:
        if isinstance(value, int) and isinstance(factor, int):
            self.const += value * factor
            return
        value = as_dim(value * factor) if not (isinstance(factor, int) and factor == 1) else value
        if isinstance(value, int):
            self.const += value
            return
        for term in (value.args if value.is_Add else (value,)):
            coeff, monomial = term.as_coeff_Mul()
            coeff = int(coeff) if coeff.is_Integer else coeff
            if monomial == 1:
                self.const += coeff
            else:
                self.terms[monomial] = self.terms.get(monomial, 0) + coeff

    def value(self) -> Dim:
        if not self.terms:
            return self.const
        return as_dim(sympy.Add(self.const, *(c * m for m, c in self.terms.items())))


class _Acc:
    """A sum of Figures: counts how often each distinct Figures occurs (repeated layers give
    few distinct ones) and adds them up once at the end."""

    __slots__ = ("counts",)

    def __init__(self):
        self.counts: dict = {}

    def add(self, figures: Figures, times: Dim = 1) -> None:
        self.counts[figures] = self.counts.get(figures, 0) + times

    def value(self) -> Figures:
        sums = [_Sum() for _ in range(6)]
        for figures, times in self.counts.items():
            for s, v in zip(sums, figures.values()):
                s.add(v, times)
        return Figures(*(s.value() for s in sums))


@dataclass
class Scope:
    """A node of the module-scope tree: ``encoder`` > ``encoder.layer.0`` > ..."""

    path: str
    total: Figures = Figures()           # this scope and everything under it
    own: Figures = Figures()             # nodes whose scope is exactly this path
    children: dict = field(default_factory=dict)   # last path component -> Scope

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path else "<top>"

    def walk(self, depth: int = 0):
        """(depth, scope) for this scope and its descendants, depth-first."""
        yield depth, self
        for child in self.children.values():
            yield from child.walk(depth + 1)

    def find(self, path: str) -> "Scope":
        node = self
        for part in (path.split(".") if path else []):
            node = node.children[part]
        return node


@dataclass(frozen=True)
class StepCost:
    """One controller of the program's top-level block: a loop's figures per trip and in all
    (a generation's prefill, and its cost per new token), a call's or branch's once."""

    label: str          # "call main", "loop -> gen_prompt_done, ..."
    trips: Dim          # 1 for a call or an if
    per_trip: Figures
    total: Figures

    def subs(self, sizes: dict) -> "StepCost":
        return StepCost(self.label, _subs(self.trips, sizes), self.per_trip.subs(sizes),
                        self.total.subs(sizes))


@dataclass
class CostReport:
    """The result of ``tdag.cost``: totals, and figures per node, op, scope, TDAG and
    top-level step."""

    total: Figures
    per_node: dict      # (graph name, node name) -> Figures, times the calls of its TDAG
    per_op: dict        # op name -> Figures
    per_graph: dict     # TDAG name -> Figures (all its calls)
    scopes: Scope       # the module-scope tree; ``scopes.total`` covers every node
    steps: tuple = ()   # StepCost of each controller of the top-level block, in order
    # fresh symbol (a size data decides) -> its upper bound, where its op knows one
    bounds: dict = field(default_factory=dict)

    flops = property(lambda self: self.total.flops)
    matmul_flops = property(lambda self: self.total.matmul_flops)
    bytes_read = property(lambda self: self.total.bytes_read)
    bytes_written = property(lambda self: self.total.bytes_written)
    fused_read = property(lambda self: self.total.fused_read)
    fused_written = property(lambda self: self.total.fused_written)
    bytes = property(lambda self: self.total.bytes)
    fused_bytes = property(lambda self: self.total.fused_bytes)
    intensity = property(lambda self: self.total.intensity)
    fused_intensity = property(lambda self: self.total.fused_intensity)

    @property
    def per_scope(self) -> dict:
        """Scope path -> Figures of everything under it (the tree, flattened)."""
        return {s.path: s.total for _, s in self.scopes.walk()}

    def __getitem__(self, key: str) -> Dim:
        """Mapping access to the totals: ``report.evaluate(b=8)["flops"]``."""
        return getattr(self.total, key)

    def evaluate(self, **sizes: int) -> "CostReport":
        """The report with symbols replaced by sizes, e.g. ``report.evaluate(b=8).flops``."""
        def tree(s: Scope) -> Scope:
            return Scope(s.path, s.total.subs(sizes), s.own.subs(sizes),
                         {k: tree(c) for k, c in s.children.items()})
        return CostReport(self.total.subs(sizes),
                          {k: f.subs(sizes) for k, f in self.per_node.items()},
                          {k: f.subs(sizes) for k, f in self.per_op.items()},
                          {k: f.subs(sizes) for k, f in self.per_graph.items()},
                          tree(self.scopes), tuple(s.subs(sizes) for s in self.steps),
                          {k: _subs(v, sizes) for k, v in self.bounds.items() if k not in sizes})

    def upper_bound(self) -> "CostReport":
        """The report with each bounded fresh size at its bound (``nonzero`` of an n-element
        tensor: n rows); every figure grows with the sizes, so each is an upper bound. A size
        with no known bound stays symbolic."""
        bounds = dict(self.bounds)
        for _ in range(len(bounds)):  # a bound may mention another fresh size
            bounds = {k: _subs(v, bounds) for k, v in bounds.items()}
        return self.evaluate(**bounds)

    def table(self, by: str = "op", depth: int | None = None, **sizes: int) -> str:
        """A readable table ``by`` "op", "scope" (the tree, indented), "graph" or "node";
        sizes given as keywords evaluate symbolic figures first."""
        report = self.evaluate(**sizes) if sizes else self
        return _format_table(report, by, depth)


@gc_paused()  # many small objects, no cycles: see tdag.ir.passes
def cost(prog: Program | TDAG) -> CostReport:
    """The cost report of a Program or TDAG (see the module docstring for conventions)."""
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    calls: dict[str, _Sum] = {}
    _count_calls(prog.main, 1, calls)
    figures = {name: graph_figures(prog.graphs[name]) for name in calls}
    per_node, per_op, scope_own, one_call = {}, {}, {}, {}
    for gname, count in calls.items():
        times = count.value()
        graph_acc = _Acc()
        for node in prog.graphs[gname].nodes:
            fig = figures[gname][node.name]
            per_node[(gname, node.name)] = fig.scaled(times)
            graph_acc.add(fig)
            per_op.setdefault(node.op.value, _Acc()).add(fig, times)
            scope_own.setdefault(node.origin.scope, _Acc()).add(fig, times)
        one_call[gname] = graph_acc.value()
    per_graph = {name: one_call[name].scaled(calls[name].value()) for name in calls}
    return CostReport(_block_cost(prog.main, 1, one_call), per_node,
                      {k: a.value() for k, a in per_op.items()}, per_graph,
                      _scope_tree({k: a.value() for k, a in scope_own.items()}),
                      tuple(_step_cost(step, one_call) for step in prog.main.steps),
                      _fresh_bounds(prog.graphs[name] for name in calls))


def _fresh_bounds(graphs) -> dict:
    """Each fresh size's upper bound, from the spec of the node defining it."""
    bounds = {}
    for graph in graphs:
        types = None
        for node in graph.nodes:
            if REGISTRY[node.op].has(Trait.FRESH_SIZE):
                types = types or graph.types()
                bounds.update(node.spec.bounds(tuple(types[n] for n in node.inputs)))
    return bounds


def graph_figures(graph: TDAG) -> dict[str, Figures]:
    """Figures of each node of ``graph`` for one call."""
    types = graph.types()
    sizes = Sizes()
    access = view_accesses(graph, sizes)
    reads, writes = fused_traffic(graph, access, sizes)
    matmul = contraction_flops(graph, access)
    rule_cache: dict = {}
    result = {}
    for node in graph.nodes:
        in_types = tuple(types[n] for n in node.inputs)
        key = (node.op, node.spec, in_types, node.type)
        c = rule_cache.get(key)
        if c is None:
            c = rule_cache[key] = REGISTRY[node.op].cost(node.spec, in_types, node.type)
        mm = c.matmul_flops or matmul.get(node.name, 0)  # a kernel's, or a contraction's
        result[node.name] = Figures(c.flops, mm, c.bytes_read, c.bytes_written,
                                    reads.get(node.name, 0), writes.get(node.name, 0))
    return result


# -- the program's control flow ---------------------------------------------------------------

def _count_calls(block: Block, factor: Dim, calls: dict) -> None:
    """How many times each TDAG runs when ``block`` runs ``factor`` times."""
    for step in block.steps:
        if isinstance(step, Call):
            calls.setdefault(step.graph, _Sum()).add(factor)
        elif isinstance(step, If):
            _count_calls(step.then_branch, factor, calls)
            _count_calls(step.else_branch, factor, calls)
        elif isinstance(step, Loop):
            _count_calls(step.body, as_dim(factor * _trips(step)), calls)


def _trips(loop: Loop) -> Dim:
    """The loop's count; a while loop's unknown trip count as the verifier names it."""
    return loop.count if loop.count is not None else symbol(trips_name(loop))


def _block_cost(block: Block, factor: Dim, one_call: dict) -> Figures:
    """Totals of ``block`` run ``factor`` times, given each TDAG's figures for one call."""
    total = Figures()
    for step in block.steps:
        total = total + _controller_cost(step, factor, one_call)
    return total


def _controller_cost(step, factor: Dim, one_call: dict) -> Figures:
    if isinstance(step, Call):
        return one_call[step.graph].scaled(factor)
    if isinstance(step, If):  # the costlier branch, figure by figure
        a = _block_cost(step.then_branch, factor, one_call)
        b = _block_cost(step.else_branch, factor, one_call)
        return Figures(*(_max(x, y) for x, y in zip(a.values(), b.values())))
    return _block_cost(step.body, as_dim(factor * _trips(step)), one_call)


def _step_cost(step, one_call: dict) -> StepCost:
    if isinstance(step, Loop):
        per_trip = _block_cost(step.body, 1, one_call)
        trips = as_dim(_trips(step))
        return StepCost(f"loop -> {', '.join(step.outputs)}", trips, per_trip,
                        per_trip.scaled(trips))
    once = _controller_cost(step, 1, one_call)
    label = f"call {step.graph}" if isinstance(step, Call) else \
        f"if -> {', '.join(step.outputs)}"
    return StepCost(label, 1, once, once)


def _max(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return sympy.Max(a, b)


def _scope_tree(own: dict[str, Figures]) -> Scope:
    root = Scope("")
    for path, figures in own.items():
        node = root
        for i, part in enumerate(path.split(".") if path else []):
            node = node.children.setdefault(part, Scope(".".join(path.split(".")[:i + 1])))
        node.own = figures
    _sum_tree(root)
    return root


def _sum_tree(scope: Scope) -> None:
    acc = _Acc()
    acc.add(scope.own)
    for child in scope.children.values():
        _sum_tree(child)
        acc.add(child.total)
    scope.total = acc.value()


# -- the table --------------------------------------------------------------------------------

_COLUMNS = (("flops", 16), ("matmul flops", 16), ("bytes (unfused)", 18),
            ("bytes (fused)", 16), ("flops/byte", 10))


def _format_table(report: CostReport, by: str, depth: int | None) -> str:
    rows = _rows(report, by, depth)
    width = max([len(by)] + [len(name) for name, _ in rows] + [5]) + 2
    header = f"{by:<{width}}" + "".join(f"  {title:>{w}}" for title, w in _COLUMNS)
    lines = [header, "-" * len(header)]
    for name, fig in rows + [("total", report.total)]:
        cells = (fig.flops, fig.matmul_flops, fig.bytes, fig.fused_bytes, fig.fused_intensity)
        lines.append(f"{name:<{width}}" + "".join(f"  {_fmt(v):>{w}}"
                                                  for v, (_, w) in zip(cells, _COLUMNS)))
    return "\n".join(lines)


def _rows(report: CostReport, by: str, depth: int | None) -> list:
    if by == "scope":
        return [("  " * (d - 1) + s.name, s.total) for d, s in report.scopes.walk()
                if (depth is None or d <= depth) and s.path]
    if by == "step":  # the program's order, not by flops
        return [(f"{s.label} (x{_fmt(s.trips)})" if s.trips != 1 else s.label, s.total)
                for s in report.steps]
    table = {"op": report.per_op, "graph": report.per_graph,
             "node": {f"{g}:%{n}": f for (g, n), f in report.per_node.items()}}.get(by)
    if table is None:
        raise ValueError(f"table: by must be op, scope, graph, node or step, not {by!r}")
    return sorted(table.items(), key=lambda kv: _sort_key(kv[1].flops), reverse=True)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, sympy.Expr) and value.is_number:
        return f"{float(value):.2f}"
    if isinstance(value, sympy.Expr) and not value.is_polynomial():
        return "-"  # a symbolic ratio does not fit a column; evaluate with sizes
    return format_dim(value)


def _sort_key(value: Dim) -> float:
    return float(value) if isinstance(value, int) else float("inf")


__all__ = ["CostReport", "Figures", "Scope", "cost", "graph_figures"]
