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

S = tdag.TensorSpec
torch.manual_seed(0)


def _args(prog, batch):
    out = []
    for t in prog.input_types:
        shape = [d if isinstance(d, int) else batch for d in t.shape]
        if t.dtype.is_float:
            out.append(torch.randn(shape, dtype=t.dtype.torch))
        elif t.dtype is tdag.DType.bool:
            out.append(torch.rand(shape) > 0.3)
        else:
            out.append(torch.randint(0, 5, shape, dtype=t.dtype.torch))
    return out


def lowered(fn, *specs, args=None) -> Counter:
    """Trace, lower, verify and compare; returns the lowered program's op counts."""
    prog = tdag.trace(fn, *specs)
    low = lower(prog, check=True)
    tdag.verify(low)
    for batch in (2, 3):
        xs = args(batch) if args else _args(prog, batch)
        ref, got = tdag.run(prog, *xs), tdag.run(low, *xs)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = got if isinstance(got, tuple) else (got,)
        for a, b in zip(got, ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4 * (b.abs().max().item() + 1))
    return Counter(n.op for g in low.graphs.values() for n in g.nodes)


def only(counts: Counter, *kernels: Op, allowed=(Op.permute, Op.reshape, Op.expand)) -> None:
    """The kernels appear once each and nothing else is left but views."""
    for k in kernels:
        assert counts[k] == 1, (k, counts)
    rest = {op for op in counts if op not in kernels and op not in allowed}
    assert not rest, counts


# -- contractions -----------------------------------------------------------------------------

def _hand_matmul(a, b):
    """out[n, s, m] = sum_k a[k, s, m] * b[n, k], built from primitives in that order."""
    a2 = ops.repeat_axes(ops.unsqueeze(ops.permute(a, 1, 0, 2), 0), (0,), (6,))  # [n,s,k,m]
    b2 = ops.unsqueeze(ops.unsqueeze(b, 1), 3)                                     # [n,1,k,1]
    b2 = ops.repeat_axes(b2, (1, 3), (a.shape[1], 7))
    return ops.sum(a2 * b2, 2)


def _hand_bmm(x, y):
    """out[b, n, m] = sum_k x[m, b, k] * y[b, n, k]: batch axis in the middle."""
    x2 = ops.unsqueeze(ops.permute(x, 1, 2, 0), 1)                # [b,1,k,m]
    x2 = ops.repeat_axes(x2, (1,), (y.shape[1],))
    y2 = ops.repeat_axes(ops.unsqueeze(y, 3), (3,), (x.shape[0],))  # [b,n,k,m]
    return ops.reduce(ops.mul(y2, x2), "sum", (2,))


CONTRACTIONS = {
    "matmul": (lambda a, b: ops.matmul(a, b), [S(("b", 4, 8)), S((8, 3))]),
    "batched-broadcast": (lambda a, b: a @ b, [S(("b", 2, 4, 8)), S((2, 8, 3))]),
    "linear-bias": (lambda x: ops.linear(x, ops.param("fc.weight", torch.randn(5, 8)),
                                         ops.param("fc.bias", torch.randn(5))),
                    [S(("b", 3, 8))]),
    "hand-odd-order": (_hand_matmul, [S((4, "b", 7)), S((6, 4))]),
    "hand-batch-middle": (_hand_bmm, [S((5, "b", 4)), S(("b", 3, 4))]),
    "einsum-transposed-out": (lambda x, y: ops.einsum("bij,bjk->bki", x, y),
                              [S(("b", 3, 4)), S(("b", 4, 5))]),
    "einsum-two-contracted": (lambda x, w: ops.einsum("bij,ij->b", x, w),
                              [S(("b", 3, 4)), S((3, 4))]),
    "einsum-heads": (lambda q, k: ops.einsum("blhe,bshe->bhls", q, k),
                     [S(("b", 5, 2, 8)), S(("b", 6, 2, 8))]),
    "matvec": (lambda a, v: ops.matmul(a, v), [S(("b", 4, 8)), S((8,))]),
}


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

def _conv(**kw):
    groups = kw.get("groups", 1)
    w, b = torch.randn(6, 4 // groups, 3, 3), torch.randn(6)
    return lambda x: ops.conv(x, ops.param("w", w), ops.param("bias", b), **kw)


def _hand_nhwc_conv(x):
    """A 3x3 conv on x[N, H, W, C] with w[kh, kw, C, Co] and no reshape or NCHW anywhere."""
    w = ops.param("w", torch.randn(3, 3, 4, 5))
    win = ops.unfold(ops.unfold(ops.pad(x, [(0, 0), (1, 1), (1, 1), (0, 0)]), 1, 3), 2, 3)
    win = ops.unsqueeze(win, 6)                                # [N, Ho, Wo, C, kh, kw, 1]
    w = ops.permute(w, 2, 0, 1, 3)                             # [C, kh, kw, Co]
    return ops.sum(win * w, (3, 4, 5))                         # [N, Ho, Wo, Co]


CONVS = {
    "plain": (_conv(), S(("b", 4, 9, 9))),
    "padded": (_conv(padding=1), S(("b", 4, 9, 9))),
    "strided": (_conv(stride=2, padding=1), S(("b", 4, 9, 9))),
    "dilated": (_conv(dilation=2), S(("b", 4, 9, 9))),
    "grouped": (_conv(groups=2, padding=1), S(("b", 4, 9, 9))),
    "same": (_conv(padding="same"), S(("b", 4, 9, 9))),
    "1d": (lambda x: ops.conv(x, ops.param("w", torch.randn(5, 4, 3)), stride=2),
           S(("b", 4, 9))),
    "3d": (lambda x: ops.conv(x, ops.param("w", torch.randn(2, 4, 1, 3, 3))),
           S(("b", 4, 3, 5, 5))),
    "depthwise": (lambda x: ops.conv(x, ops.param("w", torch.randn(4, 1, 3, 3)), groups=4,
                                     padding=1), S(("b", 4, 9, 9))),
    "one-channel": (lambda x: ops.conv(x, ops.param("w", torch.randn(3, 1, 3))),
                    S(("b", 1, 9))),
    "hand-nhwc": (_hand_nhwc_conv, S(("b", 7, 7, 4))),
}


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


POOLS = {
    "max": (lambda x: ops.max_pool(x, 2), Op.max_pool),
    "max-padded": (lambda x: ops.max_pool(x, 3, stride=2, padding=1), Op.max_pool),
    "max-dilated": (lambda x: ops.max_pool(x, 2, dilation=2), Op.max_pool),
    "avg": (lambda x: ops.avg_pool(x, 3, stride=2, padding=1), Op.avg_pool),
    # ONNX's default: the mean of the real cells only (a counts table divides the sums)
    "avg-excluding-pad": (lambda x: ops.avg_pool(x, 3, stride=1, padding=1,
                                                 count_include_pad=False), Op.avg_pool),
    "adaptive-avg": (lambda x: ops.adaptive_avg_pool(x, 3), Op.avg_pool),
    "global-avg": (lambda x: ops.adaptive_avg_pool(x, 1), Op.avg_pool),
    "global-max": (lambda x: ops.adaptive_max_pool(x, 1), Op.max_pool),
    "max-1d-on-last": (lambda x: ops.max_pool(x, 3, spatial_dims=1), Op.max_pool),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_windowed_reductions_become_pools(name):
    fn, kernel = POOLS[name]
    only(lowered(fn, S(("b", 4, 9, 9))), kernel)


RESIZES = {
    "bilinear-x2": dict(scale_factor=2, mode="bilinear"),
    "bilinear-size": dict(size=(5, 13), mode="bilinear"),
    "bilinear-corners": dict(size=(16, 12), mode="bilinear", align_corners=True),
    "nearest-x2": dict(scale_factor=2),
    "nearest-size": dict(size=(5, 13)),
}


@pytest.mark.parametrize("name", list(RESIZES))
def test_resampling_becomes_one_resize(name):
    fn = lambda x: ops.interpolate(x, **RESIZES[name])  # noqa: E731
    only(lowered(fn, S(("b", 3, 8, 6))), Op.resize)


# -- softmax, norms, activations --------------------------------------------------------------

def _naive_softmax(x):
    e = ops.exp(x)
    return e * ops.reciprocal(ops.sum(e, 1, keepdim=True))


NN = {
    "softmax": (lambda x: ops.softmax(x, 1), Op.softmax),
    "softmax-unshifted": (_naive_softmax, Op.softmax),
    "log-softmax": (lambda x: ops.log_softmax(x, -1), Op.log_softmax),
    "layer-norm": (lambda x: ops.layer_norm(x, 8, ops.param("w", torch.randn(8)),
                                            ops.param("b", torch.randn(8))), Op.layer_norm),
    "layer-norm-2-axes": (lambda x: ops.layer_norm(x, (5, 8)), Op.layer_norm),
    "rms-norm": (lambda x: ops.rms_norm(x, 8, ops.param("w", torch.randn(8)), 1e-6), Op.rms_norm),
    "gelu": (lambda x: ops.gelu(x), Op.gelu),
    "gelu-tanh": (lambda x: ops.gelu(x, "tanh"), Op.gelu),
    "gelu-by-hand": (lambda x: 0.5 * x * (1.0 + ops.erf(x / math.sqrt(2.0))), Op.gelu),
    "silu": (lambda x: ops.silu(x), Op.silu),
    "silu-as-x-sigmoid": (lambda x: x * ops.sigmoid(x), Op.silu),
    "sigmoid": (lambda x: ops.sigmoid(x), Op.sigmoid),
    "relu": (lambda x: ops.relu(x), Op.relu),
    "relu-as-maximum": (lambda x: ops.maximum(x, 0.0), Op.relu),
    "relu6": (lambda x: ops.relu6(x), Op.clamp),
    "clamp": (lambda x: ops.clamp(x, -0.5, 2.0), Op.clamp),
    "hardswish": (lambda x: ops.hardswish(x), Op.hardswish),
}


@pytest.mark.parametrize("name", list(NN))
def test_nn_chains_become_kernels(name):
    fn, kernel = NN[name]
    only(lowered(fn, S(("b", 5, 8))), kernel)


CHANNEL_NORMS = {
    "group-norm": (lambda x: ops.group_norm(x, 3, ops.param("w", torch.randn(6)),
                                            ops.param("b", torch.randn(6))), Op.group_norm),
    "instance-norm": (lambda x: ops.instance_norm(x, weight=ops.param("w", torch.randn(6)),
                                                  bias=ops.param("b", torch.randn(6))),
                      Op.group_norm),
    "batch-norm": (lambda x: ops.batch_norm(x, ops.buffer("m", torch.randn(6)),
                                            ops.buffer("v", torch.rand(6) + 0.5),
                                            ops.param("w", torch.randn(6)),
                                            ops.param("b", torch.randn(6))), Op.batch_norm),
}


@pytest.mark.parametrize("name", list(CHANNEL_NORMS))
def test_channel_norms_become_kernels_with_their_affine(name):
    fn, kernel = CHANNEL_NORMS[name]
    counts = lowered(fn, S(("b", 6, 4, 4)))
    only(counts, kernel)


# -- attention --------------------------------------------------------------------------------

def _sdpa(**kw):
    return lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, **kw)


def _hand_blhe_attention(q, k, v, causal=False):
    """Attention on [batch, length, heads, features] written with einsum, scale on q."""
    s = ops.einsum("blhe,bshe->bhls", q * 0.125, k)
    if causal:
        rows = ops.unsqueeze(ops.arange(0, q.shape[1], like=q), 1)
        cols = ops.unsqueeze(ops.arange(0, k.shape[1], like=q), 0)
        s = ops.where(ops.ge(rows, cols), s, float("-inf"))
    return ops.einsum("bhls,bshe->blhe", ops.softmax(s, -1), v)


ATTENTION = {
    "sdpa": (_sdpa(), [S(("b", 3, 5, 8))] * 3),
    "sdpa-causal": (_sdpa(is_causal=True), [S(("b", 3, "s", 8))] * 3),
    "sdpa-scale": (_sdpa(scale=0.3), [S(("b", 3, 5, 8)), S(("b", 3, 6, 8)), S(("b", 3, 6, 4))]),
    "hand-blhe": (_hand_blhe_attention, [S(("b", 5, 2, 8))] * 3),
    "hand-blhe-causal": (lambda q, k, v: _hand_blhe_attention(q, k, v, True),
                         [S(("b", 5, 2, 8))] * 3),
}


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
    prog = tdag.trace(_sdpa(is_causal=True), *[S(("b", 3, "s", 8))] * 3)
    (node,) = [n for n in lower(prog).graph.nodes if n.op is Op.attention]
    assert node.spec.causal and len(node.inputs) == 3
    assert node.spec.scale == pytest.approx(1 / math.sqrt(8))


# -- recurrence -------------------------------------------------------------------------------

def _hand_lstm(x, h, c, reverse=False, name="", hidden=3):
    """One LSTM layer over x[T, B, I] from state h, c [B, hidden], unrolled with tdag.ops."""
    torch.manual_seed(2 + len(name))
    size, n = x.shape[-1], 4 * hidden
    w_ih, w_hh = (ops.param(f"{name}w_ih", torch.randn(n, size)),
                  ops.param(f"{name}w_hh", torch.randn(n, hidden)))
    b_ih, b_hh = ops.param(f"{name}b_ih", torch.randn(n)), ops.param(f"{name}b_hh", torch.randn(n))
    projected = ops.linear(x, w_ih, b_ih)
    outs = {}
    for t in (reversed(range(x.shape[0])) if reverse else range(x.shape[0])):
        i, f, g, o = ops.chunk(ops.add(ops.select(projected, 0, t), ops.linear(h, w_hh, b_hh)),
                               4, -1)
        c = ops.sigmoid(f) * c + ops.sigmoid(i) * ops.tanh(g)
        h = outs[t] = ops.sigmoid(o) * ops.tanh(c)
    return ops.stack([outs[t] for t in range(x.shape[0])], 0)


def _hand_bilstm_stack(x, h, c):
    """Two bidirectional layers, as torch's nn.LSTM(bidirectional=True, num_layers=2)."""
    for layer in range(2):
        x = ops.concat([_hand_lstm(x, h, c, False, f"l{layer}."),
                        _hand_lstm(x, h * 0.5, c, True, f"l{layer}.reverse.")], -1)
    return x


@pytest.mark.parametrize("reverse", [False, True])
def test_unrolled_lstm_becomes_one_kernel(reverse):
    counts = lowered(lambda x, h, c: _hand_lstm(x, h, c, reverse), S((5, "b", 4)),
                     S(("b", 3)), S(("b", 3)))
    only(counts, Op.lstm)


def test_bidirectional_lstm_layers_become_one_kernel():
    prog = tdag.trace(_hand_bilstm_stack, S((5, "b", 4)), S(("b", 3)), S(("b", 3)))
    counts = lowered(_hand_bilstm_stack, S((5, "b", 4)), S(("b", 3)), S(("b", 3)))
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
    # composition gives them)
    assert len(tdag.PRIMITIVES) == 43
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
