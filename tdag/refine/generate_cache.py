"""The step of a file whose KV cache is inputs and outputs, as ``decode_loop`` runs it.

Exporters of decoder-only language models (torch.onnx with a cache, Hugging Face optimum,
onnxruntime-genai's files) write one call of the model as::

    (input_ids i64[batch, seq], attention_mask i64[batch, past + seq] (usually),
     position_ids i64[batch, seq] (sometimes), past_key_values.{i}.key/value [batch, heads,
     past, head_size], use_cache_branch bool[1] (a merged decoder))
      -> (logits [batch, seq, vocab], present.{i}.key/value [batch, heads, past + seq, size])

A past input and a present output pair up by layer and by ``key``/``value``: ``past`` is
``past_key_values``, ``past_key_value``, ``past`` or ``past_{key,value}_values``, joined to
the layer number and ``key``/``value`` by ``.`` or ``_`` in either order
(``past_key_values.0.key``, ``past.0.value``, ``past_key_values_0_key``); ``present`` is
``present`` or ``present_key_values`` the same way. The logits are the output named
``logits``, else the first. A merged decoder's ``use_cache_branch`` is fed false on the
prompt (with pasts of length 0, as optimum's runtime does) and true after.

The generation Program carries the cache as loop values rather than state, so any batch and
prompt length run: the prompt's presents are padded to ``prompt + max_new_tokens - 1`` rows,
and each decode trip reads the first ``position`` rows (an ``arange`` over the position makes
that length a fresh size, the past length the file computes its positions and mask from),
calls the step on one token and stores its present, padded again. Each trip copies the cache
once more than the step itself does: O(cache) like its attention.
"""
from __future__ import annotations

import re

from tdag.deinops.runtime import Arange
from tdag.errors import InvalidModelError
from tdag.ir.graph import Value
from tdag.ir.op import Op
from tdag.ir.program import Block, Call, Program, nested_blocks, with_blocks
from tdag.ir.symbols import as_dim, is_static, symbol
from tdag.ir.types import DType, TensorType
from tdag.ir.verify import block_types, verify
from tdag import ops
from tdag.ops import core, creation
from tdag.ops.trace import trace
from tdag.refine.specialize import specialize

_PAST = re.compile(r"(?:past_key_values?|past|past_(key|value)_values)[._](\d+)"
                   r"(?:[._](key|value))?")
_PRESENT = re.compile(r"(?:present|present_key_values|present_(key|value)_values)[._](\d+)"
                      r"(?:[._](key|value))?")
_ROLES = ("input_ids", "attention_mask", "position_ids", "use_cache_branch")


def is_cache_step(step: Program) -> bool:
    """Whether ``step`` takes its cache as inputs (a past input, and no state)."""
    return not step.state and any(_pair_key(_PAST, v.name) for v in step.main.inputs)


def _pair_key(pattern, name: str):
    """``(layer, 'key' | 'value')`` of a past or present name, None for another name."""
    match = pattern.fullmatch(name)
    if match is None or (match.group(1) is None) == (match.group(3) is None):
        return None
    return int(match.group(2)), match.group(1) or match.group(3)


class CacheStep:
    """What decode_loop reads off a past/present step, and the pieces it builds from it:
    the prefill's and a decode trip's controllers, the cache they carry, their TDAGs."""

    def __init__(self, step: Program, names, max_new_tokens: int):
        verify(step)
        self.step, self.names = step, names
        self.pairs = _pairs(step)
        self.ids = next((v for v in step.main.inputs if v.name == "input_ids"), None)
        ok = self.ids is not None and self.ids.type.dtype is DType.i64 and \
            self.ids.type.rank == 2 and not is_static(self.ids.type.shape[1])
        if not ok:
            raise InvalidModelError(f"decode_loop: a step with a cache as inputs takes "
                                    f"input_ids i64[batch, seq] (seq a symbol); this one has "
                                    f"{self.ids.type if self.ids else 'none'}")
        self.batch, self.length = self.ids.type.shape
        self.whole_prompt = True
        self.types = dict(zip(step.main.outputs, block_types(step, step.main)))
        self.logits_name = "logits" if "logits" in self.types else step.main.outputs[0]
        self.logits = self.types[self.logits_name]
        if self.logits.rank != 3 or not self.logits.dtype.is_float:
            raise InvalidModelError(f"decode_loop: the logits {self.logits_name!r} should be "
                                    f"[batch, seq, vocab], got {self.logits}")
        self.pos = Value(names("position"), TensorType((1,), DType.i64))
        self.rows = as_dim(self.length + max_new_tokens - 1)  # the cache: prompt + new - 1
        # a decode trip's fresh sizes: the past's length and the mask's, one more
        self.past_len, self.mask_len = (as_dim(symbol(names(k))) for k in ("past_len",
                                                                            "mask_len"))
        past, total = _sizes(step, self.pairs)
        self.sizes = {"prefill": {past: 0, **({total: self.length} if total else {})},
                      "decode": {self.length.name: 1, past: self.past_len,
                                 **({total: self.mask_len} if total else {})}}

    # -- the controllers ----------------------------------------------------------------------

    def prefill_steps(self) -> tuple:
        """Feed the prompt with pasts of length 0, then pad its presents into the cache."""
        n = self.names
        feed = Call(n("feed_prompt"), (self.ids.name,), self._fed())
        start = Call(n("cache_start"), self._presents(), self.initial)
        return (feed, *recalled(self.step.main.steps, self._renamed("prefill"),
                                   self.sizes["prefill"]), start)

    def decode_steps(self) -> tuple:
        """A decode trip: read the past from the cache, step on one token, store."""
        n = self.names
        read = Call(n("cache_read"), (self.pos.name, *(v.name for v in self.carried)),
                    self._fed())
        # the first past binds its length where a present's is past_len + 1
        store = Call(n("cache_store"), (self.pairs[0][0].name, *self._presents()),
                     self.stored)
        return (read, *recalled(self.step.main.steps, self._renamed("decode"),
                                   self.sizes["decode"]), store)

    @property
    def initial(self) -> tuple:
        return tuple(self.names(f"cache{k}") for k in range(len(self.pairs)))

    @property
    def carried(self) -> tuple:
        return tuple(Value(self.names(f"past{k}"), self._cache_type(p))
                     for k, (p, _) in enumerate(self.pairs))

    @property
    def stored(self) -> tuple:
        return tuple(self.names(f"stored{k}") for k in range(len(self.pairs)))

    def _fed(self) -> tuple:
        """The step inputs a feed makes, by name: every input but input_ids."""
        return tuple(v.name for v in self.step.main.inputs if v.name != self.ids.name)

    def _presents(self) -> tuple:
        return tuple(out for _, out in self.pairs)

    def _cache_type(self, past: Value) -> TensorType:
        shape = past.type.shape
        return past.type.with_shape((*shape[:2], self.rows, *shape[3:]))

    def _renamed(self, phase: str) -> dict:
        return {g: self.names.graph(f"{phase}_{g}") for g in self.step.graphs}

    # -- the TDAGs ----------------------------------------------------------------------------

    def graphs(self) -> dict:
        """Each step TDAG at the prompt's sizes and at one token's, and the feeds."""
        graphs = {}
        for phase, sizes in self.sizes.items():
            for g, name in self._renamed(phase).items():
                graphs[name] = specialize(self.step.graphs[g], sizes, name)
        n = self.names
        return {**graphs, n("feed_prompt"): self._feed_prompt(), n("cache_read"): self._read(),
                n("cache_start"): self._store("prefill"), n("cache_store"): self._store("decode")}

    def _feed_prompt(self):
        def feed(ids):  # the prompt's mask and positions, empty pasts, the no-past branch
            b, p = ids.shape
            made = {"attention_mask": creation.ones((b, p), "i64", like=ids),
                    "position_ids": core.broadcast_to(core.reshape(creation.iota(p), 1, p),
                                                      (b, p)),
                    "use_cache_branch": creation.full((1,), False, "bool", like=ids)}
            return self._in_order(made, lambda past: creation.zeros(
                (b, past.type.shape[1], 0, past.type.shape[3]), past.type.dtype, like=ids))
        return trace(feed, self.ids.type).graph

    def _read(self):
        def read(position, *caches):  # the first ``position`` rows, the mask over them + 1
            b = caches[0].shape[0]
            at = core.reshape(position, ())
            rows = at.builder.emit(Op.arange, Arange(self.past_len.name), at)
            mask = at.builder.emit(Op.arange, Arange(self.mask_len.name), ops.add(at, 1))
            mask = ops.cast(ops.ge(mask, 0), "i64")  # ones, reading the arange that sizes it
            made = {"attention_mask": core.broadcast_to(core.reshape(mask, 1, self.mask_len),
                                                        (b, self.mask_len)),
                    "position_ids": core.broadcast_to(core.reshape(position, 1, 1), (b, 1)),
                    "use_cache_branch": creation.full((1,), True, "bool", like=position)}
            pasts = iter(caches)
            return self._in_order(made, lambda _: core.gather(next(pasts), rows, 2, wrap=False))
        return trace(read, self.pos.type, *(v.type for v in self.carried)).graph

    def _in_order(self, made: dict, past_of) -> tuple:
        """The fed inputs in the step's order: the pasts from ``past_of(past input)``."""
        pasts = {p.name for p, _ in self.pairs}
        return tuple(past_of(v) if v.name in pasts else made[v.name]
                     for v in self.step.main.inputs if v.name != self.ids.name)

    def _store(self, phase: str):
        """The presents of ``phase`` zero-padded to the cache's rows."""
        subs = {symbol(k): v for k, v in self.sizes[phase].items()}
        types = [self.types[out] for _, out in self.pairs]
        types = [t.with_shape(d if is_static(d) else as_dim(d.subs(subs)) for d in t.shape)
                 for t in types]

        def store(*news):
            return tuple(core.pad(x, [(0, 0), (0, 0), (0, self.rows - x.shape[2]), (0, 0)])
                         for x in news[len(news) - len(types):])
        first = () if phase == "prefill" else (self.pairs[0][0].type.with_shape(
            d if is_static(d) else as_dim(d.subs(subs)) for d in self.pairs[0][0].type.shape),)
        return trace(store, *first, *types).graph


def _sizes(step: Program, pairs: list) -> tuple[str, str | None]:
    """The names of the past length and of the attention mask's length."""
    dims = {p.type.shape[2] for p, _ in pairs}
    mask = next((v for v in step.main.inputs if v.name == "attention_mask"), None)
    total = mask.type.shape[1] if mask is not None else None
    for d in dims | ({total} if total is not None else set()):
        if is_static(d) or not d.is_Symbol:
            raise InvalidModelError(f"decode_loop: the past and the attention mask need their "
                                    f"lengths as symbols, got {d}; export them with dynamic "
                                    "axes")
    if len(dims) != 1:
        raise InvalidModelError(f"decode_loop: the pasts have lengths "
                                f"{sorted(map(str, dims))}; they should be one size")
    return dims.pop().name, None if total is None else total.name


def _pairs(step: Program) -> list[tuple[Value, str]]:
    """(past input, present output) by layer and kind, all inputs accounted for."""
    past = {}
    for v in step.main.inputs:
        key = _pair_key(_PAST, v.name)
        if key is not None and v.type.rank != 4:
            raise InvalidModelError(f"decode_loop: the past {v.name!r} is {v.type}; a past is "
                                    "[batch, heads, past, head_size]")
        if key is not None:
            past[key] = v
        elif v.name not in _ROLES:
            raise InvalidModelError(f"decode_loop: the step's input {v.name!r} is none of "
                                    f"{', '.join(_ROLES)} or a past_key_values.<layer>.key/"
                                    "value; decode_loop does not know what to feed it")
    present = {_pair_key(_PRESENT, o): o for o in step.main.outputs}
    missing = sorted(past.keys() - present.keys())
    if missing:
        layer, kind = missing[0]
        raise InvalidModelError(f"decode_loop: the step takes {past[missing[0]].name!r} but "
                                f"returns no present for layer {layer}'s {kind} (outputs: "
                                f"{', '.join(step.main.outputs)})")
    return [(past[k], present[k]) for k in sorted(past)]


def recalled(steps: tuple, renamed: dict, sizes: dict | None = None) -> tuple:
    """``steps`` with their calls (in any branch or body) pointed at ``renamed`` TDAGs, and
    the inputs of their nested blocks typed at ``sizes`` (symbol name -> size), as
    ``specialize`` types the TDAGs."""
    subs = {symbol(k): v for k, v in (sizes or {}).items()}

    def typed(v: Value) -> Value:
        return Value(v.name, v.type.with_shape(d if is_static(d) else as_dim(d.subs(subs))
                                               for d in v.type.shape))

    def one(step):
        if isinstance(step, Call):
            return Call(renamed.get(step.graph, step.graph), step.inputs, step.outputs)
        return with_blocks(step, [Block(tuple(typed(v) for v in b.inputs),
                                        tuple(one(s) for s in b.steps), b.outputs)
                                  for b in nested_blocks(step)])
    return tuple(one(s) for s in steps)
