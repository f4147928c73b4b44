"""``decode_loop``: greedy generation as one Program, a Loop controller over a KV-cache step.

A *step* Program is what ``torch.export`` gives for a decoder-only language model with a
static cache (transformers' ``TorchExportableModuleForDecoderOnlyLM``): inputs
``(input_ids i64[batch, 1], cache_position i64[1])``, first output the logits
``[batch, 1, vocab]``, and the cache buffers it writes in its state dict. The generation
Program runs it as ``model.generate(do_sample=False)`` does:

    prefill:  a Loop over the prompt's positions feeds one token each (the logits of the last
              one pick the first new token);
    decode:   a Loop of ``max_new_tokens - 1`` trips feeds the last token at the next position
              and picks the next one (the argmax of the logits, the first on ties); with an
              ``eos_token_id`` a finished sequence is padded and the loop stops when all are;
    result:   the prompt followed by the new tokens, ``i64[batch, prompt_len + new]``.

The step's own controllers are copied into both loop bodies unchanged: the body's inputs are
named as the step's inputs, and its state (the cache) is the generation Program's state, so
every backend carries it from trip to trip (a Python loop over module buffers in torch, loop-
carried values in one ONNX Loop).
"""
from __future__ import annotations

from tdag.deinops import arrays, core
from tdag.deinops.trace import trace
from tdag.errors import InvalidModelError
from tdag.ir.graph import Value
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.symbols import as_dim, is_static, symbol
from tdag.ir.types import DType, TensorType
from tdag.ir.verify import block_types, trips_name, verify


def decode_loop(step: Program, max_new_tokens: int, eos_token_id: int | None = None,
                pad_token_id: int | None = None) -> Program:
    """The greedy generation Program of a KV-cache ``step`` Program.

    ``tdag.run(gen, prompt_ids)`` returns ``prompt_ids`` followed by up to ``max_new_tokens``
    new tokens; finished sequences are padded with ``pad_token_id`` (``eos_token_id`` when
    not given), and generation stops early once every sequence has produced the eos token.
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"decode_loop: max_new_tokens must be a positive int, "
                         f"got {max_new_tokens!r}")
    sig = _Signature.of(step)
    names = _Names(step)
    pad = eos_token_id if pad_token_id is None else pad_token_id
    prompt = Value(names("prompt_ids"), TensorType((sig.batch, names.prompt_len), DType.i64))
    steps = _prefill(sig, names, prompt) + _decode(sig, names, max_new_tokens, eos_token_id)
    loop = steps[-2] if isinstance(steps[-2], Loop) else None
    trips = None if loop is None else loop.count if loop.cond is None else \
        as_dim(symbol(trips_name(loop)))
    helpers = {**_helpers(sig, names, eos_token_id, pad), **_join_graphs(sig, names, trips)}
    graphs = {**step.graphs, **{names.graph(k): g for k, g in helpers.items()}}
    gen = Program(graphs, Block((prompt,), tuple(steps), (names("sequences"),)), step.state)
    verify(gen)
    return gen


# -- the step's signature -----------------------------------------------------------------------

class _Signature:
    """What decode_loop reads off a step: its input names, batch size, vocabulary, dtype."""

    def __init__(self, step: Program, ids: Value, pos: Value, logits: TensorType):
        self.step, self.ids, self.pos = step, ids, pos
        self.batch, self.vocab, self.logits = ids.type.shape[0], logits.shape[2], logits

    @staticmethod
    def of(step: Program) -> "_Signature":
        if not isinstance(step, Program):
            raise TypeError(f"decode_loop takes a tdag.Program, got {type(step).__name__}")
        verify(step)
        inputs = step.main.inputs
        if len(inputs) != 2:
            raise InvalidModelError(_wanted(f"{len(inputs)} inputs"))
        ids, pos = inputs
        if ids.type.dtype is not DType.i64 or ids.type.rank != 2 or \
                pos.type.dtype is not DType.i64 or pos.type.rank != 1:
            raise InvalidModelError(_wanted(f"inputs ({ids.type}, {pos.type})"))
        if ids.type.shape[1] != 1 or pos.type.shape[0] != 1:
            raise InvalidModelError(_wanted(f"inputs ({ids.type}, {pos.type})") +
                                    "; export the step with one token (input_ids of shape "
                                    "[batch, 1])")
        outs = block_types(step, step.main)
        if not outs or outs[0].rank != 3 or not outs[0].dtype.is_float or \
                not is_static(outs[0].shape[2]):
            raise InvalidModelError(_wanted(f"first output {outs[0] if outs else 'none'}"))
        if not step.state:
            raise InvalidModelError("decode_loop: the step writes no state, so it cannot "
                                    "remember the prompt: export it with its KV cache")
        return _Signature(step, ids, pos, outs[0])


def _wanted(got: str) -> str:
    return ("decode_loop: a step takes (input_ids i64[batch, 1], cache_position i64[1]) and "
            f"returns logits [batch, 1, vocab] first; this one has {got}")


class _Names:
    """Names for the values and TDAGs decode_loop adds, clear of the step's own."""

    def __init__(self, step: Program):
        taken = set(step.graphs) | set(step.state) | _block_names(step.main)
        self.prefix = next(p for p in (f"gen{k}_" if k else "gen_" for k in range(10**6))
                           if not any(t.startswith(p) for t in taken))
        self.prompt_len = as_dim(symbol(self("prompt_len")))

    def __call__(self, name: str) -> str:
        return self.prefix + name

    def graph(self, name: str) -> str:
        return self.prefix + name


def _block_names(block: Block) -> set[str]:
    names = {v.name for v in block.inputs} | set(block.outputs)
    for step in block.steps:
        names |= set(step.outputs)
        if isinstance(step, If):
            names |= _block_names(step.then_branch) | _block_names(step.else_branch)
        elif isinstance(step, Loop):
            names |= _block_names(step.body)
    return names


# -- the helper TDAGs ---------------------------------------------------------------------------

def _helpers(sig: _Signature, names: _Names, eos: int | None, pad: int | None) -> dict:
    """The small TDAGs around the step: feeding a prompt token, picking the next token,
    joining the result."""
    b, p = sig.batch, names.prompt_len
    ids = (b, p)
    logits = TensorType(sig.logits.shape, sig.logits.dtype)
    done_t = TensorType((b,), DType.bool)

    def feed(prompt, i):  # token i of the prompt, and its position
        position = core.reshape(i, 1)
        return core.gather(prompt, position, axis=1, wrap=False), position

    def pick(logits, done=None):
        token = arrays.argmax(core.select(logits, 1, 0), axis=1)  # [b]
        if eos is None:
            return core.reshape(token, b, 1)
        if done is not None:  # a finished sequence is padded
            token = core.where(done, core.full(token.shape, pad, "i64", like=token), token)
        finished = core.eq(token, core.full(token.shape, eos, "i64", like=token))
        done = finished if done is None else core.logical_or(done, finished)
        going = core.logical_not(core.reduce(done, "min", axes=(0,)))
        return core.reshape(token, b, 1), done, going

    def start(prompt):  # the carried logits before the first prompt token, and its length
        zeros = core.zeros(logits.shape, logits.dtype, like=prompt)
        return zeros, core.reshape(core.dim_tensor(p), 1)

    def advance(position):
        return core.add(position, core.full((1,), 1, "i64", like=position))

    graphs = {
        "feed": trace(feed, TensorType(ids, DType.i64), TensorType((), DType.i64)),
        "start": trace(start, TensorType(ids, DType.i64)),
        "pick_first": trace(pick, logits),
        "advance": trace(advance, TensorType((1,), DType.i64)),
    }
    if eos is not None:
        graphs["pick"] = trace(pick, logits, done_t)
    else:
        graphs["pick"] = graphs["pick_first"]
    return {k: v.graph for k, v in graphs.items()}


def _call(names: _Names, graph: str, inputs, outputs) -> Call:
    return Call(names.graph(graph), tuple(inputs), tuple(outputs))


# -- the controllers ----------------------------------------------------------------------------

def _prefill(sig: _Signature, names: _Names, prompt: Value) -> list:
    """Feed the prompt one token a trip; leave its last logits in ``last_logits``."""
    n = names
    carried_prompt = Value(n("prompt"), prompt.type)
    carried_logits = Value(n("logits"), sig.logits)
    logits_out = _step_logits(sig)
    body = Block(
        (Value(n("i"), TensorType((), DType.i64)), carried_prompt, carried_logits),
        (_call(n, "feed", (carried_prompt.name, n("i")), (sig.ids.name, sig.pos.name)),
         *sig.step.main.steps),
        (carried_prompt.name, logits_out))
    return [
        _call(n, "start", (prompt.name,), (n("logits0"), n("prompt_end"))),
        Loop((prompt.name, n("logits0")), body, (n("prompt_done"), n("last_logits")),
             count=names.prompt_len),
    ]


def _step_logits(sig: _Signature) -> str:
    return sig.step.main.outputs[0]


def _decode(sig: _Signature, names: _Names, max_new: int, eos: int | None) -> list:
    """Pick the first token, then ``max_new - 1`` trips of feed-and-pick; join the result."""
    n = names
    with_eos = eos is not None
    first = (n("token0"),) + ((n("done0"), n("going0")) if with_eos else ())
    steps = [_call(n, "pick_first", (n("last_logits"),), first)]
    new_tokens = [n("token0")]
    if max_new > 1:
        steps.append(_decode_loop(sig, names, max_new - 1, with_eos))
        new_tokens.append(n("tokens"))
    steps.append(_join(names, sig, new_tokens))
    return steps


def _decode_loop(sig: _Signature, names: _Names, trips: int, with_eos: bool) -> Loop:
    n = names
    done = [Value(n("done"), TensorType((sig.batch,), DType.bool))] if with_eos else []
    inputs = (Value(n("j"), TensorType((), DType.i64)), sig.ids, sig.pos, *done)
    picked = (n("token"),) + ((n("done_next"), n("going")) if with_eos else ())
    body_steps = (*sig.step.main.steps,
                  _call(n, "pick", (_step_logits(sig),) + tuple(v.name for v in done), picked),
                  _call(n, "advance", (sig.pos.name,), (n("position_next"),)))
    outputs = ((n("going"),) if with_eos else ()) + \
        (n("token"), n("position_next")) + ((n("done_next"),) if with_eos else ()) + \
        (n("token"),)
    body = Block(inputs, body_steps, outputs)
    carried = (n("token0"), n("prompt_end")) + ((n("done0"),) if with_eos else ())
    outs = (n("token_last"), n("position_last")) + ((n("done_last"),) if with_eos else ()) + \
        (n("tokens"),)
    return Loop(carried, body, outs, count=as_dim(trips),
                cond=n("going0") if with_eos else None, scanned=1)


def _join(names: _Names, sig: _Signature, new_tokens: list) -> Call:
    return _call(names, "join" if len(new_tokens) == 2 else "join_first",
                 (names("prompt_ids"), *new_tokens), (names("sequences"),))


def _join_graphs(sig: _Signature, names: _Names, trips) -> dict:
    """The TDAG that concatenates the prompt, the first token and the ``trips`` stacked
    others (or the first alone)."""
    b, p = sig.batch, names.prompt_len
    prompt_t, token_t = TensorType((b, p), DType.i64), TensorType((b, 1), DType.i64)

    def join(prompt, first, stacked):  # stacked: [trips, b, 1]
        rest = core.reshape(core.permute(stacked, 1, 0, 2), b, stacked.shape[0])
        return arrays.concat([prompt, first, rest], axis=1)

    def join_first(prompt, first):
        return arrays.concat([prompt, first], axis=1)

    if trips is None:
        return {"join_first": trace(join_first, prompt_t, token_t).graph}
    return {"join": trace(join, prompt_t, token_t, TensorType((trips, b, 1), DType.i64)).graph}
