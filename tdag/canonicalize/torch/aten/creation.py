"""ATen ops that make tensors from sizes and scalars: full, arange, triangles."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.torch.aten.registry import aten, scalar
from tdag.ops.builder import active_builder
from tdag.errors import UnsupportedOpError
from tdag.ir.types import DType


def _dt(dtype, default="f32"):
    return DType.of(dtype) if dtype is not None else DType.of(default)


def _full(size, value, dtype):
    value = scalar(value)
    if hasattr(value, "dtype"):  # a symbolic size as the fill value
        return ops.broadcast_to(ops.cast(value, dtype), tuple(size))
    return ops.full(tuple(size), value, dtype)


@aten("full", "new_full")
def full(*args, dtype=None, **kwargs):
    size, value = (args[-2], args[-1])  # new_full(x, size, value) or full(size, value)
    default = args[0].dtype if len(args) == 3 else ("f32" if isinstance(value, float) else
                                                   "bool" if isinstance(value, bool) else
                                                   "i64" if isinstance(value, int) else "f32")
    return _full(size, value, _dt(dtype, default))


@aten("full_like")
def full_like(x, value, dtype=None, **kwargs):
    return _full(x.shape, value, _dt(dtype, x.dtype))


@aten("zeros", "empty", "empty_strided", "new_zeros", "new_empty", "new_empty_strided")
def zeros(*args, dtype=None, **kwargs):
    size = args[1] if len(args) >= 2 and hasattr(args[0], "dtype") else args[0]
    default = args[0].dtype if hasattr(args[0], "dtype") else "f32"
    return ops.full(tuple(size), 0, _dt(dtype, default))


@aten("ones", "new_ones")
def ones(*args, dtype=None, **kwargs):
    size = args[1] if hasattr(args[0], "dtype") else args[0]
    default = args[0].dtype if hasattr(args[0], "dtype") else "f32"
    return ops.full(tuple(size), 1, _dt(dtype, default))


@aten("zeros_like", "empty_like")
def zeros_like(x, dtype=None, **kwargs):
    return ops.full(x.shape, 0, _dt(dtype, x.dtype))


@aten("ones_like")
def ones_like(x, dtype=None, **kwargs):
    return ops.full(x.shape, 1, _dt(dtype, x.dtype))


@aten("fill")
def fill(x, value):
    return _full(x.shape, value, x.dtype)


@aten("scalar_tensor")
def scalar_tensor(value, dtype=None, **kwargs):
    return _full((), value, _dt(dtype, "f32"))


@aten("arange")
def arange(*args, dtype=None, **kwargs):
    start, end, step = (0, args[0], 1) if len(args) == 1 else \
        (args[0], args[1], args[2] if len(args) > 2 else 1)
    if any(hasattr(scalar(v), "dtype") for v in (start, step)):
        raise UnsupportedOpError("arange with a symbolic start or step")
    result = ops.arange(start, end, step, dtype=None, like=None)
    return result if dtype is None else ops.cast(result, dtype)


@aten("linspace")
def linspace(start, end, steps, dtype=None, **kwargs):
    """ATen fills the second half from the end, so that the last value is exactly ``end``."""
    if steps == 1:
        return ops.reshape(ops.cast(ops.add(ops.full((), 0.0, "f32"), start), "f32"), (1,))
    i = ops.cast(ops.iota(steps, "i64", active_builder()), "f32")
    step = ops.div(ops.sub(end, start), float(steps - 1))
    forward = ops.add(ops.mul(i, step), start)
    backward = ops.sub(end, ops.mul(ops.sub(float(steps - 1), i), step))
    return ops.where(ops.lt(i, float(steps // 2)), forward, backward)


@aten("logspace")
def logspace(start, end, steps, base=10.0, dtype=None, **kwargs):
    return ops.pow(float(base), linspace(start, end, steps))


def _triangle(x, diagonal, keep_upper):
    rows, cols = x.shape[-2], x.shape[-1]
    r = ops.unsqueeze(ops.iota(rows, "i64", x.builder), 1)
    c = ops.unsqueeze(ops.iota(cols, "i64", x.builder), 0)
    offset = ops.sub(c, r)
    keep = ops.ge(offset, diagonal) if keep_upper else ops.le(offset, diagonal)
    return ops.where(keep, x, ops.full((), 0, x.dtype, like=x))


@aten("triu")
def triu(x, diagonal=0):
    return _triangle(x, diagonal, True)


@aten("tril")
def tril(x, diagonal=0):
    return _triangle(x, diagonal, False)


@aten("eye")
def eye(n, m=None, dtype=None, **kwargs):
    m = n if m is None else m
    builder = active_builder()
    r = ops.unsqueeze(ops.iota(n, "i64", builder), 1)
    c = ops.unsqueeze(ops.iota(m, "i64", builder), 0)
    return ops.cast(ops.eq(r, c), _dt(dtype))
