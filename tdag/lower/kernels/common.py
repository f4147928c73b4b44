"""Shape and cost helpers the kernel records share."""
from __future__ import annotations

from tdag.deinops.primitive import Cost, traffic
from tdag.errors import ShapeError
from tdag.ir.symbols import dims_equal, format_dim, is_static
from tdag.ir.types import TensorType
from tdag.lower.match import kernel_template

# the suffix of a framework call per spatial rank: F.conv2d, F.max_pool3d
NDIM = {1: "1d", 2: "2d", 3: "3d"}


def fmt_shape(shape) -> str:
    return "[" + ",".join(format_dim(d) for d in shape) + "]"


def check_bias(op: str, bias: TensorType, out: TensorType) -> None:
    """A bias is added with numpy broadcasting aligned to the output's trailing axes."""
    if bias.dtype is not out.dtype or bias.rank > out.rank:
        raise ShapeError(f"{op}: bias {bias} does not broadcast to {out}")
    for b, o in zip(reversed(bias.shape), reversed(out.shape)):
        if not (dims_equal(b, o) or (is_static(b) and b == 1)):
            raise ShapeError(f"{op}: bias {bias} does not broadcast to {out}")


def same_shape(op: str, t: TensorType, shape, dtype) -> None:
    if t.dtype is not dtype or len(t.shape) != len(shape) or \
            not all(dims_equal(a, b) for a, b in zip(t.shape, shape)):
        raise ShapeError(f"{op}: operand {t} should be {dtype.value}"
                         f"[{','.join(format_dim(d) for d in shape)}]")


def float_input(op: str, x: TensorType) -> None:
    if not x.dtype.is_float:
        raise ShapeError(f"{op}: needs a float input, got {x}")


def reduced_type(op: str, x: TensorType, axes: tuple, keepdim: bool) -> TensorType:
    """A float reduction's result type over ``axes`` of ``x`` (kept as 1s or dropped)."""
    float_input(op, x)
    if not axes or len(set(axes)) != len(axes) or not all(0 <= a < x.rank for a in axes):
        raise ShapeError(f"{op}: axes {axes} invalid for {x}")
    shape = [1 if i in axes else d for i, d in enumerate(x.shape)] if keepdim else \
        [d for i, d in enumerate(x.shape) if i not in axes]
    return TensorType(tuple(shape), x.dtype)


def per_element(flops_per_element: int):
    def cost(spec, ins, out: TensorType) -> Cost:
        return traffic(ins, out, flops_per_element * ins[0].numel)
    return cost


def decomposed_onnx(node, ins, g, cx) -> str:
    """The ONNX emitter of a kernel ONNX has no operator for: its ``decompose``, simplified
    as lowering meets it, written inline by the primitives' own emitters."""
    graph = kernel_template(node.op, node.spec, tuple(cx.type(i) for i in node.inputs))
    return cx.exporter.call(g, graph, f"{cx.gname}/{node.name}", ins)[0]
