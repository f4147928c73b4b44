"""tdag.memory of loops: a while loop replayed to its bound (``trips_<first output>``, a size),
a clear error naming the loop without one; and a greedy decode loop over a GPT-2 KV-cache
step, whose predicted peak is MemTracker's on the reified module within 5% (a loop body
reads the cache buffers its earlier trips wrote)."""
from __future__ import annotations

import pytest
import torch

import tdag
from tdag.errors import ShapeError
from support.control_programs import doubling_loop
from support.mem_tracker import measured_peak

pytest.importorskip("transformers")


def test_a_while_loop_needs_its_bound_and_is_replayed_to_it():
    prog = doubling_loop()  # while sum(x) < 100: x = 2x; from [1, 1], six trips
    with pytest.raises(ShapeError, match=r"-> y, sums .*trips_y=N"):
        tdag.memory(prog)
    x = torch.ones(2)
    predicted = tdag.memory(prog, trips_y=6)
    assert abs(predicted.peak / measured_peak(tdag.to_torch(prog), (x,)) - 1) <= 0.05
    assert tdag.memory(prog, trips_y=20).peak > predicted.peak  # the scanned sums grow


@pytest.fixture(scope="module", params=[False, True], ids=["one-token-step", "whole-prompt"])
def gpt2_step(request):
    """A one-token step (the prefill is a Loop over the prompt that writes the cache buffers
    each trip) or a step of any length (the prefill is one call)."""
    from support.decoder_lms import Exported, gpt2
    return Exported(gpt2, 1, whole_prompt=request.param)


@pytest.mark.parametrize("new_tokens", [2, 10])
def test_decode_loop_peak_matches_memtracker(gpt2_step, new_tokens):
    from support.decoder_lms import random_prompt
    gen = tdag.decode_loop(gpt2_step.step, new_tokens)
    prompt = random_prompt(gpt2_step, 5)
    (length,) = {d.name for v in gen.main.inputs for d in v.type.shape if not isinstance(d, int)}
    report = tdag.memory(gen, **{length: 5})
    measured = measured_peak(tdag.to_torch(gen), (prompt,))
    assert abs(report.peak / measured - 1) <= 0.05
