"""``decode_loop``: greedy generation as one Program, a Loop controller over a KV-cache step.

A *step* Program is what ``torch.export`` gives for a decoder-only language model with a
static cache (transformers' ``TorchExportableModuleForDecoderOnlyLM``): inputs
``(input_ids i64[batch, n], cache_position i64[n])``, first output the logits
``[batch, n, vocab]``, and the cache buffers it writes in its state dict. ``n`` is 1 (the
step exported with one token) or a symbol (exported with a dynamic length). The generation
Program runs it as ``model.generate(do_sample=False)`` does:

    prefill:  with a symbolic ``n``, one call on the whole prompt; with ``n = 1``, a Loop over
              the prompt's positions that feeds one token a trip. The logits of the last
              position pick the first new token;
    decode:   a Loop of ``max_new_tokens - 1`` trips feeds the last token at the next position
              and picks the next one (the argmax of the logits, the first on ties); with an
              ``eos_token_id`` a finished sequence is padded and the loop stops when all are.
              A symbolic-``n`` step is specialised to ``n = 1`` here (same weights);
    result:   the prompt followed by the new tokens, ``i64[batch, prompt_len + new]``.

The step's own controllers are copied into the prefill and the loop bodies unchanged: the
values they read are named as the step's inputs, and its state (the cache) is the generation
Program's state, so every backend carries it from trip to trip (module buffers in torch,
loop-carried values in one ONNX model).
"""
from __future__ import annotations


from tdag.ops import arrays
from tdag.ops import core, creation
from tdag.ops.trace import trace
from tdag.errors import InvalidModelError
from tdag.ir.graph import Value
from tdag.ir.names import FreshNames
from tdag.ir.program import Block, Call, Loop, Program, all_steps, nested_blocks
from tdag.ir.symbols import Dim, as_dim, is_static, symbol
from tdag.ir.types import DType, TensorType
from tdag.ir.verify import block_types, trips_name, verify
from tdag.refine.generate_cache import CacheStep, is_cache_step, recalled
from tdag.refine.specialize import specialize


def decode_loop(step: Program, max_new_tokens: int, eos_token_id: int | None = None,
                pad_token_id: int | None = None) -> Program:
    """The greedy generation Program of a KV-cache ``step`` Program.

    ``tdag.run(gen, prompt_ids)`` returns ``prompt_ids`` followed by up to ``max_new_tokens``
    new tokens; finished sequences are padded with ``pad_token_id`` (``eos_token_id`` when
    not given), and generation stops early once every sequence has produced the eos token.
    ``tdag.cost(gen).steps`` gives the prefill and the cost per new token.
    """
    if not isinstance(step, Program):
        raise TypeError(f"decode_loop takes a tdag.Program, got {type(step).__name__}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"decode_loop: max_new_tokens must be a positive int, "
                         f"got {max_new_tokens!r}")
    names = _Names(step)
    if is_cache_step(step):
        sig = CacheStep(step, names, max_new_tokens)
        decode_step, graphs = sig.decode_steps(), sig.graphs()
    else:
        sig = _Signature.of(step)
        decode_step, graphs = _decode_step(sig, names)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    prefill = _prefill if sig.whole_prompt else _prefill_loop
    prompt, steps = prefill(sig, names, eos_token_id is not None)
    steps += _decode(sig, decode_step, names, max_new_tokens, eos_token_id, prompt.name)
    loop = steps[-2] if isinstance(steps[-2], Loop) else None
    trips = None if loop is None else loop.count if loop.cond is None else \
        as_dim(symbol(trips_name(loop)))
    helpers = {**_helpers(sig, names, eos_token_id, pad),
               **_join_graphs(sig, prompt.type, trips)}
    graphs.update((names.graph(k), g) for k, g in helpers.items())
    gen = Program(graphs, Block((prompt,), tuple(steps), (names("sequences"),)), step.state)
    verify(gen)
    return gen


# -- the step's signature -----------------------------------------------------------------------

class _Signature:
    """What decode_loop reads off a step: its input names, batch, length, logits type."""

    def __init__(self, step: Program, ids: Value, pos: Value, logits: TensorType):
        self.step, self.ids, self.pos, self.logits = step, ids, pos, logits
        self.batch, self.length = ids.type.shape
        self.whole_prompt = not is_static(self.length)  # prefill in one call
        self.logits_name = step.main.outputs[0]
        self.initial = self.carried = self.stored = ()  # the cache is the state

    def prefill_steps(self) -> tuple:
        return self.step.main.steps

    @staticmethod
    def of(step: Program) -> "_Signature":
        verify(step)
        inputs = step.main.inputs
        if len(inputs) != 2:
            raise InvalidModelError(_wanted(f"{len(inputs)} inputs"))
        ids, pos = inputs
        ok = ids.type.dtype is DType.i64 and ids.type.rank == 2 and \
            pos.type.dtype is DType.i64 and pos.type.rank == 1
        if not ok or pos.type.shape[0] != ids.type.shape[1]:
            raise InvalidModelError(_wanted(f"inputs ({ids.type}, {pos.type})"))
        n = ids.type.shape[1]
        if n != 1 and (is_static(n) or not n.is_Symbol):
            raise InvalidModelError(_wanted(f"inputs ({ids.type}, {pos.type})") +
                                    "; export the step with one token or a dynamic length")
        outs = block_types(step, step.main)
        if not outs or outs[0].rank != 3 or not outs[0].dtype.is_float or \
                outs[0].shape[1] != n or not is_static(outs[0].shape[2]):
            raise InvalidModelError(_wanted(f"first output {outs[0] if outs else 'none'}"))
        if not step.state:
            raise InvalidModelError("decode_loop: the step writes no state, so it cannot "
                                    "remember the prompt: export it with its KV cache")
        return _Signature(step, ids, pos, outs[0])


def _wanted(got: str) -> str:
    return ("decode_loop: a step takes (input_ids i64[batch, n], cache_position i64[n]) and "
            f"returns logits [batch, n, vocab] first; this one has {got}")


class _Names:
    """Names for the values and TDAGs decode_loop adds, clear of the step's own: each
    begins with one prefix (``gen_``, else ``gen1_``, ``gen2_`` ...) that no step name
    begins with."""

    def __init__(self, step: Program):
        taken = set(step.graphs) | set(step.state) | _block_names(step.main)
        # ``head`` is taken as a prefix where some name begins with ``head_``
        heads = {t[:i] for t in taken for i, c in enumerate(t) if c == "_"}
        prefixes = FreshNames(heads, variant=lambda base, k: f"{base}{k}")
        self.prefix = prefixes.fresh("gen") + "_"

    def __call__(self, name: str) -> str:
        return self.prefix + name

    graph = __call__


def _block_names(block: Block) -> set[str]:
    names = {v.name for v in block.inputs} | set(block.outputs)
    for step in all_steps(block):
        names |= set(step.outputs)
        names |= {v.name for b in nested_blocks(step) for v in b.inputs}
    return names


def _decode_step(sig: _Signature, names: _Names) -> tuple[tuple, dict]:
    """The step's controllers as the decode loop runs them (on one token), and the TDAGs of
    the generation Program so far: the step's own, plus, for a symbolic-length step, each
    called TDAG specialised to one token (same weights, no copy of their values)."""
    graphs = dict(sig.step.graphs)
    steps = sig.step.main.steps
    if not sig.whole_prompt:
        return steps, graphs
    one = {sig.length.name: 1}
    renamed = {}
    for name, graph in sig.step.graphs.items():
        renamed[name] = names.graph(f"decode_{name}")
        graphs[renamed[name]] = specialize(graph, one, renamed[name])
    return recalled(steps, renamed), graphs


# -- the helper TDAGs ---------------------------------------------------------------------------

def _helpers(sig: _Signature, names: _Names, eos: int | None, pad: int | None) -> dict:
    """The small TDAGs around the step: the prompt's positions, feeding one prompt token,
    picking the next token, advancing the position."""
    b = sig.batch
    last = TensorType((b, 1, sig.logits.shape[2]), sig.logits.dtype)
    prompt_t = TensorType((b, _prompt_len(sig, names)), DType.i64)
    done_t = TensorType((b,), DType.bool)

    def positions(prompt):  # the prompt's cache positions, and the first free one
        n = prompt.shape[1]
        return creation.iota(n), core.reshape(creation.dim_tensor(as_dim(n)), 1)

    def feed(prompt, i):  # token i of the prompt, and its position
        position = core.reshape(i, 1)
        return core.gather(prompt, position, axis=1, wrap=False), position

    def start(prompt):  # the carried logits before the first prompt token
        return creation.zeros(last.shape, last.dtype, like=prompt)

    def pick(logits, done=None):  # the argmax at the last position; padding once done
        token = arrays.argmax(core.select(logits, 1, logits.shape[1] - 1), axis=1)  # [b]
        if eos is None:
            return core.reshape(token, b, 1)
        if done is not None:
            token = core.where(done, creation.full(token.shape, pad, "i64", like=token), token)
        finished = core.eq(token, creation.full(token.shape, eos, "i64", like=token))
        done = finished if done is None else core.logical_or(done, finished)
        going = core.logical_not(core.reduce(done, "min", axes=(0,)))
        return core.reshape(token, b, 1), done, going

    def advance(position):
        return core.add(position, creation.full((1,), 1, "i64", like=position))

    graphs = {"positions": trace(positions, prompt_t),
              "pick_first": trace(pick, sig.logits if sig.whole_prompt else last),
              "advance": trace(advance, TensorType((1,), DType.i64))}
    if not sig.whole_prompt:
        graphs["feed"] = trace(feed, prompt_t, TensorType((), DType.i64))
        graphs["start"] = trace(start, prompt_t)
    if eos is not None:
        graphs["pick"] = trace(pick, last, done_t)
    else:
        graphs["pick"] = trace(pick, last)
    return {k: v.graph for k, v in graphs.items()}


def _prompt_len(sig: _Signature, names: _Names) -> Dim:
    """The prompt's length: the step's own length symbol when it prefills in one call."""
    return sig.length if sig.whole_prompt else as_dim(symbol(names("prompt_len")))


def _call(names: _Names, graph: str, inputs, outputs) -> Call:
    return Call(names.graph(graph), tuple(inputs), tuple(outputs))


# -- the controllers ----------------------------------------------------------------------------

def _prefill(sig: _Signature, names: _Names, with_eos: bool) -> tuple[Value, list]:
    """One call of the step on the whole prompt (named as the step's ``input_ids``)."""
    n = names
    prompt = Value(sig.ids.name, sig.ids.type)
    steps = [_call(n, "positions", (prompt.name,), (sig.pos.name, n("prompt_end"))),
             *sig.prefill_steps()]
    return prompt, steps + [_call(n, "pick_first", (_logits(sig),), _first_pick(n, with_eos))]


def _prefill_loop(sig: _Signature, names: _Names, with_eos: bool) -> tuple[Value, list]:
    """Feed the prompt one token a trip; the last logits pick the first new token."""
    n = names
    prompt = Value(n("prompt_ids"), TensorType((sig.batch, _prompt_len(sig, n)), DType.i64))
    carried_prompt = Value(n("prompt"), prompt.type)
    carried_logits = Value(n("logits"), sig.logits)
    body = Block(
        (Value(n("i"), TensorType((), DType.i64)), carried_prompt, carried_logits),
        (_call(n, "feed", (carried_prompt.name, n("i")), (sig.ids.name, sig.pos.name)),
         *sig.step.main.steps),
        (carried_prompt.name, _logits(sig)))
    return prompt, [
        _call(n, "positions", (prompt.name,), (sig.pos.name, n("prompt_end"))),
        _call(n, "start", (prompt.name,), (n("logits0"),)),
        Loop((prompt.name, n("logits0")), body, (n("prompt_done"), n("last_logits")),
             count=prompt.type.shape[1]),
        _call(n, "pick_first", (n("last_logits"),), _first_pick(n, with_eos)),
    ]


def _logits(sig: _Signature) -> str:
    return sig.logits_name


def _first_pick(names: _Names, with_eos: bool) -> tuple:
    """What picking the first token gives: the token, and with an eos whether each sequence
    is done and whether any goes on."""
    return (names("token0"),) + ((names("done0"), names("going0")) if with_eos else ())


def _decode(sig: _Signature, decode_step: tuple, names: _Names, max_new: int,
            eos: int | None, prompt: str) -> list:
    """``max_new - 1`` trips of feed-and-pick after the first token; then the result."""
    n = names
    new_tokens = [n("token0")]
    steps = []
    if max_new > 1:
        steps.append(_decode_loop(sig, decode_step, names, max_new - 1, eos is not None))
        new_tokens.append(n("tokens"))
    return steps + [_call(n, "join" if len(new_tokens) == 2 else "join_first",
                          (prompt, *new_tokens), (n("sequences"),))]


def _decode_loop(sig: _Signature, decode_step: tuple, names: _Names, trips: int,
                 with_eos: bool) -> Loop:
    n = names
    one = lambda v: Value(v.name, v.type.with_shape(1 if d == sig.length else d  # noqa: E731
                                                    for d in v.type.shape))
    done = [Value(n("done"), TensorType((sig.batch,), DType.bool))] if with_eos else []
    inputs = (Value(n("j"), TensorType((), DType.i64)), one(sig.ids), one(sig.pos), *done,
              *sig.carried)
    picked = (n("token"),) + ((n("done_next"), n("going")) if with_eos else ())
    body_steps = (*decode_step,
                  _call(n, "pick", (_logits(sig),) + tuple(v.name for v in done), picked),
                  _call(n, "advance", (sig.pos.name,), (n("position_next"),)))
    outputs = ((n("going"),) if with_eos else ()) + \
        (n("token"), n("position_next")) + ((n("done_next"),) if with_eos else ()) + \
        sig.stored + (n("token"),)
    body = Block(inputs, body_steps, outputs)
    carried = (n("token0"), n("prompt_end")) + ((n("done0"),) if with_eos else ()) + \
        sig.initial
    outs = (n("token_last"), n("position_last")) + ((n("done_last"),) if with_eos else ()) + \
        tuple(f"{v.name}_last" for v in sig.carried) + (n("tokens"),)
    return Loop(carried, body, outs, count=as_dim(trips),
                cond=n("going0") if with_eos else None, scanned=1)


def _join_graphs(sig: _Signature, prompt_t: TensorType, trips) -> dict:
    """The TDAG that concatenates the prompt, the first token and the ``trips`` stacked
    others (or the first alone)."""
    b = sig.batch
    token_t = TensorType((b, 1), DType.i64)

    def join(prompt, first, stacked):  # stacked: [trips, b, 1]
        rest = core.reshape(core.permute(stacked, 1, 0, 2), b, stacked.shape[0])
        return arrays.concat([prompt, first, rest], axis=1)

    def join_first(prompt, first):
        return arrays.concat([prompt, first], axis=1)

    if trips is None:
        return {"join_first": trace(join_first, prompt_t, token_t).graph}
    return {"join": trace(join, prompt_t, token_t, TensorType((trips, b, 1), DType.i64)).graph}
