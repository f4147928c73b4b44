"""Python source for one TDAG: ``def _g_<name>(self, *inputs): ... return (outputs,)``.

One line per live node, written by the emitter in its op's record (``record(op).torch``).
Two peepholes keep the code as short as hand-written torch: a broadcast scalar const
becomes a Python literal (``x * 0.5``), and an operand of a broadcasting elementwise op
that is an expand/repeat view reads the unexpanded tensor (torch broadcasts it implicitly).
Nodes nothing reads are not emitted, nor those written inside another node's call
(``fusions.py``: an activation inside its product, a norm folded into its convolution, a
rotary embedding as one call). A fresh symbol (a size data decides) is bound from the
result of the node defining it, on the line after it: ``s_nz0 = v_4.shape[0]``.
"""
from __future__ import annotations

import keyword
import re

import sympy

from tdag.deinops.codegen import literal
from tdag.errors import UnsupportedOpError
from tdag.ir.carriers import carried_source, cast_value
from tdag.ir.graph import TDAG, Node
from tdag.ir.names import NameMap
from tdag.ir.op import Op
from tdag.ir.record import Trait, has, record
from tdag.ir.rewrite import Context
from tdag.ir.symbols import Dim, dims_equal, is_static
from tdag.ir.types import DType
from tdag.lower.match import scalar
from tdag.refine.consumed import view_roots
from tdag.refine.dataflow import fresh_definers, sizes_named
from tdag.ops.promotion import broadcasts_to
from tdag.refine.memory.walk import ChannelsLast
from tdag.reify.torch.fusions import CLAMPED_PAD, NORM, GroupedKV, NormThen, Rotary, \
    clamped_pad_source, fused_refs, fusions, norm_argument
from tdag.reify.torch.layout import layout

RESERVED = {"self", "torch", "F", "_rt", "dev", "float", "int", "bool", "max", "min", "range",
            "len", "tuple", "list", "getattr", "setattr"}


def identifier(name: str) -> str:
    """A tdag name as a Python identifier; ``s_`` and ``_`` prefixes are kept for symbols and
    the runtime, so a name that starts with one is prefixed ``v_``."""
    base = re.sub(r"\W", "_", name)
    if not base.isidentifier() or keyword.iskeyword(base) or base.startswith(("s_", "_")):
        base = "v_" + base
    return base


class Scope(NameMap):
    """Python identifiers for tdag names, unique within one generated function; ``fresh``
    names a value no tdag name stands for (a loop's carried values)."""

    def __init__(self):
        super().__init__(RESERVED, identifier)


def dim_expr(dim: Dim, used: set | None = None) -> str:
    """A Python expression for a (symbolic) Dim over ``s_<name>`` variables."""
    if is_static(dim):
        return str(dim)
    if used is not None:
        used.update(s.name for s in dim.free_symbols)
    return _sym(sympy.sympify(dim))


def _sym(e) -> str:
    if e.is_Integer:
        return str(int(e))
    if e.is_Symbol:
        return f"s_{e.name}"
    if e.is_Add:
        return "(" + " + ".join(_sym(a) for a in e.args) + ")"
    if e.is_Mul:
        num, den = sympy.fraction(e)
        if den != 1:
            return f"({_sym(num)} // {_sym(den)})"
        return "(" + " * ".join(_sym(a) for a in e.args) + ")"
    if e.is_Pow and e.exp.is_Integer and e.exp > 0:
        return f"({_sym(e.base)} ** {int(e.exp)})"
    if isinstance(e, sympy.floor):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"({_sym(num)} // {_sym(den)})"
    if isinstance(e, sympy.ceiling):
        num, den = sympy.fraction(sympy.together(e.args[0]))
        return f"(-(-{_sym(num)} // {_sym(den)}))"
    if isinstance(e, sympy.Mod):
        return f"({_sym(e.args[0])} % {_sym(e.args[1])})"
    if isinstance(e, (sympy.Max, sympy.Min)):
        fn = "max" if isinstance(e, sympy.Max) else "min"
        return f"{fn}({', '.join(_sym(a) for a in e.args)})"
    raise UnsupportedOpError(f"cannot express the dimension {e} in Python")


class Code:
    """What an emitter may ask while writing one node."""

    def __init__(self, ctx: Context, device: str, owned: frozenset = frozenset(),
                 channels_last: frozenset = frozenset(), method: str = "",
                 prepack: bool = False):
        self.ctx, self.device, self.owned = ctx, device, owned
        # oneDNN calls keep their weights' packs in the module, each under the method's name
        # and the node's (``onednn.packed``)
        self.method, self.prepack = method, prepack
        self.fused: set[str] = set()  # nodes written inside the product they read
        self._channels_last = channels_last
        self.symbols: set[str] = set()
        self._once: dict = {}
        self._roots = view_roots(ctx.graph)
        self._last_read = _last_reads(ctx.graph, self._roots)
        self._at = {node.name: k for k, node in enumerate(ctx.graph.nodes)}

    def channels_last(self, name: str) -> bool:
        """Whether ``name``'s value may be channels-last (``layout``): an input copied so,
        a conv's result on a weight stored so, or a value computed from those."""
        return name in self._channels_last

    def root(self, name: str) -> str:
        """The input, weight or node whose storage ``name`` may share (itself unless a view)."""
        return self._roots.get(name, name)

    def may_overwrite(self, node: Node, name: str) -> bool:
        """Whether ``node`` may write over the value ``name`` in place: its storage is this
        code's own (a node's, or an input the calls consume: ``consumed_inputs``), nothing
        after ``node`` reads it or a view of it, and it is not an output (an optimizer
        updating its state, as torch's optimizers do; a KV-cache step writing its cache)."""
        root = self.root(name)
        own = root in self.owned or self.ctx.producer(root) is not None
        return own and self._last_read.get(root) == self._at[node.name]

    def written_over(self, node: Node) -> tuple[str, ...]:
        """The operands ``node``'s code writes its result into (its record's ``in_place``:
        a scatter into its target, an optimizer update into its state), () where it
        writes a new tensor."""
        rule = record(node.op).in_place
        return rule(node, self) if rule is not None else ()

    def once(self, key, expr: str) -> str:
        """``expr`` evaluated once per graph: the first ask binds it to a local in place
        (``(_once0 := expr)``), later asks with an equal ``key`` read the local. Kernels that
        are outputs of one framework call (cummax's values and indices) run it once."""
        if key in self._once:
            return self._once[key]
        self._once[key] = f"_once{len(self._once)}"
        return f"({self._once[key]} := {expr})"

    def dim(self, d: Dim) -> str:
        return dim_expr(d, self.symbols)

    def shape(self, dims, tuple_: bool = False) -> str:
        """Dims as call arguments; one symbolic dim among static ones becomes -1."""
        dims = list(dims)
        dynamic = [i for i, d in enumerate(dims) if not is_static(d)]
        parts = ["-1" if len(dynamic) == 1 and i == dynamic[0] else self.dim(d)
                 for i, d in enumerate(dims)]
        if tuple_:
            return f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})"
        return ", ".join(parts) if parts else "()"

    def shape_of(self, name: str) -> tuple:
        return self.ctx.type(name).shape

    def rank(self, name: str) -> int:
        return self.ctx.type(name).rank

    @staticmethod
    def same_dim(a: Dim, b: Dim) -> bool:
        return dims_equal(a, b)

    @staticmethod
    def literal(value, dtype: DType | None = None) -> str:
        """A scalar as an exact Python literal; see ``tdag.deinops.codegen.literal``."""
        return literal(value, dtype)


def graph_source(name: str, graph: TDAG, weight_expr, owned: frozenset = frozenset(),
                 prepack: bool = True) -> tuple[str, list[str]]:
    """The source of the method for ``graph`` and the symbols its caller must pass;
    ``owned``: the inputs its code may write over (``consumed_inputs``); ``prepack``:
    oneDNN's calls keep their weights packed in the module (``onednn.packed``)."""
    scope = Scope()
    ctx = Context(graph)
    params = [scope(v.name) for v in graph.inputs]
    # the device of generated tensors (iota): the first input's, else the module's
    device = f"{params[0]}.device" if params else "self._tdag_device.device"
    plan = layout(graph, owned)
    code = Code(ctx, device, owned, plan.values, name, prepack)
    operands = {node.name: _operands(node, ctx, scope) for node in graph.nodes}
    fused, activated, aliases = fusions(graph, code)
    refs = fused_refs({name: used for name, (_, used) in operands.items()}, fused)
    live = _live(graph, refs)
    body = [f"{p} = _rt.channels_last({p})"
            for p, v in zip(params, graph.inputs) if v.name in plan.inputs]
    for w in graph.weights:
        if w in live:
            body.append(f"{scope(w)} = {weight_expr(w)}")
    dying = _last_uses(graph, live, refs)
    defined: set[str] = set()  # fresh symbols: bound from the result of the node defining them
    for node in graph.nodes:  # only live nodes are written, so only their symbols are bound
        if node.name in live:
            expr = _expression(node, fused, activated, aliases, operands, code, scope)
            body.append(f"{scope(node.name)} = {expr}")
            if has(node.op, Trait.FRESH_SIZE):
                body.extend(_bind_fresh(node, scope(node.name), defined))
            if dying.get(node.name):
                body.append(f"del {', '.join(scope(n) for n in dying[node.name])}")
    outs = [f"{scope(o)}.contiguous()" if o in plan.outputs else scope(o)
            for o in graph.outputs]  # the (N, C, H, W) layout, restored
    body.append(f"return ({', '.join(outs)},)" if outs else "return ()")
    header, free = _bind_symbols(graph, params, code.symbols - defined)
    signature = ", ".join(["self"] + params + [f"s_{s}" for s in free])
    lines = [f"def _g_{name}({signature}):"] + ["    " + line for line in header + body]
    return "\n".join(lines), free


def _expression(node: Node, fused: dict, activated: dict, aliases: dict, operands: dict,
                code: Code, scope: Scope) -> str:
    """The expression of ``node``: its own, or the call of the product it is written inside
    (``fusions``) with its extra arguments."""
    if node.name in aliases:  # applied inside the product the reshape reads
        return scope(aliases[node.name])
    product, extra = fused.get(node.name, (node, activated.get(node.name)))
    if extra == CLAMPED_PAD:
        return clamped_pad_source(node, product, operands, code)
    if isinstance(extra, Rotary):
        return f"_rt.rotary({scope(extra.x)}, {scope(extra.cos)}, {scope(extra.sin)})"
    if isinstance(extra, GroupedKV):  # k and v unrepeated
        exprs = list(operands[node.name][0])
        exprs[1:3] = [scope(name) for name in extra.sources]
        expr = _source(node, {node.name: (exprs, None)}, code)
        return f"{expr[:-1]}, enable_gqa=True)"
    expr = _source(product, operands, code)
    if extra == NORM:  # the convolution's call, the norm folded into its weight
        return f"{expr[:-1]}, {norm_argument(node, operands[node.name][0])})"
    if isinstance(extra, NormThen):  # ... and the activation after the norm
        norm = norm_argument(extra.norm, operands[extra.norm.name][0])
        return f"{expr[:-1]}, {extra.post!r}, {norm})"
    if extra:  # the product's call, with the activation as its epilogue
        return expr[:-1] + "".join(f", {arg!r}" for arg in extra) + ")"
    return expr


def _source(node: Node, operands: dict, code: Code) -> str:
    """The expression of ``node``, written by its record's torch emitter."""
    emit = lambda a: record(node.op).torch(node, a, code)  # noqa: E731
    dtypes = [code.ctx.type(n).dtype for n in node.inputs]
    return carried_source(node, operands[node.name][0], dtypes, emit)


def _bind_fresh(node: Node, var: str, defined: set) -> list[str]:
    """``s_nz0 = v.shape[0]``: the fresh symbols ``node`` defines, read from its result."""
    lines = []
    for axis, d in enumerate(node.type.shape):
        if not is_static(d) and d.is_Symbol and d.name in node.spec.fresh:
            lines.append(f"s_{d.name} = {var}.shape[{axis}]")
            defined.add(d.name)
    return lines


def _operands(node: Node, ctx: Context, scope: Scope) -> tuple[list[str], set]:
    """Expressions for node's operands after the literal and implicit-broadcast peepholes."""
    names = list(node.inputs)
    exprs = [scope(n) for n in names]
    used = list(names)
    literals = [None] * len(names)
    for i, n in enumerate(names):
        if accepts_literal(node, i):
            literals[i] = operand_literal(ctx, n)
    tensors = [i for i in range(len(names)) if literals[i] is None and
               not (node.op is Op.where and i == 0)]
    if not tensors and names:  # keep one real tensor so the result has the right shape and dtype
        keep = 1 if node.op is Op.where else 0
        literals[keep] = None
    for i, lit in enumerate(literals):
        if lit is not None:
            exprs[i], used[i] = lit, None
    if has(node.op, Trait.SCALAR_OPERAND):
        _unexpand(node, ctx, scope, exprs, used, literals)
    return exprs, {u for u in used if u is not None}


def accepts_literal(node: Node, position: int) -> bool:
    """Whether operand ``position`` of ``node`` may be a Python scalar in the emitted code."""
    if not has(node.op, Trait.SCALAR_OPERAND):
        return False
    if node.type.dtype is DType.bool and node.op is Op.multiply:  # emitted as a & b
        return False
    return not (node.op is Op.where and position == 0)  # torch.where needs a bool tensor


def operand_literal(ctx: Context, name: str) -> str | None:
    """The exact value of ``name`` as a Python literal when it is one constant broadcast, else
    None. Exact, not ``scalar``'s shortest decimal (kept for matching eps values): float32's
    lowest prints as -3.4028235e+38, which as a Python float lies past float32's range, so
    torch refuses it; its exact value, -3.4028234663852886e+38, round-trips."""
    if scalar(ctx, name) is None:
        return None
    casts, cur = [], name
    while (node := ctx.producer(cur)) is not None:  # the path scalar() walked
        if node.op is Op.cast:
            casts.append(node.type.dtype)
        cur = node.inputs[0]
    value = ctx.weight(cur).value.reshape(-1)[0]
    for dtype in reversed(casts):  # nearest the const first; tdag's cast, not torch's
        value = cast_value(value, dtype)
    return _typed_literal(value.item(), ctx.type(name).dtype)


def _typed_literal(value, dtype: DType) -> str:
    if dtype is DType.bool:
        return literal(bool(value))
    if dtype.is_complex:
        value = complex(value)
        return f"complex({literal(value.real)}, {literal(value.imag)})"
    if not dtype.is_float:
        return literal(int(value))
    return literal(float(value), dtype)


def _unexpand(node: Node, ctx: Context, scope: Scope, exprs, used, literals) -> None:
    """Read the source of expand/repeat operands when implicit broadcasting rebuilds them."""
    shapes = [ctx.type(n).shape if literals[i] is None else () for i, n in enumerate(node.inputs)]
    for i, n in enumerate(node.inputs):
        producer = ctx.producer(n)
        if literals[i] is not None or producer is None or producer.op not in (Op.expand, Op.repeat):
            continue
        src = producer.inputs[0]
        trial = list(shapes)
        trial[i] = ctx.type(src).shape
        if broadcasts_to(trial, node.type.shape):
            shapes = trial
            exprs[i], used[i] = scope(src), src


def liveness(graph: TDAG, owned: frozenset = frozenset()
             ) -> tuple[set[str], dict[str, list[str]], dict[str, tuple], ChannelsLast]:
    """The nodes ``graph_source`` writes, per node the values deleted after it, the
    nodes that write over their operands (-> the operands: a scatter's target, or an
    optimizer update's three values), and its channels-last values (``layout``): the
    schedule whose memory ``tdag.memory`` replays."""
    ctx, scope = Context(graph), Scope()
    code = Code(ctx, "", owned)
    fused, _, aliases = fusions(graph, code)  # an alias: the reshape's value, named anew
    refs = fused_refs({node.name: _operands(node, ctx, scope)[1] for node in graph.nodes},
                       fused)
    live = _live(graph, refs)
    overwrites = {node.name: parts for node in graph.nodes
                  if node.name in live and (parts := code.written_over(node))}
    overwrites.update({name: (view,) for name, view in aliases.items() if name in live})
    return live, _last_uses(graph, live, refs), overwrites, layout(graph, owned).replay


def _live(graph: TDAG, refs: dict) -> set[str]:
    """The nodes to write: those the outputs read, and the definers of the run-time sizes
    they name (their results bind the sizes even where no one reads their values)."""
    live = set(graph.outputs)
    definer = fresh_definers(graph)
    for node in reversed(graph.nodes):
        if node.name in live:
            live.update(refs[node.name])
            if definer:
                live.update(definer[s] for s in sizes_named(node) if s in definer)
    return live


def _last_reads(graph: TDAG, shows: dict[str, str]) -> dict[str, int]:
    """The position of the last node reading each value, counting the reads of the views
    made from it (``shows``: a view -> the value whose storage it shows; torch runs those
    ops as views of the same storage); past the end for an output."""
    last: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for name in node.inputs:
            last[shows.get(name, name)] = last[name] = k
    for name in graph.outputs:
        last[shows.get(name, name)] = last[name] = len(graph.nodes)
    return last


def _last_uses(graph: TDAG, live: set, refs: dict) -> dict[str, list[str]]:
    """For each live node, the intermediate values it is the last reader of: deleting them
    there frees their memory as eager code would, instead of holding every intermediate to
    the end of the function (a working set far larger than the caches)."""
    keep = set(graph.outputs) | {v.name for v in graph.inputs} | set(graph.weights)
    last: dict[str, str] = {}
    for node in graph.nodes:
        if node.name in live:
            for name in refs[node.name]:
                last[name] = node.name
    dying: dict[str, list[str]] = {}
    for name, reader in last.items():
        if name not in keep:
            dying.setdefault(reader, []).append(name)
    return {k: sorted(v) for k, v in dying.items()}


def _bind_symbols(graph: TDAG, params, symbols: set) -> tuple[list[str], list[str]]:
    """Lines binding each used symbol from an input's shape; the rest come from the caller."""
    lines, bound = [], set()
    for value, param in zip(graph.inputs, params):
        for i, d in enumerate(value.type.shape):
            if not is_static(d) and d.is_Symbol and d.name in symbols and d.name not in bound:
                lines.append(f"s_{d.name} = {param}.shape[{i}]")
                bound.add(d.name)
    return lines, sorted(symbols - bound)
