"""The ATen-graph walker behind ``from_torch``, shared by the straight-line converter
(``torch_export``) and the one that splits a graph at control flow (``torch_control``)."""
from __future__ import annotations

import operator
from collections.abc import Collection

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from tdag import ops
from tdag.canonicalize.torch import aten
from tdag.canonicalize.torch.aten.registry import is_inplace
from tdag.canonicalize.torch.inplace import alias_root, aliases, inplace_safe, written_buffers
from tdag.canonicalize.torch.names import leaf_fields, origin_of
from tdag.canonicalize.torch.recurrent import RECURRENT
from tdag.canonicalize.torch.symbols import SymbolMap, is_symbolic
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.ops.masking import size_of
from tdag.errors import TdagError, UnsupportedOpError
from tdag.ir.graph import TDAG, Weight
from tdag.ir.symbols import shapes_equal
from tdag.ir.types import DType, Origin, TensorKind, TensorType

_ITEM = {torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default}

# the higher-order ops and the recurrent modules (tdag::recurrent) that become controllers
# (torch_control); the walker leaves them alone
CONTROL = {torch.ops.higher_order.cond, torch.ops.higher_order.while_loop, RECURRENT}


class _Missing:
    """A value the table does not compute (saved statistics, pooling indices)."""

    def __init__(self, what: str):
        self.what = what


class _Poisoned:
    """The output of a node that could not be converted; its users are skipped."""


_POISONED = _Poisoned()


class Converter:
    """Walks an ExportedProgram's graph, emitting each ATen node through the op table."""

    def __init__(self, ep: ExportedProgram, names: dict, writable: Collection[str] = ()):
        self.ep = ep
        self.names = names
        self.builder = Builder()
        self.symbols = SymbolMap()
        self.env: dict = {}
        self.problems: list[tuple[str, Origin]] = []
        self.origins: dict = {}
        self.graph: TDAG | None = None
        # buffers the model writes (a KV cache, running statistics): each is state of the
        # Program, read by the TDAG as an input and written back as an extra output; those
        # written in place (``writable``: see inplace.py) by their placeholder
        self.writable = frozenset(writable)
        self.written_in_place = written_buffers(ep, self.writable)
        self.written = {s.target for s in ep.graph_signature.output_specs
                        if s.kind is OutputKind.BUFFER_MUTATION} | \
            set(self.written_in_place.values())
        self.state: dict[str, Weight] = {}
        self.state_outputs: list[str] = []
        # the field each user output has in the output pytree (``logits``), None for one
        # reached by positions only
        self.output_fields: list[str | None] = []

    # -- the walk -------------------------------------------------------------------------------

    def run(self) -> None:
        self._name_symbols()
        specs = iter(self.ep.graph_signature.input_specs)
        self._precheck()
        outputs = None
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node, next(specs))
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "get_attr":
                self._get_attr(node)
            elif node.op == "output":
                outputs = self._outputs(node)
        if self.problems:
            raise unsupported_error(self.problems)
        self.graph = self.builder.build(outputs)

    def _precheck(self) -> None:
        """Report every op the table lacks before converting anything."""
        for node in self.ep.graph.nodes:
            if node.op == "call_function" and not handled(node, self.writable):
                self.problems.append((why_unsupported(node.target), self._origin(node)))
        if self.problems:
            raise unsupported_error(self.problems)

    def _name_symbols(self) -> None:
        """Name torch's symbols after the dims the caller named, else after input and axis."""
        users = [n for n, s in zip(self._placeholders(), self.ep.graph_signature.input_specs)
                 if s.kind is InputKind.USER_INPUT and isinstance(n.meta.get("val"), torch.Tensor)]
        for pass_named in (True, False):
            for i, node in enumerate(users):
                for axis, size in enumerate(node.meta["val"].shape):
                    expr = size.node.expr if is_symbolic(size) else None
                    if expr is None or not expr.is_Symbol:
                        continue
                    name = self.names.get((i, axis))
                    if pass_named and name:
                        self.symbols.name(expr, name)
                    elif not pass_named:
                        self.symbols.name(expr, f"{node.name}_{axis}")

    def _placeholders(self):
        return [n for n in self.ep.graph.nodes if n.op == "placeholder"]

    # -- placeholders ---------------------------------------------------------------------------

    def _placeholder(self, node, spec) -> None:
        val = node.meta.get("val")
        kind = spec.kind
        if kind is InputKind.USER_INPUT:
            if isinstance(val, torch.Tensor):
                # weights come first in export's order; an input may not reuse their names
                name = node.name if node.name not in self.builder.weights else \
                    self.builder.fresh(node.name + "_")
                self.env[node] = self.builder.input(name, self._type(val))
            else:  # ints and the like were specialised into the graph by torch.export
                self.env[node] = self._scalar(val)
        elif kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            self.env[node] = self._weight(spec, val)
        elif kind is InputKind.TOKEN:
            self.env[node] = None
        else:
            self.problems.append((f"input {spec.target or node.name} of kind {kind.name}",
                                  Origin(op="placeholder", scope=node.name)))
            self.env[node] = _POISONED

    def _weight(self, spec, val) -> Tensor:
        target = spec.target
        if spec.kind is InputKind.PARAMETER:
            value = self.ep.state_dict[target]
            # a frozen parameter (requires_grad=False) is state nothing trains: a buffer, so
            # tdag.grad and train_step leave it as torch's optimizers do
            trained = getattr(value, "requires_grad", True)
            kind = TensorKind.parameter if trained else TensorKind.buffer
        elif spec.kind is InputKind.BUFFER and spec.persistent:
            value, kind = self.ep.state_dict[target], TensorKind.buffer
        elif spec.kind is InputKind.BUFFER:
            # a non-persistent buffer (a rotary inv_freq) is not in the model's state dict:
            # a const, unless the model writes it (then it is state below)
            value = self.ep.constants[target]
            kind = TensorKind.buffer if target in self.written else TensorKind.const
        else:
            value, kind = self.ep.constants[target], TensorKind.const
        value = value.detach() if isinstance(value, torch.Tensor) else None
        if target in self.written:
            type = self._type(val)
            self.state[target] = Weight(kind, type, value)
            return self.builder.input(target, type)
        return self.builder.weight(target, kind, value, self._type(val))

    def _get_attr(self, node) -> None:
        value = getattr(self.ep.graph_module, node.target, None)
        if isinstance(value, torch.Tensor):
            self.env[node] = self.builder.weight(node.target, TensorKind.const,
                                                 value.detach(), self._type(value))
        else:
            self.env[node] = value  # a submodule, for higher-order ops

    # -- calls ----------------------------------------------------------------------------------

    def _call(self, node) -> None:
        if is_noop(node):
            self.env[node] = None
            return
        args, kwargs = self._args(node.args), self._args(node.kwargs)
        if _poisoned(args) or _poisoned(kwargs):
            self.env[node] = _POISONED
            return
        if node.target is operator.getitem:
            self.env[node] = self._getitem(node, *args)
            return
        if node.target in _ITEM and self._item(node, args[0]):
            return
        if is_scalar(node):
            self.env[node] = self._scalar(node.meta["val"], node)
            return
        origin = self._origin(node)
        with self.builder.scope(origin):
            try:
                result = aten.entry_for(node.target)(*args, **kwargs)
                self.env[node] = self._fit(node, result)
                if is_inplace(node.target):  # readers of the written tensor now read this
                    for alias in aliases(alias_root(node.args[0])):
                        self.env[alias] = self.env[node]
            except (UnsupportedOpError, NotImplementedError) as exc:
                self.problems.append((f"{origin.op}: {exc}", origin))
                self.env[node] = _POISONED

    def _item(self, node, tensor) -> bool:
        """``t.item()`` of an integer tensor that torch gave an unbacked symbol (u0): a fresh
        tdag size bound to t's value at run time (a negative one is refused there, as torch
        refuses it as a size). False where it is not that case."""
        val = node.meta.get("val")
        if not isinstance(val, torch.SymInt) or not isinstance(tensor, Tensor) or \
                tensor.dtype.is_float or tensor.dtype is DType.bool:
            return False
        expr = val.node.expr
        if not expr.is_Symbol or not free_unbacked_symbols(val) or \
                expr.name in self.symbols.names:
            return False
        with self.builder.scope(self._origin(node)):
            _, size = size_of(tensor)
        self.symbols.adopt(expr, size.name)
        self.env[node] = size
        return True

    def _args(self, value):
        if isinstance(value, torch.fx.Node):
            result = self.env[value]
            if isinstance(result, _Missing):
                raise UnsupportedOpError(f"uses {result.what}, which tdag does not compute")
            return result
        if isinstance(value, (list, tuple)):
            return type(value)(self._args(v) for v in value)
        if isinstance(value, dict):
            return {k: self._args(v) for k, v in value.items()}
        return value

    def _getitem(self, node, value, index):
        item = value[index]
        if item is None and isinstance(node.meta.get("val"), torch.Tensor):
            return _Missing(f"output {index} of {node.args[0].name}")
        return item

    def _scalar(self, val, node=None):
        if val is None or isinstance(val, (str, torch.dtype, torch.device)):
            return val
        if is_symbolic(val):
            # a size data decides is known once the node making it (nonzero, unique) has
            # given it a fresh tdag symbol (see _adopt); a value read with .item() is not
            unknown = [s for s in free_unbacked_symbols(val) if s.name not in self.symbols.names]
            if unknown:
                origin = self._origin(node) if node is not None else Origin()
                self.problems.append((f"{origin.op}: a size read from data with .item() "
                                      "cannot be a tdag size yet", origin))
                return _POISONED
            if isinstance(val, torch.SymBool) and val.node.expr.is_Relational and \
                    free_unbacked_symbols(val):
                # torch's range checks of a size (u0 >= 0), read only by _assert_scalar
                return _Missing(f"the size check {val.node.expr}")
            return self.symbols.dim(val) if isinstance(val, torch.SymInt) else \
                self.symbols.dim(val.node.expr)
        return val

    # -- results --------------------------------------------------------------------------------

    def _fit(self, node, result):
        """Cast to the dtype torch recorded and check the shape against torch's."""
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            return self._fit_one(node, result, val)
        if isinstance(val, (list, tuple)) and isinstance(result, (list, tuple)):
            return tuple(self._fit_one(node, r, v) if isinstance(v, torch.Tensor) and
                         r is not None else r for r, v in zip(result, val))
        return result

    def _fit_one(self, node, result, val: torch.Tensor) -> Tensor:
        if isinstance(result, Tensor):
            self._adopt(val, result)
        expected = self._type(val)
        if not isinstance(result, Tensor):
            result = self.builder.const(result, expected.dtype)
        if result.dtype is not expected.dtype:
            result = torch_conversion(result, expected.dtype)
        if not shapes_equal(result.shape, expected.shape):
            raise TdagError(f"{node.target} became {result.type} but torch computed "
                            f"{expected}: a bug in tdag's entry for it",
                            node=result.name, origin=self.builder.origin)
        return result

    def _adopt(self, val: torch.Tensor, result: Tensor) -> None:
        """torch's unbacked symbols (u0, u1: sizes data decides) in ``val``'s shape take the
        names of the fresh symbols tdag gave the same axes of ``result``."""
        if len(val.shape) != len(result.shape):
            return
        for size, dim in zip(val.shape, result.shape):
            expr = size.node.expr if is_symbolic(size) else None
            if expr is not None and expr.is_Symbol and free_unbacked_symbols(size) and \
                    expr.name not in self.symbols.names and not isinstance(dim, int) and \
                    dim.is_Symbol:
                self.symbols.adopt(expr, dim.name)

    def _type(self, val: torch.Tensor) -> TensorType:
        return TensorType(tuple(self.symbols.dim(d) for d in val.shape), DType.of(val.dtype))

    def _origin(self, node) -> Origin:
        return origin_of(node, self.origins)

    # -- outputs --------------------------------------------------------------------------------

    def _outputs(self, node) -> list[Tensor]:
        values = node.args[0] if isinstance(node.args[0], (tuple, list)) else (node.args[0],)
        outputs, written = [], []
        fields = iter(self._user_fields())
        for spec, value in zip(self.ep.graph_signature.output_specs, values):
            if spec.kind is OutputKind.USER_OUTPUT:
                result = self._args(value) if isinstance(value, torch.fx.Node) else value
                field = next(fields, None)
                if result is not None and not isinstance(result, _Poisoned):
                    outputs.append(self._as_output(result))
                    self.output_fields.append(field)
            elif spec.kind is OutputKind.BUFFER_MUTATION and spec.target in self.state:
                result = self._args(value)
                if not isinstance(result, _Poisoned):
                    self.state_outputs.append(spec.target)
                    written.append(self._as_output(result))
            elif spec.kind is not OutputKind.TOKEN:
                self.problems.append((f"the model writes {spec.kind.name.lower()} "
                                      f"{spec.target}: tdag carries written buffers as state, "
                                      "not inputs or parameters",
                                      Origin(op="output", scope=spec.target or "")))
        for placeholder, target in self.written_in_place.items():
            if target in self.state and target not in self.state_outputs:
                self.state_outputs.append(target)
                written.append(self._as_output(self.env[placeholder]))
        return outputs + written

    def _user_fields(self) -> list[str | None]:
        """The field of each user output, from the program's output pytree; none where the
        pytree and the graph do not count the same outputs."""
        spec = self.ep.call_spec.out_spec
        users = sum(1 for s in self.ep.graph_signature.output_specs
                    if s.kind is OutputKind.USER_OUTPUT)
        if spec is None or spec.num_leaves != users:
            return []
        return leaf_fields(spec)

    def _as_output(self, value) -> Tensor:
        if isinstance(value, Tensor):
            return value
        if hasattr(value, "free_symbols"):
            return aten.registry.dim_tensor(value)
        return self.builder.const(value)


def handled(node, writable: Collection[str] = ()) -> bool:
    """Whether the converter can take this call_function node as it is; ``writable`` names
    the buffer placeholders an in-place op may write (as state)."""
    if node.target is operator.getitem or is_scalar(node) or is_noop(node):
        return True
    if node.target in CONTROL:
        return True
    return aten.supports(node.target) and inplace_safe(node, writable)


def is_scalar(node) -> bool:
    """Sizes and other Python scalars: their value is known from torch's trace."""
    val = node.meta.get("val")
    return isinstance(val, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))


def is_noop(node) -> bool:
    """Runtime assertions (``_assert_scalar``...): they have no value and no users."""
    return "val" in node.meta and node.meta["val"] is None and not node.users \
        and node.target is not operator.getitem


def _poisoned(value) -> bool:
    if isinstance(value, _Poisoned):
        return True
    if isinstance(value, (list, tuple)):
        return any(_poisoned(v) for v in value)
    if isinstance(value, dict):
        return any(_poisoned(v) for v in value.values())
    return False


def why_unsupported(target) -> str:
    name = aten.key(target)
    if name is None:
        name = getattr(target, "__name__", str(target))
        if isinstance(target, torch._ops.OpOverload):
            # what torch's decompositions left, e.g. prims.frexp: its namespace says so
            name = f"{target.namespace}.{target.overloadpacket.__name__}"
        if isinstance(target, torch._ops.HigherOrderOperator):
            return f"{name}: a higher-order op tdag does not convert (torch.cond and " \
                "while_loop it does)"
        return f"{name}: not an ATen op"
    if aten.entry_for(target) is None:
        return f"aten.{name}: no tdag mapping"
    return f"aten.{name}: writes in place into a tensor that a view shares"


def unsupported_error(problems) -> UnsupportedOpError:
    """One error naming every unsupported op with its module path and source line."""
    lines = []
    for what, origin in problems:
        where = " @ " + origin.scope if origin.scope else ""
        where += f" ({origin.location})" if origin.location else ""
        lines.append(f"  {what}{where}")
    distinct = sorted({what.split(":")[0] for what, _ in problems})
    error = UnsupportedOpError(f"{len(problems)} unsupported op use(s) ({', '.join(distinct)}):\n"
                               + "\n".join(lines))
    error.problems = list(problems)
    return error


def torch_conversion(x: Tensor, dtype: DType) -> Tensor:
    """torch's conversion to ``dtype`` as tdag ops: tdag's cast, except that torch saturates
    a conversion to float8_e4m3fn (1e6 and inf give 448, NaN stays NaN), which tdag's cast,
    as ONNX's ``saturate=0`` and torch's other float8 kinds, does not."""
    if dtype is DType.f8e4m3fn and x.dtype not in (DType.f8e4m3fn, DType.bool):
        top = torch.finfo(torch.float8_e4m3fn).max
        x = ops.clamp(x, -top, top)
    return ops.cast(x, dtype)
