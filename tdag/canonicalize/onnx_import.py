"""``from_onnx``: an ONNX model, walked node by node into a tdag Program.

Graph inputs become inputs (``dim_param`` axes become symbols), initializers become
parameters under their own (sanitised) names, Constant nodes become consts. Each node is
converted by its entry in the op table (onnx_ops*.py) inside ``Builder.scope(origin)``, where
the origin names the ONNX op, the module path torch.onnx.export encodes in the node name, and
the node name itself. Unsupported ops are collected over the whole graph and reported in one
UnsupportedOpError.

Runs of nodes between control-flow nodes become TDAGs ("segments"); If and Loop become
controllers (onnx_control.py). A model without them is one TDAG called once. Inside a
segment a name's value is a Tensor, a shape value (Known) or None for an output tdag does not
compute; a value made by an earlier step is a Boundary, read as one of the segment's inputs.
"""
from __future__ import annotations

import onnx
import torch
from onnx import helper, numpy_helper

import tdag.canonicalize.onnx_ops_nn  # noqa: F401,E402  (registers the nn entries)
from tdag import ops
from tdag.canonicalize.onnx_control import convert_if, convert_loop
from tdag.canonicalize.onnx_load import dtype_of, load_model, scope_of, symbol_name, tdag_name
from tdag.canonicalize.onnx_ops import OPS
from tdag.canonicalize.onnx_values import Known, Param, free_names, known_of, materialize
from tdag.canonicalize.segments import Boundary
from tdag.deinops.builder import Builder, Tensor
from tdag.errors import InvalidModelError, ShapeError, TdagError, UnsupportedOpError
from tdag.ir.graph import Value
from tdag.ir.names import NameMap
from tdag.ir.program import Block, Call, Program
from tdag.ir.symbols import as_dim
from tdag.ir.types import DType, Origin, TensorKind, TensorType
from tdag.refine.dataflow import prune

CONTROLLERS = {"If": convert_if, "Loop": convert_loop}


def from_onnx(model_or_path) -> Program:
    """Canonicalize an ONNX model (a path or an ``onnx.ModelProto``) into a tdag Program.

    >>> import onnx, tdag
    >>> from onnx import helper, TensorProto as T
    >>> g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
    ...     [helper.make_tensor_value_info("y", T.FLOAT, ["batch", 4])])
    >>> prog = tdag.from_onnx(helper.make_model(g))
    >>> [str(t) for t in prog.input_types], [str(t) for t in prog.graph.output_types]
    (['f32[batch,4]'], ['f32[batch,4]'])
    """
    model = load_model(model_or_path)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise InvalidModelError("the model imports no version of the default ONNX domain")
    shared = Shared(opset, model.graph)
    _precheck(model.graph, shared)
    importer = _Importer(model.graph, shared, "main", {})
    block = importer.main_block()
    if shared.problems:
        raise unsupported_error(shared.problems)
    step = block.steps[0] if len(block.steps) == 1 else None
    if isinstance(step, Call) and step.outputs == block.outputs:  # the common case
        return Program.from_tdag(shared.graphs[step.graph])
    return Program(shared.graphs, block)


def _precheck(graph: onnx.GraphProto, shared: "Shared") -> None:
    """Report every op type the table lacks before converting anything."""
    for node in all_nodes(graph):
        if node.domain not in ("", "ai.onnx") or \
                node.op_type not in OPS and node.op_type not in CONTROLLERS:
            shared.problems.append(("no tdag mapping", node))
    if shared.problems:
        raise unsupported_error(shared.problems)


class _Poisoned:
    """The output of a node that could not be converted; its users are skipped."""


_POISONED = _Poisoned()


class Shared:
    """What the importers of a model and of its subgraphs share."""

    def __init__(self, opset: int, graph: onnx.GraphProto):
        self.opset = opset
        self.names = NameMap(sanitize=tdag_name)  # ONNX names -> tdag names, stable
        self.graphs: dict = {}
        self.problems: list = []
        infos = [v for g in all_graphs(graph) for v in list(g.value_info) + list(g.output)]
        self.types = {v.name: v.type for v in infos}

    def graph_name(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.graphs:
            name, k = f"{hint}_{k}", k + 1
        return name


class _Importer:
    """Converts one ONNX graph into a Block: straight-line runs of nodes become TDAGs
    (segments) joined by the controllers that If nodes become."""

    def __init__(self, graph: onnx.GraphProto, shared: Shared, prefix: str, env: dict):
        self.graph, self.shared, self.prefix = graph, shared, prefix
        self.opset, self.names, self.types = shared.opset, shared.names, shared.types
        self.problems = shared.problems
        self.env: dict = dict(env)
        self.builder, self.local = Builder(), {}
        self.steps: list = []
        self.later = later_uses(graph)
        self.graph_outputs_hook = None

    # -- blocks ---------------------------------------------------------------------------------

    def main_block(self) -> Block:
        self._initializers()
        inputs = self._inputs()
        for onnx_name in [v.name for v in self.graph.input if v.name in self.env]:
            if isinstance(self.env[onnx_name], Boundary):  # the model's inputs, in order
                self._read_boundary(onnx_name)
        return self._walk(inputs)

    def sub_block(self, inputs: list, bool_first: bool = False) -> Block:
        """The Block of a subgraph; ``bool_first`` makes its first output a bool scalar
        (a loop body's condition, which ONNX allows to be a one-element tensor)."""
        self._initializers()
        if bool_first:
            self.graph_outputs_hook = self._scalar_condition
        return self._walk(inputs)

    def _scalar_condition(self, name: str) -> None:
        value = self.read(name)
        if not isinstance(value, _Poisoned):
            with self.builder.active():
                self.env[name] = ops.reshape(ops.cast(self._as_tensor(value), DType.bool))

    def _walk(self, inputs: list) -> Block:
        for index, node in enumerate(self.graph.node):
            if node.op_type in CONTROLLERS:
                self._controller(node, index)
            else:
                self._node(node)
        outputs = []
        if self.graph_outputs_hook is not None and self.graph.output:
            self.graph_outputs_hook(self.graph.output[0].name)
        for out in self.graph.output:
            value = self.env.get(out.name, _POISONED)
            if isinstance(value, Boundary):
                outputs.append(value.name)
                continue
            if not isinstance(value, _Poisoned):
                self.env[out.name] = self._as_tensor(self.read(out.name))
            outputs.append(self.names(out.name))
        self.close([o.name for o in self.graph.output])
        return Block(tuple(Value(v.name, v.type) for v in inputs), tuple(self.steps),
                     tuple(outputs))

    def _controller(self, node: onnx.NodeProto, index: int) -> None:
        if any(isinstance(self.env.get(n), _Poisoned) for n in node.input if n):
            self._bind(node, [_POISONED] * len(node.output))
            return
        try:
            CONTROLLERS[node.op_type](self, node, index)
        except (UnsupportedOpError, NotImplementedError, ShapeError) as exc:
            self.problems.append((_message(exc), node))
            for name in node.output:
                self.env[name] = _POISONED

    def close(self, needed) -> None:
        """End the current segment: its values read later become its TDAG's outputs (in
        the order of ``needed`` where it is a list)."""
        rank = {k: i for i, k in enumerate(needed)} if isinstance(needed, list) else {}
        outs = sorted(((k, v) for k, v in self.env.items()
                       if isinstance(v, Tensor) and v.builder is self.builder and k in needed),
                      key=lambda kv: rank.get(kv[0], len(rank)))
        if outs or self.builder.nodes:
            graph = prune(self.builder.build([v for _, v in outs]))
            name = self.shared.graph_name(self.prefix)
            self.shared.graphs[name] = graph
            names = tuple(self.names(k) for k, _ in outs)
            self.steps.append(Call(name, tuple(v.name for v in graph.inputs), names))
            for (key, value), block_name in zip(outs, names):
                self.env[key] = Boundary(block_name, value.type)
        self.builder, self.local = Builder(), {}

    # -- graph boundary -------------------------------------------------------------------------

    def _initializers(self, graph: onnx.GraphProto | None = None) -> None:
        for init in (graph or self.graph).initializer:
            name = self.names(init.name)
            try:
                dtype_of(init.data_type, init.name)
                value = torch.from_numpy(numpy_helper.to_array(init).copy())
            except (UnsupportedOpError, TypeError, ValueError) as exc:
                self.problems.append((f"initializer: {exc}", None))
                self.env[init.name] = _POISONED
                continue
            # small integer initializers are shape data: made tensors only where read as such
            known = known_of(value, name)
            self.env[init.name] = known if known is not None else Param(name, value)

    def _inputs(self) -> list:
        values = []
        for value in self.graph.input:
            if value.name in self.env:  # IR < 4 lists initializers among the inputs
                continue
            if not value.type.HasField("tensor_type"):
                self.problems.append((f"input {value.name}: only tensor inputs are supported",
                                      None))
                continue
            tensor_type = value.type.tensor_type
            shape = [self._dim(d, value.name, axis)
                     for axis, d in enumerate(tensor_type.shape.dim)]
            dtype = dtype_of(tensor_type.elem_type, value.name)
            boundary = Boundary(self.names(value.name), TensorType(tuple(shape), dtype))
            self.env[value.name] = boundary
            values.append(boundary)
        return values

    def _dim(self, dim, input_name: str, axis: int):
        if dim.HasField("dim_value"):
            return int(dim.dim_value)
        if dim.HasField("dim_param"):
            return as_dim(symbol_name(dim.dim_param))
        return as_dim(symbol_name(f"{input_name}_{axis}"))  # unnamed: name it after its place

    # -- values ---------------------------------------------------------------------------------

    def read(self, name: str):
        """The value of an ONNX name, usable in the current segment."""
        value = self.env.get(name, _POISONED)
        if isinstance(value, Boundary):
            return self._read_boundary(name)
        if isinstance(value, Param):
            if name not in self.local:
                weight_name = value.name if value.name not in self.builder._taken else \
                    self.builder.fresh(value.name + "_")
                self.local[name] = self.builder.weight(weight_name, TensorKind.parameter,
                                                       value.value)
            return self.local[name]
        return value

    def _read_boundary(self, name: str) -> Tensor:
        if name not in self.local:
            value = self.env[name]
            self.local[name] = self.builder.input(value.name, value.type)
        return self.local[name]

    def _as_tensor(self, value) -> Tensor:
        with self.builder.active():
            return materialize(self.builder, value) if isinstance(value, Known) else value

    # -- nodes ----------------------------------------------------------------------------------

    def _node(self, node: onnx.NodeProto) -> None:
        inputs = [self.read(name) if name else None for name in node.input]
        if any(isinstance(v, _Poisoned) for v in inputs):
            self._bind(node, [_POISONED] * len(node.output))
            return
        origin = Origin(op=f"onnx.{node.op_type}", scope=scope_of(node.name),
                        location=node.name)
        ctx = NodeContext(self, node)
        with self.builder.active(), self.builder.scope(origin):
            try:
                result = OPS[node.op_type](ctx, *inputs)
                results = list(result) if isinstance(result, (list, tuple)) else [result]
                self._bind(node, [self._fit(node, i, r) for i, r in enumerate(results)])
            except (UnsupportedOpError, NotImplementedError, ShapeError) as exc:
                self.problems.append((_message(exc), node))
                self._bind(node, [_POISONED] * len(node.output))

    def _bind(self, node, results) -> None:
        for i, name in enumerate(node.output):
            if not name:
                continue
            value = results[i] if i < len(results) else None
            if value is None and name in self.later[0]:
                raise UnsupportedOpError(f"output {i} ({name}) is not computed by tdag")
            self.env[name] = value

    def _fit(self, node, index: int, value):
        """Cast to the element type ONNX's shape inference recorded (ONNX never promotes)."""
        if not isinstance(value, Tensor) or index >= len(node.output):
            return value
        t = self.types.get(node.output[index])
        if t is not None and t.HasField("tensor_type") and t.tensor_type.elem_type:
            dtype = dtype_of(t.tensor_type.elem_type)
            if value.dtype is not dtype:
                value = ops.cast(value, dtype)
        return value


def all_graphs(graph: onnx.GraphProto):
    """The graph and every subgraph in it, depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                yield from all_graphs(sub)


def all_nodes(graph: onnx.GraphProto):
    return [n for g in all_graphs(graph) for n in g.node]


def later_uses(graph: onnx.GraphProto) -> list:
    """For each node index, the names read by that node or any after it (and the outputs)."""
    uses, acc = [], {o.name for o in graph.output}
    for node in reversed(graph.node):
        acc = acc | {name for name in node.input if name}
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                acc = acc | free_names(attr.g)
        uses.append(acc)
    uses.reverse()
    return uses + [{o.name for o in graph.output}]


class NodeContext:
    """What an op-table entry sees of its node: attributes, opset and value helpers."""

    def __init__(self, importer: _Importer, node: onnx.NodeProto):
        self.importer, self.node, self.opset = importer, node, importer.opset
        self.builder = importer.builder
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def attr(self, name: str, default=None):
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def tensor(self, value) -> Tensor:
        """Any value as a tensor of the graph (Knowns are materialised)."""
        if isinstance(value, Known):
            return materialize(self.builder, value)
        if not isinstance(value, Tensor):
            raise UnsupportedOpError(f"{self.node.op_type}: expected a tensor, got {value!r}")
        return value

    def known(self, value) -> Known | None:
        """The value as a Known when it is one, or a small integer const/initializer."""
        if isinstance(value, Known) or value is None:
            return value
        weight = self.builder.weights.get(value.name)
        if weight is not None and weight.value is not None:
            return known_of(weight.value)
        return None

    def ints(self, value, what: str = "") -> list | None:
        """The elements of an integer input known at import time (Dims); None if absent."""
        if value is None:
            return None
        known = self.known(value)
        if known is None:
            raise UnsupportedOpError(f"{self.node.op_type}: input {what or ''} must be known "
                                     "at import time (it is computed from data)")
        return known.dims()

    def scalar(self, value, what: str = ""):
        """A Python number for a scalar input known at import time."""
        if value is None:
            return None
        if isinstance(value, Known):
            return value.dims()[0]
        weight = self.builder.weights.get(value.name)
        if weight is None or weight.value is None or weight.value.numel() != 1:
            raise UnsupportedOpError(f"{self.node.op_type}: {what or 'a scalar input'} must be "
                                     "a constant")
        return weight.value.reshape(()).item()

    def const_tensor(self, value: torch.Tensor) -> Tensor | Known:
        known = known_of(value)
        return known if known is not None else self.builder.const(value)

    def dtype(self, onnx_type: int) -> DType:
        return dtype_of(onnx_type)


def unsupported_error(problems) -> UnsupportedOpError:
    """One error naming every unsupported op: its type, its node name and its domain."""
    lines = []
    for what, node in problems:
        if node is None:
            lines.append(f"  {what}")
            continue
        domain = node.domain or "ai.onnx"
        lines.append(f"  {node.op_type} (node {node.name or '<unnamed>'!r}, domain {domain}): "
                     f"{what}")
    kinds = sorted({node.op_type for _, node in problems if node is not None})
    error = UnsupportedOpError(f"{len(problems)} unsupported ONNX op use(s) "
                               f"({', '.join(kinds)}):\n" + "\n".join(lines))
    error.problems = list(problems)
    return error


def _message(exc: Exception) -> str:
    """The failure without its location: the problem list names the ONNX node itself."""
    return exc.message if isinstance(exc, TdagError) else str(exc)
