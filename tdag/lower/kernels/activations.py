"""Softmax and activation kernels: one fused elementwise pass each."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tdag import ops
from tdag.deinops import inplace
from tdag.deinops.codegen import literal
from tdag.lower.kernels.common import decomposed_onnx, float_input, per_element, reduced_type
from tdag.deinops.primitive import NoSpec, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import Aligned, AxisRule, Refuse, same_axis
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.types import DType
from tdag.ops.nn.functional import SELU_ALPHA, SELU_SCALE

# -- softmax ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Softmax:
    axis: int


def _softmax_shape(spec: Softmax, ins):
    (x,) = ins
    float_input("softmax", x)
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"softmax: axis {spec.axis} out of range for {x}")
    return x


# works along its axis only: any other axis may be the batch
SOFTMAX_BATCH = AxisRule(
    lambda s, t: {s.axis}, same_axis, lambda s, t, p: Softmax(s.axis - (p < s.axis)),
    lambda s: Softmax(s.axis + 1), mixing="normalises along the batch axis")


def _softmax_torch(node, a, code):
    return f"torch.{node.op.value}({a[0]}, {node.spec.axis})"


def _softmax_onnx(node, ins, g, cx):
    return g.node("Softmax", ins, axis=node.spec.axis)


def _log_softmax_onnx(node, ins, g, cx):
    return g.node("LogSoftmax", ins, axis=node.spec.axis)


# max, subtract, exp, sum, divide: five per element, as the decomposition
primitive(Op.softmax, Softmax, 1, _softmax_shape,
          lambda s, xs, r: torch.softmax(xs[0], s.axis), per_element(5),
          "exp/reduce/reciprocal chain makes five passes over memory; softmax makes one",
          traits=Trait.KERNEL, batch=SOFTMAX_BATCH, torch=_softmax_torch, onnx=_softmax_onnx,
          jax=lambda node, a, cx: cx.nn.softmax(a[0], axis=node.spec.axis),
          decompose=lambda s, x: ops.softmax(x, s.axis))
primitive(Op.log_softmax, Softmax, 1, _softmax_shape,
          lambda s, xs, r: torch.log_softmax(xs[0], s.axis), per_element(5),
          "x - max - log(sum(exp)) makes five passes over memory; log_softmax makes one",
          traits=Trait.KERNEL, batch=SOFTMAX_BATCH, torch=_softmax_torch,
          onnx=_log_softmax_onnx,
          jax=lambda node, a, cx: cx.nn.log_softmax(a[0], axis=node.spec.axis),
          decompose=lambda s, x: ops.log_softmax(x, s.axis))



@dataclass(frozen=True, slots=True)
class LogSumExp:
    axes: tuple
    keepdim: bool = False


def _logsumexp_onnx(node, ins, g, cx):
    # onnxruntime's ReduceLogSumExp shifts by the max and keeps +-inf rows as torch does
    return g.node("ReduceLogSumExp", [ins[0], g.const(list(node.spec.axes))],
                  keepdims=int(node.spec.keepdim))


primitive(Op.logsumexp, LogSumExp, 1,
          lambda s, ins: reduced_type("logsumexp", ins[0], s.axes, s.keepdim),
          lambda s, xs, r: torch.logsumexp(xs[0], s.axes, s.keepdim),
          lambda s, ins, out: traffic(ins, out, 4 * ins[0].numel),
          "max, an inf test, subtract, exp, sum, log and add are seven passes over memory; "
          "logsumexp makes one", traits=Trait.KERNEL,
          batch=Refuse("reduces over fixed axes: strip the batch before lowering"),
          torch=lambda node, a, code: f"torch.logsumexp({a[0]}, {node.spec.axes!r}, "
                                      f"{node.spec.keepdim})",
          onnx=_logsumexp_onnx,
          jax=lambda node, a, cx: cx.nn.logsumexp(a[0], axis=node.spec.axes,
                                                   keepdims=node.spec.keepdim),
          decompose=lambda s, x: ops.logsumexp(x, s.axes, s.keepdim))


# -- activations ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Gelu:
    approximate: str = "none"  # or "tanh"


def _float_unary(op: str):
    def rule(spec, ins):
        float_input(op, ins[0])
        if op == "gelu" and spec.approximate not in ("none", "tanh"):
            raise ShapeError("gelu: approximate must be 'none' or 'tanh', "
                             f"not {spec.approximate!r}")
        return ins[0]
    return rule


# F.gelu(x, approximate="tanh") on a float32 CPU tensor takes 3 ns an element on an Intel Xeon
# core (AVX-512): a [128, 1024] activation 403 us, 4x its erf form. The same function
# written x * sigmoid(2c (x + 0.044715 x^3)), as 0.5 (1 + tanh z) = sigmoid(2z), is five
# vectorised passes: 186 us, and nearer float64's values by the origin (1e-6 relative where
# F.gelu's is 8e-3). Below a few thousand elements the five calls cost more than they save;
# under autograd F.gelu's one derivative is kept.
GELU_TANH_MIN_ELEMENTS = 4096
_GELU_SCALE = 2 * math.sqrt(2 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """``F.gelu(x, approximate="tanh")``, as five vectorised passes where that is faster."""
    if x.numel() < GELU_TANH_MIN_ELEMENTS or not x.is_cpu or x.dtype is not torch.float32 \
            or torch.is_grad_enabled() and x.requires_grad:
        return F.gelu(x, approximate="tanh")
    y = torch.mul(x, x)
    y.mul_(_GELU_SCALE * 0.044715).add_(_GELU_SCALE).mul_(x).sigmoid_()
    return y.mul_(x)


def _gelu_torch(node, a, code):
    if node.spec.approximate == "tanh":
        return f"_rt.gelu_tanh({a[0]})"
    return inplace.unary(node, a, code, f"F.gelu({a[0]})", "torch.ops.aten.gelu_({x})")


def _gelu_overwritten(node, code) -> tuple[str, ...]:
    """The erf form writes over a dying operand; the tanh form's passes need their operand
    (``gelu_tanh``) and write a new tensor."""
    return () if node.spec.approximate == "tanh" else inplace.overwritten_operand(node, code)


def _gelu_onnx(node, ins, g, cx):
    if g.opset >= 20:
        return g.node("Gelu", ins, approximate=node.spec.approximate)
    dtype = node.type.dtype
    x = ins[0]
    if node.spec.approximate == "tanh":
        cube = g.node("Mul", [g.node("Mul", [x, x]), x])
        inner = g.node("Add", [x, g.node("Mul", [cube, g.const(0.044715, dtype)])])
        inner = g.node("Tanh", [g.node("Mul", [inner, g.const(0.7978845608028654, dtype)])])
    else:
        inner = g.node("Erf", [g.node("Mul", [x, g.const(0.7071067811865476, dtype)])])
    half = g.node("Mul", [x, g.const(0.5, dtype)])
    return g.node("Mul", [half, g.node("Add", [inner, g.const(1.0, dtype)])])


primitive(Op.gelu, Gelu, 1, _float_unary("gelu"),
          lambda s, xs, r: F.gelu(xs[0], approximate=s.approximate), per_element(5),
          "x * (1 + erf(x/sqrt 2)) / 2 is five elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_gelu_torch, onnx=_gelu_onnx, in_place=_gelu_overwritten,
          jax=lambda node, a, cx: cx.nn.gelu(a[0], approximate=node.spec.approximate == "tanh"),
          decompose=lambda s, x: ops.gelu(x, s.approximate))


def _silu_torch(node, a, code):
    return inplace.unary(node, a, code, f"F.silu({a[0]})", "F.silu({x}, inplace=True)")


def _silu_onnx(node, ins, g, cx):
    return g.node("Mul", [ins[0], g.node("Sigmoid", ins)])


primitive(Op.silu, NoSpec, 1, _float_unary("silu"), lambda s, xs, r: F.silu(xs[0]),
          per_element(5), "x / (1 + exp(-x)) is five elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_silu_torch, onnx=_silu_onnx, jax=lambda node, a, cx: cx.nn.silu(a[0]),
          in_place=inplace.overwritten_operand,
          decompose=lambda s, x: ops.silu(x))


def _sigmoid_torch(node, a, code):
    return inplace.unary(node, a, code, f"torch.sigmoid({a[0]})", "torch.sigmoid_({x})")


def _sigmoid_onnx(node, ins, g, cx):
    return g.node("Sigmoid", ins)


primitive(Op.sigmoid, NoSpec, 1, _float_unary("sigmoid"), lambda s, xs, r: torch.sigmoid(xs[0]),
          per_element(4), "1 / (1 + exp(-x)) is four elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_sigmoid_torch, onnx=_sigmoid_onnx, in_place=inplace.overwritten_operand,
          jax=lambda node, a, cx: cx.nn.sigmoid(a[0]), decompose=lambda s, x: ops.sigmoid(x))


def _relu_torch(node, a, code):
    return inplace.unary(node, a, code, f"torch.relu({a[0]})", "torch.relu_({x})")


def _relu_onnx(node, ins, g, cx):
    return g.node("Relu", ins)


primitive(Op.relu, NoSpec, 1, lambda s, ins: ins[0], lambda s, xs, r: torch.relu(xs[0]),
          per_element(1), "(x + |x|) / 2 or where(x > 0, x, 0) is several passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_relu_torch, onnx=_relu_onnx, jax=lambda node, a, cx: cx.nn.relu(a[0]),
          in_place=inplace.overwritten_operand,
          decompose=lambda s, x: ops.relu(x))


@dataclass(frozen=True, slots=True)
class Clamp:
    """``min(max(x, lo), hi)`` propagating nan (torch.clamp); None leaves a side open."""

    lo: float | None = None
    hi: float | None = None


def _clamp_eval(spec: Clamp, xs, resolve):
    return torch.clamp(xs[0], spec.lo, spec.hi)


def _clamp_torch(node, a, code):
    lo, hi, dtype = node.spec.lo, node.spec.hi, node.type.dtype
    bounds = f"{'None' if lo is None else literal(lo, dtype)}, " \
             f"{'None' if hi is None else literal(hi, dtype)}"
    return inplace.unary(node, a, code, f"torch.clamp({a[0]}, {bounds})",
                         f"torch.clamp_({{x}}, {bounds})")


# the float types onnxruntime registers a Clip kernel for (it runs bfloat16 through a
# function of Less and Where that it has no kernels for either); the clamp kernel is lowered
# for floats only
_CLIP_TYPES = frozenset({DType.f64, DType.f32, DType.f16})


def _clamp_onnx(node, ins, g, cx):
    """One Clip, which onnxruntime fuses into the Conv or Gemm before it (ReLU6 after each
    of MobileNet's convolutions); its Clip and that fused Conv keep nan as torch.clamp does
    (ONNX does not specify it: tests/reify/test_onnx_fusable.py checks onnxruntime's). Max
    then Min, which propagate nan everywhere, for the other types."""
    dtype, out = node.type.dtype, ins[0]
    if dtype in _CLIP_TYPES:
        # a bound left out is the type's largest finite value in onnxruntime, which would
        # clip an infinity: the open side is the infinity itself
        lo = float("-inf") if node.spec.lo is None else node.spec.lo
        hi = float("inf") if node.spec.hi is None else node.spec.hi
        return g.node("Clip", [out, g.const(lo, dtype), g.const(hi, dtype)])
    if node.spec.lo is not None:
        out = g.node("Max", [out, g.const(node.spec.lo, dtype)])
    if node.spec.hi is not None:
        out = g.node("Min", [out, g.const(node.spec.hi, dtype)])
    return out


primitive(Op.clamp, Clamp, 1, lambda s, ins: ins[0], _clamp_eval, per_element(2),
          "max/min with nan checks are two compares and two selects per bound",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_clamp_torch, onnx=_clamp_onnx, in_place=inplace.overwritten_operand,
          jax=lambda node, a, cx: cx.jnp.clip(a[0], node.spec.lo, node.spec.hi),  # keeps nan
          decompose=lambda s, x: ops.clamp(x, s.lo, s.hi))


# -- maximum / minimum of two tensors ---------------------------------------------------------


def _extremum_shape(op: str):
    def rule(spec, ins):
        a, b = ins
        if a != b:
            raise ShapeError(f"{op}: two tensors of one type, got {a} and {b}")
        return a
    return rule


def _extremum_torch(fn: str):
    def emit(node, a, code):
        fresh = f"torch.{fn}({a[0]}, {a[1]})"
        k = inplace.written_operand(node, a, code)
        return fresh if k is None else inplace.in_place(fresh, f"torch.{fn}({a[0]}, {a[1]}, "
                                                               f"out={a[k]})")
    return emit


def _extremum(op: Op, fn: str, onnx: str, compose) -> None:
    """``op``: torch's ``fn`` of two tensors (nan where either is nan; on a tie the first,
    where the composition takes the second: the two differ only in a zero's sign)."""
    primitive(op, NoSpec, 2, _extremum_shape(fn), lambda s, xs, r: getattr(torch, fn)(*xs),
              per_element(1),
              f"where(a {'>' if fn == 'maximum' else '<'} b or isnan(a), a, b) is four "
              "elementwise passes and two bool tensors",
              traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
              torch=_extremum_torch(fn), onnx=lambda node, ins, g, cx: g.node(onnx, ins),
              in_place=inplace.overwritten_operand,
              jax=lambda node, a, cx: getattr(cx.jnp, fn)(*a),  # nan propagating too
              decompose=lambda s, a, b: compose(a, b))


_extremum(Op.maximum, "maximum", "Max", ops.maximum)
_extremum(Op.minimum, "minimum", "Min", ops.minimum)


def _hardswish_torch(node, a, code):
    return inplace.unary(node, a, code, f"F.hardswish({a[0]})", "F.hardswish({x}, inplace=True)")


def _hardswish_onnx(node, ins, g, cx):
    return g.node("HardSwish", ins)


primitive(Op.hardswish, NoSpec, 1, _float_unary("hardswish"),
          lambda s, xs, r: F.hardswish(xs[0]), per_element(4),
          "x * clamp(x + 3, 0, 6) / 6 is four elementwise passes",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_hardswish_torch, onnx=_hardswish_onnx, in_place=inplace.overwritten_operand,
          jax=lambda node, a, cx: cx.nn.hard_swish(a[0]), decompose=lambda s, x: ops.hardswish(x))


# -- absolute value ---------------------------------------------------------------------------

_ABS_TYPES = frozenset({DType.f16, DType.bf16, DType.f32, DType.f64,
                        DType.i8, DType.i16, DType.i32, DType.i64})


def _abs_shape(spec, ins):
    if ins[0].dtype not in _ABS_TYPES:  # an unsigned x is its own; a complex one's a hypot
        raise ShapeError(f"abs: a real float or signed integer tensor, got {ins[0]}")
    return ins[0]


def _abs_torch(node, a, code):
    return inplace.unary(node, a, code, f"torch.abs({a[0]})", "torch.abs_({x})")


primitive(Op.abs, NoSpec, 1, _abs_shape, lambda s, xs, r: torch.abs(xs[0]), per_element(1),
          "where(x == 0, 0, x * sign(x)) is four passes and a bool tensor (ONNX: six, its "
          "Sign wrapped for nan)",
          traits=Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE, batch=Aligned(),
          torch=_abs_torch, onnx=lambda node, ins, g, cx: g.node("Abs", ins),
          in_place=inplace.overwritten_operand, jax=lambda node, a, cx: cx.jnp.abs(a[0]),
          decompose=lambda s, x: ops.abs(x))


# -- torch.nn.functional's other one-pass activations -----------------------------------------

@dataclass(frozen=True, slots=True)
class LeakyRelu:
    slope: float


@dataclass(frozen=True, slots=True)
class Elu:
    """aten.elu's: scale (x > 0 ? x : alpha (exp(input_scale x) - 1)); F.elu is scale 1 and
    input_scale 1, F.selu alpha SELU_ALPHA and scale SELU_SCALE, F.celu input_scale 1 / alpha."""

    alpha: float
    scale: float = 1.0
    input_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class Softplus:
    """log(1 + exp(beta x)) / beta, or x where beta x > threshold (torch's)."""

    beta: float = 1.0
    threshold: float = 20.0


def _f_call(fn: str, args=lambda spec: "", in_place: bool = True):
    """The torch code of ``F.<fn>(x<args>)``, with ``inplace=True`` where its operand dies."""
    def emit(node, a, code):
        fresh = f"F.{fn}({a[0]}{args(node.spec)})"
        if not in_place:
            return fresh
        return inplace.unary(node, a, code, fresh,
                             f"F.{fn}({{x}}{args(node.spec)}, inplace=True)")
    return emit


_ONE_PASS = Trait.KERNEL | Trait.ELEMENTWISE | Trait.POINTWISE


primitive(Op.leaky_relu, LeakyRelu, 1, _float_unary("leaky_relu"),
          lambda s, xs, r: F.leaky_relu(xs[0], s.slope), per_element(2),
          "where(x > 0, x, x * slope) is three passes and a bool tensor",
          traits=_ONE_PASS, batch=Aligned(),
          torch=_f_call("leaky_relu", lambda s: f", {s.slope!r}"),
          onnx=lambda node, ins, g, cx: g.node("LeakyRelu", ins, alpha=node.spec.slope),
          jax=lambda node, a, cx: cx.nn.leaky_relu(a[0], node.spec.slope),
          in_place=inplace.overwritten_operand,
          decompose=lambda s, x: ops.leaky_relu(x, s.slope))

def _as_f32(value: float) -> float:
    return struct.unpack("f", struct.pack("f", value))[0]


def _is_selu(s: Elu) -> bool:
    """torch's selu, its constants as a float32 tensor's graph holds them (aten.elu computes
    a float32 tensor's in float32: the same values)."""
    return s.input_scale == 1 and _as_f32(s.alpha) == _as_f32(SELU_ALPHA) and \
        _as_f32(s.scale) == _as_f32(SELU_SCALE)


def _is_celu(s: Elu) -> bool:
    """celu(x, alpha): input_scale 1 / alpha (to float32)."""
    return s.scale == 1 and s.alpha != 0 and _as_f32(s.input_scale) == _as_f32(1.0 / s.alpha)


def _elu_torch(node, a, code):
    s, x = node.spec, a[0]
    if s.scale == 1 and s.input_scale == 1:
        return _f_call("elu", lambda s: f", {s.alpha!r}")(node, a, code)
    if _is_selu(s) and node.type.dtype is DType.f32:
        return inplace.unary(node, a, code, f"F.selu({x})", "F.selu({x}, inplace=True)")
    if _is_celu(s):
        return inplace.unary(node, a, code, f"F.celu({x}, {s.alpha!r})",
                             f"F.celu({{x}}, {s.alpha!r}, inplace=True)")
    args = f"{s.alpha!r}, {s.scale!r}, {s.input_scale!r}"
    return inplace.unary(node, a, code, f"torch.ops.aten.elu({x}, {args})",
                         f"torch.ops.aten.elu_({{x}}, {args})")


def _elu_onnx(node, ins, g, cx):
    """Elu, Selu (input_scale 1) or Celu (scale 1, input_scale 1 / alpha); ONNX has no other
    elu, so any other is the composition."""
    s = node.spec
    if s.input_scale == 1:
        return g.node("Elu", ins, alpha=s.alpha) if s.scale == 1 else \
            g.node("Selu", ins, alpha=s.alpha, gamma=s.scale)
    if _is_celu(s):
        return g.node("Celu", ins, alpha=s.alpha)
    return decomposed_onnx(node, ins, g, cx)


def _elu_jax(node, a, cx):
    s, x, jnp = node.spec, a[0], cx.jnp
    if s.scale == 1 and s.input_scale == 1:
        return cx.nn.elu(x, s.alpha)
    return s.scale * jnp.where(x > 0, x, s.alpha * jnp.expm1(s.input_scale * x))


primitive(Op.elu, Elu, 1, _float_unary("elu"),
          lambda s, xs, r: torch.ops.aten.elu(xs[0], s.alpha, s.scale, s.input_scale),
          per_element(4), "where(x > 0, x, alpha (exp(x) - 1)) is four or five passes and a "
          "bool tensor (and exp(x) - 1 loses digits by 0 that torch's expm1 keeps); selu "
          "and celu one or two more", traits=_ONE_PASS, batch=Aligned(), torch=_elu_torch,
          onnx=_elu_onnx, jax=_elu_jax, in_place=inplace.overwritten_operand,
          decompose=lambda s, x: ops.elu(x, s.alpha, s.scale, s.input_scale))

primitive(Op.hardsigmoid, NoSpec, 1, _float_unary("hardsigmoid"),
          lambda s, xs, r: F.hardsigmoid(xs[0]), per_element(3),
          "clamp(x + 3, 0, 6) / 6 is three passes", traits=_ONE_PASS, batch=Aligned(),
          torch=_f_call("hardsigmoid"),
          onnx=lambda node, ins, g, cx: g.node("HardSigmoid", ins, alpha=1 / 6, beta=0.5),
          jax=lambda node, a, cx: cx.nn.hard_sigmoid(a[0]),
          in_place=inplace.overwritten_operand, decompose=lambda s, x: ops.hardsigmoid(x))

# ONNX's Softplus is log(1 + exp(x)) throughout: past a threshold of 20 that differs from x
# by under exp(-20) = 2e-9, below float32's step there, so it stands for torch's
_ONNX_SOFTPLUS_THRESHOLD = 20.0


def _softplus_onnx(node, ins, g, cx):
    s, dtype, x = node.spec, node.type.dtype, ins[0]
    scaled = x if s.beta == 1 else g.node("Mul", [x, g.const(s.beta, dtype)])
    soft = g.node("Softplus", [scaled])
    soft = soft if s.beta == 1 else g.node("Div", [soft, g.const(s.beta, dtype)])
    if s.threshold >= _ONNX_SOFTPLUS_THRESHOLD:
        return soft
    over = g.node("Greater", [scaled, g.const(s.threshold, dtype)])
    return g.node("Where", [over, x, soft])


def _softplus_jax(node, a, cx):
    s, x = node.spec, a[0]
    scaled = x * s.beta
    return cx.jnp.where(scaled > s.threshold, x, cx.nn.softplus(scaled) / s.beta)


primitive(Op.softplus, Softplus, 1, _float_unary("softplus"),
          lambda s, xs, r: F.softplus(xs[0], s.beta, s.threshold), per_element(4),
          "where(beta x > threshold, x, log(exp(beta x) + 1) / beta) is five to seven passes "
          "and a bool tensor", traits=_ONE_PASS, batch=Aligned(),
          torch=_f_call("softplus", lambda s: f", {s.beta!r}, {s.threshold!r}", in_place=False),
          onnx=_softplus_onnx, jax=_softplus_jax,
          decompose=lambda s, x: ops.softplus(x, s.beta, s.threshold))


def _mish_jax(node, a, cx):
    x = a[0]
    return x * cx.jnp.tanh(cx.jnp.where(x > 20.0, x, cx.nn.softplus(x)))


primitive(Op.mish, NoSpec, 1, _float_unary("mish"), lambda s, xs, r: F.mish(xs[0]),
          per_element(6), "x tanh(softplus(x)) is seven passes and a bool tensor",
          traits=_ONE_PASS, batch=Aligned(), torch=_f_call("mish"),
          onnx=lambda node, ins, g, cx: g.node("Mish", ins), jax=_mish_jax,
          in_place=inplace.overwritten_operand, decompose=lambda s, x: ops.mish(x))


primitive(Op.logsigmoid, NoSpec, 1, _float_unary("logsigmoid"),
          lambda s, xs, r: F.logsigmoid(xs[0]), per_element(6),
          "min(x, 0) - log1p(exp(-|x|)) is seven passes and a bool tensor", traits=_ONE_PASS,
          batch=Aligned(), torch=lambda node, a, code: f"F.logsigmoid({a[0]})",
          onnx=decomposed_onnx,  # ONNX has none; -Softplus(-x) loses its digits past x = 17
          jax=lambda node, a, cx: cx.nn.log_sigmoid(a[0]),
          decompose=lambda s, x: ops.logsigmoid(x))


# -- shrinkage ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Shrink:
    """F.hardshrink (x outside [-lambd, lambd], else 0) or, ``soft``, F.softshrink (x moved
    lambd towards 0 outside it, else x * 0); ONNX's Shrink with bias 0 or lambd."""

    lambd: float
    soft: bool


def _shrink_shape(spec: Shrink, ins):
    if spec.lambd < 0:
        raise ShapeError(f"shrink: lambd must be at least 0, got {spec.lambd}")
    return _float_unary("shrink")(spec, ins)


def _shrink_torch(node, a, code):
    return f"F.{'soft' if node.spec.soft else 'hard'}shrink({a[0]}, {node.spec.lambd!r})"


def _shrink_onnx(node, ins, g, cx):
    """ONNX's Shrink makes nan 0 (onnxruntime's: no comparison holds, so the 'otherwise' 0),
    where torch keeps it: nan goes round it. A hard shrink is Where(|x| <= lambd, 0, x),
    which keeps nan itself and runs in half the time."""
    s, x = node.spec, ins[0]
    if not s.soft:
        dtype = node.type.dtype
        inside = g.node("LessOrEqual", [g.node("Abs", [x]), g.const(s.lambd, dtype)])
        return g.node("Where", [inside, g.const(0.0, dtype), x])
    shrunk = g.node("Shrink", ins, lambd=s.lambd, bias=s.lambd)
    return g.node("Where", [g.node("IsNaN", [x]), x, shrunk])


def _shrink_jax(node, a, cx):
    s, x, jnp = node.spec, a[0], cx.jnp
    if not s.soft:
        return jnp.where(x >= -s.lambd, jnp.where(x <= s.lambd, jnp.zeros_like(x), x), x)
    inside = jnp.where(x < -s.lambd, x + s.lambd, x * 0)
    return jnp.where(x > s.lambd, x - s.lambd, inside)


primitive(Op.shrink, Shrink, 1, _shrink_shape,
          lambda s, xs, r: (F.softshrink if s.soft else F.hardshrink)(xs[0], s.lambd),
          per_element(2), "two compares and selects (and two adds, soft) are four to seven "
          "passes and two bool tensors", traits=_ONE_PASS, batch=Aligned(),
          torch=_shrink_torch, onnx=_shrink_onnx, jax=_shrink_jax,
          decompose=lambda s, x: (ops.softshrink if s.soft else ops.hardshrink)(x, s.lambd))


# -- rounding to an integral value ------------------------------------------------------------

ROUNDINGS = {"floor": ("floor", "Floor"), "ceil": ("ceil", "Ceil"),
             "half_even": ("round", "Round")}  # mode: (torch's and jnp's name, ONNX's op)


@dataclass(frozen=True, slots=True)
class Rounding:
    """floor, ceil or half_even (torch.round, ONNX Round, jnp.round)."""

    mode: str


def _rounding_shape(spec: Rounding, ins):
    if spec.mode not in ROUNDINGS:
        raise ShapeError(f"rounding: mode one of {sorted(ROUNDINGS)}, got {spec.mode!r}")
    return _float_unary("rounding")(spec, ins)


def _rounding_torch(node, a, code):
    fn = ROUNDINGS[node.spec.mode][0]
    return inplace.unary(node, a, code, f"torch.{fn}({a[0]})", f"torch.{fn}_({{x}})")


primitive(Op.rounding, Rounding, 1, _rounding_shape,
          lambda s, xs, r: getattr(torch, ROUNDINGS[s.mode][0])(xs[0]), per_element(1),
          "trunc and a corrected step is four passes (floor), six (ceil), fourteen (half to "
          "even)", traits=_ONE_PASS, batch=Aligned(), torch=_rounding_torch,
          onnx=lambda node, ins, g, cx: g.node(ROUNDINGS[node.spec.mode][1], ins),
          jax=lambda node, a, cx: getattr(cx.jnp, ROUNDINGS[node.spec.mode][0])(a[0]),
          in_place=inplace.overwritten_operand,
          decompose=lambda s, x: {"floor": ops.floor, "ceil": ops.ceil,
                                  "half_even": ops.round}[s.mode](x))


# -- log(1 + x) and exp(x) - 1 ----------------------------------------------------------------

def _expm1_onnx(node, ins, g, cx):
    """ONNX has no Expm1: tanh(x/2) (e^x + 1), which is e^x - 1 with no difference taken
    (tanh keeps its digits by 0, e^x + 1 adds positives): five nodes and no Where, whose
    pass costs onnxruntime twenty times an Exp's; -inf gives -1, +inf and overflow inf."""
    x, dtype = ins[0], node.type.dtype
    half = g.node("Tanh", [g.node("Mul", [x, g.const(0.5, dtype)])])
    return g.node("Mul", [half, g.node("Add", [g.node("Exp", [x]), g.const(1.0, dtype)])])


def _precise(op: Op, fn: str, onnx) -> None:
    """``op``: torch's and jnp's ``fn``; ``onnx`` writes it accurately without a Log1p or
    Expm1 op (torch.onnx.export writes Log(1 + x) and Exp(x) - 1: log1p(1e-8) is 0). log1p
    stays Kahan's composition there: its other forms need atanh (onnxruntime's is scalar,
    fifty times its Log) or a Where for u = 0 and inf."""
    primitive(op, NoSpec, 1, _float_unary(fn), lambda s, xs, r: getattr(torch, fn)(xs[0]),
              per_element(6), f"Kahan's {fn} is nine to eleven passes and three bool tensors",
              traits=_ONE_PASS, batch=Aligned(),
              torch=lambda node, a, code: inplace.unary(node, a, code, f"torch.{fn}({a[0]})",
                                                        f"torch.{fn}_({{x}})"),
              onnx=onnx, jax=lambda node, a, cx: getattr(cx.jnp, fn)(a[0]),
              in_place=inplace.overwritten_operand,
              decompose=lambda s, x: getattr(ops, fn)(x))


_precise(Op.log1p, "log1p", decomposed_onnx)
_precise(Op.expm1, "expm1", _expm1_onnx)


def _float_pair(op: str):
    def rule(spec, ins):
        float_input(op, ins[0])
        return _extremum_shape(op)(spec, ins)
    return rule


def _two_operand(op: Op, fn: str, jax_fn: str, reason: str, onnx=decomposed_onnx) -> None:
    """``op``: torch's ``fn`` of two tensors of one float type (jnp's ``jax_fn``); ONNX, which
    has none of these, runs ``onnx`` (the decomposition unless given)."""
    primitive(op, NoSpec, 2, _float_pair(fn), lambda s, xs, r: getattr(torch, fn)(*xs),
              per_element(8), reason, traits=_ONE_PASS, batch=Aligned(),
              torch=lambda node, a, code: f"torch.{fn}({a[0]}, {a[1]})", onnx=onnx,
              jax=lambda node, a, cx: getattr(cx.jnp, jax_fn)(*a),
              decompose=lambda s, a, b: getattr(ops, fn)(a, b))


_two_operand(Op.hypot, "hypot", "hypot", "|x|, |y|, their max and min, the ratio's square "
             "root and the infinity test are twelve passes and four bool tensors")
_two_operand(Op.atan2, "atan2", "arctan2", "atan of the ratio, the quadrant's shift and the "
             "limits of 0/0 and inf/inf are sixteen passes and seven bool tensors")


def _logaddexp_onnx(node, ins, g, cx):
    """max(a, b) + log1p(e), e = exp(-|a - b|), log1p(e) as log(u) - ((u - 1) - e) / u, u =
    1 + e (within an ulp, no Where: onnxruntime's Softplus is a scalar loop three times
    this whole function's time); the equal infinities (inf - inf is nan) by one Where.
    torch.onnx.export writes log(exp(a) + exp(b)): inf past 88, -inf below -104."""
    (a, b), dtype = ins, node.type.dtype
    one = g.const(1.0, dtype)
    e = g.node("Exp", [g.node("Neg", [g.node("Abs", [g.node("Sub", [a, b])])])])
    u = g.node("Add", [e, one])
    rounding = g.node("Div", [g.node("Sub", [g.node("Sub", [u, one]), e]), u])
    total = g.node("Add", [g.node("Max", [a, b]),
                           g.node("Sub", [g.node("Log", [u]), rounding])])
    same = g.node("And", [g.node("Equal", [a, b]), g.node("IsInf", [a])])
    return g.node("Where", [same, a, total])


_two_operand(Op.logaddexp, "logaddexp", "logaddexp", "max, |a - b|, exp, Kahan's log1p and "
             "the test of equal infinities are sixteen passes and four bool tensors",
             onnx=_logaddexp_onnx)


# -- nan and infinities replaced ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NanToNum:
    """What torch.nan_to_num puts for nan, +inf and -inf."""

    nan: float
    posinf: float
    neginf: float


def _nan_to_num_args(s: NanToNum) -> str:
    return f"{s.nan!r}, {s.posinf!r}, {s.neginf!r}"


primitive(Op.nan_to_num, NanToNum, 1, _float_unary("nan_to_num"),
          lambda s, xs, r: torch.nan_to_num(xs[0], s.nan, s.posinf, s.neginf),
          per_element(3), "three tests and selects are six passes and three bool tensors",
          traits=_ONE_PASS, batch=Aligned(),
          torch=lambda node, a, code: inplace.unary(
              node, a, code, f"torch.nan_to_num({a[0]}, {_nan_to_num_args(node.spec)})",
              f"torch.nan_to_num_({{x}}, {_nan_to_num_args(node.spec)})"),
          onnx=decomposed_onnx,  # ONNX has no such op
          jax=lambda node, a, cx: cx.jnp.nan_to_num(a[0], nan=node.spec.nan,
                                                    posinf=node.spec.posinf,
                                                    neginf=node.spec.neginf),
          in_place=inplace.overwritten_operand,
          decompose=lambda s, x: ops.nan_to_num(x, s.nan, s.posinf, s.neginf))
