"""torch.histc over a given range lowers to one torch.histc call (its composition is a bin
index, a range test and a scatter-add of ones: ten passes over the values), counts equal
to torch's on random values, values on the bins' edges, outside the range and nan; ONNX
(which has no histogram op) runs the composition, jax its jnp form. The data-range form
(min == max) stays the composition. Transformers' mixture-of-experts layers count the
tokens per expert with it."""
from __future__ import annotations

import importlib.util

import numpy as np
import onnxruntime as ort
import pytest
import torch

import tdag
import tdag.lower
from tdag.ir.op import Op

from support.torch_models import Fn

CASES = {  # name: (bins, min, max, values)
    "normal": (10, -2.0, 2.0, lambda: torch.randn(4, 50, generator=torch.Generator()
                                                  .manual_seed(0)) * 1.5),
    "edges": (4, 0.0, 2.0, lambda: torch.tensor(
        [0.0, 0.5, 1.0, 1.5, 2.0, -0.0, -1e-7, 2.0000002, float("nan"), float("inf"),
         -float("inf"), 0.49999997, 1.9999999])),
    "experts": (8, 0.0, 7.0, lambda: torch.randint(0, 8, (64, 2), generator=torch.Generator()
                                                   .manual_seed(1)).float()),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_histc_is_one_call_counting_as_torch(name):
    bins, low, high, values = CASES[name]
    x = values()
    fn = lambda t: torch.histc(t, bins, low, high)  # noqa: E731
    prog = tdag.from_torch(Fn(fn), (x,))
    low_prog = tdag.lower.lower(prog)
    assert [n.op for n in low_prog.graph.nodes] == [Op.histc], low_prog
    want = fn(x)
    assert torch.equal(tdag.run(low_prog, x), want)
    assert torch.equal(tdag.run(prog, x), want)  # the composition
    module = tdag.to_torch(prog)
    assert "torch.histc(" in module.code
    assert torch.equal(module(x), want)
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    assert np.array_equal(got, want.numpy())
    if importlib.util.find_spec("jax"):
        assert np.array_equal(np.asarray(tdag.to_jax(prog)(x.numpy())), want.numpy())


def test_the_data_range_form_stays_the_composition():
    x = torch.randn(30, generator=torch.Generator().manual_seed(2))
    fn = lambda t: torch.histc(t, 6)  # noqa: E731  (min == max == 0: the data's range)
    prog = tdag.from_torch(Fn(fn), (x,))
    assert Op.histc not in {n.op for n in tdag.lower.lower(prog).graph.nodes}
    assert torch.equal(tdag.to_torch(prog)(x), fn(x))


def test_a_million_values_in_one_pass():
    """Linear in the values (a scatter-add, never a compare with every bin): a million
    values in a thousand bins, counted as torch counts them."""
    x = torch.randn(1_000_000, generator=torch.Generator().manual_seed(3))
    fn = lambda t: torch.histc(t, 1000, -3.0, 3.0)  # noqa: E731
    prog = tdag.from_torch(Fn(fn), (x[:10],))
    assert tdag.cost(prog).flops < 100 * 10  # per value, not per value and bin
    module = tdag.to_torch(tdag.from_torch(Fn(fn), (x,)))
    assert torch.equal(module(x), fn(x))
