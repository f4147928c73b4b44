"""``tdag.decode_loop`` over ONNX files whose KV cache is inputs and outputs: GPT-2 and Llama
(with position_ids) steps by torch.onnx's legacy exporter, and a merged decoder built as
optimum builds it (tests/support/cached_decoders.py). Each yields exactly
``model.generate(do_sample=False)``'s tokens (prompt of batch 2, mask all ones) through
tdag.run, the reified torch module and one ONNX model on onnxruntime. The merged file also
imports and runs both of its branches against onnxruntime (1e-4 of the output's scale).
"""
from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import onnxruntime as ort
import pytest
import torch

import tdag
from tdag.ir.program import Block

from support.cached_decoders import export_step, merge_decoders
from support.decoder_lms import gpt2, llama
from support.guards import assert_close, run_onnx

NEW = 6


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> (the torch model, its step file)."""
    root = tmp_path_factory.mktemp("decoders")
    made = {}
    for name, make, positions in (("gpt2", gpt2, False), ("llama", llama, True)):
        torch.manual_seed(0)
        model = make().eval()
        export_step(model, root / f"{name}.onnx", position_ids=positions)
        made[name] = (model, root / f"{name}.onnx")
    model = made["gpt2"][0]
    export_step(model, root / "first.onnx", with_past=False)
    merge_decoders(root / "first.onnx", root / "gpt2.onnx", root / "merged.onnx")
    made["gpt2-merged"] = (model, root / "merged.onnx")
    return made


def _generate(model, prompt, eos=None):
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(prompt, attention_mask=torch.ones_like(prompt),
                              max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                              pad_token_id=0 if eos is None else eos)


def _prompt(length=5):
    return torch.randint(2, 97, (2, length), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", ["gpt2", "llama", "gpt2-merged"])
def test_decode_loop_over_a_file_yields_generates_tokens(files, name):
    model, path = files[name]
    prompt = _prompt()
    expected = _generate(model, prompt)
    gen = tdag.decode_loop(tdag.from_onnx(str(path)), NEW)
    assert torch.equal(tdag.run(gen, prompt), expected)
    with torch.no_grad():
        assert torch.equal(tdag.to_torch(gen)(prompt), expected)
    assert torch.equal(run_onnx(tdag.to_onnx(gen), prompt), expected)
    assert not gen.state  # the cache is carried by the loop, any batch and prompt length
    longer = _prompt(9)[:1]
    assert torch.equal(tdag.run(gen, longer), _generate(model, longer))


def test_an_eos_stops_generation_as_generate_does(files):
    model, path = files["gpt2"]
    prompt = _prompt()
    eos = int(_generate(model, prompt)[0, prompt.shape[1] + 2])  # met at the third token
    gen = tdag.decode_loop(tdag.from_onnx(str(path)), NEW, eos_token_id=eos)
    expected = _generate(model, prompt, eos)
    assert torch.equal(tdag.run(gen, prompt), expected)
    assert torch.equal(run_onnx(tdag.to_onnx(gen), prompt), expected)


def test_a_merged_decoder_runs_both_branches(files):
    """The If on use_cache_branch: the no-past branch on pasts of length 0, the with-past
    one at a past of 5; its presents' lengths (seq vs past + seq) join in one fresh size."""
    path = files["gpt2-merged"][1]
    prog = tdag.from_onnx(str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    emitted = tdag.to_onnx(prog)
    names = [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(0)
    for seq, past, use in ((3, 0, False), (1, 5, True)):
        feeds = [rng.integers(2, 97, (2, seq)), np.ones((2, past + seq), np.int64),
                 *[rng.standard_normal((2, 2, past, 16), np.float32) for _ in range(4)],
                 np.array([use])]
        ref = [torch.from_numpy(r) for r in session.run(None, dict(zip(names, feeds)))]
        tensors = [torch.from_numpy(a) for a in feeds]
        assert_close(tdag.run(prog, *tensors), ref, f"tdag.run, past {past}")
        assert_close(list(run_onnx(emitted, *tensors)), ref, f"to_onnx, past {past}")


# -- what decode_loop refuses -------------------------------------------------------------------

def _step(names, outputs=("logits", "present.0.key", "present.0.value")) -> tdag.Program:
    """A traced step with inputs and outputs named as an exporter names them."""
    specs = [tdag.TensorSpec(("b", "s"), "int64")] + \
        [tdag.TensorSpec(("b", 2, "p", 4)) for _ in names[1:]]
    prog = tdag.trace(lambda ids, *past: (tdag.ops.cast(tdag.ops.unsqueeze(ids, 2), "f32"),
                                          *past[:len(outputs) - 1]), *specs, names=names)
    (call,) = prog.main.steps
    return prog.replace(main=Block(prog.main.inputs, (replace(call, outputs=outputs),),
                                   outputs))


def test_a_past_without_its_present_is_refused_by_name():
    prog = _step(["input_ids", "past_key_values.0.key", "past_key_values.0.value"],
                 ("logits", "present.0.key"))
    with pytest.raises(tdag.InvalidModelError, match="'past_key_values.0.value' but returns "
                                                     "no present for layer 0's value"):
        tdag.decode_loop(prog, 4)


def test_an_input_decode_loop_cannot_feed_is_refused_by_name():
    prog = _step(["input_ids", "past.0.key", "past.0.value", "token_type_ids"])
    with pytest.raises(tdag.InvalidModelError, match="input 'token_type_ids' is none of"):
        tdag.decode_loop(prog, 4)
