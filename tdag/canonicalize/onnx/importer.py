"""``from_onnx``: an ONNX model, walked node by node into a tdag Program.

Graph inputs become inputs (``dim_param`` axes become symbols), initializers become
parameters under their own (sanitised) names, Constant nodes become consts. Each node is
converted by its entry in the op table (onnx/ops/, a family a file; an entry sees its node
through onnx/context.py's NodeContext) inside ``Builder.scope(origin)``, where the origin
names the ONNX op, the module path torch.onnx.export encodes in the node name, and the node
name itself. Unsupported ops are collected over the whole graph and reported in one
UnsupportedOpError.

Runs of nodes between control-flow nodes become TDAGs ("segments"); If and Loop become
controllers (onnx/control.py). A model without them is one TDAG called once. Inside a
segment a name's value is a Tensor, a shape value (Known) or None for an output tdag does not
compute; a value made by an earlier step is a Boundary, read as one of the segment's inputs.

On bad input from_onnx raises a tdag error, never another exception: what tdag does not
handle (an op, an attribute value, a shape) is collected into the one UnsupportedOpError;
anything else raised while converting a node becomes an InvalidModelError naming the ONNX
node (name, op, place), the original kept as its cause. A type the model declares
(value_info, a graph output) that is not the computed one is an error, never a cast, and
the Program returned is verified. Memory stays linear in the graph: per name, not per node.
"""
from __future__ import annotations

import contextlib
import dataclasses

import onnx
import torch
from onnx import numpy_helper

from tdag import ops
from tdag.canonicalize.onnx.context import NodeContext, PinnedSize
from tdag.canonicalize.onnx.control import convert_if, convert_loop, convert_scan
from tdag.canonicalize.onnx.load import (
    declared_clash,
    dense_of_sparse,
    describe_node,
    dtype_of,
    initializer_dtype,
    load_model,
    scope_of,
    symbol_name,
    tdag_name,
    tensor_of,
)
from tdag.canonicalize.onnx.ops import OPS  # the package imports every family: the table is full
from tdag.canonicalize.onnx.ops.contrib import CONTRIB_OPS
from tdag.canonicalize.onnx.ops.functions import PREVIEW_OPS
from tdag.canonicalize.onnx.ops.ml import ML_OPS
from tdag.canonicalize.onnx.ops.table import table_key
from tdag.canonicalize.onnx.ops.training import TRAINING_OPS
from tdag.canonicalize.onnx.recurrent import RECURRENT_OPS, convert_recurrent
from tdag.canonicalize.onnx.values import Known, Param, known_of, materialize
from tdag.canonicalize.common.segments import Boundary, SegmentEnv, finished_program
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.errors import InvalidModelError, ShapeError, TdagError, UnsupportedOpError
from tdag.ir.graph import Value
from tdag.ir.names import FreshNames, NameMap
from tdag.ir.program import Block, Call, Program
from tdag.ir.symbols import as_dim
from tdag.ir.types import DType, Origin, TensorKind, TensorType, spec_of
from tdag.refine.dataflow import prune

CONTROLLERS = {"If": convert_if, "Loop": convert_loop, "Scan": convert_scan,
               **{op: convert_recurrent for op in RECURRENT_OPS}}


def from_onnx(model_or_path, inputs: dict | None = None) -> Program:
    """Canonicalize an ONNX model (a path or an ``onnx.ModelProto``) into a tdag Program.

    ``inputs`` pins graph inputs to values (``{"axes": [1]}``): each becomes a const of the
    Program, which no longer takes it (its other inputs keep their order). Pin an input whose
    value decides the output's rank or which axes an op touches (the axes of Reduce*,
    Squeeze and Unsqueeze, Resize's scales or sizes): no tdag type can describe its result
    for every value. Shapes, pads, repeats, k and bounds given at run time need no pin: they
    become fresh sizes (tdag/deinops/runtime.py). A pinned Program is specialised: for
    another value, import again (a cache of Programs keyed by the pinned values is the
    caller's). Dropping the input rather than guarding it means no run can disagree with
    the pin, in tdag.run, the torch module or the ONNX model alike.

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
    bound: dict = {}
    while True:
        try:
            return _import(model, inputs, bound)
        except PinnedSize as pin:  # a weight fixes a named input size: import again
            if pin.name in bound:
                raise InvalidModelError(f"input size {pin.name} is fixed twice, to "
                                        f"{bound[pin.name]} and by {pin}") from None
            bound[pin.name] = pin.value


def _import(model: onnx.ModelProto, inputs: dict | None, bound: dict) -> Program:
    """One import, the input sizes named in ``bound`` taken as those numbers."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None and all(n.domain in _OTHER_DOMAINS for n in all_nodes(model.graph)):
        opset = onnx.defs.onnx_opset_version()  # only other domains' ops: no default op reads it
    if opset is None:
        raise InvalidModelError("the model imports no version of the default ONNX domain")
    shared = Shared(opset, model.graph)
    shared.pinned, shared.bound = _pinned(model.graph, inputs or {}), bound
    _precheck(model.graph, shared)
    importer = GraphImporter(model.graph, shared, "main", {})
    block = importer.main_block()
    if shared.problems:
        raise unsupported_error(shared.problems)
    prog = _named_outputs(finished_program(shared.graphs, block, "the ONNX model"), block)
    labels = {name: shared.class_labels[out.name]
              for name, out in zip(block.outputs, model.graph.output)
              if out.name in shared.class_labels}
    return prog.replace(class_labels=labels) if labels else prog


def _named_outputs(prog: Program, block: Block) -> Program:
    """``prog`` returning its outputs under the file's names (``logits``, ``present.0.key``),
    which to_onnx writes back, where finished_program numbered them."""
    main = prog.main
    if main.outputs == block.outputs or len(main.steps) != 1 or \
            set(block.outputs) & {v.name for v in main.inputs}:
        return prog
    call = dataclasses.replace(main.steps[0], outputs=block.outputs)
    return prog.replace(main=Block(main.inputs, (call,), block.outputs))



def _pinned(graph: onnx.GraphProto, values: dict) -> dict:
    """The pinned inputs as torch tensors of their declared type and shape."""
    declared = {v.name: v for v in graph.input}
    for init in graph.initializer:
        declared.pop(init.name, None)
    pinned = {}
    for name, value in values.items():
        if name not in declared:
            raise InvalidModelError(f"inputs: {name!r} is not an input of the model "
                                    f"(its inputs: {sorted(declared)})")
        proto = declared[name].type
        if not proto.HasField("tensor_type"):
            raise UnsupportedOpError(f"inputs: {name!r} is not a tensor input")
        dtype = dtype_of(proto.tensor_type.elem_type, name)
        tensor = torch.as_tensor(value).to(dtype.torch)
        dims = [d.dim_value if d.HasField("dim_value") else None
                for d in proto.tensor_type.shape.dim]
        if proto.tensor_type.HasField("shape") and (
                len(dims) != tensor.ndim or
                any(d is not None and d != n for d, n in zip(dims, tensor.shape))):
            raise ShapeError(f"inputs: {name!r} is declared of shape "
                             f"{[d if d is not None else '?' for d in dims]}, the pinned value "
                             f"has shape {list(tensor.shape)}")
        pinned[name] = tensor
    return pinned


# the ops of other domains that the table maps (by op type, as the default domain's)
_OTHER_DOMAINS = {"ai.onnx.preview": PREVIEW_OPS, "ai.onnx.preview.training": TRAINING_OPS,
                  "ai.onnx.ml": ML_OPS, "com.microsoft": CONTRIB_OPS}


def _precheck(graph: onnx.GraphProto, shared: "Shared") -> None:
    """Report every op type the table lacks before converting anything."""
    for node in all_nodes(graph):
        known_domain = node.domain in ("", "ai.onnx") or \
            node.op_type in _OTHER_DOMAINS.get(node.domain, ())
        if not known_domain or node.op_type not in OPS and node.op_type not in CONTROLLERS:
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
        self.pinned: dict = {}  # graph inputs pinned to values (from_onnx's ``inputs``)
        self.bound: dict = {}  # input size names a node fixed: name -> int (ctx.pin)
        self.input_symbols: set = set()  # the names of the main graph inputs' sizes
        self.class_labels: dict = {}  # ZipMap output name -> its labels (ops/ml_features.py)
        self.graph_names = FreshNames()

    def graph_name(self, hint: str) -> str:
        """``hint``, else the first free ``hint_k``: a name is taken once a TDAG is stored
        under it (a subgraph's prefix may name none)."""
        return self.graph_names.fresh(hint, avoid=self.graphs, take=False)


class GraphImporter:
    """Converts one ONNX graph into a Block: straight-line runs of nodes become TDAGs
    (segments) joined by the controllers that If nodes become."""

    def __init__(self, graph: onnx.GraphProto, shared: Shared, prefix: str, env: dict):
        self.graph, self.shared, self.prefix = graph, shared, prefix
        self.opset, self.names, self.types = shared.opset, shared.names, shared.types
        self.problems = shared.problems
        self.env = SegmentEnv(env)
        self.builder, self.local = Builder(), {}
        self.offsets: dict = {}  # int tensor name -> (root name, constant): onnx/runtime.py
        self.entries: dict = {}  # shape tensor name -> [Dim, or None: data decides it]: same
        self.entry_sizes: dict = {}  # (shape tensor name, k) -> arange of that entry: same
        self.steps: list = []
        self.last_use = last_uses(graph)
        self.graph_outputs_hook = None

    # -- blocks ---------------------------------------------------------------------------------

    def main_block(self) -> Block:
        self.read_initializers()
        inputs = self._inputs()
        for onnx_name in [v.name for v in self.graph.input if v.name in self.env]:
            if isinstance(self.env[onnx_name], Boundary):  # the model's inputs, in order
                self._read_boundary(onnx_name)
        return self._walk(inputs)

    def sub_block(self, inputs: list, bool_first: bool = False) -> Block:
        """The Block of a subgraph; ``bool_first`` makes its first output a bool scalar
        (a loop body's condition, which ONNX allows to be a one-element tensor)."""
        self.read_initializers()
        if bool_first:
            self.graph_outputs_hook = self._scalar_condition
        return self._walk(inputs)

    def _scalar_condition(self, name: str) -> None:
        value = self.read(name)
        if not isinstance(value, _Poisoned):
            with self.builder.active():
                self.env[name] = ops.reshape(ops.cast(self.as_tensor(value), DType.bool))

    def _walk(self, inputs: list) -> Block:
        for index, node in enumerate(self.graph.node):
            if node.op_type in CONTROLLERS:
                self._controller(node, index)
            else:
                self.convert_node(node, index)
        for out in self.graph.output:
            self.check_declared(out.name, self.env.get(out.name))
        outputs = []
        if self.graph_outputs_hook is not None and self.graph.output:
            self.graph_outputs_hook(self.graph.output[0].name)
        for out in self.graph.output:
            value = self.env.get(out.name, _POISONED)
            if isinstance(value, Boundary):
                outputs.append(value.name)
                continue
            if not isinstance(value, _Poisoned):
                self.env[out.name] = self.as_tensor(self.read(out.name))
            outputs.append(self.names(out.name))
        self.close([o.name for o in self.graph.output])
        return Block(tuple(Value(v.name, v.type) for v in inputs), tuple(self.steps),
                     tuple(outputs))

    def _controller(self, node: onnx.NodeProto, index: int) -> None:
        with self._boundary(node, index):
            if any(isinstance(self.env.get(n), _Poisoned) for n in node.input if n):
                self._bind(node, [_POISONED] * len(node.output))
                return
            CONTROLLERS[node.op_type](self, node, index)

    def live_after(self, index: int, keep=()) -> "_LiveAfter":
        """The names read by node ``index`` or a later one (or by the graph's outputs)."""
        return _LiveAfter(self.last_use, index, set(keep))

    def close(self, needed) -> None:
        """End the current segment: its values read later become its TDAG's outputs (in
        the order of ``needed`` where it is a list)."""
        rank = {k: i for i, k in enumerate(needed)} if isinstance(needed, list) else {}
        made = ((k, self.env[k]) for k in self.env.take_recent())
        outs = sorted(((k, v) for k, v in made
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
        self.offsets, self.entries, self.entry_sizes = {}, {}, {}

    # -- graph boundary -------------------------------------------------------------------------

    def read_initializers(self, graph: onnx.GraphProto | None = None) -> None:
        graph = graph or self.graph
        for init in graph.initializer:
            self._initializer(graph, init.name, init.data_type,
                              lambda init=init: numpy_helper.to_array(init))
        for sparse in graph.sparse_initializer:
            self._initializer(graph, sparse.values.name, sparse.values.data_type,
                              lambda sparse=sparse: dense_of_sparse(sparse))

    def _initializer(self, graph: onnx.GraphProto, onnx_name: str, data_type: int,
                     read) -> None:
        try:
            initializer_dtype(data_type, onnx_name)
            value = tensor_of(read())
        except UnsupportedOpError as exc:
            self.problems.append((f"initializer: {exc}", None))
            self.env[onnx_name] = _POISONED
            return
        except Exception as exc:  # numpy on damaged data: ValueError, TypeError ...
            raise InvalidModelError(f"initializer {onnx_name!r} of graph {graph.name!r}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        # small integer initializers are shape data: made tensors only where read as such
        name = self.names(onnx_name)
        known = known_of(value, name)
        self.env[onnx_name] = known if known is not None else Param(name, value)

    def _inputs(self) -> list:
        values = []
        for value in self.graph.input:
            if value.name in self.env:  # IR < 4 lists initializers among the inputs
                continue
            pinned = self.shared.pinned.get(value.name)
            if pinned is not None:  # a const, and no longer an input
                known = known_of(pinned)
                self.env[value.name] = known if known is not None else \
                    Param(self.names(value.name), pinned, TensorKind.const)
                continue
            if not value.type.HasField("tensor_type"):
                self.problems.append((f"input {value.name}: only tensor inputs are supported",
                                      None))
                continue
            tensor_type = value.type.tensor_type
            shape = [self._dim(d, value.name, axis)
                     for axis, d in enumerate(tensor_type.shape.dim)]
            try:
                dtype = dtype_of(tensor_type.elem_type, value.name)
            except UnsupportedOpError as exc:  # a string input: name the nodes it feeds
                raise UnsupportedOpError(f"{exc} (read by {_readers(self.graph, value.name)})") \
                    from None
            boundary = Boundary(self.names(value.name), TensorType(tuple(shape), dtype))
            self.env[value.name] = boundary
            values.append(boundary)
        return values

    def _dim(self, dim, input_name: str, axis: int):
        if dim.HasField("dim_value"):
            if dim.dim_value < 0:
                raise InvalidModelError(f"input {input_name!r} of graph {self.graph.name!r}: "
                                        f"axis {axis} has the negative size {dim.dim_value}")
            return int(dim.dim_value)
        name = symbol_name(dim.dim_param if dim.HasField("dim_param") else
                           f"{input_name}_{axis}")  # unnamed: named after its place
        if name in self.shared.bound:  # a weight fixes it (NodeContext.pin)
            return self.shared.bound[name]
        self.shared.input_symbols.add(name)
        return as_dim(name)

    def check_declared(self, name: str, value) -> None:
        """A type the model declares for ``name`` (value_info, a graph output) must be the
        one tdag computes: casting to it would silently change the result."""
        declared, computed = self.types.get(name), _type_of(value)
        if declared is None or computed is None or not declared.HasField("tensor_type"):
            return
        clash = declared_clash(declared.tensor_type, computed)
        if clash is not None:
            raise InvalidModelError(f"value {name!r} is declared {clash} but computes to "
                                    f"{computed}")

    # -- values ---------------------------------------------------------------------------------

    def read(self, name: str):
        """The value of an ONNX name, usable in the current segment."""
        value = self.env.get(name, _POISONED)
        if isinstance(value, Boundary):
            return self._read_boundary(name)
        if isinstance(value, Param):
            if name not in self.local:
                weight_name = value.name if value.name not in self.builder.names.taken else \
                    self.builder.fresh(value.name + "_")
                self.local[name] = self.builder.weight(weight_name, value.kind, value.value)
            return self.local[name]
        return value

    def _read_boundary(self, name: str) -> Tensor:
        if name not in self.local:
            value = self.env[name]
            self.local[name] = self.builder.input(value.name, value.type)
        return self.local[name]

    def as_tensor(self, value) -> Tensor:
        with self.builder.active():
            return materialize(self.builder, value) if isinstance(value, Known) else value

    # -- nodes ----------------------------------------------------------------------------------

    def convert_node(self, node: onnx.NodeProto, index: int,
              graph: onnx.GraphProto | None = None) -> None:
        with self._boundary(node, index, graph):
            inputs = [self.read(name) if name else None for name in node.input]
            if any(isinstance(v, _Poisoned) for v in inputs):
                self._bind(node, [_POISONED] * len(node.output))
                return
            origin = Origin(op=f"onnx.{node.op_type}", scope=scope_of(node.name),
                            location=node.name)
            ctx = NodeContext(self, node)
            with self.builder.active(), self.builder.scope(origin):
                result = OPS[table_key(node.op_type, node.domain)](ctx, *inputs)
                results = list(result) if isinstance(result, (list, tuple)) else [result]
                for name, value in zip(node.output, results):
                    self.check_declared(name, value)
                self._bind(node, results)

    @contextlib.contextmanager
    def _boundary(self, node: onnx.NodeProto, index: int, graph=None):
        """Where a node's failure is sorted: one tdag can say it does not handle (an op, an
        attribute, a shape) is collected for the one report that lists them all; any other
        becomes an InvalidModelError naming the ONNX node, the original kept as its cause."""
        try:
            yield
        except PinnedSize:
            raise  # from_onnx imports again
        except (UnsupportedOpError, NotImplementedError, ShapeError) as exc:
            self.problems.append((_message(exc), node))
            self._bind(node, [_POISONED] * len(node.output))
        except Exception as exc:
            what = _message(exc) if isinstance(exc, TdagError) else \
                f"{type(exc).__name__}: {exc}"
            place = describe_node(node, index, (graph or self.graph).name)
            raise InvalidModelError(f"{place}: {what}") from exc

    def _bind(self, node, results) -> None:
        for i, name in enumerate(node.output):
            if not name:
                continue
            value = results[i] if i < len(results) else None
            if value is None and name in self.last_use:
                raise UnsupportedOpError(f"output {i} ({name}) is not computed by tdag")
            self.env[name] = value


def _readers(graph: onnx.GraphProto, name: str) -> str:
    """The nodes that read ``name``: op, node name and domain, as the unsupported-op report."""
    nodes = [f"{n.op_type} (node {n.name or '<unnamed>'!r}, domain {n.domain or 'ai.onnx'})"
             for n in graph.node if name in n.input]
    return ", ".join(nodes[:4]) + (", ..." if len(nodes) > 4 else "") if nodes else "no node"


def _type_of(value) -> TensorType | None:
    if isinstance(value, (Tensor, Boundary)):
        return value.type
    if isinstance(value, Known):
        return TensorType(value.shape, value.dtype)
    if isinstance(value, Param):
        return spec_of(value.value)
    return None  # not computed, or poisoned


class _LiveAfter:
    """The names a graph reads at or after one node index, as a view of its last uses."""

    def __init__(self, last_use: dict, index: int, keep: set):
        self.last_use, self.index, self.keep = last_use, index, keep

    def __contains__(self, name) -> bool:
        return name in self.keep or self.last_use.get(name, -1) >= self.index


def all_graphs(graph: onnx.GraphProto):
    """The graph and every subgraph in it, depth first."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from all_graphs(sub)


def subgraphs(node: onnx.NodeProto) -> list:
    return [g for attr in node.attribute
            for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs)]


def all_nodes(graph: onnx.GraphProto):
    return [n for g in all_graphs(graph) for n in g.node]


def last_uses(graph: onnx.GraphProto) -> dict:
    """The index of the last node that reads each name, itself or inside its subgraphs; the
    graph's outputs count as read after its last node. One entry per name, so memory stays
    linear in the graph (a set of live names per node grew with its square)."""
    last: dict = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            last[name] = index
        for sub in subgraphs(node):
            for inner in all_graphs(sub):
                for name in [n for i in inner.node for n in i.input] + \
                        [o.name for o in inner.output]:
                    last[name] = index
    for out in graph.output:
        last[out.name] = len(graph.node)
    last.pop("", None)  # an omitted optional input
    return last


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
