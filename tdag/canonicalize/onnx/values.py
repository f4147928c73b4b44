"""Shape values: small integer tensors known at import time.

``Shape`` of a tensor with a known (possibly symbolic) type is a list of Dims, not a runtime
value. Keeping such values as ``Known`` arrays of Dims through Gather/Slice/Concat/arithmetic
lets Reshape, Expand, ConstantOfShape and Range see their target shapes while importing, as
torch.onnx.export's ``Shape -> Gather -> Concat -> Reshape`` chains need. A Known becomes a
tensor only where an op reads it as data.

The folds follow ONNX's integer semantics on Dims: Div truncates toward 0, Mod takes the
divisor's sign (the dividend's with fmod=1), Neg/Abs/Not/And/Or/Xor, comparisons, Where on
a decided condition, and ReduceSum/Prod/Max/Min (ONNX function bodies such as Attention's
count heads with Div and Mod, LayerNormalization's axes with Neg). Where the symbols leave a
result open (the sign of ``s - t``, ``s == 1``), the fold declines and the op runs on
tensors; a shape read from such a tensor becomes a fresh run-time size (onnx/runtime.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
import sympy
import torch

from tdag import ops
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.ops.creation import dim_tensor
from tdag.ir.symbols import as_dim, is_static
from tdag.ir.types import DType, TensorKind

MAX_KNOWN = 1024  # integer constants up to this many elements are tracked as values
MAX_TABLE = 2 ** 24  # elements of an index table or constant built while importing


@dataclass(frozen=True)
class Param:
    """An initializer (or a pinned input, a const): each TDAG that reads it holds it under
    its own name."""

    name: str
    value: torch.Tensor
    kind: TensorKind = TensorKind.parameter


class Known:
    """An integer (or bool) tensor whose elements are known: ints or symbolic Dims."""

    __slots__ = ("values", "dtype", "weight_name", "tensor")

    def __init__(self, values, dtype: DType, weight_name: str | None = None):
        self.values = np.vectorize(_dim, otypes=[object])(np.asarray(values, dtype=object)) \
            if np.size(values) else np.asarray(values, dtype=object).reshape(np.shape(values))
        self.dtype = dtype
        self.weight_name = weight_name  # an initializer: materialised under its own name
        self.tensor: Tensor | None = None

    @property
    def shape(self) -> tuple:
        return self.values.shape

    @property
    def static(self) -> bool:
        return all(is_static(v) for v in self.values.flat)

    def dims(self) -> list:
        return [v for v in self.values.reshape(-1)]

    def torch(self) -> torch.Tensor:
        return torch.tensor(np.asarray(self.values, dtype=np.int64), dtype=self.dtype.torch) \
            .reshape(self.shape)


def _dim(v):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, sympy.logic.boolalg.BooleanAtom):
        return bool(v)
    return as_dim(int(v) if isinstance(v, np.integer) else v)


def known_of(value: torch.Tensor, weight_name: str | None = None) -> Known | None:
    """A Known for a small integer or bool torch tensor, else None."""
    dtype = DType.of(value.dtype)
    if dtype.is_float or value.numel() > MAX_KNOWN:
        return None
    return Known(value.to(torch.int64).numpy().astype(object), dtype, weight_name)


def materialize(builder: Builder, value: Known) -> Tensor:
    """The tensor of a Known: a const (or the initializer) when static, else built from the
    symbolic sizes it holds."""
    if value.tensor is not None and value.tensor.builder is builder:
        return value.tensor
    if value.static:
        if value.weight_name is not None:
            name = value.weight_name
            if name in builder.names.taken:  # a generated name got there first
                name = builder.fresh(name + "_")
            value.tensor = builder.weight(name, TensorKind.parameter, value.torch())
        else:
            value.tensor = builder.const(value.torch())
        return value.tensor
    parts = [ops.cast(dim_tensor(sympy.sympify(d)), value.dtype) for d in value.dims()]
    flat = ops.stack(parts, 0) if parts else builder.const(value.torch())
    value.tensor = ops.reshape(flat, *value.shape) if value.shape != (len(parts),) else flat
    return value.tensor


# -- folding ------------------------------------------------------------------------------------

def fits(shape) -> bool:
    """Whether a folded value of ``shape`` stays a Known: at most MAX_KNOWN elements, so
    folding costs memory linear in the graph (a Concat of a value with itself, repeated,
    would otherwise double it at every node)."""
    return all(is_static(d) for d in shape) and math.prod(int(d) for d in shape) <= MAX_KNOWN


def fold_arith(fn, values, dtype: DType) -> Known | None:
    """An elementwise integer op applied to Dims (ints stay ints, symbols stay symbolic);
    None where the result would not stay small, or where ``fn`` gives None for an element
    (the symbols leave it open): then the op runs on tensors instead."""
    arrays = np.broadcast_arrays(*[v.values for v in values])
    if not fits(arrays[0].shape) or not all(_small(d) for a in arrays for d in a.flat):
        return None
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        out[idx] = fn(*[a[idx] for a in arrays])
        if out[idx] is None:
            return None
    return Known(out, dtype) if all(_small(d) for d in out.flat) else None


def fold_reduce(fn, value: Known, axes: tuple, keep: bool) -> Known | None:
    """A reduction of a Known over ``axes`` by the binary ``fn`` on Dims; None over an empty
    axis (the op's identity is the tensors' business) or where ``fn`` leaves it open."""
    kept = [a for a in range(value.values.ndim) if a not in axes]
    moved = np.transpose(value.values, kept + list(axes))
    groups = moved.reshape(moved.shape[:len(kept)] + (-1,))
    if groups.shape[-1] == 0:
        return None
    out = np.empty(groups.shape[:-1], dtype=object)
    for idx in np.ndindex(out.shape):
        total = groups[idx][0]
        for item in groups[idx][1:]:
            total = fn(total, item)
            if total is None or not _small(total):
                return None
        out[idx] = total
    return Known(np.expand_dims(out, axes) if keep else out, value.dtype)


def _small(dim) -> bool:
    """An int64 (beyond it ONNX integers wrap, Python's do not), or a short expression:
    multiplying symbolic Dims expands them, so repeated squaring would grow them
    exponentially."""
    if isinstance(dim, (bool, np.bool_)):
        return True
    if is_static(dim):
        return -2 ** 63 <= dim < 2 ** 63
    return len(str(dim)) <= 256


def decide(relation):
    """A comparison of Dims as a Python bool, or None when the symbols leave it open."""
    if isinstance(relation, (bool, np.bool_)):
        return bool(relation)
    if relation in (sympy.true, sympy.false):
        return bool(relation)
    return None


def dim_max(a, b):
    """The larger of two Dims; a sympy Max where the symbols leave it open."""
    choice = decide(sympy.Ge(sympy.sympify(a), b))
    if choice is None:
        return as_dim(sympy.Max(a, b))
    return a if choice else b


def dim_min(a, b):
    """The smaller of two Dims; a sympy Min where the symbols leave it open."""
    choice = decide(sympy.Le(sympy.sympify(a), b))
    if choice is None:
        return as_dim(sympy.Min(a, b))
    return a if choice else b


END = 2 ** 31  # a Slice bound at or past it means "to the end" (exporters write INT64_MAX)


def slice_bounds(start, stop, dim) -> tuple | None:
    """ONNX's normalisation of one axis's Slice bounds (a positive step) on Dims: a negative
    bound counts from the end, both are clamped to [0, dim] and the stop to at least the
    start, so ``stop - start`` is the length. Returns (start, stop, checks). Where the
    symbols leave a clamp open (``:k`` on a causal-mask buffer of 64 rows, ``-s:`` on an
    axis of ``t``) the bound is taken as it is, in range, and ``checks`` holds the pairs
    (a, b) of Dims that must satisfy a <= b at run time: the shape the exporter meant
    (``k``, not ``Min(k, 64)``, which would not broadcast against the scores), and an error
    at run time, never a wrong shape, where it does not hold. None where the symbols leave
    open whether a bound counts from the end (then the tensors slice it, a fresh size)."""
    out, checks = [], []
    for bound in (start, stop):
        if is_static(bound) and abs(bound) >= END:
            out.append(dim if bound > 0 else 0)
            continue
        sign = _sign(bound)
        if sign is None:
            return None
        low, high = (0, as_dim(dim + bound)) if sign < 0 else (bound, dim)
        inside = decide(sympy.Le(sympy.sympify(low), high))
        if inside is None:
            checks.append((low, high))
        out.append(high if sign < 0 and inside is not False else
                   0 if sign < 0 else bound if inside is not False else dim)
    ordered = decide(sympy.Le(sympy.sympify(out[0]), out[1]))
    if ordered is None:
        checks.append((out[0], out[1]))
    return out[0], out[1] if ordered is not False else out[0], checks


def fold_compare(fn, a: Known, b: Known) -> Known | None:
    arrays = np.broadcast_arrays(a.values, b.values)
    if not fits(arrays[0].shape):
        return None
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        result = decide(fn(sympy.sympify(arrays[0][idx]), sympy.sympify(arrays[1][idx])))
        if result is None:
            return None
        out[idx] = result
    return Known(out, DType.bool)


def cast_known(value: Known, dtype: DType) -> Known | None:
    """A Known as another integer or bool type, as ONNX's Cast gives it; None where a value
    would wrap or a symbolic one's truth is open (then the tensors cast it)."""
    if dtype is DType.bool:
        return fold_arith(_truth, [value], dtype)
    if value.dtype is DType.bool:
        return fold_arith(int, [value], dtype)
    info = torch.iinfo(dtype.torch)
    if all(not is_static(d) or info.min <= d <= info.max for d in value.dims()):
        return Known(value.values, dtype)
    return None


def _truth(dim) -> bool | None:
    if is_static(dim):
        return dim != 0
    sign = _sign(dim)
    return None if sign is None else sign != 0


def _sign(dim) -> int | None:
    """1, 0 or -1 where the symbols decide it (sizes are positive), else None."""
    dim = sympy.sympify(dim)
    if dim.is_positive:
        return 1
    if dim.is_zero:
        return 0
    return -1 if dim.is_negative else None


def trunc_div(a, b):
    """ONNX Div on integers truncates toward 0 (a division by 0 is left to the tensors,
    whose runtimes differ on it); a symbolic quotient needs the signs known."""
    signs = _sign(a), _sign(b)
    if signs[1] in (0, None) or signs[0] is None:
        return None
    if is_static(a) and is_static(b):
        quotient = abs(a) // abs(b)  # exact: a float division would round big ints
    else:
        quotient = as_dim(sympy.floor(sympy.Abs(sympy.sympify(a)) / abs(sympy.sympify(b))))
    return quotient if signs[0] * signs[1] >= 0 else as_dim(-quotient)


def mod(a, b, truncated: bool):
    """ONNX Mod of integers: the remainder takes the divisor's sign (Python's ``%``), or
    the dividend's where ``truncated`` (fmod=1); None where the symbols leave it open."""
    quotient = trunc_div(a, b)
    if quotient is None:
        return None
    rest = as_dim(a - b * quotient)  # the dividend's sign
    if truncated or _sign(a) * _sign(b) >= 0:
        return rest
    zero = _sign(rest)
    if zero is None:
        return None
    return rest if zero == 0 else as_dim(rest + b)


def absolute(a):
    sign = _sign(a)
    return None if sign is None else (a if sign >= 0 else as_dim(-a))


def logical(fn):
    """A bool op on elements that are Python bools (a comparison the symbols leave open
    never becomes a Known)."""
    return lambda *xs: fn(*[bool(x) for x in xs])


def free_names(graph: onnx.GraphProto) -> set:
    """Names a graph reads from its enclosing scope."""
    defined = {v.name for v in graph.input} | {i.name for i in graph.initializer} | \
        {i.values.name for i in graph.sparse_initializer}
    read = set()
    for node in graph.node:
        read |= {name for name in node.input if name}
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                read |= free_names(attr.g)
        defined |= set(node.output)
    read |= {o.name for o in graph.output}
    return read - defined
