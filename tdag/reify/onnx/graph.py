"""A small ONNX graph builder: nodes, initializers, unique names and symbolic dims.

Nested graphs (If branches, Loop bodies) are child builders: they share the model's
initializers and name space and may read any outer value, as ONNX subgraphs can.
"""
from __future__ import annotations

import numpy as np
import onnx
import sympy
import torch
from onnx import TensorProto, helper

from tdag.errors import UnsupportedOpError
from tdag.ir.names import FreshNames
from tdag.ir.symbols import Dim, format_dim, is_static
from tdag.ir.types import IN_ONNX, DType, TensorType, fill_of

ONNX_DTYPE = {dtype: dtype.onnx for dtype in IN_ONNX}


def tensor_proto(name: str, value: torch.Tensor) -> onnx.TensorProto:
    """An initializer holding ``value`` (raw bytes, so bfloat16, float8 and bool work too)."""
    return _fill_tensor(onnx.TensorProto(), name, value)


def _fill_tensor(proto: onnx.TensorProto, name: str, value: torch.Tensor) -> onnx.TensorProto:
    value = value.detach().cpu()
    if value.is_complex():  # to_onnx holds a complex value as its pair (reify/onnx/complex.py)
        value = torch.view_as_real(value.resolve_conj())
    value = value.contiguous()
    dtype = DType.of(value.dtype)
    # numpy has no bfloat16 or float8: their raw bits go as unsigned integers of their width
    raw = value.view(torch.int16) if dtype is DType.bf16 else \
        value.view(torch.uint8) if dtype.is_float8 else value
    proto.name, proto.data_type = name, ONNX_DTYPE[dtype]
    proto.dims.extend(value.shape)
    proto.raw_data = raw.numpy().tobytes()
    return proto


def value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    dims = [d if is_static(d) else format_dim(d) for d in t.shape]
    return helper.make_tensor_value_info(name, ONNX_DTYPE[t.dtype], dims)


def zipmap(src: str, dst: str, labels: tuple, name: str) -> tuple:
    """(the ai.onnx.ml ZipMap node making ``dst``, a seq(map(int64, float)), of the [N, C]
    probabilities ``src`` with the C ``labels``, ``dst``'s value info): Program.class_labels
    written back as the file had it."""
    node = helper.make_node("ZipMap", [src], [dst], name=name, domain="ai.onnx.ml",
                            classlabels_int64s=list(labels))
    maps = helper.make_map_type_proto(TensorProto.INT64,
                                      helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    return node, helper.make_value_info(dst, helper.make_sequence_type_proto(maps))


def _value_name(hint: str) -> str:
    return hint or "t"


class Symbols:
    """Where each size's value lives: a 1-element int64 tensor, made on first use from
    ``Shape(x, start=i, end=i+1)`` of a tensor that has the size on axis i. A symbol is read
    from the inputs (or a fresh size's definer); a size expression (a conv's output length)
    from any tensor written so far that has it, rather than recomputed from its symbols."""

    def __init__(self, parent: "Symbols | None" = None):
        self.parent = parent
        self.sources: dict = {}  # a symbol's name or an expression -> (tensor, axis)
        self.made: dict = {}

    def bind(self, tensor: str, shape, expressions: bool = False) -> None:
        for i, d in enumerate(shape):
            if is_static(d):
                continue
            key = d.name if d.is_Symbol else d if expressions else None
            if key is not None and key not in self.sources:
                self.sources[key] = (tensor, i)

    def lookup(self, name, g: "GraphBuilder", required: bool = True) -> str | None:
        """The tensor holding the size ``name`` (a symbol's name, or an expression)."""
        scope = self
        while scope is not None:
            if name in scope.made:
                return scope.made[name]
            if name in scope.sources:
                tensor, axis = scope.sources[name]
                hint = f"sym_{name}" if isinstance(name, str) else "size"
                out = g.node("Shape", [tensor], start=axis, end=axis + 1, hint=hint)
                scope.made[name] = out
                return out
            scope = scope.parent
        if required:
            raise UnsupportedOpError(f"symbol {name!r} has no tensor to read it from")
        return None


class GraphBuilder:
    def __init__(self, opset: int, names: FreshNames | None = None,
                 initializers: list | None = None, parent: "GraphBuilder | None" = None,
                 runtime: str | None = None):
        self.opset = opset
        # None: standard ONNX; "onnxruntime": its com.microsoft fused kernels allowed too
        self.runtime = parent.runtime if parent else runtime
        # value names are unique across the whole model, subgraphs included
        self.names = names or FreshNames(sanitize=_value_name)
        self.initializers = initializers if initializers is not None else []
        self.nodes: list[onnx.NodeProto] = []
        self.parent = parent
        self.symbols = Symbols(parent.symbols if parent else None)
        self._consts: dict = parent._consts if parent else {}
        self._once: dict = {}  # node_once's nodes, this graph's own

    def child(self) -> "GraphBuilder":
        return GraphBuilder(self.opset, self.names, self.initializers, self)

    def node(self, op_type: str, inputs, hint: str = "", outputs: int = 1, **attrs):
        """Append a node; returns its output name (or names if ``outputs`` > 1)."""
        outs = [self.names(hint or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs,
                                           name=self.names(f"n_{op_type}"), **attrs))
        return outs[0] if outputs == 1 else outs

    def node_once(self, op_type: str, inputs, outputs: int = 1, **attrs):
        """``node``, appended once per (op, inputs, attributes) in this graph: the parts of
        a multi-output op (DynamicQuantizeLinear's), each one tdag node, share one ONNX node."""
        key = (op_type, tuple(inputs), outputs, tuple(sorted(attrs.items())))
        if key not in self._once:
            self._once[key] = self.node(op_type, inputs, outputs=outputs, **attrs)
        return self._once[key]

    def initializer(self, name: str, value: torch.Tensor) -> str:
        name = self.names(name)
        self.initializers.append((name, value))
        return name

    def weight(self, name: str, value: torch.Tensor) -> str:
        """A weight's value: an initializer, or a ConstantOfShape where the value is one
        element broadcast (a file's filled weight: onnxruntime folds it once, at load)."""
        fill = fill_of(value)
        if fill is None:
            return self.initializer(name, value.contiguous())
        return self.node("ConstantOfShape", [self.const(list(value.shape))], hint=name,
                         value=tensor_proto(f"{name}_value", fill.reshape(1)))

    def const(self, value, dtype: DType = DType.i64) -> str:
        """A constant initializer (a scalar or a list), shared by value and dtype."""
        array = np.asarray(value)
        key = (array.tobytes(), array.shape, dtype)
        if key not in self._consts:
            tensor = torch.tensor(array.tolist(), dtype=dtype.torch)
            self._consts[key] = self.initializer("c", tensor)
        return self._consts[key]

    def cast(self, x: str, dtype: DType) -> str:
        if dtype is DType.f8e8m0fnu:
            return self._cast_e8m0(x)
        if dtype.is_float8:  # tdag's cast does not saturate (ONNX's default does)
            return self.node("Cast", [x], to=ONNX_DTYPE[dtype], saturate=0)
        return self.node("Cast", [x], to=ONNX_DTYPE[dtype])

    def bitcast(self, x: str, dtype: DType) -> str:
        """x's bits as ``dtype`` (ONNX's BitCast, opset 26)."""
        return self.node("BitCast", [x], to=ONNX_DTYPE[dtype])

    def _cast_e8m0(self, x: str) -> str:
        """tdag's (torch's) cast to float8_e8m0: |x| to the nearest power of two, 0 and
        values below the range to the least, NaN from 1.5 * 2**127 up (rounding past the
        top); ONNX's saturating cast does the rest once the overflow is made NaN."""
        wide = self.node("Abs", [self.node("Cast", [x], to=TensorProto.DOUBLE)])
        over = self.node("GreaterOrEqual", [wide, self.const(1.5 * 2.0 ** 127, DType.f64)])
        wide = self.node("Where", [over, self.const(float("nan"), DType.f64), wide])
        return self.node("Cast", [wide], to=TensorProto.FLOAT8E8M0, saturate=1,
                         round_mode="nearest")

    def filled(self, shape, value: float, dtype: DType) -> str:
        """A tensor of ``value`` with ``shape`` (static: an initializer; else Expand)."""
        if all(is_static(d) for d in shape):
            return self.initializer("fill", torch.full(tuple(shape), value, dtype=dtype.torch))
        return self.node("Expand", [self.const(value, dtype), self.shape(shape, False)])

    # -- symbolic dimensions ------------------------------------------------------------------

    def dim(self, d: Dim) -> str:
        """A 1-element int64 tensor holding the value of ``d``."""
        if is_static(d):
            return self.const([int(d)])
        return self._expr(sympy.sympify(d))

    def _expr(self, e) -> str:
        if e.is_Integer:
            return self.const([int(e)])
        if e.is_Symbol:
            return self.symbols.lookup(e.name, self)
        held = self.symbols.lookup(e, self, required=False)
        if held is not None:
            return held
        if e.is_Add or e.is_Mul:
            num, den = sympy.fraction(e) if e.is_Mul else (e, 1)
            if den != 1:
                return self.node("Div", [self._expr(num), self._expr(den)])
            parts = [self._expr(a) for a in e.args]
            out = parts[0]
            for p in parts[1:]:
                out = self.node("Add" if e.is_Add else "Mul", [out, p])
            return out
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return self.node("Div", [self._expr(num), self._expr(den)])
        if e.is_Pow and e.exp.is_Integer and e.exp > 0:
            out = base = self._expr(e.base)
            for _ in range(int(e.exp) - 1):
                out = self.node("Mul", [out, base])
            return out
        if isinstance(e, sympy.Mod):
            return self.node("Mod", [self._expr(e.args[0]), self._expr(e.args[1])])
        if isinstance(e, (sympy.Max, sympy.Min)):  # a Slice bound clamped to its axis
            return self.node("Max" if isinstance(e, sympy.Max) else "Min",
                             [self._expr(a) for a in e.args])
        raise UnsupportedOpError(f"cannot compute the dimension {e} in ONNX")

    def shape(self, dims, minus_one: bool = True) -> str:
        """An int64 shape tensor; with ``minus_one`` a single symbolic dim becomes -1."""
        dims = list(dims)
        dynamic = [i for i, d in enumerate(dims) if not is_static(d)]
        if minus_one and len(dynamic) == 1:
            return self.const([int(d) if is_static(d) else -1 for d in dims])
        if not dynamic:
            return self.const([int(d) for d in dims])
        parts, run = [], []
        for d in dims:
            if is_static(d):
                run.append(int(d))
                continue
            if run:
                parts.append(self.const(run))
                run = []
            parts.append(self.dim(d))
        if run:
            parts.append(self.const(run))
        return self.node("Concat", parts, axis=0) if len(parts) > 1 else parts[0]

    def scalar_dim(self, d: Dim) -> str:
        """A 0-d int64 tensor holding ``d``."""
        if is_static(d):
            return self.const(int(d))
        return self.node("Squeeze", [self.dim(d), self.const([0])])

    def graph(self, name: str, inputs, outputs,
              into: onnx.GraphProto | None = None) -> onnx.GraphProto:
        """The graph of these nodes (written into ``into`` where given: a model's own graph,
        since copying a tensor past 2 GiB into a message serializes it)."""
        graph = into if into is not None else onnx.GraphProto()
        graph.name = name
        graph.node.extend(self.nodes)
        graph.input.extend(inputs)
        graph.output.extend(outputs)
        if self.parent is None:
            for value_name, value in self.initializers:
                _fill_tensor(graph.initializer.add(), value_name, value)
        return graph


def prune(graph: onnx.GraphProto) -> None:
    """Drop the nodes whose outputs nothing reads and the initializers no node reads, in
    ``graph`` and its subgraphs (If branches, Loop bodies), to a fixed point.

    Converters and symbol lookups may build values that end up unread (a dimension computed
    for a branch not taken, a constant superseded by a literal); onnxruntime would warn about
    each such initializer and remove it at every session start. Every op emitted here is
    pure, so an unread node is dead. Value names are unique across the model, so one set of
    read names serves all graphs.
    """
    graphs = all_graphs(graph)
    while True:
        read = {o.name for g in graphs for o in g.output}
        for g in graphs:
            for node in g.node:
                read.update(node.input)
        removed = False
        for g in graphs:
            keep = [n for n in g.node if any(o in read for o in n.output)]
            if len(keep) != len(g.node):
                del g.node[:]
                g.node.extend(keep)
                removed = True
        if not removed:
            break
        graphs = all_graphs(graph)  # a dropped If or Loop takes its subgraphs with it
    read.update(i.name for i in graph.input)  # an initializer that is an input's default
    for i in reversed(range(len(graph.initializer))):  # in place: no tensor is copied
        if graph.initializer[i].name not in read:
            del graph.initializer[i]


def rename(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    """Rename values (node inputs and outputs, subgraphs included) by ``names``."""
    if not names:
        return
    for g in all_graphs(graph):
        for node in g.node:
            for field in (node.input, node.output):
                for i, name in enumerate(field):
                    if name in names:
                        field[i] = names[name]


def all_graphs(graph: onnx.GraphProto) -> list[onnx.GraphProto]:
    """``graph`` and every subgraph nested in its nodes' attributes."""
    found, pending = [], [graph]
    while pending:
        g = pending.pop()
        found.append(g)
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    pending.append(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    pending.extend(a.graphs)
    return found
