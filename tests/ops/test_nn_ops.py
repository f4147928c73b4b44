"""Differential tests of the neural-network compositions (tdag/deinops/nn*.py): each op is
traced with ``tdag.trace``, checked by ``tdag.verify``, run by ``tdag.run`` and compared with
the torch.nn.functional function it mirrors, on tables of cases (edge cases included).

Tolerance: float32, rtol=1e-4 and atol=1e-5 everywhere; nan positions must match exactly
(``equal_nan``), and so must infinities.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import tdag
from tdag import ops
from tdag.errors import ShapeError, UnsupportedOpError

RTOL, ATOL = 1e-4, 1e-5
INF, NAN = float("inf"), float("nan")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def check(fn, ref, *inputs: torch.Tensor, shapes=None, runs=None) -> tdag.Program:
    """Trace ``fn`` on specs (``shapes`` may hold symbols), verify, run and compare with
    ``ref``; ``runs`` are further input tuples to run the same program on."""
    shapes = shapes or [tuple(t.shape) for t in inputs]
    prog = tdag.trace(fn, *(tdag.TensorSpec(s, t.dtype) for s, t in zip(shapes, inputs)))
    tdag.verify(prog)
    for args in [inputs, *(runs or [])]:
        got = tdag.run(prog, *args)
        torch.testing.assert_close(got, ref(*args), rtol=RTOL, atol=ATOL, equal_nan=True)
    return prog


def batches(shape: tuple, make, sizes=(1, 3)):
    """Inputs for a symbolic leading batch: one tuple per batch size."""
    return [make((n,) + tuple(shape[1:])) for n in sizes]


# -- conv -------------------------------------------------------------------------------------

_TORCH_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_TORCH_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}

CONV_CASES = [  # x shape, weight shape, bias?, kwargs
    ((2, 4, 10), (6, 4, 3), True, {}),
    ((2, 4, 10), (6, 4, 3), False, dict(stride=2, padding=1)),
    ((2, 4, 10), (6, 2, 3), True, dict(groups=2, dilation=2, padding=4)),   # padding > kernel
    ((2, 4, 10), (8, 1, 3), True, dict(groups=4, padding="same")),          # depthwise
    ((2, 4, 11), (6, 4, 4), False, dict(padding="same", dilation=2)),       # odd total pad
    ((2, 4, 10), (6, 4, 2), True, dict(stride=4)),                           # stride > kernel
    ((4, 10), (6, 4, 3), True, dict(padding="valid")),                      # unbatched
    ((2, 3, 8, 9), (5, 3, 3, 3), True, dict(stride=(2, 1), padding=(1, 2))),
    ((2, 6, 7, 7), (6, 2, 3, 2), True, dict(groups=3, dilation=(2, 1), padding=(0, 3))),
    ((1, 4, 6, 6), (4, 1, 5, 5), False, dict(groups=4, padding=6, stride=3)),
    ((2, 3, 1, 1), (4, 3, 1, 1), True, {}),                                  # size-1 spatial
    ((0, 3, 5, 5), (4, 3, 3, 3), True, dict(padding=1)),                    # empty batch
    ((2, 2, 5, 6, 4), (3, 2, 3, 3, 2), True, dict(stride=(1, 2, 1), padding=(1, 0, 2))),
    ((1, 4, 4, 4, 4), (4, 2, 2, 3, 1), False, dict(groups=2, dilation=(2, 1, 1), padding="same")),
]


@pytest.mark.parametrize("x_shape, w_shape, has_bias, kwargs", CONV_CASES)
def test_conv(x_shape, w_shape, has_bias, kwargs):
    x, w, b = randn(*x_shape, seed=1), randn(*w_shape, seed=2), randn(w_shape[0], seed=3)
    torch_conv = _TORCH_CONV[len(w_shape) - 2]
    if has_bias:
        check(lambda x, w, b: ops.conv(x, w, b, **kwargs),
              lambda x, w, b: torch_conv(x, w, b, **kwargs), x, w, b)
    else:
        check(lambda x, w: ops.conv(x, w, **kwargs), lambda x, w: torch_conv(x, w, **kwargs), x, w)


CONV_T_CASES = [  # x shape, weight shape (C_in, C_out/groups, *K), kwargs
    ((2, 4, 6), (4, 3, 3), {}),
    ((2, 4, 6), (4, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    ((2, 4, 6), (4, 2, 3), dict(groups=2, dilation=3, padding=2, output_padding=2)),
    ((2, 4, 5), (4, 1, 2), dict(groups=4, stride=3)),                        # depthwise
    ((4, 5), (4, 2, 3), dict(stride=2)),                                     # unbatched
    ((2, 3, 4, 5), (3, 2, 3, 2), dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2))),
    ((1, 4, 3, 3), (4, 3, 3, 3), dict(groups=2, dilation=(1, 2), padding=(2, 1))),
    ((2, 2, 1, 1), (2, 3, 1, 1), {}),                                        # size-1 spatial
    ((0, 2, 3, 3), (2, 3, 2, 2), dict(stride=2)),                            # empty batch
    ((1, 2, 3, 2, 3), (2, 2, 2, 3, 2), dict(stride=(2, 1, 2), padding=(0, 1, 1),
                                          output_padding=(1, 0, 1))),
]


@pytest.mark.parametrize("x_shape, w_shape, kwargs", CONV_T_CASES)
def test_conv_transpose(x_shape, w_shape, kwargs):
    x, w = randn(*x_shape, seed=4), randn(*w_shape, seed=5)
    groups = kwargs.get("groups", 1)
    b = randn(w_shape[1] * groups, seed=6)
    torch_fn = _TORCH_CONV_T[len(w_shape) - 2]
    check(lambda x, w, b: ops.conv_transpose(x, w, b, **kwargs),
          lambda x, w, b: torch_fn(x, w, b, **kwargs), x, w, b)


def test_conv_symbolic_batch_and_length():
    w, b = randn(5, 3, 3, 3, seed=7), randn(5, seed=8)
    runs = batches((1, 3, 8, 8), lambda s: (randn(*s, seed=s[0]),))
    check(lambda x: ops.conv(x, ops.param("w", w), ops.param("b", b), stride=2, padding=1),
          lambda x: F.conv2d(x, w, b, stride=2, padding=1), *runs[0],
          shapes=[("b", 3, 8, 8)], runs=runs[1:])
    # a symbolic sequence length: 'same' padding keeps it, a transpose doubles it
    w1 = randn(4, 4, 3, seed=9)
    prog = tdag.trace(lambda x: ops.conv_transpose(ops.conv(x, ops.param("w", w1), padding="same"),
                                                   ops.param("wt", w1), stride=2),
                      tdag.TensorSpec(("b", 4, "t")))
    tdag.verify(prog)
    for n, t in ((1, 5), (3, 9)):
        x = randn(n, 4, t, seed=t)
        want = F.conv_transpose1d(F.conv1d(x, w1, padding="same"), w1, stride=2)
        torch.testing.assert_close(tdag.run(prog, x), want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("fn", [
    lambda x, w: ops.conv(x, w, groups=2),                  # 3 channels, 2 groups
    lambda x, w: ops.conv(x, w, padding="same", stride=2),  # torch refuses it too
    lambda x, w: ops.conv(x, w, padding=0, dilation=9),     # window longer than the input
])
def test_conv_errors(fn):
    with pytest.raises(ShapeError):
        tdag.trace(fn, tdag.TensorSpec((1, 3, 6, 6)), tdag.TensorSpec((4, 3, 3, 3)))


# -- pooling ----------------------------------------------------------------------------------

def _pool_input(shape, seed=10, specials=False) -> torch.Tensor:
    x = randn(*shape, seed=seed)
    if specials:  # -inf and nan must propagate as in torch
        flat = x.view(-1)
        flat[0], flat[7] = NAN, -INF
    return x


MAX_POOL_CASES = [  # x shape, kernel_size, kwargs
    ((2, 3, 10), 3, {}),
    ((2, 3, 10), 3, dict(stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 11), 2, dict(stride=5)),                                          # stride > kernel
    ((2, 3, 10), 3, dict(dilation=2, padding=1, ceil_mode=True, stride=2)),
    ((2, 3, 9, 10), (3, 2), dict(stride=(2, 3), padding=(1, 1), ceil_mode=True)),
    ((2, 3, 9, 10), 3, dict(stride=2, dilation=(2, 1))),
    ((1, 2, 1, 1), 1, {}),                                                    # size-1 axes
    ((0, 3, 6, 6), 2, {}),                                                    # empty batch
    ((3, 7, 7), (2, 2), dict(ceil_mode=True)),                               # unbatched 2-d
    ((1, 2, 5, 6, 7), 2, dict(stride=(1, 2, 3), padding=1, ceil_mode=True)),
]


@pytest.mark.parametrize("x_shape, kernel, kwargs", MAX_POOL_CASES)
@pytest.mark.parametrize("specials", [False, True])
def test_max_pool(x_shape, kernel, kwargs, specials):
    x = _pool_input(x_shape, specials=specials and math.prod(x_shape) > 8)
    d = len(kernel) if isinstance(kernel, tuple) else len(x_shape) - 2
    torch_fn = (F.max_pool1d, F.max_pool2d, F.max_pool3d)[d - 1]
    check(lambda x: ops.max_pool(x, kernel, **kwargs), lambda x: torch_fn(x, kernel, **kwargs), x)


AVG_POOL_CASES = [  # x shape, kernel_size, kwargs
    ((2, 3, 10), 3, {}),
    ((2, 3, 10), 3, dict(stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 10), 3, dict(stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((2, 3, 11), 2, dict(stride=4)),
    ((2, 3, 9, 10), (3, 2), dict(stride=(2, 3), padding=(1, 1), count_include_pad=False)),
    ((2, 3, 9, 10), 3, dict(stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((2, 3, 9, 10), 3, dict(stride=2, padding=1, ceil_mode=True)),
    ((2, 3, 9, 10), 3, dict(stride=2, padding=1, divisor_override=5)),
    ((0, 3, 6, 6), 2, {}),
    ((1, 2, 5, 6, 7), 3, dict(stride=2, padding=1, ceil_mode=True, count_include_pad=False)),
    ((1, 2, 4, 4, 4), (2, 3, 1), dict(stride=(2, 1, 3))),
]


@pytest.mark.parametrize("x_shape, kernel, kwargs", AVG_POOL_CASES)
def test_avg_pool(x_shape, kernel, kwargs):
    x = _pool_input(x_shape)
    d = len(kernel) if isinstance(kernel, tuple) else len(x_shape) - 2
    torch_fn = (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d)[d - 1]
    check(lambda x: ops.avg_pool(x, kernel, **kwargs), lambda x: torch_fn(x, kernel, **kwargs), x)


@pytest.mark.parametrize("kwargs", [dict(padding=1, count_include_pad=False),
                                    dict(padding=1), dict(stride=2, ceil_mode=False)])
def test_pool_symbolic_sizes(kwargs):
    """Batch and spatial sizes symbolic: the divisor is built from the traced shape."""
    runs = [(randn(n, 2, h, w, seed=h),) for n, h, w in ((1, 5, 6), (3, 7, 4))]
    check(lambda x: ops.avg_pool(x, 3, **kwargs), lambda x: F.avg_pool2d(x, 3, **kwargs),
          *runs[0], shapes=[("b", 2, "h", "w")], runs=runs[1:])
    kwargs = {k: v for k, v in kwargs.items() if k != "count_include_pad"}
    check(lambda x: ops.max_pool(x, 3, **kwargs), lambda x: F.max_pool2d(x, 3, **kwargs),
          *runs[0], shapes=[("b", 2, "h", "w")], runs=runs[1:])


ADAPTIVE_CASES = [  # x shape, output size
    ((2, 3, 10), 5), ((2, 3, 10), 3), ((2, 3, 7), 7), ((2, 3, 5), 8), ((2, 3, 7), 1),
    ((2, 3, 9, 10), (3, 4)), ((2, 3, 9, 10), (4, None)), ((2, 3, 9, 10), 1), ((0, 3, 5, 5), 2),
    ((1, 2, 5, 6, 7), (2, 3, 4)), ((1, 2, 4, 4, 4), 2),
]


@pytest.mark.parametrize("x_shape, size", ADAPTIVE_CASES)
@pytest.mark.parametrize("kind", ["avg", "max"])
def test_adaptive_pool(x_shape, size, kind):
    x = _pool_input(x_shape)
    d = len(x_shape) - 2
    torch_fn = getattr(F, f"adaptive_{kind}_pool{d}d")
    ours = getattr(ops, f"adaptive_{kind}_pool")
    check(lambda x: ours(x, size), lambda x: torch_fn(x, size), x)


def test_adaptive_pool_symbolic_batch():
    runs = batches((1, 3, 9, 10), lambda s: (randn(*s, seed=s[0]),))
    check(lambda x: ops.adaptive_avg_pool(x, (4, 3)), lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
          *runs[0], shapes=[("b", 3, 9, 10)], runs=runs[1:])


# -- interpolate ------------------------------------------------------------------------------

INTERP_CASES = [  # x shape, mode, kwargs
    ((2, 3, 7), "nearest", dict(size=12)),
    ((2, 3, 7), "nearest", dict(scale_factor=2)),
    ((2, 3, 7), "nearest", dict(scale_factor=0.6)),
    ((2, 3, 5, 6), "nearest", dict(size=(9, 4))),
    ((2, 3, 5, 6), "nearest", dict(scale_factor=(1.7, 0.5))),
    ((1, 2, 3, 4, 5), "nearest", dict(size=(5, 2, 7))),
    ((2, 3, 7), "linear", dict(size=12, align_corners=False)),
    ((2, 3, 7), "linear", dict(size=12, align_corners=True)),
    ((2, 3, 7), "linear", dict(scale_factor=0.5)),
    ((2, 3, 5, 6), "bilinear", dict(size=(9, 4))),
    ((2, 3, 5, 6), "bilinear", dict(size=(9, 4), align_corners=True)),
    ((2, 3, 5, 6), "bilinear", dict(scale_factor=2.5)),
    ((2, 3, 5, 6), "bilinear", dict(scale_factor=2.5, recompute_scale_factor=True)),
    ((2, 3, 5, 6), "bilinear", dict(size=(1, 1), align_corners=True)),
    ((2, 3, 1, 1), "bilinear", dict(size=(3, 2))),
    ((2, 3, 5, 6), "bicubic", dict(size=(9, 4))),
    ((2, 3, 5, 6), "bicubic", dict(size=(9, 4), align_corners=True)),
    ((2, 3, 5, 6), "bicubic", dict(scale_factor=(2.5, 0.7))),
    ((2, 3, 2, 1), "bicubic", dict(size=(5, 3))),
    ((1, 2, 3, 4, 5), "trilinear", dict(size=(5, 2, 7))),
    ((1, 2, 3, 4, 5), "trilinear", dict(scale_factor=(2, 1.5, 0.8), align_corners=True)),
]


@pytest.mark.parametrize("x_shape, mode, kwargs", INTERP_CASES)
def test_interpolate(x_shape, mode, kwargs):
    x = randn(*x_shape, seed=11)
    check(lambda x: ops.interpolate(x, mode=mode, **kwargs),
          lambda x: F.interpolate(x, mode=mode, **kwargs), x)


def test_interpolate_symbolic_batch():
    runs = batches((1, 3, 5, 6), lambda s: (randn(*s, seed=s[0]),))
    check(lambda x: ops.interpolate(x, size=(8, 8), mode="bilinear"),
          lambda x: F.interpolate(x, size=(8, 8), mode="bilinear"),
          *runs[0], shapes=[("b", 3, 5, 6)], runs=runs[1:])


# -- torch_pad --------------------------------------------------------------------------------

PAD_CASES = [  # x shape, flat pad, mode, value
    ((2, 3, 6), (2, 3), "constant", 1.5),
    ((2, 3, 6), (-2, 1), "constant", 0.0),                                   # negative crops
    ((2, 3, 5, 6), (1, 2, 3, 0), "constant", -INF),
    ((2, 3, 5, 6), (1, 1, 1, 1, 1, 2), "constant", 0.0),                     # pads channels too
    ((2, 3, 6), (5, 2), "reflect", None),
    ((2, 3, 5, 6), (2, 3, 4, 1), "reflect", None),
    ((1, 2, 3, 4, 5), (1, 2, 2, 0, 1, 1), "reflect", None),
    ((2, 3, 6), (4, 7), "replicate", None),
    ((2, 3, 5, 6), (0, 3, 2, 1), "replicate", None),
    ((1, 2, 3, 4, 5), (3, 1, 0, 2, 2, 2), "replicate", None),
    ((2, 3, 6), (6, 2), "circular", None),
    ((2, 3, 5, 6), (2, 3, 5, 1), "circular", None),
    ((1, 2, 3, 4, 5), (1, 0, 2, 4, 3, 1), "circular", None),
]


@pytest.mark.parametrize("x_shape, pad, mode, value", PAD_CASES)
def test_torch_pad(x_shape, pad, mode, value):
    x = randn(*x_shape, seed=12)
    check(lambda x: ops.torch_pad(x, pad, mode, value), lambda x: F.pad(x, pad, mode, value), x)


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular", "constant"])
def test_torch_pad_symbolic(mode):
    """Reflect's right edge indexes from the traced (symbolic) length."""
    runs = [(randn(n, 3, h, w, seed=w),) for n, h, w in ((1, 5, 6), (3, 4, 9))]
    check(lambda x: ops.torch_pad(x, (2, 3, 1, 2), mode), lambda x: F.pad(x, (2, 3, 1, 2), mode),
          *runs[0], shapes=[("b", 3, "h", "w")], runs=runs[1:])


# -- activations ------------------------------------------------------------------------------

_SPECIAL = torch.tensor([-INF, INF, NAN, 0.0, -0.0, 1e-7, -1e-7, 3.0, -3.0, 6.0, 19.9, 20.1,
                         25.0, -25.0, 90.0, -90.0, 100.0, -100.0])

ACTIVATIONS = [  # name, ours, torch's, whether torch agrees with itself on +inf
    ("relu", ops.relu, F.relu, True),
    ("relu6", ops.relu6, F.relu6, True),
    ("leaky_relu", lambda x: ops.leaky_relu(x, 0.2), lambda x: F.leaky_relu(x, 0.2), True),
    ("sigmoid", ops.sigmoid, torch.sigmoid, True),
    ("silu", ops.silu, F.silu, True),
    # torch's erf-gelu(+inf) is inf on its scalar path but nan on its vectorised one
    ("gelu", ops.gelu, F.gelu, False),
    ("gelu_tanh", lambda x: ops.gelu(x, "tanh"), lambda x: F.gelu(x, approximate="tanh"), True),
    ("softplus", ops.softplus, F.softplus, True),
    ("softplus_beta", lambda x: ops.softplus(x, 2.0, 10.0), lambda x: F.softplus(x, 2.0, 10.0),
     True),
    ("elu", lambda x: ops.elu(x, 0.7), lambda x: F.elu(x, 0.7), True),
    ("hardtanh", lambda x: ops.hardtanh(x, -2.0, 0.5), lambda x: F.hardtanh(x, -2.0, 0.5), True),
    ("hardsigmoid", ops.hardsigmoid, F.hardsigmoid, True),
    ("hardswish", ops.hardswish, F.hardswish, True),
    ("mish", ops.mish, F.mish, True),
    ("tanh", ops.tanh, torch.tanh, True),
]


@pytest.mark.parametrize("name, ours, theirs, pos_inf_agrees", ACTIVATIONS,
                         ids=[a[0] for a in ACTIVATIONS])
def test_activation(name, ours, theirs, pos_inf_agrees):
    specials = _SPECIAL if pos_inf_agrees else _SPECIAL.nan_to_num(posinf=0.0, nan=NAN)
    x = torch.cat([randn(40, seed=13) * 5, specials]).reshape(2, -1)
    check(lambda x: ours(x), theirs, x)
    runs = batches((1, 7), lambda s: (randn(*s, seed=s[0]) * 4,))
    check(lambda x: ours(x), theirs, *runs[0], shapes=[("b", 7)], runs=runs[1:])


# -- softmax family ---------------------------------------------------------------------------

def _rows_with_specials() -> torch.Tensor:
    x = randn(5, 6, seed=14) * 3
    x[1] = -INF              # a fully masked row: nan for softmax, -inf for logsumexp
    x[2, :3] = -INF          # partly masked
    x[3, 4] = INF            # +inf: nan for softmax, +inf for logsumexp
    x[4, 0] = NAN
    return x


SOFTMAX_CASES = [  # ours, torch's
    (lambda x: ops.softmax(x, -1), lambda x: torch.softmax(x, -1)),
    (lambda x: ops.softmax(x, 0), lambda x: torch.softmax(x, 0)),
    (lambda x: ops.log_softmax(x, -1), lambda x: torch.log_softmax(x, -1)),
    (lambda x: ops.log_softmax(x, 0), lambda x: torch.log_softmax(x, 0)),
    (lambda x: ops.logsumexp(x, -1), lambda x: torch.logsumexp(x, -1)),
    (lambda x: ops.logsumexp(x, 0, keepdim=True), lambda x: torch.logsumexp(x, 0, keepdim=True)),
    (lambda x: ops.logsumexp(x, (0, 1)), lambda x: torch.logsumexp(x, (0, 1))),
]


@pytest.mark.parametrize("ours, theirs", SOFTMAX_CASES)
@pytest.mark.parametrize("data", ["random", "large", "specials"])
def test_softmax_family(ours, theirs, data):
    x = {"random": lambda: randn(5, 6, seed=15),
         "large": lambda: randn(5, 6, seed=16) * 1000,   # exp would overflow unshifted
         "specials": _rows_with_specials}[data]()
    check(ours, theirs, x)


def test_softmax_symbolic():
    runs = [(randn(n, 4, s, seed=s),) for n, s in ((1, 3), (3, 8))]
    check(lambda x: ops.softmax(x, -1), lambda x: torch.softmax(x, -1),
          *runs[0], shapes=[("b", 4, "s")], runs=runs[1:])
    check(lambda x: ops.logsumexp(x, 1), lambda x: torch.logsumexp(x, 1),
          *runs[0], shapes=[("b", 4, "s")], runs=runs[1:])


# -- norms ------------------------------------------------------------------------------------

def _affine(n: int, seed: int):
    return randn(n, seed=seed), randn(n, seed=seed + 1)


NORM_CASES = [  # name, input shape, build(x_spec_inputs...) -> (ours, theirs, extra inputs)
    "layer_norm", "layer_norm_2d", "layer_norm_plain", "rms_norm", "rms_norm_eps",
    "group_norm", "group_norm_plain", "group_norm_1group", "batch_norm", "batch_norm_2d",
    "batch_norm_train", "instance_norm", "instance_norm_running",
]


def _norm_case(name: str):
    """(x shape, ours(x, *extra), theirs(x, *extra), extra tensors)."""
    w, b = _affine(6, 20)
    rm, rv = randn(6, seed=22), randn(6, seed=23).abs() + 0.5
    return {
        "layer_norm": ((2, 3, 6), lambda x, w, b: ops.layer_norm(x, 6, w, b),
                       lambda x, w, b: F.layer_norm(x, (6,), w, b), (w, b)),
        "layer_norm_2d": ((2, 3, 6), lambda x: ops.layer_norm(x, (3, 6), eps=1e-3),
                          lambda x: F.layer_norm(x, (3, 6), eps=1e-3), ()),
        "layer_norm_plain": ((4, 6), lambda x: ops.layer_norm(x, [6]),
                             lambda x: F.layer_norm(x, [6]), ()),
        "rms_norm": ((2, 3, 6), lambda x, w: ops.rms_norm(x, (6,), w),
                     lambda x, w: F.rms_norm(x, (6,), w), (w,)),
        "rms_norm_eps": ((2, 3, 6), lambda x: ops.rms_norm(x, (3, 6), eps=0.1),
                         lambda x: F.rms_norm(x, (3, 6), eps=0.1), ()),
        "group_norm": ((2, 6, 4, 5), lambda x, w, b: ops.group_norm(x, 3, w, b),
                       lambda x, w, b: F.group_norm(x, 3, w, b), (w, b)),
        "group_norm_plain": ((2, 6, 7), lambda x: ops.group_norm(x, 6),
                             lambda x: F.group_norm(x, 6), ()),
        "group_norm_1group": ((2, 6), lambda x: ops.group_norm(x, 1),
                              lambda x: F.group_norm(x, 1), ()),
        "batch_norm": ((2, 6, 4, 5), lambda x, m, v, w, b: ops.batch_norm(x, m, v, w, b, eps=1e-3),
                       lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, eps=1e-3),
                       (rm, rv, w, b)),
        "batch_norm_2d": ((3, 6), lambda x, m, v: ops.batch_norm(x, m, v),
                          lambda x, m, v: F.batch_norm(x, m, v), (rm, rv)),
        "batch_norm_train": ((3, 6, 5), lambda x: ops.batch_norm(x, None, None, training=True),
                             lambda x: F.batch_norm(x, None, None, training=True), ()),
        "instance_norm": ((2, 6, 4, 5), lambda x, w, b: ops.instance_norm(x, weight=w, bias=b),
                          lambda x, w, b: F.instance_norm(x, weight=w, bias=b), (w, b)),
        "instance_norm_running": (
            (2, 6, 5), lambda x, m, v: ops.instance_norm(x, m, v, use_input_stats=False),
            lambda x, m, v: F.instance_norm(x, m, v, use_input_stats=False), (rm, rv)),
    }[name]


@pytest.mark.parametrize("name", NORM_CASES)
def test_norm(name):
    shape, ours, theirs, extra = _norm_case(name)
    x = randn(*shape, seed=24) * 3 + 1
    check(ours, theirs, x, *extra)


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "group_norm", "batch_norm",
                                  "instance_norm"])
def test_norm_symbolic_batch(name):
    shape, ours, theirs, extra = _norm_case(name)
    runs = batches(shape, lambda s: (randn(*s, seed=s[0]), *extra))
    check(ours, theirs, *runs[0], shapes=[("b",) + shape[1:]] + [tuple(t.shape) for t in extra],
          runs=runs[1:])


def test_layer_norm_symbolic_sequence():
    w, b = _affine(8, 25)
    runs = [(randn(n, s, 8, seed=s), w, b) for n, s in ((1, 3), (3, 5))]
    check(lambda x, w, b: ops.layer_norm(x, 8, w, b), lambda x, w, b: F.layer_norm(x, (8,), w, b),
          *runs[0], shapes=[("b", "s", 8), (8,), (8,)], runs=runs[1:])


# -- embedding --------------------------------------------------------------------------------

@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding(index_dtype, padding_idx):
    weight = randn(10, 4, seed=26)
    runs = [(torch.randint(0, 10, (n, 5), generator=_gen(n)).to(index_dtype), weight)
            for n in (1, 3)]
    check(lambda i, w: ops.embedding(i, w, padding_idx),
          lambda i, w: F.embedding(i, w, padding_idx), *runs[0],
          shapes=[("b", 5), (10, 4)], runs=runs[1:])


# -- attention --------------------------------------------------------------------------------

def _bool_mask(shape, seed: int, full_rows=()) -> torch.Tensor:
    mask = torch.rand(*shape, generator=_gen(seed)) > 0.3
    for r in full_rows:
        mask[..., r, :] = False  # a fully masked row: torch's safe softmax gives 0
    return mask


def _float_mask(shape, seed: int, full_rows=()) -> torch.Tensor:
    mask = randn(*shape, seed=seed)
    mask[torch.rand(*shape, generator=_gen(seed + 1)) < 0.3] = -INF
    for r in full_rows:
        mask[..., r, :] = -INF
    return mask


SDPA_CASES = [  # q, k, v shapes, mask kind, kwargs (masks broadcast from (L, S) or mask_shape)
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 5), None, {}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), None, dict(scale=0.3)),
    ((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), None, dict(is_causal=True)),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), None, dict(is_causal=True)),   # L < S
    ((2, 3, 6, 8), (2, 3, 4, 8), (2, 3, 4, 8), None, dict(is_causal=True)),   # L > S
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "bool", {}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "bool_full", {}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "float", {}),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "float_full", {}),
    ((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), "bool", dict(is_causal=True)),
    ((2, 6, 4, 8), (2, 2, 6, 8), (2, 2, 6, 4), None, dict(enable_gqa=True)),
    ((2, 6, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), "float", dict(enable_gqa=True, is_causal=True)),
    ((4, 8), (6, 8), (6, 3), "bool", {}),                                        # no batch
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "bool_full", dict(mask_shape=(2, 1, 4, 6))),
    ((2, 3, 4, 8), (2, 3, 6, 8), (2, 3, 6, 8), "float", dict(mask_shape=(3, 4, 6))),
    ((0, 3, 4, 8), (0, 3, 6, 8), (0, 3, 6, 8), None, {}),                        # empty batch
]


@pytest.mark.parametrize("q_shape, k_shape, v_shape, mask_kind, kwargs", SDPA_CASES)
def test_scaled_dot_product_attention(q_shape, k_shape, v_shape, mask_kind, kwargs):
    q, k, v = randn(*q_shape, seed=30), randn(*k_shape, seed=31), randn(*v_shape, seed=32)
    if mask_kind is None:
        check(lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, **kwargs),
              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs), q, k, v)
        return
    kwargs = dict(kwargs)
    shape = kwargs.pop("mask_shape", (q_shape[-2], k_shape[-2]))
    full = (1,) if mask_kind.endswith("full") else ()
    mask = (_bool_mask if mask_kind.startswith("bool") else _float_mask)(shape, 33, full)
    check(lambda q, k, v, m: ops.scaled_dot_product_attention(q, k, v, m, **kwargs),
          lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m, **kwargs), q, k, v, mask)


def test_attention_fully_masked_rows_give_zero():
    """torch (2.5+) returns 0 for a query that sees no key; a nan would poison later layers."""
    q, k, v = randn(1, 1, 3, 4, seed=34), randn(1, 1, 5, 4, seed=35), randn(1, 1, 5, 4, seed=36)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    prog = tdag.trace(lambda q, k, v, m: ops.scaled_dot_product_attention(q, k, v, m),
                      *(tdag.TensorSpec(t.shape, t.dtype) for t in (q, k, v, mask)))
    out = tdag.run(prog, q, k, v, mask)
    assert torch.equal(out[0, 0, 1], torch.zeros(4)) and out[0, 0, [0, 2]].isfinite().all()


def test_attention_symbolic_causal():
    """The causal mask is built from iota, so the sequence length may be symbolic."""
    runs = [tuple(randn(n, 2, s, 8, seed=s + i) for i in range(3)) for n, s in ((1, 3), (3, 7))]
    check(lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, is_causal=True),
          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
          *runs[0], shapes=[("b", 2, "s", 8)] * 3, runs=runs[1:])


def test_attention_errors():
    spec = tdag.TensorSpec((1, 3, 4, 8))
    with pytest.raises(UnsupportedOpError):
        tdag.trace(lambda q: ops.scaled_dot_product_attention(q, q, q, dropout_p=0.1), spec)
    with pytest.raises(ShapeError):
        tdag.trace(lambda q, k: ops.scaled_dot_product_attention(q, k, k, enable_gqa=True),
                   spec, tdag.TensorSpec((1, 2, 4, 8)))


# -- dropout ----------------------------------------------------------------------------------

def test_dropout():
    x = randn(2, 5, seed=40)
    check(lambda x: ops.dropout(x, 0.3), lambda x: F.dropout(x, 0.3, training=False), x)
    check(lambda x: ops.dropout(x, 0.0, training=True), lambda x: x, x)  # p=0: still identity
    with pytest.raises(UnsupportedOpError):
        tdag.trace(lambda x: ops.dropout(x, 0.3, training=True), tdag.TensorSpec((2, 5)))


# -- a small network, end to end --------------------------------------------------------------

def test_small_cnn_symbolic_batch():
    """conv -> group_norm -> silu -> max_pool -> adaptive_avg_pool -> linear -> log_softmax."""
    w1, b1 = randn(8, 3, 3, 3, seed=50) * 0.3, randn(8, seed=51)
    gw, gb = _affine(8, 52)
    w2, b2 = randn(10, 8, seed=54) * 0.3, randn(10, seed=55)

    def ours(x):
        y = ops.conv(x, ops.param("c.w", w1), ops.param("c.b", b1), padding=1)
        y = ops.silu(ops.group_norm(y, 4, ops.param("n.w", gw), ops.param("n.b", gb)))
        y = ops.adaptive_avg_pool(ops.max_pool(y, 2), 1)
        y = ops.linear(ops.reshape(y, (-1, 8)), ops.param("f.w", w2), ops.param("f.b", b2))
        return ops.log_softmax(y, -1)

    def theirs(x):
        y = F.silu(F.group_norm(F.conv2d(x, w1, b1, padding=1), 4, gw, gb))
        y = F.adaptive_avg_pool2d(F.max_pool2d(y, 2), 1).reshape(-1, 8)
        return torch.log_softmax(F.linear(y, w2, b2), -1)

    runs = batches((1, 3, 8, 8), lambda s: (randn(*s, seed=s[0]),))
    check(ours, theirs, *runs[0], shapes=[("b", 3, 8, 8)], runs=runs[1:])
