"""Lowering: primitive patterns become single kernels, in any axis order, and the lowered
program still verifies and computes the same outputs under ``tdag.run``.

Each case traces a function (through ``tdag.ops``, or built by hand from primitives in an
unusual axis order), lowers it, and checks which kernels are left and that ``tdag.run`` of
the lowered program matches the original at two batch sizes.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tdag
import tdag.lower
from tdag import ops
from tdag.ir.op import Op
from tdag.ir.record import Trait, ops_with
from tdag.lower import PassError, lower

from support.lowering_tables import (ATTENTION, CHANNEL_NORMS, CONTRACTIONS, CONVS, NN, POOLS,
                                     RESIZES, hand_bilstm_stack, hand_lstm, random_args, sdpa)

S = tdag.TensorSpec


def lowered(fn, *specs, args=None) -> Counter:
    """Trace, lower, verify and compare; returns the lowered program's op counts."""
    prog = tdag.trace(fn, *specs)
    low = lower(prog, check=True)
    tdag.verify(low)
    for batch in (2, 3):
        xs = args(batch) if args else random_args(prog, batch)
        ref, got = tdag.run(prog, *xs), tdag.run(low, *xs)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(got, ref):
            scale = b.nan_to_num(0.0).abs().max().item()  # log1p of x below -1 is nan
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * (scale + 1), equal_nan=True)
    return Counter(n.op for g in low.graphs.values() for n in g.nodes)


def only(counts: Counter, *kernels: Op, allowed=(Op.permute, Op.reshape, Op.expand)) -> None:
    """The kernels appear once each and nothing else is left but views."""
    for k in kernels:
        assert counts[k] == 1, (k, counts)
    rest = {op for op in counts if op not in kernels and op not in allowed}
    assert not rest, counts


# -- contractions -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONTRACTIONS))
def test_contractions_become_one_einsum(name):
    fn, specs = CONTRACTIONS[name]
    counts = lowered(fn, *specs)
    only(counts, Op.einsum)


def test_selects_that_drop_nan_are_not_relu():
    """where(x > 0, x, 0) maps nan to 0, torch.relu keeps it: not the same op."""
    counts = lowered(lambda x: ops.where(x > 0, x, 0.0), S(("b", 8)))
    assert counts[Op.relu] == 0 and counts[Op.where] == 1


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_any_axis_order_of_a_contraction_is_one_einsum(data):
    """Random einsums (batch, free and contracted letters in random orders) lower to one
    einsum kernel that computes the same thing."""
    kinds = data.draw(st.lists(st.sampled_from("bmnk"), min_size=2, max_size=5))
    letters = "pqrstu"[:len(kinds)]
    a = [c for c, k in zip(letters, kinds) if k in "bmk"]
    b = [c for c, k in zip(letters, kinds) if k in "bnk"]
    out = [c for c, k in zip(letters, kinds) if k in "bmn"]
    if not a or not b or "k" not in kinds or not ({"m", "n"} & set(kinds)):
        return  # not a contraction of two operands with a one-sided axis
    a, b, out = (data.draw(st.permutations(x)) for x in (a, b, out))
    eq = f"{''.join(a)},{''.join(b)}->{''.join(out)}"
    sizes = dict(zip(letters, (2, 3, 4, 5, 2, 3)))
    counts = lowered(lambda x, y: ops.einsum(eq, x, y),
                     S(tuple(sizes[c] for c in a)), S(tuple(sizes[c] for c in b)))
    only(counts, Op.einsum)


def test_elementwise_product_sum_is_not_a_contraction():
    counts = lowered(lambda x: ops.sum(x * x, 1), S(("b", 8)))
    assert counts[Op.einsum] == 0 and counts[Op.reduce] == 1


# -- convolutions and pooling -----------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONVS))
def test_convolutions_become_one_conv(name):
    fn, spec = CONVS[name]
    only(lowered(fn, spec), Op.conv, allowed=(Op.permute, Op.reshape, Op.pad))


def test_even_same_padding_keeps_an_explicit_pad():
    counts = lowered(lambda x: ops.conv(x, ops.param("w", torch.randn(2, 4, 4, 4)),
                                        padding="same"), S(("b", 4, 9, 9)))
    only(counts, Op.conv, Op.pad)


@pytest.mark.parametrize("kw", [{}, {"stride": 2}, {"stride": 2, "padding": 1, "output_padding": 1},
                                {"groups": 2, "stride": 2}, {"dilation": 2}])
def test_folds_become_one_conv_transpose(kw):
    w = torch.randn(4, 6 // kw.get("groups", 1), 3, 3)
    fn = lambda x: ops.conv_transpose(x, ops.param("w", w), ops.param("b", torch.randn(6)), **kw)  # noqa: E731
    only(lowered(fn, S(("b", 4, 5, 5))), Op.conv_transpose)


@pytest.mark.parametrize("name", list(POOLS))
def test_windowed_reductions_become_pools(name):
    fn, kernel = POOLS[name]
    only(lowered(fn, S(("b", 4, 9, 9))), kernel)


@pytest.mark.parametrize("name", list(RESIZES))
def test_resampling_becomes_one_resize(name):
    fn = lambda x: ops.interpolate(x, **RESIZES[name])  # noqa: E731
    only(lowered(fn, S(("b", 3, 8, 6))), Op.resize)


# -- softmax, norms, activations --------------------------------------------------------------


@pytest.mark.parametrize("name", list(NN))
def test_nn_chains_become_kernels(name):
    fn, kernel = NN[name]
    only(lowered(fn, S(("b", 5, 8))), kernel)


@pytest.mark.parametrize("name", list(CHANNEL_NORMS))
def test_channel_norms_become_kernels_with_their_affine(name):
    fn, kernel = CHANNEL_NORMS[name]
    counts = lowered(fn, S(("b", 6, 4, 4)))
    only(counts, kernel)


# -- attention --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ATTENTION))
def test_attention_becomes_one_kernel(name):
    fn, specs = ATTENTION[name]
    counts = lowered(fn, *specs)
    only(counts, Op.attention)


def test_attention_with_a_bool_mask_passes_it_unbroadcast():
    fn = lambda q, k, v, m: ops.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    specs = [S(("b", 3, 5, 8))] * 3 + [S((5, 5), "bool")]
    only(lowered(fn, *specs), Op.attention)


def test_causal_mask_is_recognised():
    prog = tdag.trace(sdpa(is_causal=True), *[S(("b", 3, "s", 8))] * 3)
    (node,) = [n for n in lower(prog).graph.nodes if n.op is Op.attention]
    assert node.spec.causal and len(node.inputs) == 3
    assert node.spec.scale == pytest.approx(1 / math.sqrt(8))


# -- recurrence -------------------------------------------------------------------------------


@pytest.mark.parametrize("reverse", [False, True])
def test_unrolled_lstm_becomes_one_kernel(reverse):
    counts = lowered(lambda x, h, c: hand_lstm(x, h, c, reverse), S((5, "b", 4)),
                     S(("b", 3)), S(("b", 3)))
    only(counts, Op.lstm)


def test_bidirectional_lstm_layers_become_one_kernel():
    prog = tdag.trace(hand_bilstm_stack, S((5, "b", 4)), S(("b", 3)), S(("b", 3)))
    counts = lowered(hand_bilstm_stack, S((5, "b", 4)), S(("b", 3)), S(("b", 3)))
    only(counts, Op.lstm, allowed=(Op.multiply, Op.expand))  # h * 0.5 stays
    (node,) = [n for n in lower(prog).graph.nodes if n.op is Op.lstm]
    assert (node.spec.layers, node.spec.bidirectional, node.spec.reverse) == (2, True, False)


# -- movement ---------------------------------------------------------------------------------

def test_movement_chains_collapse():
    def fn(x):
        y = ops.reshape(ops.unsqueeze(ops.flatten(x, 1), 0), (1, -1, 4, 5))  # reshapes
        y = ops.permute(ops.permute(y, 0, 2, 1, 3), 0, 3, 2, 1)              # two permutes
        return ops.squeeze(y, 0)
    counts = lowered(fn, S(("b", 4, 5)))
    assert counts == Counter({Op.permute: 1}), counts  # all of it is one transpose


def test_sums_of_pads_become_one_concat():
    counts = lowered(lambda a, b: ops.concat([a, b * 2.0, a], 1), S(("b", 3)), S(("b", "n")))
    only(counts, Op.concat, allowed=(Op.multiply, Op.expand))


def test_concat_keeps_negative_zeros_lowered_or_not():
    """The pads of a concat fill with -0.0, the identity of +, so a -0.0 survives the sum."""
    prog = tdag.trace(lambda a, b: ops.concat([a, b], 0), S((2,)), S((2,)))
    a, b = torch.tensor([-0.0, 1.0]), torch.tensor([-0.0, 0.0])
    want = torch.cat([a, b])
    for p in (prog, lower(prog)):
        got = tdag.run(p, a, b)
        assert torch.equal(got, want) and torch.equal(got.signbit(), want.signbit())


def test_gathers_of_progressions_become_slices():
    counts = lowered(lambda x: ops.interpolate(x, size=(4, 4)) + x[:, :, 1::2, :2].sum(),
                     S(("b", 3, 4, 4)))
    assert counts[Op.gather] == 0, counts


def test_identity_movement_disappears():
    counts = lowered(lambda x: ops.permute(ops.permute(ops.reshape(ops.flatten(x), (3, 4)), 1, 0),
                                           1, 0), S((3, 4)))
    assert not counts, counts


# -- the IR contract --------------------------------------------------------------------------

def test_primitives_exclude_kernels():
    # 40, nonzero and arange (sizes data decides), bitcast (bits as another type: no arithmetic
    # composition gives them), fft (the DFT as a product costs n^2 where the FFT is n log n)
    assert len(tdag.PRIMITIVES) == 47
    assert not set(tdag.PRIMITIVES) & ops_with(Trait.KERNEL)
    assert ops_with(Trait.KERNEL) == set(tdag.deinops.REGISTRY) - set(tdag.PRIMITIVES)


def test_every_kernel_has_rules_and_a_reason():
    for op in ops_with(Trait.KERNEL):
        prim = tdag.deinops.REGISTRY[op]
        assert prim.reason and prim.shape and prim.evaluate and prim.cost, op


def test_lowered_costs_keep_the_contraction_flops():
    prog = tdag.trace(lambda a, b: a @ b, S((4, 8)), S((8, 3)))
    before, after = tdag.cost(prog, lowered=False), tdag.cost(lower(prog), lowered=False)
    assert after.flops == before.flops == 2 * 4 * 8 * 3
    assert after.bytes_written < before.bytes_written  # the broadcast product is gone


def test_constant_subgraphs_fold_before_lowering():
    """A causal mask built from iotas on every call is one constant after lowering."""
    def fn(x):
        rows, cols = ops.iota(6), ops.iota(6)
        mask = ops.unsqueeze(rows, 1) >= ops.unsqueeze(cols, 0)
        return ops.where(mask, x, float("-inf"))
    only(lowered(fn, S(("b", 6, 6))), Op.where)  # no iota, no compare


def test_recognition_ignores_names_and_provenance():
    prog = tdag.trace(lambda x: ops.softmax(x, -1), S(("b", 8)))
    graph = prog.graph
    renamed = {n.name: f"z{i}" for i, n in enumerate(graph.nodes)}
    nodes = [n.replace(name=renamed[n.name], origin=tdag.Origin("aten.mystery", "x.y"),
                       inputs=tuple(renamed.get(i, i) for i in n.inputs)) for n in graph.nodes]
    graph = graph.replace(nodes=tuple(nodes), outputs=tuple(renamed[o] for o in graph.outputs))
    low = lower(prog.with_graph(next(iter(prog.graphs)), graph))
    assert [n.op for n in low.graph.nodes] == [Op.softmax]


def test_unknown_pass_is_an_error():
    prog = tdag.trace(lambda x: ops.exp(x), S((2,)))
    with pytest.raises(PassError, match="unknown lowering passes"):
        lower(prog, passes=("contraction", "nope"))
