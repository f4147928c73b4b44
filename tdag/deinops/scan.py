"""The scan primitive: the inclusive cumulative sum / product / max / min along one axis.

Without it a prefix sum is an unfold of the whole axis (output j reduces a window of j+1
inputs): n^2 work and memory for an axis of n. The kernels every framework has (torch's
``cumsum``, ONNX's ``CumSum``, XLA's ``cumsum``) do n.

Bools accumulate as torch's sum-then-cast and prod-then-cast leave them: ``add`` is a
running or (a cumulative max), ``mul`` a running and (a cumulative min). Small ints and
floats keep their dtype (torch's front ends cast to i64 first, as they promote); f16 and
bf16 accumulate sums and products in f32, as torch's CPU kernels do. ``max``/``min``
propagate NaN: from the first NaN on, the running value is NaN (torch's ``cummax``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import onnx
import torch

from tdag.deinops.codegen import dtype_expr
from tdag.deinops.primitive import Cost, primitive, traffic
from tdag.errors import ShapeError
from tdag.ir.batching import UNKNOWN, Affine, AxisRule, same_axis
from tdag.ir.op import Op
from tdag.ir.record import Trait
from tdag.ir.symbols import is_static
from tdag.ir.types import DType

COMBINES = ("add", "mul", "max", "min")


@dataclass(frozen=True, slots=True)
class Scan:
    axis: int
    combine: str  # one of COMBINES
    reverse: bool = False  # accumulate from the end of the axis


def _scan_shape(spec: Scan, ins):
    (x,) = ins
    if spec.combine not in COMBINES:
        raise ShapeError(f"scan: combine {spec.combine!r} is not one of {COMBINES}")
    if not 0 <= spec.axis < x.rank:
        raise ShapeError(f"scan: axis {spec.axis} out of range for {x}")
    return x


def _kernel(spec: Scan, dtype: DType) -> tuple[str, DType | None]:
    """The torch method that computes the scan and the dtype it accumulates in (None: the
    input's): a bool sum is a running or, a half-precision sum accumulates in f32."""
    if dtype is DType.bool and spec.combine in ("add", "mul"):
        return ("cummax" if spec.combine == "add" else "cummin"), None
    if spec.combine in ("max", "min"):
        return f"cum{spec.combine}", None
    method = "cumsum" if spec.combine == "add" else "cumprod"
    return method, (DType.f32 if dtype in (DType.f16, DType.bf16) else None)


def _scan_eval(spec: Scan, xs, resolve):
    (x,) = xs
    if x.shape[spec.axis] == 0:
        return x.clone()
    method, acc = _kernel(spec, DType.of(x.dtype))
    y = x.flip(spec.axis) if spec.reverse else x
    if method in ("cummax", "cummin"):
        y = getattr(torch, method)(y, spec.axis).values
    else:  # torch returns i64 for small ints; wrapping back to the dtype is the same sum
        y = getattr(torch, method)(y, spec.axis, dtype=acc.torch if acc else None)
    y = y.to(x.dtype)
    return y.flip(spec.axis) if spec.reverse else y


def _scan_cost(spec: Scan, ins, out) -> Cost:
    return traffic(ins, out, ins[0].numel)  # one combine per element


def _scan_torch(node, a, code):
    s, dtype = node.spec, node.type.dtype
    method, acc = _kernel(s, dtype)
    x = f"{a[0]}.flip({s.axis})" if s.reverse else a[0]
    if method in ("cummax", "cummin"):
        x = f"{x}.{method}({s.axis}).values"
    else:
        x = f"{x}.{method}({s.axis}" + (f", dtype={dtype_expr(acc)})" if acc else ")")
        if acc or dtype is not DType.i64 and not dtype.is_float:
            x = f"{x}.to({dtype_expr(dtype)})"
    return f"{x}.flip({s.axis})" if s.reverse else x


# -- ONNX -------------------------------------------------------------------------------------

def _onnx_dtype(dtype: DType) -> DType:
    """What onnxruntime scans in: CumSum, Mul, Max and Min all take f32, f64, i32, i64."""
    if dtype.is_float:
        return dtype if dtype in (DType.f32, DType.f64) else DType.f32
    return DType.i32 if dtype is DType.bool else DType.i64


def _identity(combine: str, dtype: DType):
    if combine == "mul":
        return 1
    if dtype.is_float:
        return float("-inf") if combine == "max" else float("inf")
    info = torch.iinfo(dtype.torch)
    return info.min if combine == "max" else info.max


def _scan_onnx(node, ins, g, cx):
    s, dtype = node.spec, node.type.dtype
    n = node.type.shape[s.axis]
    wide = _onnx_dtype(dtype)
    x = ins[0] if wide is dtype else g.cast(ins[0], wide)
    combine = {"add": "max", "mul": "min"}.get(s.combine, s.combine) if dtype is DType.bool \
        else s.combine
    if combine == "add":
        y = g.node("CumSum", [x, g.const(s.axis)], reverse=int(s.reverse))
    elif not is_static(n):
        y = _running(g, x, s.axis, combine, s.reverse, g.const(_identity(combine, wide), wide),
                     wide)
    else:
        scan = _Blelloch(g, s.axis, combine, g.const(_identity(combine, wide), wide),
                         list(node.type.shape))
        y = _flip(g, scan(_flip(g, x, s.axis) if s.reverse else x, int(n)), s.axis) \
            if s.reverse else scan(x, int(n))
    return y if wide is dtype else g.cast(y, dtype)


def _running(g, x: str, axis: int, combine: str, reverse: bool, identity: str,
             dtype: DType) -> str:
    """An ONNX ``Scan`` carrying the running value along an axis whose length is known only
    at run time (the Blelloch levels are laid out per static length): one combine of a
    slice per step, from the end where ``reverse`` (the scan's directions). onnxruntime's
    Scan fails on no steps, so one identity step goes first (cut off after)."""
    body = g.child()
    state, item = body.names("running"), body.names("item")
    new = body.node(combine.capitalize(), [state, item])
    out = body.node("Identity", [new])
    info = [onnx.helper.make_tensor_value_info(v, dtype.onnx, None)
            for v in (state, item, new, out)]
    shape = g.node("Shape", [x])
    rest = g.node("Concat", [g.node("Slice", [shape, g.const([0]), g.const([axis])]),
                             g.node("Slice", [shape, g.const([axis + 1]),
                                              g.const([2 ** 62])])], axis=0)
    start = g.node("Expand", [identity, rest])
    first = [0, 1] if reverse else [1, 0]
    x = g.node("Pad", [x, g.const(first), identity, g.const([axis])])
    _, y = g.node("Scan", [start, x], outputs=2, num_scan_inputs=1,
                  body=body.graph(g.names("scan_body"), info[:2], info[2:]),
                  scan_input_axes=[axis], scan_output_axes=[axis],
                  scan_input_directions=[int(reverse)], scan_output_directions=[int(reverse)])
    stop = [-1] if reverse else [2 ** 62]
    return g.node("Slice", [y, g.const([first[0]]), g.const(stop), g.const([axis])])


def _flip(g, x: str, axis: int) -> str:
    return g.node("Slice", [x, g.const([-1]), g.const([-(2 ** 63)]), g.const([axis]),
                            g.const([-1])])


@dataclass
class _Blelloch:
    """A work-efficient scan of ONNX nodes for the combines ONNX has no cumulative op for:
    combine neighbouring pairs, scan the pairs (half as long), then each even position is
    the scan before its pair combined with itself. 2n combines in log2(n) levels of a few
    nodes each, where a scan per position would be n^2 and one ONNX Scan step per position
    runs a subgraph n times."""

    g: object
    axis: int
    combine: str
    identity: str  # a scalar const of the scanned dtype
    dims: list  # the shape, whose scanned axis each level sets

    def __call__(self, x: str, n: int) -> str:
        if n <= 1:
            return x
        g, axis, op = self.g, self.axis, self.combine.capitalize()
        odd = n % 2
        if odd:  # pad one identity at the end, so positions pair up
            x = self._pad(x, (0, 1))
        even, odd_pos = self._every_other(x, 0), self._every_other(x, 1)
        pairs = self(g.node(op, [even, odd_pos]), (n + odd) // 2)  # scan up to each odd position
        before = self._pad(g.node("Slice", [pairs, g.const([0]), g.const([-1]),
                                            g.const([axis])]), (1, 0))
        evens = g.node(op, [before, even])
        both = g.node("Concat", [g.node("Unsqueeze", [v, g.const([axis + 1])])
                                 for v in (evens, pairs)], axis=axis + 1)
        self.dims[axis] = n + odd
        out = g.node("Reshape", [both, g.shape(self.dims)])
        if odd:
            out = g.node("Slice", [out, g.const([0]), g.const([n]), g.const([axis])])
        return out

    def _every_other(self, x: str, start: int) -> str:
        g = self.g
        return g.node("Slice", [x, g.const([start]), g.const([2 ** 62]), g.const([self.axis]),
                                g.const([2])])

    def _pad(self, x: str, widths: tuple) -> str:
        g = self.g
        return g.node("Pad", [x, g.const(list(widths)), self.identity, g.const([self.axis])])


def _scan_jax(node, a, cx):
    s, dtype, x = node.spec, node.type.dtype, a[0]
    method, acc = _kernel(s, dtype)
    if dtype is DType.bool:  # XLA's cumulative max takes numbers
        x = x.astype(cx.jnp.int8)
    elif acc:
        x = x.astype(cx.dtype(acc))
    y = getattr(cx.lax, method)(x, axis=s.axis, reverse=s.reverse)
    return y.astype(cx.dtype(dtype))


def _axis_drop(spec: Scan, in_type, p: int) -> Scan:
    return replace(spec, axis=spec.axis - (p < spec.axis))


def _scan_values(spec: Scan, facts, batch, types) -> Affine | None:
    """A running max or min is one of the values so far; a running sum of values in
    [lo, hi] over an axis of n is in [min(lo, n*lo), max(hi, n*hi)] (a cumsum of a mask, as
    RoBERTa numbers its positions, is in [0, n]). A strided value (its scan along the batch
    axis is refused by the walker) keeps its stride through a max or min only."""
    (a,) = facts
    if spec.combine in ("max", "min"):
        return a
    n = types[0].shape[spec.axis]
    if a.stride or spec.combine != "add" or not all(isinstance(b, int) for b in (a.lo, a.hi)) \
            or not is_static(n):
        return None if a.stride else UNKNOWN
    return Affine(0, min(a.lo, n * a.lo), max(a.hi, n * a.hi))


_SCAN_BATCH = AxisRule(lambda s, t: {s.axis}, same_axis, _axis_drop,
                       lambda s: replace(s, axis=s.axis + 1),
                       mixing="accumulates along the batch axis", values=_scan_values)


def _scan_vjp(spec: Scan, xs, y, dy, ops):
    """add: the reverse scan of the cotangent (the mirror); max/min: each output's cotangent
    to the position holding its running extreme (the last one of a tie, or the NaN, as
    torch's cummax picks); mul: ``_product_scan_vjp``."""
    (x,) = xs
    if spec.combine == "add":
        return (ops.scan(dy, spec.axis, "add", not spec.reverse),)
    if spec.combine == "mul":
        return (_product_scan_vjp(spec, x, y, dy, ops),)
    n = x.shape[spec.axis]
    shape = [1] * x.ndim
    shape[spec.axis] = n
    where_ = ops.broadcast_to(ops.reshape(ops.iota(n, "i64", x.builder), shape), x.shape)
    holds = ops.logical_or(x == y, ops.isnan(x))
    if spec.reverse:  # from the end: the first position (in index order) of a tie
        past_end = ops.size_tensor(x, (spec.axis,), "i64")
        source = ops.scan(ops.where(holds, where_, past_end), spec.axis, "min", True)
    else:
        source = ops.scan(ops.where(holds, where_, -1), spec.axis, "max")
    zeros = ops.zeros(x.shape, x.dtype, like=x)
    return (ops.scatter_elements(zeros, spec.axis, source, dy, "sum"),)


def _product_scan_vjp(spec: Scan, x, y, dy, ops):
    """d cumprod: before the first zero of a row, the reverse sum of dy*y over x; at the
    first zero, the reverse sum of dy times the running product with that zero read as 1;
    after it, nothing (every product holds the zero). Linear, and exact with zeros."""
    axis, reverse = spec.axis, spec.reverse
    zero = ops.cast(x == 0.0, x.dtype)
    seen = ops.scan(zero, axis, "add", reverse)
    before, first = seen == 0.0, ops.logical_and(zero == 1.0, seen == 1.0)
    after_sum = ops.scan(dy * y, axis, "add", not reverse) / ops.where(before, x, 1.0)
    skipped = ops.scan(ops.where(first, 1.0, x), axis, "mul", reverse)
    at_zero = ops.scan(dy * skipped, axis, "add", not reverse)
    return ops.where(before, after_sum, ops.where(first, at_zero, 0.0))


primitive(Op.scan, Scan, 1, _scan_shape, _scan_eval, _scan_cost,
          "cumulative sum/prod/max/min along an axis (cumsum, cummax, logcumsumexp) in n; "
          "pad + unfold + reduce over every prefix costs n^2",
          traits=Trait.NONE, batch=_SCAN_BATCH,
          torch=_scan_torch, onnx=_scan_onnx, jax=_scan_jax, vjp=_scan_vjp)
