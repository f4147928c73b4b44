"""A KV-cache step writes its cache in place (``_rt.scatter_rows_``, as torch's static cache
writes itself with ``index_copy_``): the reified module keeps each cache buffer's storage, its
logits and new cache equal the eager model's, and tdag.memory's prediction, which reads the
same decision from the code generator, is MemTracker's measured peak within 1% (a second
copy of the cache would be 7% here). A tensor the caller passed is never written over."""
from __future__ import annotations

import copy

import pytest
import torch

import tdag
from tdag import ops
from support.mem_tracker import measured_peak

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def llama_step():
    from support.decoder_lms import Exported, llama
    return Exported(llama, 1, whole_prompt=True)


def test_a_cache_step_writes_its_cache_in_place(llama_step):
    from support.decoder_lms import random_prompt
    step, eager = llama_step.step, llama_step.wrapper.model
    module = tdag.to_torch(step)
    assert "_rt.scatter_rows_(" in module.code and "_rt.scatter_rows(" not in module.code
    (length,) = {d.name for v in step.main.inputs for d in v.type.shape if not isinstance(d, int)}
    caches = [n for n in step.state if "cache" in n]
    prompt = random_prompt(llama_step, 5)
    for ids, pos in ((prompt, torch.arange(5)), (torch.tensor([[7]]), torch.tensor([5]))):
        predicted = tdag.memory(step, **{length: ids.shape[1]}).peak
        measured = measured_peak(copy.deepcopy(module), (ids, pos))
        assert abs(predicted / measured - 1) <= 0.01
        storage = {n: module.get_buffer(n).data_ptr() for n in caches}
        with torch.no_grad():
            expected, got = eager(input_ids=ids, cache_position=pos), module(ids, pos)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        for name in caches:
            assert module.get_buffer(name).data_ptr() == storage[name]
            torch.testing.assert_close(module.get_buffer(name), eager.get_buffer(name),
                                       rtol=1e-4, atol=1e-5)


def test_a_callers_tensor_is_not_written_over():
    """A scatter into an input the caller passed writes a new tensor; one into an
    intermediate that nothing reads after it writes over it; both as the interpreter,
    and the replay holds one new tensor less (one write: ``scatter_rows`` makes no
    scratch for duplicates)."""
    def fn(x, i, v):
        return ops.scatter(x, i, v, 0), ops.scatter(x * 2.0, i, v, 0)
    prog = tdag.trace(fn, tdag.TensorSpec((6, 3)), tdag.TensorSpec((1,), "int64"),
                      tdag.TensorSpec((1, 3)))
    module = tdag.to_torch(prog)
    assert module.code.count("_rt.scatter_rows(") == module.code.count("_rt.scatter_rows_(") == 1
    x, i, v = torch.randn(6, 3), torch.tensor([4]), torch.randn(1, 3)
    kept = x.clone()
    for got, want in zip(module(x, i, v), tdag.run(prog, x, i, v)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(x, kept, rtol=0, atol=0)
    assert tdag.memory(prog).peak == measured_peak(module, (x, i, v))
