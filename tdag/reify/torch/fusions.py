"""The fusions of the torch code: nodes written inside the call of another (``fusions``).

- epilogues: a SiLU, GELU or hardswish inside the oneDNN or MKL product it alone reads, an
  eval-mode batch norm folded into the convolution it alone reads, and the activation
  after such a norm (``epilogues``, ``reshaped_epilogues`` through GPT-2's row reshape);
- a ReLU6 or ReLU written into the pad that alone reads it (``_rt.clamped_pad``);
- an attention reading repeat_kv's k and v unrepeated (SDPA's ``enable_gqa``);
- transformers' rotary embedding as one call (``_rt.rotary``).

Each maps the node whose line is written to (the node whose call it is, the extra
arguments); the nodes between are not written, and ``fused_refs`` gives the liveness what
the written line reads instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from tdag.deinops.extent import torch_pads
from tdag.ir.graph import TDAG, Node
from tdag.ir.op import Op
from tdag.ir.symbols import dims_equal, is_static
from tdag.lower.kernels.contraction import activation_inside, folded_norm, onednn_activation, \
    onednn_product
from tdag.ops.promotion import broadcasts_to


def fusions(graph: TDAG, code) -> tuple[dict, dict, dict]:
    """(``epilogues`` with the clamped pads, grouped attentions and rotary embeddings;
    ``reshaped_epilogues``' two maps), the nodes written inside another's call noted in
    ``code.fused`` (their code is that call: nothing is written in place)."""
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


def epilogues(graph: TDAG, code) -> dict[str, tuple[Node, tuple | str | NormThen]]:
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


def grouped_attention(graph: TDAG, code) -> dict[str, tuple[Node, GroupedKV]]:
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


def _repeated_heads(name: str, producer: dict, users: dict, outputs, code) -> str | None:
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


def rotary_embeddings(graph: TDAG, code) -> dict[str, tuple[Node, Rotary]]:
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


def _unexpanded(name: str, shape, code) -> str:
    """The source of ``name`` where it is an expand or repeat that broadcasting against
    ``shape`` rebuilds (as ``_unexpand`` reads an elementwise op's operands), else ``name``."""
    producer = code.ctx.producer(name)
    if producer is not None and producer.op in (Op.expand, Op.repeat) and \
            broadcasts_to([shape, code.ctx.type(producer.inputs[0]).shape], shape):
        return producer.inputs[0]
    return name


def _rotary_parts(scaled: Node | None, rotated: Node | None, producer: dict, code):
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


def clamped_pad_source(pad: Node, act: Node, operands: dict, code) -> str:
    """``_rt.clamped_pad`` of the pad ``pad`` over the clamp or ReLU ``act``."""
    dtype = act.type.dtype
    lo, hi = (act.spec.lo, act.spec.hi) if act.op is Op.clamp else (0.0, None)
    bounds = ", ".join("None" if b is None else code.literal(b, dtype) for b in (lo, hi))
    return (f"_rt.clamped_pad({operands[act.name][0][0]}, {torch_pads(pad, code)}, "
            f"{code.literal(pad.spec.value, dtype)}, {bounds})")


def norm_argument(node: Node, operands: list[str]) -> str:
    """``norm=(mean, var, weight, bias, eps)`` of the batch norm ``node`` (its operands'
    expressions ``operands``) folded into the convolution it reads."""
    parts = list(operands[1:]) + ["None"] * (5 - len(operands))
    return f"norm=({', '.join(parts)}, {node.spec.eps!r})"


def reshaped_epilogues(graph: TDAG, code, fused: dict) -> tuple[dict, dict]:
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


def fused_refs(refs: dict, fused: dict) -> dict:
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


__all__ = ["CLAMPED_PAD", "NORM", "GroupedKV", "NormThen", "Rotary", "clamped_pad_source",
           "epilogues", "fused_refs", "fusions", "grouped_attention", "norm_argument",
           "reshaped_epilogues", "rotary_embeddings"]
