"""Python source for one TDAG: ``def _g_<name>(self, *inputs): ... return (outputs,)``.

One line per live node, written by the emitter in its op's record (``record(op).torch``).
Two peepholes keep the code as short as hand-written torch: a broadcast scalar const
becomes a Python literal (``x * 0.5``), and an operand of a broadcasting elementwise op
that is an expand/repeat view reads the unexpanded tensor (torch broadcasts it implicitly).
Nodes nothing reads are not emitted. A fresh symbol (a size data decides) is bound from the
result of the node defining it, on the line after it: ``s_nz0 = v_4.shape[0]``.
"""
from __future__ import annotations

from dataclasses import dataclass

import keyword
import re

import sympy

from tdag.deinops.codegen import literal
from tdag.deinops.extent import torch_pads
from tdag.errors import UnsupportedOpError
from tdag.ir.carriers import carried_source, cast_value
from tdag.ir.graph import TDAG, Node
from tdag.ir.names import NameMap
from tdag.ir.op import Op
from tdag.ir.record import Trait, has, record
from tdag.ir.rewrite import Context
from tdag.ir.symbols import Dim, dims_equal, is_static
from tdag.ir.types import DType
from tdag.lower.kernels.contraction import activation_inside, folded_norm, onednn_activation, \
    onednn_product
from tdag.lower.match import scalar
from tdag.refine.consumed import view_roots
from tdag.refine.dataflow import fresh_definers, sizes_named
from tdag.refine.memory.walk import ChannelsLast
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
    refs = _fused_refs({name: used for name, (_, used) in operands.items()}, fused)
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
        return _clamped_pad_source(node, product, operands, code)
    if isinstance(extra, Rotary):
        return f"_rt.rotary({scope(extra.x)}, {scope(extra.cos)}, {scope(extra.sin)})"
    if isinstance(extra, GroupedKV):  # k and v unrepeated
        exprs = list(operands[node.name][0])
        exprs[1:3] = [scope(name) for name in extra.sources]
        expr = _source(node, {node.name: (exprs, None)}, code)
        return f"{expr[:-1]}, enable_gqa=True)"
    expr = _source(product, operands, code)
    if extra == NORM:  # the convolution's call, the norm folded into its weight
        return f"{expr[:-1]}, {_norm_argument(node, operands[node.name][0])})"
    if isinstance(extra, NormThen):  # ... and the activation after the norm
        norm = _norm_argument(extra.norm, operands[extra.norm.name][0])
        return f"{expr[:-1]}, {extra.post!r}, {norm})"
    if extra:  # the product's call, with the activation as its epilogue
        return expr[:-1] + "".join(f", {arg!r}" for arg in extra) + ")"
    return expr


def _source(node: Node, operands: dict, code: Code) -> str:
    """The expression of ``node``, written by its record's torch emitter."""
    emit = lambda a: record(node.op).torch(node, a, code)  # noqa: E731
    dtypes = [code.ctx.type(n).dtype for n in node.inputs]
    return carried_source(node, operands[node.name][0], dtypes, emit)


def fusions(graph: TDAG, code: Code) -> tuple[dict, dict, dict]:
    """``epilogues`` and ``reshaped_epilogues``, the nodes they write inside a product noted
    in ``code.fused`` (their code is the product's call: nothing is written in place)."""
    fused = epilogues(graph, code)
    fused.update(grouped_attention(graph, code))
    fused.update(rotary_embeddings(graph, code))
    activated, aliases = reshaped_epilogues(graph, code, fused)
    code.fused = set(fused) | set(aliases)
    return fused, activated, aliases


NORM = "norm"  # an epilogue's extra arguments: the batch norm's own operands (``norm=``)
# a pad's "product": the clamp or ReLU it alone reads, written into the pad's interior
# (``_rt.clamped_pad``: MobileNet-v2's ReLU6 before its TF-style padded convolutions)
CLAMPED_PAD = "clamped pad"


@dataclass(frozen=True, slots=True)
class NormThen:
    """An epilogue's extra arguments: a batch norm folded into the convolution (``norm``, the
    node between them, not written), then the activation ``post`` inside the call."""

    norm: Node
    post: tuple


def epilogues(graph: TDAG, code: Code) -> dict[str, tuple[Node, tuple | str | NormThen]]:
    """The activations the torch code applies inside the product they read (an
    ``onednn_linear`` call that only they read), the batch norms it folds into the
    convolution they read (``folded_norm``), and a SiLU, GELU or hardswish after such a norm
    (a conv -> norm -> SiLU block is one call): node -> (the product's node, the call's extra
    arguments, ``NORM`` or a ``NormThen``). The product is then not written on its own
    line, nor a norm a ``NormThen`` holds."""
    producer = {node.name: node for node in graph.nodes}
    users = graph.users()
    fused = {}
    for node in graph.nodes:
        product = producer.get(node.inputs[0]) if node.inputs else None
        if product is None or product.name in graph.outputs or users[product.name] != [node]:
            continue
        extra = onednn_activation(node)
        if extra and onednn_product(product, code) and activation_inside(node, product, code):
            fused[node.name] = (product, extra)
        elif folded_norm(node, product, code):
            fused[node.name] = (product, NORM)
        elif extra and fused.get(product.name, (None, None))[1] == NORM and \
                activation_inside(node, fused[product.name][0], code):
            conv, _ = fused.pop(product.name)
            fused[node.name] = (conv, NormThen(product, extra[0]))
        elif _clamped_pad(node, product) and product.name not in fused:
            fused[node.name] = (product, CLAMPED_PAD)
    return fused


@dataclass(frozen=True, slots=True)
class GroupedKV:
    """An attention's extra arguments: its k and v read unrepeated (``grouped_attention``):
    ``repeated`` the operands it had, ``sources`` the tensors they repeat."""

    repeated: tuple[str, str]
    sources: tuple[str, str]


def grouped_attention(graph: TDAG, code: Code) -> dict[str, tuple[Node, GroupedKV]]:
    """The attention nodes whose k and v each repeat a tensor over groups of query heads
    (transformers' ``repeat_kv``: reshaped to [B, H, 1, S, D], expanded to [B, H, g, S, D],
    reshaped to [B, H * g, S, D]), which the torch code passes unrepeated to SDPA with
    ``enable_gqa=True``: no copy of the keys and values g times per layer (of a KV cache's
    size at long contexts). node -> (node, ``GroupedKV``)."""
    producer = {node.name: node for node in graph.nodes}
    users, found = graph.users(), {}
    for node in graph.nodes:
        if node.op is not Op.attention or node.inputs[1] == node.inputs[2]:
            continue
        sources = [_repeated_heads(name, producer, users, graph.outputs, code)
                   for name in node.inputs[1:3]]
        if None not in sources:
            found[node.name] = (node, GroupedKV(tuple(node.inputs[1:3]), tuple(sources)))
    return found


def _repeated_heads(name: str, producer: dict, users: dict, outputs, code: Code) -> str | None:
    """The [B, H, S, D] tensor that ``name`` repeats over groups of heads (``repeat_kv``),
    each step read only by the next; None where ``name`` is not such a repeat."""
    merged = producer.get(name)
    expanded = producer.get(merged.inputs[0]) if merged is not None else None
    split = producer.get(expanded.inputs[0]) if expanded is not None else None
    chain = (merged, expanded, split)
    if split is None or tuple(n.op for n in chain) != (Op.reshape, Op.expand, Op.reshape) or \
            any(n.name in outputs for n in chain) or \
            users[split.name] != [expanded] or users[expanded.name] != [merged]:
        return None
    source = code.ctx.type(split.inputs[0]).shape
    if len(source) != 4:
        return None
    b, h, length, d = source
    g = expanded.type.shape[2]
    wants = ((split, (b, h, 1, length, d)), (expanded, (b, h, g, length, d)),
             (merged, (b, h * g, length, d)))
    same = all(len(n.type.shape) == len(want) and all(dims_equal(x, y) for x, y in
                                                       zip(n.type.shape, want))
               for n, want in wants)
    return split.inputs[0] if same else None


@dataclass(frozen=True, slots=True)
class Rotary:
    """A rotary embedding written as one call (``rotary_embeddings``): x * cos + rotate_half(x)
    * sin of ``x``, ``cos`` and ``sin`` (names)."""

    x: str
    cos: str
    sin: str


def rotary_embeddings(graph: TDAG, code: Code) -> dict[str, tuple[Node, Rotary]]:
    """The adds that finish transformers' ``apply_rotary_pos_emb`` on a float x of an even
    last axis: x * cos + cat(-x2, x1) * sin, x1 and x2 the halves of that axis, each step
    read only by the next. Its torch code is one ``_rt.rotary`` call writing no
    intermediate (Llama's, Mistral's, Qwen's, Phi's queries and keys). add -> (add,
    ``Rotary``)."""
    producer = {node.name: node for node in graph.nodes}
    users, found = graph.users(), {}
    only = lambda name, reader: name not in graph.outputs and users.get(name) == [reader]  # noqa: E731
    for node in graph.nodes:
        if node.op is not Op.add or not node.type.dtype.is_float:
            continue
        for a, b in (node.inputs, node.inputs[::-1]):
            parts = _rotary_parts(producer.get(a), producer.get(b), producer, code)
            if parts is not None and only(a, node) and only(b, node) and \
                    all(only(name, reader) for name, reader in parts[1]):
                x, cos, sin = parts[0]
                shape = code.ctx.type(x).shape
                if len(shape) == node.type.rank and \
                        all(dims_equal(d, e) for d, e in zip(shape, node.type.shape)):
                    found[node.name] = (node, Rotary(x, _unexpanded(cos, shape, code),
                                                     _unexpanded(sin, shape, code)))
                break
    return found


def _unexpanded(name: str, shape, code: Code) -> str:
    """The source of ``name`` where it is an expand or repeat that broadcasting against
    ``shape`` rebuilds (as ``_unexpand`` reads an elementwise op's operands), else ``name``."""
    producer = code.ctx.producer(name)
    if producer is not None and producer.op in (Op.expand, Op.repeat) and \
            broadcasts_to([shape, code.ctx.type(producer.inputs[0]).shape], shape):
        return producer.inputs[0]
    return name


def _rotary_parts(scaled: Node | None, rotated: Node | None, producer: dict, code: Code):
    """((x, cos, sin), [(intermediate, its reader)]) where ``scaled`` is x * cos and
    ``rotated`` cat(-x2, x1) * sin, else None."""
    if scaled is None or rotated is None or scaled.op is not Op.multiply or \
            rotated.op is not Op.multiply:
        return None
    for cat_name, sin in (rotated.inputs, rotated.inputs[::-1]):
        cat = producer.get(cat_name)
        if cat is None or cat.op is not Op.concat or len(cat.inputs) != 2:
            continue
        neg, first = producer.get(cat.inputs[0]), producer.get(cat.inputs[1])
        second = producer.get(neg.inputs[0]) if neg is not None and neg.op is Op.neg else None
        if second is None or first is None or first.op is not Op.slice or \
                second.op is not Op.slice or first.inputs[0] != second.inputs[0]:
            continue
        x = first.inputs[0]
        if x not in scaled.inputs or not _halves(code.ctx.type(x), cat, first, second):
            continue
        cos = scaled.inputs[1] if scaled.inputs[0] == x else scaled.inputs[0]
        width = code.ctx.type(x).shape[-1]
        if any(not dims_equal(code.ctx.type(t).shape[-1], width) for t in (cos, sin)):
            continue
        return (x, cos, sin), [(cat_name, rotated), (neg.name, cat), (first.name, cat),
                               (second.name, neg)]
    return None


def _halves(x_type, cat: Node, first: Node, second: Node) -> bool:
    """Whether ``first`` and ``second`` are the first and second halves of ``x``'s last axis
    (a static, even length) and ``cat`` joins on that axis."""
    width, last = x_type.shape[-1], x_type.rank - 1
    if not is_static(width) or width % 2 or cat.spec.axis not in (last, -1):
        return False
    half = width // 2
    want = {first.name: (0, half), second.name: (half, width)}
    return all(n.spec.axes == (last,) and n.spec.steps == (1,) and
               (n.spec.starts[0], n.spec.stops[0]) == want[n.name] for n in (first, second))


def _clamped_pad(node: Node, product: Node) -> bool:
    """Whether ``node`` pads the float result of a clamp or ReLU (``product``, which only it
    reads): ``_rt.clamped_pad`` writes the clamp into the padded tensor."""
    if node.op is not Op.pad or not node.type.dtype.is_float:
        return False
    if product.op is Op.clamp:
        return product.spec.lo is not None or product.spec.hi is not None
    return product.op is Op.relu


def _clamped_pad_source(pad: Node, act: Node, operands: dict, code: Code) -> str:
    """``_rt.clamped_pad`` of the pad ``pad`` over the clamp or ReLU ``act``."""
    dtype = act.type.dtype
    lo, hi = (act.spec.lo, act.spec.hi) if act.op is Op.clamp else (0.0, None)
    bounds = ", ".join("None" if b is None else code.literal(b, dtype) for b in (lo, hi))
    return (f"_rt.clamped_pad({operands[act.name][0][0]}, {torch_pads(pad, code)}, "
            f"{code.literal(pad.spec.value, dtype)}, {bounds})")


def _norm_argument(node: Node, operands: list[str]) -> str:
    """``norm=(mean, var, weight, bias, eps)`` of the batch norm ``node`` (its operands'
    expressions ``operands``) folded into the convolution it reads."""
    parts = list(operands[1:]) + ["None"] * (5 - len(operands))
    return f"norm=({', '.join(parts)}, {node.spec.eps!r})"


def reshaped_epilogues(graph: TDAG, code: Code, fused: dict) -> tuple[dict, dict]:
    """The activations of a product read through a reshape (GPT-2's Conv1D: ``addmm`` of the
    rows, then ``view`` back to [B, S, N]), applied inside the product all the same: an
    elementwise op commutes with a reshape. (product -> the call's extra arguments,
    activation -> the reshape whose value it then is.)"""
    producer = {node.name: node for node in graph.nodes}
    users = graph.users()
    activated, aliases = {}, {}
    for node in graph.nodes:
        extra = onednn_activation(node)
        view = producer.get(node.inputs[0]) if extra and node.name not in fused else None
        if view is None or view.op is not Op.reshape or users[view.name] != [node]:
            continue
        product = producer.get(view.inputs[0])
        if product is not None and onednn_product(product, code) and \
                activation_inside(node, product, code) and \
                not {product.name, view.name} & set(graph.outputs) and \
                users[product.name] == [view] and product.name not in activated:
            activated[product.name], aliases[node.name] = extra, view.name
    return activated, aliases


def _fused_refs(refs: dict, fused: dict) -> dict:
    """``refs`` with each fused node reading its product's operands in the product's stead
    (and its own others: a batch norm's statistics; through a ``NormThen``, the norm's)."""
    out = dict(refs)
    for name, (product, extra) in fused.items():
        if isinstance(extra, GroupedKV):
            out[name] = set(refs[name]) - set(extra.repeated) | set(extra.sources)
            continue
        if isinstance(extra, Rotary):
            out[name] = {extra.x, extra.cos, extra.sin}
            continue
        between = [extra.norm.name] if isinstance(extra, NormThen) else []
        skipped = {product.name, *between}
        out[name] = set(refs[product.name]).union(
            *(set(refs[n]) - skipped for n in [name, *between]))
    return out


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


def broadcasts_to(shapes, target) -> bool:
    """Whether numpy broadcasting of ``shapes`` gives exactly ``target``."""
    rank = len(target)
    for axis in range(rank):
        covered = False
        for shape in shapes:
            j = axis - (rank - len(shape))
            if j < 0:
                continue
            d = shape[j]
            if dims_equal(d, target[axis]):
                covered = True
            elif not (is_static(d) and d == 1):
                return False
        if not covered and not (is_static(target[axis]) and target[axis] == 1):
            return False
    return True


def liveness(graph: TDAG, owned: frozenset = frozenset()
             ) -> tuple[set[str], dict[str, list[str]], dict[str, tuple], ChannelsLast]:
    """The nodes ``graph_source`` writes, per node the values deleted after it, the
    nodes that write over their operands (-> the operands: a scatter's target, or an
    optimizer update's three values), and its channels-last values (``layout``): the
    schedule whose memory ``tdag.memory`` replays."""
    ctx, scope = Context(graph), Scope()
    code = Code(ctx, "", owned)
    fused, _, aliases = fusions(graph, code)  # an alias: the reshape's value, named anew
    refs = _fused_refs({node.name: _operands(node, ctx, scope)[1] for node in graph.nodes},
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
