"""Cost analysis: flops and memory traffic per node, primitive, module scope, TDAG and Program.

Two programs take part: the *source* program (primitives, as captured) and the *lowered*
one (``tdag.lower``'s kernels: conv, einsum, attention, norms ...), which ``tdag.cost``
passes in. Conventions:

- **flops** come from each op's cost rule, on the lowered program: one per output element
  of an elementwise op, one per *input* element of a reduction or fold, none for movement;
  so multiply + reduce-sum of an [m,k]x[k,n] matmul is 2mkn, as is the einsum kernel.
- **matmul_flops** are the flops of contractions only (matmul, conv, einsum, attention), by
  the ``torch.utils.flop_counter`` convention (2*M*K*N; bias adds and softmax not counted):
  a multiply of broadcast operands feeding a reduce-sum (see ``fusion.contraction_flops``),
  and the ``matmul_flops`` that a kernel's cost rule reports (einsum, conv, attention).
- **masked_flops**: the contraction flops a causal attention kernel skips where the mask is
  structurally causal (``refine.causal``); ``useful_flops`` = flops - masked_flops.
- **bytes_read / bytes_written**: what the lowered program moves, run op by op: each kernel
  or remaining primitive reads its inputs and writes its output once, and views (reshape,
  expand, permute ...) move nothing. A convolution is its input, weight and output, not the
  im2col windows of its decomposition.
- **unfused_read / unfused_written**: every *source* primitive reads its inputs and writes
  its output once, as the reference interpreter does (im2col windows and broadcast
  products included).
- **fused_read / fused_written**: a model of a fusing compiler over the source program;
  views are free and elementwise chains fuse into their producer (see ``fusion``). For one
  large matmul or convolution it is exactly inputs + weights + output.
- **intensity** is flops per byte moved (lowered, unfused and fused).
- **int_macs** (integer multiply-accumulates), **float_flops** and **bytes_by_dtype**: a
  quantized model's work and traffic by element type (``tdag.refine.cost.dtypes``).
- **saved_bytes**: of a gradient or training program, the forward values its backward nodes
  read (each once, on the forward node that computes it; lowered): the activations training
  keeps (``tdag.refine.cost.saved``); of a program with control flow, the values its forward
  steps hand its backward steps (in the total and the forward phase, on no node's row).

Source figures are attributed to the lowered node of the same provenance (source op, module
scope, line): the kernel that replaced them. A source node with no lowered counterpart (a
constant the lowering folded) keeps its own row. Called with one program, the program is
both: its own op-by-op traffic is ``bytes``.

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

``tdag.cost`` (``tdag.lower.cost``) lowers first; ``report.table()`` is the per-layer tree,
``report.to_dict()`` the same data for scripts (``tdag.refine.cost.table``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import sympy

from tdag.ir.graph import TDAG
from tdag.ir.passes import gc_paused
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.op import Op
from tdag.ir.record import REGISTRY, Trait, ops_with
from tdag.ir.symbols import Dim, as_dim, symbol
from tdag.ir.types import Origin
from tdag.ir.verify import trips_name
from tdag.refine.cost import table as cost_table
from tdag.refine.cost.causal import CausalMasks
from tdag.refine.cost.dtypes import bytes_by_dtype, int_macs
from tdag.refine.cost.fusion import Sizes, contraction_flops, fused_traffic, view_accesses
from tdag.refine.cost.saved import saved_between_steps, saved_for_backward


@dataclass(frozen=True)
class Figures:
    """Cost figures of a node, a scope, a TDAG or a Program (each may be symbolic)."""

    flops: Dim = 0
    matmul_flops: Dim = 0
    masked_flops: Dim = 0      # contraction flops a causal kernel skips
    bytes_read: Dim = 0        # as the lowered program moves them
    bytes_written: Dim = 0
    unfused_read: Dim = 0      # every source primitive's inputs and output
    unfused_written: Dim = 0
    fused_read: Dim = 0        # a fusing compiler over the source program
    fused_written: Dim = 0
    int_macs: Dim = 0          # multiply-accumulates of contractions over integer operands
    saved_bytes: Dim = 0       # a forward value the backward reads: kept until it does

    @property
    def bytes(self) -> Dim:
        return as_dim(self.bytes_read + self.bytes_written)

    @property
    def unfused_bytes(self) -> Dim:
        return as_dim(self.unfused_read + self.unfused_written)

    @property
    def fused_bytes(self) -> Dim:
        return as_dim(self.fused_read + self.fused_written)

    @property
    def useful_flops(self) -> Dim:
        """Flops a causal (masked) attention kernel does: the dense flops less the skipped."""
        return as_dim(self.flops - self.masked_flops)

    @property
    def float_flops(self) -> Dim:
        """Flops of everything but the integer contractions (see ``int_macs``)."""
        return as_dim(self.flops - 2 * self.int_macs)

    @property
    def useful_matmul_flops(self) -> Dim:
        return as_dim(self.matmul_flops - self.masked_flops)

    @property
    def intensity(self):
        """Flops per byte, lowered traffic."""
        return _ratio(self.flops, self.bytes)

    @property
    def unfused_intensity(self):
        return _ratio(self.flops, self.unfused_bytes)

    @property
    def fused_intensity(self):
        """Flops per byte, fused traffic."""
        return _ratio(self.flops, self.fused_bytes)

    def values(self) -> tuple:
        return tuple(getattr(self, f) for f in _FIELDS)

    def only(self, fields: frozenset) -> "Figures":
        """These figures with every field outside ``fields`` zero."""
        return Figures(*(v if f in fields else 0 for f, v in zip(_FIELDS, self.values())))

    def scaled(self, factor: Dim) -> "Figures":
        if factor == 1:
            return self
        return Figures(*(as_dim(v * factor) for v in self.values()))

    def subs(self, sizes: dict) -> "Figures":
        return Figures(*(_subs(v, sizes) for v in self.values()))

    def __add__(self, other: "Figures") -> "Figures":
        return Figures(*(as_dim(a + b) for a, b in zip(self.values(), other.values())))


_FIELDS = tuple(f.name for f in fields(Figures))
# what the lowered program decides, and what the source program does
LOWERED = frozenset(("flops", "matmul_flops", "masked_flops", "bytes_read", "bytes_written",
                     "int_macs", "saved_bytes"))
SOURCE = frozenset(_FIELDS) - LOWERED


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
        sums = [_Sum() for _ in _FIELDS]
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
    # (graph name, node name) -> (op name, module scope, dtype name, phase) of each row
    node_info: dict = field(default_factory=dict)
    lowered: bool = False  # bytes are a lowered program's (else the source's, op by op)
    bytes_by_dtype: dict = field(default_factory=dict)  # dtype name -> its share of bytes
    # "forward", "backward" (tdag.grad's nodes) or "optimizer" (train_step's) -> Figures
    per_phase: dict = field(default_factory=dict)

    flops = property(lambda self: self.total.flops)
    matmul_flops = property(lambda self: self.total.matmul_flops)
    int_macs = property(lambda self: self.total.int_macs)
    saved_bytes = property(lambda self: self.total.saved_bytes)
    float_flops = property(lambda self: self.total.float_flops)
    masked_flops = property(lambda self: self.total.masked_flops)
    useful_flops = property(lambda self: self.total.useful_flops)
    useful_matmul_flops = property(lambda self: self.total.useful_matmul_flops)
    bytes_read = property(lambda self: self.total.bytes_read)
    bytes_written = property(lambda self: self.total.bytes_written)
    unfused_read = property(lambda self: self.total.unfused_read)
    unfused_written = property(lambda self: self.total.unfused_written)
    fused_read = property(lambda self: self.total.fused_read)
    fused_written = property(lambda self: self.total.fused_written)
    bytes = property(lambda self: self.total.bytes)
    unfused_bytes = property(lambda self: self.total.unfused_bytes)
    fused_bytes = property(lambda self: self.total.fused_bytes)
    intensity = property(lambda self: self.total.intensity)
    fused_intensity = property(lambda self: self.total.fused_intensity)

    @property
    def per_dtype(self) -> dict:
        """Element type of each node's result (``"i32"``) -> Figures: a quantized model's
        integer work and traffic apart from its float work."""
        out: dict = {}
        for key, figures in self.per_node.items():
            name = self.node_info[key][2] if key in self.node_info else "?"
            out[name] = out.get(name, Figures()) + figures
        return out

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
                          {k: _subs(v, sizes) for k, v in self.bounds.items() if k not in sizes},
                          self.node_info, self.lowered,
                          {k: _subs(v, sizes) for k, v in self.bytes_by_dtype.items()},
                          {k: f.subs(sizes) for k, f in self.per_phase.items()})

    def upper_bound(self) -> "CostReport":
        """The report with each bounded fresh size at its bound (``nonzero`` of an n-element
        tensor: n rows); every figure grows with the sizes, so each is an upper bound. A size
        with no known bound stays symbolic."""
        bounds = dict(self.bounds)
        for _ in range(len(bounds)):  # a bound may mention another fresh size
            bounds = {k: _subs(v, bounds) for k, v in bounds.items()}
        return self.evaluate(**bounds)

    def table(self, by: str = "layer", depth: int | None = None, device=None,
              sort: str | None = None, **sizes: int) -> str:
        """A readable table ``by`` "layer" (the module-scope tree, indented, in the order the
        model runs), "op", "scope" (every scope, flat), "node", "graph", "step" or "phase"
        (forward, backward, optimizer of a training program); ``depth``
        cuts the tree; ``device`` (a ``tdag.refine.cost.roofline.Device``) adds the estimated time
        and bound; ``sort`` "flops" or "bytes" orders the rows; sizes given as keywords
        evaluate symbolic figures first.

        >>> import tdag
        >>> from tdag import ops
        >>> prog = tdag.trace(lambda x: ops.exp(x), tdag.TensorSpec(("b", 4)))
        >>> tdag.cost(prog).table(by="op", b=2).splitlines()[3].split()[:3]
        ['exp', '8', '0']
        """
        return cost_table.format_table(self, by, depth, sizes, device, sort)

    def to_dict(self, by: str = "layer", depth: int | None = None, sizes: dict | None = None,
                device=None, sort: str | None = None) -> dict:
        """The rows of ``table`` as plain data, schema ``tdag.cost/1`` (documented in
        ``tdag.refine.cost.table``): what ``tdag cost --json`` prints."""
        return cost_table.to_dict(self, by, depth, sizes, device, sort)

    def to_csv(self, by: str = "layer", depth: int | None = None, sizes: dict | None = None,
               device=None, sort: str | None = None) -> str:
        """The rows of ``to_dict`` as CSV, the total last: what ``tdag cost --csv`` prints."""
        return cost_table.to_csv(self.to_dict(by, depth, sizes, device, sort))


@gc_paused()  # many small objects, no cycles: see tdag.ir.passes
def cost(prog: Program | TDAG, lowered: Program | TDAG | None = None) -> CostReport:
    """The cost report of a Program or TDAG (see the module docstring for conventions);
    ``lowered`` is ``tdag.lower.lower(prog)``, whose kernels decide flops and bytes
    (``tdag.cost`` passes it; without it the program is costed op by op as it stands)."""
    prog = _as_program(prog)
    run = prog if lowered is None else _as_program(lowered)
    rows = _Rows()
    run_calls, run_one = rows.add_program(run, LOWERED if run is not prog else frozenset(_FIELDS))
    if run is not prog:
        rows.attribute_by_origin(run)
        src_calls, src_one = rows.add_program(prog, SOURCE)
    else:
        src_calls, src_one = run_calls, {}
    total = _block_cost(run.main, 1, run_one)
    steps = tuple(_step_cost(step, run_one) for step in run.main.steps)
    if src_one:
        total = total + _block_cost(prog.main, 1, src_one)
        if len(prog.main.steps) == len(steps):  # the same controllers: the source's labels
            steps = tuple(_add_steps(_step_cost(a, src_one), b)
                          for a, b in zip(prog.main.steps, steps))
    per_phase = rows.sum_by(lambda key: rows.info[key][3])
    kept = saved_between_steps(run)
    if kept != 0:  # a program with control flow: what its forward steps hand its backward
        total = replace(total, saved_bytes=as_dim(total.saved_bytes + kept))
        per_phase["forward"] = replace(per_phase["forward"], saved_bytes=as_dim(
            per_phase["forward"].saved_bytes + kept))
    bounds = _fresh_bounds(run.graphs[name] for name in run_calls)
    bounds.update(_fresh_bounds(prog.graphs[name] for name in src_calls))
    return CostReport(total, rows.per_node(), rows.sum_by(lambda key: rows.info[key][0]),
                      {k: a.value() for k, a in rows.graphs.items()},
                      _scope_tree(rows.sum_by(lambda key: rows.info[key][1])), steps, bounds,
                      dict(rows.info), lowered=lowered is not None,
                      bytes_by_dtype=bytes_by_dtype(
                          run, {g: c.value() for g, c in run_calls.items()}),
                      per_phase=per_phase)


def _as_program(prog: Program | TDAG) -> Program:
    return Program.from_tdag(prog) if isinstance(prog, TDAG) else prog


class _Rows:
    """Per-node figures of one or two programs, keyed by (graph, node) in the order the
    programs run; a source node's row can be the lowered node of its provenance."""

    def __init__(self):
        self.nodes: dict = {}    # (graph, node) -> _Acc
        self.info: dict = {}     # (graph, node) -> (op name, scope, dtype name, phase)
        self.graphs: dict = {}   # graph -> _Acc
        self.target: dict = {}   # source Origin -> the lowered row it belongs to
        self.lowered_rows: frozenset = frozenset()  # the lowered program's rows

    def add_program(self, prog: Program, keep: frozenset) -> tuple[dict, dict]:
        """Add every node of ``prog`` (the ``keep`` fields of its figures, times the calls
        of its TDAG); returns the call counts and each TDAG's figures for one call."""
        calls: dict[str, _Sum] = {}
        _count_calls(prog.main, 1, calls)
        one_call = {}
        for gname, count in calls.items():
            times = count.value()
            graph_acc = _Acc()
            figures = graph_figures(prog.graphs[gname])
            for node in prog.graphs[gname].nodes:
                fig = figures[node.name].only(keep)
                graph_acc.add(fig)
                key = self._row_of(gname, node)
                if key not in self.info:
                    self.info[key] = (node.op.value, node.origin.scope, node.type.dtype.value,
                                      node.origin.phase)
                self.nodes.setdefault(key, _Acc()).add(fig, times)
            one_call[gname] = graph_acc.value()
            self.graphs.setdefault(gname, _Acc()).add(one_call[gname], times)
        return calls, one_call

    def attribute_by_origin(self, lowered: Program) -> None:
        """From now on, send a node's figures to the lowered node of the same name (the
        lowering keeps a node's name where it keeps or replaces the node), else to the one of
        the same provenance: the kernel that absorbed it, or the first of that origin."""
        self.lowered_rows = frozenset(self.nodes)
        for gname, graph in lowered.graphs.items():
            for node in graph.nodes:
                if node.origin == _NO_ORIGIN:
                    continue  # built without provenance: nothing ties it to another node
                known = self.target.get(node.origin)
                if known is None or _is_kernel(node.op.value) and not \
                        _is_kernel(self.info[known][0]):
                    self.target[node.origin] = (gname, node.name)

    def _row_of(self, gname: str, node) -> tuple:
        key = (gname, node.name)
        if key in self.lowered_rows or node.origin not in self.target:
            return key
        return self.target[node.origin]

    def per_node(self) -> dict:
        return {key: acc.value() for key, acc in self.nodes.items()}

    def sum_by(self, label) -> dict:
        """Figures summed over the rows with the same ``label(key)``, in first-seen order."""
        groups: dict = {}
        for key, acc in self.nodes.items():
            into = groups.setdefault(label(key), _Acc())
            for figures, times in acc.counts.items():
                into.add(figures, times)
        return {k: a.value() for k, a in groups.items()}


_NO_ORIGIN = Origin()


def _is_kernel(op_name: str) -> bool:
    return REGISTRY[Op(op_name)].has(Trait.KERNEL)


def _add_steps(a: StepCost, b: StepCost) -> StepCost:
    return StepCost(a.label, a.trips, a.per_trip + b.per_trip, a.total + b.total)


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
    saved = saved_for_backward(graph, sizes)
    views = ops_with(Trait.VIEW)
    masks = None
    rule_cache: dict = {}
    result = {}
    for node in graph.nodes:
        in_types = tuple(types[n] for n in node.inputs)
        key = (node.op, node.spec, in_types, node.type)
        c = rule_cache.get(key)
        if c is None:
            c = rule_cache[key] = REGISTRY[node.op].cost(node.spec, in_types, node.type)
        mm = c.matmul_flops or matmul.get(node.name, 0)  # a kernel's, or a contraction's
        masked = 0
        if node.op is Op.attention:
            masks = masks or CausalMasks(graph, types)
            masked = masks.masked_flops(node, mm)
        # run op by op, a view (reshape, expand, permute) is a strided view: no data moves
        moved = (0, 0) if node.op in views else (c.bytes_read, c.bytes_written)
        result[node.name] = Figures(c.flops, mm, masked, *moved, c.bytes_read, c.bytes_written,
                                    reads.get(node.name, 0), writes.get(node.name, 0),
                                    int_macs(mm, node, in_types), saved.get(node.name, 0))
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


__all__ = ["CostReport", "Figures", "Scope", "cost", "graph_figures"]
