"""State and generation: a decoder-only LM exported with its static KV cache (transformers'
``TorchExportableModuleForDecoderOnlyLM``, small configs, random weights) becomes a step
Program whose cache is the state dict; ``tdag.decode_loop`` turns it into the greedy
generation Program, one Loop over the step, that yields exactly ``model.generate``'s tokens
through ``tdag.run``, the reified torch module and one ONNX model on onnxruntime.
"""
from __future__ import annotations


import pytest
import torch

import tdag

from support.decoder_lms import NEW, Exported, gpt2, llama, random_prompt
from support.guards import run_onnx


@pytest.fixture(scope="module", params=[(gpt2, 1, False), (llama, 2, True)],
                ids=["gpt2-one-token", "llama-batch2-any-length"])
def lm(request):
    return Exported(*request.param)


# -- the step: the cache is state ---------------------------------------------------------------

def test_the_cache_is_the_programs_state(lm):
    prog = lm.step
    assert set(prog.state) and all(w.kind is tdag.TensorKind.buffer for w in prog.state.values())
    text = str(prog)
    assert "state %" in text  # printed as state, not as hidden side effects
    call = prog.main.steps[0]
    assert set(prog.state) <= set(call.outputs)  # the call writes the cache back


def test_step_carries_its_cache_through_run_torch_and_onnx(lm):
    """Feed four tokens one at a time: every backend's logits match the eager wrapper, which
    keeps its own cache (run: the state returned and passed back; torch: module buffers;
    ONNX: the state as inputs with defaults and ``<name>.next`` outputs)."""
    prompt = random_prompt(lm, 4)
    eager = lm.wrapper.model  # transformers' outer forward drops cache_position
    module, model = tdag.to_torch(lm.step), tdag.to_onnx(lm.step)
    state, onnx_state = None, []
    for i in range(prompt.shape[1]):
        ids, pos = prompt[:, i:i + 1], torch.tensor([i])
        with torch.no_grad():
            expected = eager(input_ids=ids, cache_position=pos)
        got, state = tdag.run(lm.step, ids, pos, state=state, return_state=True)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(module(ids, pos), expected, rtol=1e-4, atol=1e-5)
        outs = run_onnx(model, ids, pos, *onnx_state)
        torch.testing.assert_close(outs[0], expected, rtol=1e-4, atol=1e-5)
        onnx_state = _next_state(model, outs)


def _next_state(model, outs) -> list:
    """The ``.next`` outputs, in the order of the state inputs they feed back."""
    names = [o.name for o in model.graph.output]
    by_name = dict(zip(names, outs))
    return [by_name[f"{i.name}.next"] for i in model.graph.input if f"{i.name}.next" in by_name]


# -- generation -------------------------------------------------------------------------------

@pytest.mark.parametrize("eos", [None, "third", "first"])
def test_decode_loop_yields_generates_tokens(lm, eos):
    """The same tokens as ``model.generate(do_sample=False)``: without eos all ``NEW``; with
    an eos that greedy decoding meets at the third token (or at once) it stops there, the
    sequences that finished first padded."""
    prompt = random_prompt(lm)
    free = lm.generate(prompt)
    assert free.shape == (lm.batch, prompt.shape[1] + NEW)
    eos_id = None if eos is None else \
        int(free[0, prompt.shape[1] + (2 if eos == "third" else 0)])
    expected = lm.generate(prompt, eos_id)
    gen = tdag.decode_loop(lm.step, NEW, eos_token_id=eos_id)
    tdag.verify(gen)
    assert torch.equal(tdag.run(gen, prompt), expected)
    with torch.no_grad():
        assert torch.equal(tdag.to_torch(gen)(prompt), expected)
    assert torch.equal(run_onnx(tdag.to_onnx(gen), prompt)[0], expected)


def test_generation_is_one_program_of_loops_over_one_step(lm):
    """Prefill over the prompt (a Loop for a one-token step, else one call) and a Loop over
    the new tokens; the step's nodes appear once per use, never per token."""
    gen = tdag.decode_loop(lm.step, NEW)
    loops = [s for s in gen.main.steps if isinstance(s, tdag.Loop)]
    assert len(loops) == (1 if lm.whole_prompt else 2)
    assert loops[-1].count == NEW - 1
    assert gen.state.keys() == lm.step.state.keys()
    assert gen.num_nodes < 2 * lm.step.num_nodes + 100
    model = tdag.to_onnx(gen)
    assert sum(n.op_type == "Loop" for n in model.graph.node) == len(loops)


def test_cost_reports_prefill_and_per_token(lm):
    gen = tdag.decode_loop(lm.step, NEW)
    report = tdag.cost(gen)
    decode = report.steps[-2]  # the decode loop, then the join
    assert decode.label.startswith("loop") and decode.trips == NEW - 1
    one_token = tdag.cost(lm.step)
    length = lm.step.main.inputs[0].type.shape[1]
    if lm.whole_prompt:  # the step's cost is symbolic in the length: one token
        one_token = one_token.evaluate(**{length.name: 1})
    assert decode.per_trip.flops > one_token.flops  # a step and the pick of the next token
    prefill = next(s for s in report.steps if "main" in s.label or "prompt_done" in s.label)
    sizes = {length.name: 5} if lm.whole_prompt else {"gen_prompt_len": 5}
    prompt_of_5 = report.evaluate(**sizes)
    assert prompt_of_5.total.flops == sum(s.total.flops for s in prompt_of_5.steps)
    if not lm.whole_prompt:
        assert str(prefill.trips) == "gen_prompt_len"
    assert "(x9)" in report.table(by="step")


def test_extract_pulls_a_layer_of_the_step_out_of_the_generation(lm):
    """The step's TDAG is in the generation Program as it was (its weights shared, not
    copied): a layer extracted from it is the layer extracted from the step."""
    gen = tdag.decode_loop(lm.step, NEW)
    name = lm.step.main.steps[0].graph
    assert gen.graphs[name] is lm.step.graphs[name]
    scope = "model.transformer.h.0" if "gpt2" in type(lm.model).__name__.lower() else \
        "model.model.layers.0"
    layer = tdag.extract(gen, scope=scope, graph=name)
    assert str(layer) == str(tdag.extract(lm.step, scope=scope))
    tdag.verify(layer)


# -- what decode_loop refuses -----------------------------------------------------------------

def test_decode_loop_refuses_a_step_without_a_cache():
    prog = tdag.trace(lambda ids, pos: tdag.ops.cast(tdag.ops.unsqueeze(ids, 2), "f32"),
                      tdag.TensorSpec((1, 1), "int64"), tdag.TensorSpec((1,), "int64"))
    with pytest.raises(tdag.InvalidModelError, match="writes no state"):
        tdag.decode_loop(prog, 4)


def test_decode_loop_refuses_another_signature():
    prog = tdag.trace(lambda x: x * 2.0, tdag.TensorSpec((1, 4)))
    with pytest.raises(tdag.InvalidModelError, match="input_ids i64"):
        tdag.decode_loop(prog, 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tdag.decode_loop(prog, 0)


# -- guards -------------------------------------------------------------------------------------

def test_reified_module_refuses_inputs_its_program_does_not_describe(lm):
    module = tdag.to_torch(lm.step)
    with pytest.raises(tdag.ShapeError, match="input %(input_ids|cache_position) should be i64"):
        module(torch.zeros(lm.batch, 2, dtype=torch.long), torch.tensor([0, 1, 2]))
    with pytest.raises(tdag.ShapeError, match="should be i64"):
        module(torch.zeros(lm.batch, 1), torch.tensor([0]))


def test_guard_checks_one_value_per_symbol():
    prog = tdag.trace(lambda x, y: x + y, tdag.TensorSpec(("b", 3)), tdag.TensorSpec(("b", 3)))
    module = tdag.to_torch(prog)
    assert module(torch.ones(2, 3), torch.ones(2, 3)).shape == (2, 3)
    with pytest.raises(tdag.ShapeError, match="but b = 2 from an earlier input"):
        module(torch.ones(2, 3), torch.ones(4, 3))
