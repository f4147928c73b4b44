"""JAX movement primitives: broadcasts, reshapes, slices, pads, dynamic slices and iota."""
from __future__ import annotations

from tdag import ops
from tdag.canonicalize.jax.ops.table import dtype_of_np, op
from tdag.canonicalize.jax.trace import dim_of
from tdag.ir.symbols import as_dim, is_static
from tdag.ir.types import DType


@op("broadcast_in_dim")
def _broadcast_in_dim(ctx, x, *dynamic):
    """Operand axis k lands on output axis ``broadcast_dimensions[k]``; the others are new."""
    if dynamic:
        raise ctx.unsupported("sizes given at run time")
    shape = tuple(dim_of(d) for d in ctx.params["shape"])
    placed = ctx.params["broadcast_dimensions"]
    new = tuple(a for a in range(len(shape)) if a not in placed)
    if new:
        x = ops.unsqueeze(x, new)
    return ops.broadcast_to(x, shape)


@op("reshape")
def _reshape(ctx, x, *dynamic):
    if dynamic or ctx.params.get("dimensions") is not None:
        raise ctx.unsupported("reshape with a dimension order or run-time sizes")
    return ops.reshape(x, tuple(dim_of(d) for d in ctx.params["new_sizes"]))


@op("transpose")
def _transpose(ctx, x):
    return ops.permute(x, *ctx.params["permutation"])


@op("squeeze")
def _squeeze(ctx, x):
    return ops.squeeze(x, tuple(ctx.params["dimensions"]))


@op("expand_dims")
def _expand_dims(ctx, x):
    return ops.unsqueeze(x, tuple(ctx.params["dimensions"]))


@op("concatenate")
def _concatenate(ctx, *xs):
    return ops.concat(list(xs), ctx.params["dimension"])


@op("stack")
def _stack(ctx, *xs):
    return ops.stack(list(xs), ctx.params["axis"])


@op("split")
def _split(ctx, x):
    return ops.split(x, list(ctx.params["sizes"]), ctx.params["axis"])


@op("tile")
def _tile(ctx, x):
    return ops.tile(x, tuple(ctx.params["reps"]))


@op("rev")
def _rev(ctx, x):
    for axis in ctx.params["dimensions"]:
        x = reverse(x, axis)
    return x


def reverse(x, axis: int):
    n = x.shape[axis]
    return ops.gather(x, ops.sub(ops.sub(n, 1), ops.iota(n, "i64", x.builder)), axis, wrap=False)


@op("iota")
def _iota(ctx, *dynamic):
    if dynamic:
        raise ctx.unsupported("sizes given at run time")
    shape = tuple(dim_of(d) for d in ctx.params["shape"])
    axis = ctx.params["dimension"]
    line = ops.iota(shape[axis], dtype_of_np(ctx.params["dtype"]), ctx.builder)
    line = ops.reshape(line, tuple(s if a == axis else 1 for a, s in enumerate(shape)))
    return ops.broadcast_to(line, shape)


# -- slices and pads ------------------------------------------------------------------------------

@op("slice")
def _slice(ctx, x):
    p = ctx.params
    strides = p.get("strides") or (1,) * x.ndim
    for axis, (start, stop, step) in enumerate(zip(p["start_indices"], p["limit_indices"],
                                                   strides)):
        if not (start == 0 and stop == x.shape[axis] and step == 1):
            x = ops.slice(x, axis, dim_of(start), dim_of(stop), int(step))
    return x


@op("pad")
def _pad(ctx, x, value):
    """lax.pad: per axis (low, high, interior); negative low/high crop, interior inserts
    ``interior`` values between neighbours."""
    config = ctx.params["padding_config"]
    known = ctx.literal(1)
    if known is not None and complex(known).imag:
        known = None  # a complex fill pads the mask below (the fill here is a real number)
    fill = complex(known).real if known is not None else 0.0
    out = x
    for axis, (_, _, interior) in enumerate(config):
        out = interior_pad(out, axis, int(interior), fill)
    out = ops.pad(out, [(lo, hi) for lo, hi, _ in config], fill)
    if known is not None:
        return out
    # a fill computed from data: pad a mask the same way, and pick the fill where it is 0
    mask = ops.full(x.shape, 1.0, DType.f32, like=x)
    for axis, (_, _, interior) in enumerate(config):
        mask = interior_pad(mask, axis, int(interior), 0.0)
    mask = ops.pad(mask, [(lo, hi) for lo, hi, _ in config], 0.0)
    return ops.where(ops.eq(mask, 1.0), out, value)


def interior_pad(x, axis: int, k: int, fill: float):
    """``k`` copies of ``fill`` between neighbours along ``axis`` (lax.pad's interior, and
    a conv's lhs dilation): pad a new axis after it, flatten the two, drop the tail."""
    if k == 0 or not is_static(x.shape[axis]) or x.shape[axis] == 0:
        return x
    n = x.shape[axis]
    x = ops.unsqueeze(x, axis + 1)
    x = ops.pad(x, [(0, 0)] * (axis + 1) + [(0, k)] + [(0, 0)] * (x.ndim - axis - 2), fill)
    x = ops.group(x, axis, 2)
    return ops.slice(x, axis, 0, n + (n - 1) * k)


# -- dynamic slices -------------------------------------------------------------------------------

def _start(ctx, start, dim, size):
    """A start index clamped into [0, dim - size], as lax clamps dynamic starts."""
    high = as_dim(dim - size)
    return ops.clamp(ops.cast(ops.reshape(start, ()), DType.i64), 0,
                     high if is_static(high) else ops.dim_tensor(high))


@op("dynamic_slice")
def _dynamic_slice(ctx, x, *starts):
    sizes = [dim_of(s) for s in ctx.params["slice_sizes"]]
    for axis, (start, size) in enumerate(zip(starts, sizes)):
        known = ctx.literal(1 + axis)
        if known is not None and is_static(x.shape[axis]):
            begin = min(max(int(known), 0), x.shape[axis] - size)
            if begin != 0 or size != x.shape[axis]:
                x = ops.slice(x, axis, begin, begin + size)
            continue
        first = _start(ctx, start, x.shape[axis], size)
        x = ops.gather(x, ops.add(ops.iota(size, "i64", x.builder), first), axis, wrap=False)
    return x


@op("dynamic_update_slice")
def _dynamic_update_slice(ctx, x, update, *starts):
    """x with ``update`` written at the (clamped) starts: per axis, each position of x
    reads the update at its offset from the start (a gather), and a mask of the positions
    inside the update picks between the two."""
    spread, inside = update, None
    for axis, start in enumerate(starts):
        n, size = x.shape[axis], update.shape[axis]
        offset = ops.sub(ops.iota(n, "i64", x.builder), _start(ctx, start, n, size))
        hit = ops.logical_and(ops.ge(offset, 0), ops.lt(offset, size))
        spread = ops.gather(spread, ops.clamp(offset, 0, size - 1), axis, wrap=False)
        hit = ops.reshape(hit, tuple(n if a == axis else 1 for a in range(x.ndim)))
        inside = hit if inside is None else ops.logical_and(inside, hit)
    if inside is None:
        return update
    return ops.where(inside, spread, x)
