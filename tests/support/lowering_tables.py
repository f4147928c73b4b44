"""The lowering tables: traced functions that lower to each kernel, one table per family
(contractions, convolutions, pools, resizes, nn chains, channel norms, attention), hand-built
unrolled LSTMs, and ``KERNEL_PROGRAMS``, every kernel's programs for the back ends.

tests/lower/test_lower.py lowers each row and checks the kernel left; tests/reify/test_reify.py,
tests/ir/test_records.py and tests/reify/test_to_jax.py run ``KERNEL_PROGRAMS`` through the
back ends. ``random_args`` draws a program's inputs at a batch size.
"""
from __future__ import annotations

import math

import torch

import tdag
from tdag import ops
from tdag.ir.op import Op
from tdag.ir.record import NoSpec, record
from tdag.ir.types import DType
from tdag.lower.kernels.activations import Clamp, Gelu, Softmax
from tdag.lower.kernels.conv_grad import ConvWeightGrad
from tdag.lower.kernels.norms import BatchNorm, LayerNorm, RMSNorm
from tdag.lower.kernels.windows import Pool
from tdag.ops import writes
from tdag.ops.linalg import kernels
from tdag.ops.ml import (
    linear_label,
    linear_scores,
    normalize,
    svm_label,
    svm_pair_weight,
    svm_scores,
    tree_sum,
)
from tdag.ops.quantize import (
    conv_integer,
    dequantize_linear,
    dynamic_quantize_linear,
    matmul_integer,
    qlinear_conv,
    qlinear_matmul,
    quantize_linear,
)

S = tdag.TensorSpec
torch.manual_seed(0)  # the tables draw their weights as they are built


def random_args(prog, batch):
    """Random inputs of ``prog`` with every symbolic dim at ``batch``: floats normal, bools
    true with chance 0.7, integers in [0, 5)."""
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


RESIZES = {
    "bilinear-x2": dict(scale_factor=2, mode="bilinear"),
    "bilinear-size": dict(size=(5, 13), mode="bilinear"),
    "bilinear-corners": dict(size=(16, 12), mode="bilinear", align_corners=True),
    "nearest-x2": dict(scale_factor=2),
    "nearest-size": dict(size=(5, 13)),
}


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
    "abs": (lambda x: ops.abs(x), Op.abs),
    "leaky-relu": (lambda x: ops.leaky_relu(x, 0.2), Op.leaky_relu),
    "elu": (lambda x: ops.elu(x), Op.elu),
    "elu-alpha": (lambda x: ops.elu(x, 0.5), Op.elu),
    "selu": (lambda x: ops.selu(x), Op.elu),
    "celu": (lambda x: ops.celu(x, 0.5), Op.elu),
    "hardshrink": (lambda x: ops.hardshrink(x), Op.shrink),
    "softshrink": (lambda x: ops.softshrink(x, 0.3), Op.shrink),
    "hardsigmoid": (lambda x: ops.hardsigmoid(x), Op.hardsigmoid),
    "softplus": (lambda x: ops.softplus(x), Op.softplus),
    "softplus-beta": (lambda x: ops.softplus(x, 2.0, 5.0), Op.softplus),
    "mish": (lambda x: ops.mish(x), Op.mish),
    "logsigmoid": (lambda x: ops.logsigmoid(x), Op.logsigmoid),
    "floor": (lambda x: ops.floor(x), Op.rounding),
    "ceil": (lambda x: ops.ceil(x), Op.rounding),
    "round": (lambda x: ops.round(x), Op.rounding),
    "log1p": (lambda x: ops.log1p(x), Op.log1p),
    "expm1": (lambda x: ops.expm1(x), Op.expm1),
    "nan-to-num": (lambda x: ops.nan_to_num(x), Op.nan_to_num),
    "logsumexp": (lambda x: ops.logsumexp(x, -1), Op.logsumexp),
    "logsumexp-keepdim": (lambda x: ops.logsumexp(x, 1, keepdim=True), Op.logsumexp),
    "logsumexp-2-axes": (lambda x: ops.logsumexp(x, (1, 2)), Op.logsumexp),
    "var": (lambda x: ops.var(x, -1), Op.var),
    "var-biased-keepdim": (lambda x: ops.var(x, (1, 2), keepdim=True, correction=0), Op.var),
    "vector-norm": (lambda x: ops.vector_norm(x, 2, -1), Op.vector_norm),
    "vector-norm-keepdim": (lambda x: ops.vector_norm(x, 2, (1, 2), keepdim=True),
                            Op.vector_norm),
}


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


def sdpa(**kw):
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
    "sdpa": (sdpa(), [S(("b", 3, 5, 8))] * 3),
    "sdpa-causal": (sdpa(is_causal=True), [S(("b", 3, "s", 8))] * 3),
    "sdpa-scale": (sdpa(scale=0.3), [S(("b", 3, 5, 8)), S(("b", 3, 6, 8)), S(("b", 3, 6, 4))]),
    "hand-blhe": (_hand_blhe_attention, [S(("b", 5, 2, 8))] * 3),
    "hand-blhe-causal": (lambda q, k, v: _hand_blhe_attention(q, k, v, True),
                         [S(("b", 5, 2, 8))] * 3),
}


def hand_lstm(x, h, c, reverse=False, name="", hidden=3):
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


def hand_bilstm_stack(x, h, c):
    """Two bidirectional layers, as torch's nn.LSTM(bidirectional=True, num_layers=2)."""
    for layer in range(2):
        x = ops.concat([hand_lstm(x, h, c, False, f"l{layer}."),
                        hand_lstm(x, h * 0.5, c, True, f"l{layer}.reverse.")], -1)
    return x


# -- every kernel, for the back ends ----------------------------------------------------------

def _quantized(x):
    """quantize, dequantize and matmul_integer, as the ONNX importer writes them."""
    scale, zero = ops.param("s", torch.tensor(0.05)), ops.param("z", torch.tensor(3).byte())
    q = quantize_linear(x, scale, zero, DType.u8)
    w = ops.param("w", torch.randint(-128, 128, (8, 5), dtype=torch.int8))
    acc = matmul_integer(q, w, zero, ops.param("wz", torch.tensor(-2, dtype=torch.int8)))
    return ops.concat([ops.cast(acc, DType.f32), dequantize_linear(q, scale, zero)], -1)


def _dynamic_conv(x):
    """DynamicQuantizeLinear's three outputs and conv_integer, as the importer writes them."""
    q, scale, zero = dynamic_quantize_linear(x)
    w = ops.param("w", torch.randint(-128, 128, (4, 3, 3, 3), dtype=torch.int8))
    acc = conv_integer(q, w, zero, ops.param("wz", torch.tensor([-2], dtype=torch.int8)),
                       stride=1, padding=1)
    return ops.mul(ops.cast(acc, DType.f32), scale)


def _qlinear(x):
    """qlinear_conv, an 8-bit max_pool and qlinear_matmul, as the ONNX importer writes
    QLinearConv, MaxPool and QLinearMatMul."""
    p = ops.param
    xs, xz = p("xs", torch.tensor(0.05)), p("xz", torch.tensor(3).byte())
    ys, yz = p("ys", torch.tensor(0.4)), p("yz", torch.tensor(5).byte())
    q = quantize_linear(x, xs, xz, DType.u8)
    conv = qlinear_conv(q, xs, xz, p("w", torch.randint(-128, 128, (4, 3, 3, 3)).char()),
                        p("ws", torch.rand(4) / 50), p("wz", torch.tensor(0).char()), ys, yz,
                        p("b", torch.randint(-500, 500, (4,)).int()), padding=1)
    mm = qlinear_matmul(q, xs, xz, p("m", torch.randint(-128, 128, (6, 5)).char()),
                        p("ms", torch.tensor(0.01)), p("mz", torch.tensor(2).char()),
                        p("ns", torch.tensor(0.2)), p("nz", torch.tensor(7).byte()), DType.u8)
    pooled = ops.max_pool(conv, 3, 2, 1)  # an 8-bit max_pool, padded with 0 (u8's least)
    return ops.concat([ops.flatten(dequantize_linear(pooled, ys, yz), 1),
                       ops.flatten(ops.cast(mm, DType.f32), 1)], 1)


def _forest(x):
    """tree_sum, as the ONNX importer writes a tree ensemble: two trees (nodes 0-4: 0 and 1
    branch; nodes 5-7: 5 branches) of three comparison modes, node 0 sending NaN true."""
    def table(*values, dtype=torch.int64):
        return ops.const(torch.tensor(values, dtype=dtype))

    def nodes(*branches):
        return table(*[k in branches for k in range(8)], dtype=torch.bool)
    return tree_sum(x, table(0, 1, 0, 0, 0, 2, 0, 0),
                    table(0.1, -0.3, 0, 0, 0, 0.4, 0, 0, dtype=torch.float32),
                    table(1, 3, 2, 3, 4, 6, 6, 7), table(2, 4, 2, 3, 4, 7, 6, 7), table(0, 5),
                    ops.const(torch.randn(8, 2)), nodes(0), nodes(0), nodes(5), nodes(1),
                    depth=2, modes=("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT"), missing=True)


def _svms(x):
    """svm_scores as the ONNX importer writes an RBF SVMClassifier's three pair scores (a
    one-vs-one weight: classes of 2, 2 and 1 vectors) and their svm_label, and a cubic
    SVMRegressor."""
    vectors, rho = ops.const(torch.randn(5, 3)), ops.const(torch.randn(3))
    weight = svm_pair_weight(torch.randn(2, 5).numpy(), (2, 2, 1))
    pairs = svm_scores(x, vectors, ops.const(torch.from_numpy(weight).float()), rho,
                       kernel="RBF", gamma=0.5, coef0=0.0, degree=0.0, wide=True)
    target = svm_scores(x, vectors, ops.const(torch.randn(5, 1)), ops.const(torch.randn(1)),
                        kernel="POLY", gamma=0.25, coef0=1.0, degree=3.0, wide=False)
    label = ops.cast(svm_label(pairs, (4, 2, 9)), DType.f32)
    return ops.concat([pairs, target, ops.unsqueeze(label, 1)], -1)


def _linear_classifier(x):
    """A LinearClassifier's label (as f32) beside its softmax scores, as the importer writes
    them: the linear_classifier kernel's two parts."""
    weight, bias = ops.const(torch.randn(3, 4)), ops.const(torch.randn(4))
    label = ops.cast(linear_label(x, weight, bias, (7, 3, 5, 1)), DType.f32)
    return ops.concat([ops.unsqueeze(label, 1), linear_scores(x, weight, bias, "SOFTMAX")], -1)


def _bags(i, o, p):
    """embedding_bag's three modes (weighted sums, means with a padding index, maxima) over
    offsets made from ``o`` (a start 0, then o sorted: bags in [0, 6], empty ones too)."""
    table = ops.param("table", torch.randn(7, 3))
    offsets = ops.concat([ops.zeros((1,), DType.i64, like=o), ops.sort(o, 0)[0]], 0)
    return ops.concat([ops.embedding_bag(table, i, offsets, "sum", p),
                       ops.embedding_bag(table, i, offsets, "mean", padding_idx=2),
                       ops.embedding_bag(table, i, offsets, "max")], -1)


def _top_p(x):
    """transformers' top-p filter: the sorted values read and a mask sent back by one sort's
    permutation (take_along, put_along)."""
    values, order = ops.sort(x, -1)
    remove = ops.cumsum(ops.softmax(values, -1), -1) <= 0.3
    remove = ops.scatter_elements(remove, -1, order, remove)
    return ops.where(remove, -1e9, x)


def _adamw(p, g, m, v, step):
    """One AdamW update, the second moment and the step count drawn non-negative."""
    return ops.adamw_update(p, g, m, ops.abs(v), ops.abs(step), 1e-3, 0.9, 0.999, 1e-8, 1e-2)


def _linalg(a, rhs):
    """Every linear-algebra kernel, read through what its vectors' signs do not change
    (squared entries of eigen- and singular vectors), flattened side by side."""
    spd = ops.matmul(a, ops.transpose(a, 1, 2)) + ops.const(4 * torch.eye(4))
    lower = kernels.cholesky(spd)
    values, vectors = kernels.eigh(spd)
    u, s, vh = kernels.svd(rhs)
    q, r = kernels.qr(rhs)
    parts = [kernels.inv(spd), kernels.solve(spd, rhs), lower,
             ops.unsqueeze(kernels.det(spd), 1), *map(lambda x: ops.unsqueeze(x, 1),
                                                      kernels.slogdet(a)),
             values, ops.square(vectors), ops.square(u), s, ops.square(vh), q, r,
             kernels.solve_triangular(lower, rhs, upper=False)]
    return ops.concat([ops.reshape(p, (-1, math.prod(p.shape[1:]))) for p in parts], 1)


def _eig(a):
    """linalg.eig read through what the order and phase leave alone (LAPACK's and the
    composition's differ): the eigenvalues' sum (the trace) and sum_j |v_ij|^2 lambda_j per
    row, as (real, imaginary) pairs."""
    values, vectors = kernels.eig(a)
    trace = ops.view_as_real(ops.sum(values, -1))
    magnitudes = ops.sum(ops.square(ops.view_as_real(vectors)), -1)
    weighted = ops.view_as_real(ops.sum(ops.mul(ops.cast(magnitudes, values.dtype),
                                                ops.unsqueeze(values, -2)), -1))
    return ops.concat([trace, ops.reshape(weighted, (-1, 8))], 1)


def _ldl(a, rhs):
    """ldl_factor of a symmetric matrix and ldl_solve with its factors."""
    ld, pivots, _ = kernels.ldl_factor(a + ops.transpose(a, 1, 2))
    return ops.reshape(kernels.ldl_solve(ld, pivots, rhs), (-1, 12))


# to_jax refuses LDL^T (JAX has none)
JAX_REFUSED = {"linalg-ldl": "linalg_ldl_factor"}


# input gradients as tdag.grad writes them (the decomposition is that chain)
BACKWARDS = {"softmax-backward": (Op.softmax_backward, Softmax(2)),
             "gelu-backward": (Op.gelu_backward, Gelu("none")),
             "gelu-tanh-backward": (Op.gelu_backward, Gelu("tanh")),
             "relu-backward": (Op.relu_backward, NoSpec()),
             "relu6-backward": (Op.clamp_backward, Clamp(0.0, 6.0)),
             "silu-backward": (Op.silu_backward, NoSpec()),
             "layer-norm-backward": (Op.layer_norm_backward, LayerNorm(1, 1e-5)),
             "rms-norm-backward": (Op.rms_norm_backward, RMSNorm(1, 1e-6))}


def _kernel_programs():
    tables = [(k, v[0], v[1]) for k, v in CONTRACTIONS.items()]
    tables += [(k, v[0], [v[1]]) for k, v in CONVS.items()]
    tables += [(k, v[0], [S(("b", 4, 9, 9))]) for k, v in POOLS.items()]
    tables += [(k, v[0], [S(("b", 5, 8))]) for k, v in NN.items()]
    tables += [(k, (lambda kw: lambda x: ops.interpolate(x, **kw))(kw), [S(("b", 3, 8, 6))])
               for k, kw in RESIZES.items()]
    tables += [(k, v[0], [S(("b", 6, 4, 4))]) for k, v in CHANNEL_NORMS.items()]
    tables += [(k, v[0], v[1]) for k, v in ATTENTION.items()]
    tables.append(("conv-transpose", lambda x: ops.conv_transpose(
        x, ops.param("w", torch.randn(4, 3, 3, 3)), ops.param("b", torch.randn(6)), stride=2,
        padding=1, output_padding=1, groups=2), [S(("b", 4, 5, 5))]))
    tables.append(("conv-weight-grad", lambda dy, x: record(Op.conv_weight_grad).decompose(
        ConvWeightGrad((3, 3), (2, 2), (1, 1), (1, 1)), dy, x),
        [S(("b", 4, 5, 5)), S(("b", 3, 9, 9))]))
    tables += [(k, (lambda op, spec: lambda dy, x: record(op).decompose(spec, dy, x))(*v),
                [S(("b", 5, 8))] * 2) for k, v in BACKWARDS.items()]
    tables.append(("max-pool-backward", lambda dy, x: record(Op.max_pool_backward).decompose(
        Pool((3, 3), (2, 2), (1, 1), (1, 1)), dy, x), [S(("b", 4, 5, 5)), S(("b", 4, 9, 9))]))
    tables.append(("batch-norm-backward", lambda dy, var, w: record(
        Op.batch_norm_backward).decompose(BatchNorm(1e-3), dy, ops.abs(var), w),
        [S(("b", 4, 5, 5)), S((4,)), S((4,))]))  # abs: a variance is not negative
    tables.append(("adamw-update", _adamw, [S(("b", 4))] * 4 + [S(())]))
    tables.append(("lstm", lambda x, h, c: hand_lstm(x, h, c, True),
                   [S((5, "b", 4)), S(("b", 3)), S(("b", 3))]))
    tables.append(("lstm-bidirectional-stack", hand_bilstm_stack,
                   [S((5, "b", 4)), S(("b", 3)), S(("b", 3))]))
    tables.append(("quantized", _quantized, [S(("b", 8))]))
    tables.append(("quantized-conv", _dynamic_conv, [S((2, 3, 6, 6))]))
    tables.append(("qlinear", _qlinear, [S((2, 3, 6, 6))]))
    tables.append(("forest", _forest, [S(("b", 3))]))
    tables.append(("svm", _svms, [S(("b", 3))]))
    tables.append(("linear-classifier", _linear_classifier, [S(("b", 3))]))
    tables.append(("normalizer", lambda x: ops.concat(
        [normalize(x, n) for n in ("MAX", "L1", "L2")], -1), [S(("b", 5))]))
    tables.append(("concat", lambda a, b: ops.concat([a, b, a], -1), [S(("b", 3)), S(("b", 2))]))
    tables.append(("order", lambda x: ops.concat(
        [ops.topk(x, 2, -1)[0], ops.sort(x, -1)[0],
         ops.cast(ops.topk(x, 3, -1, False)[1], DType.f32),
         ops.cast(ops.unsqueeze(ops.argmax(x, 1), 1), DType.f32),
         ops.cast(ops.unsqueeze(ops.argmin(x, 1), 1), DType.f32)], -1), [S(("b", 6))]))
    tables.append(("running-extremes", lambda x: ops.concat(
        [ops.cummax(x, 1)[0], ops.cast(ops.cummax(x, 1)[1], DType.f32), ops.cummin(x, 1)[0],
         ops.cast(ops.cummin(x, 1)[1], DType.f32)], -1), [S(("b", 6))]))
    tables.append(("bags", _bags, [S((6,), "int64"), S((3,), "int64"), S((6,))]))
    tables.append(("sized-counts", lambda x: writes.bincount(ops.abs(x), minlength=4),
                   [S((6,), "int64")]))  # abs: no negative value to refuse
    tables.append(("histogram", lambda x: writes.histc(x, 5, -1.0, 1.5), [S(("b", 6))]))
    tables.append(("counts", lambda x: ops.scatter(
        ops.zeros((6,), DType.i64, like=x), ops.argmax(x, 1), 1, 0, "add"), [S(("b", 6))]))
    tables.append(("search-and-log-scan", lambda x: ops.concat(
        [ops.cast(ops.searchsorted(ops.param("edges", torch.tensor([-1.0, 0.0, 0.0, 0.5, 2.0])),
                                   x), DType.f32), ops.logcumsumexp(x, 1)], -1),
        [S(("b", 6))]))
    tables.append(("top-p", _top_p, [S(("b", 6))]))
    tables.append(("slice-write", _slice_write, [S(("b", 6, 3))]))
    tables.append(("extrema", lambda x: ops.minimum(ops.maximum(x, ops.exp(x) - 1.5),
                                                    ops.sin(x)), [S(("b", 6))]))
    tables.append(("log-add-exp", lambda x: ops.logaddexp(x, ops.sin(x)), [S(("b", 6))]))
    tables.append(("angle", lambda x: ops.atan2(ops.sin(x), x), [S(("b", 6))]))
    tables.append(("hypotenuse", lambda x: ops.hypot(ops.sin(x), x), [S(("b", 6))]))
    tables.append(("spectrum", lambda x: ops.view_as_real(ops.full_spectrum(
        ops.fft(x, 1, kind="r2c"), 1, 8)), [S(("b", 8))]))
    tables.append(("linalg", _linalg, [S(("b", 4, 4)), S(("b", 4, 3))]))
    tables.append(("linalg-eig", _eig, [S(("b", 4, 4))]))
    tables.append(("linalg-ldl", _ldl, [S(("b", 4, 4)), S(("b", 4, 3))]))
    tables.append(("experts", lambda x, offsets: ops.grouped_matmul(
        x, ops.const(torch.randn(3, 4, 5)), offsets), [S(("b", 4)), S((3,), "int64")]))
    tables.append(("movement", lambda x: ops.reshape(ops.transpose(x, 1, 2), (-1, 40)) +
                   ops.unsqueeze(ops.sum(x, (1, 2)), 1), [S(("b", 5, 8))]))
    return {name: (fn, specs) for name, fn, specs in tables}


def _slice_write(x):
    """Two writes into a fresh tensor (out[:, 2] = -x[:, 2]; out[:, 4:6] = x[:, :2]),
    functionalized as concatenations of its runs around the values."""
    out = ops.exp(x)
    out = ops.concat([ops.slice(out, 1, 0, 2), ops.neg(ops.slice(x, 1, 2, 3)),
                      ops.slice(out, 1, 3, 6)], 1)
    return ops.concat([ops.slice(out, 1, 0, 4), ops.slice(x, 1, 0, 2)], 1)


KERNEL_PROGRAMS = _kernel_programs()
