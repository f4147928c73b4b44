"""One line of torch code per op: ``EMIT[op](node, args, code) -> expression``.

``args`` are Python expressions for the operands (variables, or literals for broadcast
scalars where the op accepts them); ``code`` turns Dims into expressions (``code.dim``) and
knows the device variable. Every primitive and every kernel has an entry.
"""
from __future__ import annotations

import math
from typing import Callable

from tdag.deinops.elementwise import CompareKind, DivideMode
from tdag.deinops.reduce import ReduceKind
from tdag.ir.graph import Node
from tdag.ir.op import Op
from tdag.ir.record import Trait, has
from tdag.ir.symbols import is_static
from tdag.ir.types import DType
from tdag.deinops.codegen import dtype_expr, literal, tuple_expr as _tuple
from tdag.deinops.kernels.windows import torch_mode
from tdag.deinops.kernels.sequence import lstm_parts
from tdag.deinops.kernels.einsum_plan import plan_einsum

EMIT: dict[Op, Callable] = {}


def emits(*ops: Op):
    def register(fn):
        for op in ops:
            EMIT[op] = fn
        return fn
    return register


# -- movement ---------------------------------------------------------------------------------

@emits(Op.permute)
def _permute(node, a, code):
    return f"{a[0]}.permute{_tuple(node.spec.perm)}" if node.spec.perm else a[0]


@emits(Op.group)
def _group(node, a, code):
    s = node.spec
    return f"{a[0]}.flatten({s.axis}, {s.axis + s.count - 1})"


@emits(Op.ungroup)
def _ungroup(node, a, code):
    sizes = [-1 if is_static(s) and s == -1 else code.dim(s) for s in node.spec.sizes]
    return f"{a[0]}.unflatten({node.spec.axis}, {_tuple(sizes)})"


@emits(Op.squeeze)
def _squeeze(node, a, code):
    return f"{a[0]}.squeeze({_tuple(node.spec.axes)})" if node.spec.axes else a[0]


@emits(Op.unsqueeze)
def _unsqueeze(node, a, code):
    axes = set(node.spec.axes)
    last = max(axes)
    index = ", ".join("None" if i in axes else ":" for i in range(last + 1))
    return f"{a[0]}[{index}]"


@emits(Op.slice)
def _slice(node, a, code):
    index = [":"] * (max(node.spec.axes) + 1)
    for ax, start, stop, step in zip(node.spec.axes, node.spec.starts, node.spec.stops,
                                     node.spec.steps):
        index[ax] = f"{code.dim(start)}:{code.dim(stop)}" + (f":{step}" if step != 1 else "")
    return f"{a[0]}[{', '.join(index)}]"


@emits(Op.pad)
def _pad(node, a, code):
    flat = []
    for lo, hi in reversed(node.spec.widths):
        flat += [code.dim(lo), code.dim(hi)]
    pads = f"[{', '.join(flat)}]"
    if node.type.dtype is DType.bool:
        return (f"F.pad({a[0]}.to(torch.uint8), {pads}, value={int(bool(node.spec.value))})"
                ".to(torch.bool)")
    return f"F.pad({a[0]}, {pads}, value={code.literal(node.spec.value)})"


@emits(Op.select)
def _select(node, a, code):
    return f"{a[0]}.select({node.spec.axis}, {code.dim(node.spec.index)})"


@emits(Op.repeat)
def _repeat(node, a, code):
    sizes = ["-1"] * node.type.rank
    for ax, size in zip(node.spec.axes, node.spec.sizes):
        sizes[ax] = code.dim(size)
    return f"{a[0]}.expand({', '.join(sizes)})"


@emits(Op.unfold)
def _unfold(node, a, code):
    s = node.spec
    span = s.dilation * (s.size - 1) + 1
    out = f"{a[0]}.unfold({s.axis}, {span}, {s.step})"
    return f"{out}[..., ::{s.dilation}]" if s.dilation > 1 else out


@emits(Op.fold)
def _fold(node, a, code):
    s = node.spec
    return f"_rt.fold({a[0]}, {s.axis}, {s.step}, {s.dilation}, {code.dim(s.length)})"


@emits(Op.gather)
def _gather(node, a, code):
    axis = node.spec.axis
    table_rank = node.type.rank - code.rank(node.inputs[1]) + 1
    if axis == 0 and table_rank == 2:
        return f"F.embedding({a[1]}, {a[0]})"
    return f"{a[0]}[{', '.join([':'] * axis + [a[1]])}]"


@emits(Op.iota)
def _iota(node, a, code):
    return (f"torch.arange({code.dim(node.spec.length)}, dtype={dtype_expr(node.spec.dtype)}, "
            f"device={code.device})")


# -- reduction and elementwise ----------------------------------------------------------------

@emits(Op.reduce)
def _reduce(node, a, code):
    axes, kind, x = node.spec.axes, node.spec.kind, a[0]
    dtype = node.type.dtype
    if not axes:
        return x
    if kind is ReduceKind.prod:
        for ax in sorted(axes, reverse=True):
            x = f"{x}.prod({ax})"
    elif kind is ReduceKind.sum:
        x = f"{x}.sum({_tuple(axes)})"
    elif dtype is DType.bool:
        x = f"{x}.{'any' if kind is ReduceKind.max else 'all'}({_tuple(axes)})"
    else:
        x = f"{x}.{'amax' if kind is ReduceKind.max else 'amin'}({_tuple(axes)})"
    # torch sums and multiplies small ints (and bools) into int64; tdag keeps the dtype
    if kind in (ReduceKind.sum, ReduceKind.prod) and not dtype.is_float and dtype is not DType.i64:
        x = f"{x}.to({dtype_expr(dtype)})"
    return x


_UNARY = {Op.neg: "torch.neg", Op.reciprocal: "torch.reciprocal", Op.exp: "torch.exp",
          Op.log: "torch.log", Op.sin: "torch.sin", Op.cos: "torch.cos", Op.tan: "torch.tan",
          Op.asin: "torch.asin", Op.acos: "torch.acos", Op.atan: "torch.atan",
          Op.sinh: "torch.sinh", Op.cosh: "torch.cosh", Op.tanh: "torch.tanh",
          Op.asinh: "torch.asinh", Op.acosh: "torch.acosh", Op.atanh: "torch.atanh",
          Op.erf: "torch.erf", Op.erfinv: "torch.erfinv", Op.sign: "torch.sign",
          Op.sigmoid: "torch.sigmoid", Op.relu: "torch.relu", Op.silu: "F.silu",
          Op.hardswish: "F.hardswish"}


@emits(*_UNARY)
def _unary(node, a, code):
    return f"{_UNARY[node.op]}({a[0]})"


@emits(Op.add)
def _add(node, a, code):
    return f"{a[0]} + {a[1]}"


@emits(Op.multiply)
def _multiply(node, a, code):
    return f"{a[0]} & {a[1]}" if node.type.dtype is DType.bool else f"{a[0]} * {a[1]}"


@emits(Op.divide)
def _divide(node, a, code):
    if node.spec.mode is DivideMode.true:
        return f"{a[0]} / {a[1]}"
    if node.spec.mode in (DivideMode.remainder, DivideMode.fmod):
        return f"torch.{node.spec.mode.value}({a[0]}, {a[1]})"
    return f"torch.div({a[0]}, {a[1]}, rounding_mode={node.spec.mode.value!r})"


@emits(Op.pow)
def _pow(node, a, code):
    return f"torch.pow({a[0]}, {a[1]})"


@emits(Op.where)
def _where(node, a, code):
    return f"torch.where({a[0]}, {a[1]}, {a[2]})"


_COMPARE = {CompareKind.eq: "==", CompareKind.ne: "!=", CompareKind.lt: "<",
            CompareKind.le: "<=", CompareKind.gt: ">", CompareKind.ge: ">="}


@emits(Op.compare)
def _compare(node, a, code):
    return f"{a[0]} {_COMPARE[node.spec.kind]} {a[1]}"


@emits(Op.cast)
def _cast(node, a, code):
    return f"{a[0]}.to({dtype_expr(node.spec.dtype)})"


# -- kernels ----------------------------------------------------------------------------------

@emits(Op.reshape)
def _reshape(node, a, code):
    return f"{a[0]}.reshape({code.shape(node.type.shape)})"


@emits(Op.expand)
def _expand(node, a, code):
    in_shape = code.shape_of(node.inputs[0])
    lead = node.type.rank - len(in_shape)
    sizes = [code.dim(d) if i < lead or not code.same_dim(in_shape[i - lead], d) else "-1"
             for i, d in enumerate(node.type.shape)]
    return f"{a[0]}.expand({', '.join(sizes)})"


@emits(Op.concat)
def _concat(node, a, code):
    return f"torch.cat([{', '.join(a)}], {node.spec.axis})"


@emits(Op.einsum)
def _einsum(node, a, code):
    bias = a[2] if len(a) == 3 else None
    plan = plan_einsum(node.spec.equation, code.rank(node.inputs[2]) if bias else None)
    if plan.kind == "einsum":
        out = f"torch.einsum({node.spec.equation!r}, {a[0]}, {a[1]})"
        return f"{out} + {bias}" if bias else out
    x, y = (a[1], a[0]) if plan.swap else (a[0], a[1])
    if plan.transpose_a:
        x = f"{x}.mT"
    if plan.transpose_b:
        y = f"{y}.mT"
    if plan.kind == "linear":
        out = f"F.linear({x}, {y}, {bias if plan.bias_inside else 'None'})"
    else:
        out = f"torch.matmul({x}, {y})"
    if plan.out_perm is not None:
        out = f"{out}.permute{_tuple(plan.out_perm)}"
    return f"{out} + {bias}" if bias and not plan.bias_inside else out


_NDIM = {1: "1d", 2: "2d", 3: "3d"}


@emits(Op.conv)
def _conv(node, a, code):
    s = node.spec
    bias = a[2] if len(a) == 3 else "None"
    return (f"F.conv{_NDIM[len(s.stride)]}({a[0]}, {a[1]}, {bias}, {_tuple(s.stride)}, "
            f"{_tuple(s.padding)}, {_tuple(s.dilation)}, {s.groups})")


@emits(Op.conv_transpose)
def _conv_transpose(node, a, code):
    s = node.spec
    bias = a[2] if len(a) == 3 else "None"
    return (f"F.conv_transpose{_NDIM[len(s.stride)]}({a[0]}, {a[1]}, {bias}, {_tuple(s.stride)}, "
            f"{_tuple(s.padding)}, {_tuple(s.output_padding)}, {s.groups}, {_tuple(s.dilation)})")


def global_pool(node, in_shape) -> bool:
    """A pool whose one window covers the whole (static) spatial extent."""
    s = node.spec
    return all(p == 0 for p in s.padding) and all(d == 1 for d in s.dilation) and \
        tuple(in_shape[2:]) == tuple(s.kernel)


@emits(Op.max_pool)
def _max_pool(node, a, code):
    s = node.spec
    if global_pool(node, code.shape_of(node.inputs[0])):  # what adaptive pooling to 1 runs
        return f"{a[0]}.amax({_tuple(range(2, node.type.rank))}, keepdim=True)"
    return (f"F.max_pool{_NDIM[len(s.kernel)]}({a[0]}, {_tuple(s.kernel)}, {_tuple(s.stride)}, "
            f"{_tuple(s.padding)}, {_tuple(s.dilation)})")


@emits(Op.avg_pool)
def _avg_pool(node, a, code):
    s = node.spec
    if global_pool(node, code.shape_of(node.inputs[0])):
        return f"{a[0]}.mean({_tuple(range(2, node.type.rank))}, keepdim=True)"
    return (f"F.avg_pool{_NDIM[len(s.kernel)]}({a[0]}, {_tuple(s.kernel)}, {_tuple(s.stride)}, "
            f"{_tuple(s.padding)})")


@emits(Op.resize)
def _resize(node, a, code):
    s = node.spec
    align = f", align_corners={s.align_corners}" if s.mode == "linear" else ""
    target = f"size={_tuple(s.sizes)}" if s.scales is None else f"scale_factor={_tuple(s.scales)}"
    return f"F.interpolate({a[0]}, {target}, mode={torch_mode(s)!r}{align})"


@emits(Op.softmax, Op.log_softmax)
def _softmax(node, a, code):
    return f"torch.{node.op.value}({a[0]}, {node.spec.axis})"


@emits(Op.layer_norm, Op.rms_norm)
def _layer_norm(node, a, code):
    shape = code.shape(node.type.shape[node.type.rank - node.spec.count:], tuple_=True)
    rest = ", ".join(a[1:] + ["None"] * (3 - len(a))) if node.op is Op.layer_norm else \
        (a[1] if len(a) > 1 else "None")
    return f"F.{node.op.value}({a[0]}, {shape}, {rest}, {node.spec.eps!r})"


@emits(Op.group_norm)
def _group_norm(node, a, code):
    w, b = (a[1], a[2]) if len(a) == 3 else ("None", "None")
    return f"F.group_norm({a[0]}, {node.spec.groups}, {w}, {b}, {node.spec.eps!r})"


@emits(Op.batch_norm)
def _batch_norm(node, a, code):
    w = a[3] if len(a) > 3 else "None"
    b = a[4] if len(a) > 4 else "None"
    return f"F.batch_norm({a[0]}, {a[1]}, {a[2]}, {w}, {b}, False, 0.0, {node.spec.eps!r})"


@emits(Op.attention)
def _attention(node, a, code):
    mask = a[3] if len(a) == 4 else "None"
    return (f"F.scaled_dot_product_attention({a[0]}, {a[1]}, {a[2]}, attn_mask={mask}, "
            f"is_causal={node.spec.causal}, scale={node.spec.scale!r})")


@emits(Op.clamp)
def _clamp(node, a, code):
    lo, hi = node.spec.lo, node.spec.hi
    return f"torch.clamp({a[0]}, {'None' if lo is None else literal(lo)}, " \
           f"{'None' if hi is None else literal(hi)})"


@emits(Op.lstm)
def _lstm(node, a, code):
    s = node.spec
    x, weights, h0s, c0s = lstm_parts(s, a)
    if s.reverse:
        x = f"{x}.flip(0)"
    flat = ", ".join(w for cell in weights for w in cell)
    out = (f"torch.lstm({x}, ({_stacked(h0s)}, {_stacked(c0s)}), ({flat}), True, {s.layers}, 0.0, "
           f"False, {s.bidirectional}, False)[0]")
    return f"{out}.flip(0)" if s.reverse else out


def _stacked(states) -> str:
    """Per-cell [B, H] states as torch's [layers * directions, B, H]."""
    return f"{states[0]}[None]" if len(states) == 1 else f"torch.stack([{', '.join(states)}])"


@emits(Op.gelu)
def _gelu(node, a, code):
    approx = node.spec.approximate
    return f"F.gelu({a[0]})" if approx == "none" else f"F.gelu({a[0]}, approximate={approx!r})"


def accepts_literal(node: Node, position: int) -> bool:
    """Whether operand ``position`` of ``node`` may be a Python scalar in the emitted code."""
    if not has(node.op, Trait.SCALAR_OPERAND) or node.type.dtype is DType.bool and node.op is Op.multiply:
        return False
    return not (node.op is Op.where and position == 0)
