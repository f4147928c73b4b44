"""``torch.cond`` and ``while_loop`` in an ExportedProgram as tdag controllers.

A graph with control flow is split at each higher-order node: the ATen nodes between two
of them form a segment (one TDAG, run by a ``Call``), and the values a later step reads
become its outputs. ``cond`` becomes an ``If`` whose blocks convert the branch graphs;
``while_loop`` a ``Loop`` whose body converts the body graph followed by the condition
graph (its result is the loop's ``keep_going``; the initial condition is computed by the
preceding segment). A block is closed: the computed values a branch or body reads become
its inputs (for a loop, extra carried values passed through unchanged); the weights it
reads are weights of its own TDAGs, under their state-dict names.
"""
from __future__ import annotations

import operator

import torch
from torch.export.graph_signature import InputKind, OutputKind

from tdag import ops
from tdag.canonicalize.common.segments import Boundary
from tdag.canonicalize.torch.recurrent import RECURRENT, convert_recurrent
from tdag.canonicalize.torch.converter import (
    CONTROL,
    Converter,
    handled,
    is_scalar,
    unsupported_error,
    why_unsupported,
)
from tdag.ops.builder import Builder
from tdag.ops.tensor import Tensor
from tdag.errors import UnsupportedOpError
from tdag.ir.graph import Value
from tdag.ir.names import FreshNames
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.types import DType, Origin, TensorKind, TensorType
from tdag.refine.dataflow import prune


# Python operators on sizes and loop counters that run as scalar tensor ops where their
# value is known only at run time: a comparison of a symbolic size (a SymBool is no tdag
# dim), or arithmetic on an int a while_loop carries (an i64[] tensor in the loop)
_SCALAR_OPS = {
    operator.lt: ops.lt, operator.le: ops.le, operator.gt: ops.gt, operator.ge: ops.ge,
    operator.eq: ops.eq, operator.ne: ops.ne, operator.add: ops.add, operator.sub: ops.sub,
    operator.mul: ops.mul, operator.floordiv: ops.floor_divide, operator.mod: ops.remainder,
    operator.and_: ops.logical_and, operator.or_: ops.logical_or,
}


def has_control_flow(ep) -> bool:
    return any(n.op == "call_function" and n.target in CONTROL for n in ep.graph.nodes)


class _Lazy:
    """A weight, made a weight of whichever segment reads it."""

    def __init__(self, name: str, kind: TensorKind, value, type: TensorType):
        self.name, self.kind, self.value, self.type = name, kind, value, type


def _attr(module, dotted: str):
    for part in dotted.split("."):
        module = getattr(module, part, None)
    return module


def convert_control(ep, names: dict) -> Program:
    class Segmented(Converter):
        def __init__(self):
            super().__init__(ep, names)
            self.graphs: dict = {}
            self.steps: list = []
            self.local: dict = {}
            self.seg_inputs: list = []
            self.done: set = set()
            self.prefix = ""
            self.block_names = FreshNames()
            self.graph_names = FreshNames()
            self.weight_names = {s.target for s in ep.graph_signature.input_specs
                                 if s.target is not None}

        # -- names --------------------------------------------------------------------------

        def block_name(self, hint: str) -> str:
            return self.block_names.fresh(hint, avoid=self.weight_names)

        def graph_name(self, hint: str) -> str:
            # taken once a TDAG is stored under it
            return self.graph_names.fresh(hint, avoid=self.graphs, take=False)

        # -- reading values -----------------------------------------------------------------

        def _args(self, value):
            if isinstance(value, torch.fx.Node):
                result = self.env[value]
                if isinstance(result, (Boundary, _Lazy)):
                    return self.read(result)
            return super()._args(value)

        def read(self, value):
            if isinstance(value, Boundary):
                key = ("in", value.name)
                if key not in self.local:
                    name = value.name if value.name not in self.builder.names.taken else \
                        self.builder.fresh(value.name + "_")
                    self.local[key] = self.builder.input(name, value.type)
                    self.seg_inputs.append(value.name)
                return self.local[key]
            if isinstance(value, _Lazy):
                key = ("w", value.name)
                if key not in self.local:
                    self.local[key] = self.builder.weight(value.name, value.kind, value.value,
                                                          value.type)
                return self.local[key]
            return value

        def _call(self, node) -> None:
            if node.target in _SCALAR_OPS and is_scalar(node) and self.runtime_scalar(node):
                args = [self.scalar_tensor(a) for a in node.args]
                with self.builder.scope(self._origin(node)):
                    self.env[node] = _SCALAR_OPS[node.target](*args)
                return
            super()._call(node)

        def runtime_scalar(self, node) -> bool:
            """A SymBool, or arithmetic on a value that is a tensor here."""
            return isinstance(node.meta["val"], torch.SymBool) or any(
                isinstance(self.env.get(a), (Tensor, Boundary)) for a in node.args
                if isinstance(a, torch.fx.Node))

        def scalar_tensor(self, arg) -> Tensor:
            value = self.value(arg)
            if isinstance(value, Boundary):
                return self.read(value)
            return value if isinstance(value, Tensor) else self._as_output(value)

        def tensor(self, value) -> Tensor | Boundary:
            """A value as a tensor of the current segment (or a Boundary as it is)."""
            if isinstance(value, Boundary):
                return value
            value = self.read(value)
            if isinstance(value, Tensor):
                return value
            with self.builder.active():
                return self._as_output(value)

        # -- segments -----------------------------------------------------------------------

        def close(self, extra=()) -> list[Boundary]:
            """End the segment; values read later and ``extra`` become its outputs. Returns
            the Boundaries of ``extra``."""
            inputs = {t.name: b for b, t in
                      ((n, self.local[("in", n)]) for n in self.seg_inputs)}
            outs = []
            for node, v in list(self.env.items()):
                if isinstance(v, Tensor) and v.builder is self.builder and \
                        any(u not in self.done for u in node.users):
                    if v.name in inputs:
                        self.env[node] = Boundary(inputs[v.name], v.type)
                    else:
                        outs.append((node, v))
            tensors, bnames = [], {}
            for node, v in outs:
                if v.name not in bnames:
                    bnames[v.name] = self.block_name(self.prefix + node.name)
                    tensors.append(v)
            for v in extra:
                if isinstance(v, Tensor) and v.name not in bnames and v.name not in inputs:
                    bnames[v.name] = self.block_name(self.prefix + "v")
                    tensors.append(v)
            if tensors:
                graph = prune(self.builder.build(tensors))
                name = self.graph_name(self.prefix + "main")
                self.graphs[name] = graph
                self.steps.append(Call(name, tuple(self.seg_inputs),
                                       tuple(bnames[t.name] for t in tensors)))
            for node, v in outs:
                self.env[node] = Boundary(bnames[v.name], v.type)
            result = []
            for v in extra:
                if isinstance(v, Boundary):
                    result.append(v)
                elif v.name in inputs:
                    result.append(Boundary(inputs[v.name], v.type))
                else:
                    result.append(Boundary(bnames[v.name], v.type))
            self.builder, self.local, self.seg_inputs = Builder(), {}, []
            return result

        # -- walking ------------------------------------------------------------------------

        def walk(self, graph) -> list:
            """Convert ``graph``'s nodes (placeholders already bound); its output values."""
            outputs = []
            for node in graph.nodes:
                if node.op == "call_function":
                    if node.target in CONTROL:
                        self.control(node)
                    else:
                        with self.builder.active():
                            self._call(node)
                elif node.op == "get_attr":
                    value = _attr(node.graph.owning_module or self.graph_module, node.target)
                    self.env[node] = _Lazy(node.target, TensorKind.const, value.detach(),
                                           self._type(value)) \
                        if isinstance(value, torch.Tensor) else value
                elif node.op == "output":
                    outputs = node.args[0]
                    if not isinstance(outputs, (tuple, list)):
                        outputs = [outputs]
                if node.op != "placeholder":
                    self.done.add(node)
            if self.problems:
                raise unsupported_error(self.problems)
            return outputs

        def value(self, arg):
            return self.env[arg] if isinstance(arg, torch.fx.Node) else arg

        def block(self, graph, bindings: dict, prefix: str, finish=None):
            """A Block converting ``graph`` with its placeholders bound to ``bindings``
            (Boundaries become the block's inputs); ``finish`` maps the output values."""
            saved = (self.builder, self.local, self.seg_inputs, self.steps, self.prefix)
            self.builder, self.local, self.seg_inputs, self.steps = Builder(), {}, [], []
            self.prefix = prefix
            try:
                inputs, inner = [], {}
                for ph, value in bindings:
                    if isinstance(value, Boundary):
                        if value.name not in inner:
                            inner[value.name] = Boundary(
                                self.block_name(prefix + ph.name), value.type)
                            inputs.append(inner[value.name])
                        value = inner[value.name]
                    self.env[ph] = value
                outs = [self.value(o) for o in self.walk(graph)]
                if finish is not None:
                    outs = finish(outs, inputs)
                outs = [self.tensor(v) for v in outs]
                outs = self.close(outs)
                return Block(tuple(Value(b.name, b.type) for b in inputs), tuple(self.steps),
                             tuple(b.name for b in outs)), inputs
            finally:
                self.builder, self.local, self.seg_inputs, self.steps, self.prefix = saved

        def control(self, node) -> None:
            if self.problems:  # reported before a poisoned value reaches a block
                raise unsupported_error(self.problems)
            if node.target is torch.ops.higher_order.cond:
                self.cond(node)
            elif node.target is RECURRENT:
                convert_recurrent(self, node)
            else:
                self.while_loop(node)

        def scalar_bool(self, value) -> Tensor:
            t = self.tensor(value)
            if isinstance(t, Boundary):
                t = self.read(t)
            with self.builder.active():
                return ops.reshape(ops.cast(t, DType.bool))

        def cond(self, node) -> None:
            pred, true_gm, false_gm, operands = node.args[:4]
            c = self.scalar_bool(self.value(pred))
            [cb] = self.close([c])
            values = [self.value(a) for a in operands]
            blocks = []
            for which, gm in (("then", true_gm), ("else", false_gm)):
                graph = self.env[gm].graph
                phs = [n for n in graph.nodes if n.op == "placeholder"]
                block, _ = self.block(graph, list(zip(phs, values)),
                                           f"{self.prefix}{node.name}_{which}_")
                blocks.append(block)
            names = []  # the Boundaries among the operands, as the blocks take them
            for b in values:
                if isinstance(b, Boundary) and b.name not in names:
                    names.append(b.name)
            outs = [self.block_name(f"{self.prefix}{node.name}_{i}")
                    for i in range(len(node.meta["val"]))]
            self.steps.append(If(cb.name, tuple(names), blocks[0], blocks[1], tuple(outs)))
            self.env[node] = tuple(Boundary(o, self._type(v))
                                   for o, v in zip(outs, node.meta["val"]))

        def while_loop(self, node) -> None:
            cond_gm, body_gm, carried, extra = node.args[:4]
            cond_graph, body_graph = self.env[cond_gm].graph, self.env[body_gm].graph
            carried = [self.value(a) for a in carried]
            extra = [self.value(a) for a in extra]
            if any(v is None or isinstance(v, (str, torch.dtype, torch.device))
                   for v in carried):
                raise UnsupportedOpError("while_loop: carried values must be tensors or "
                                         "numbers")
            # the initial condition, in the current segment
            phs = [n for n in cond_graph.nodes if n.op == "placeholder"]
            for ph, v in zip(phs, carried + extra):
                self.env[ph] = v
            [c0] = self.walk(cond_graph)
            c0 = self.scalar_bool(self.value(c0))
            init = [self.tensor(v) for v in carried]
            bounds = self.close([c0] + init)
            c0b, init = bounds[0], bounds[1:]
            extra = [self.value(a) for a in node.args[3]]  # now Boundaries
            passed = []
            for v in extra:
                if isinstance(v, Boundary) and v.name not in [p.name for p in passed]:
                    passed.append(v)
            counter = Boundary(self.block_name(f"{self.prefix}{node.name}_i"),
                               TensorType((), DType.i64))
            body_phs = [n for n in body_graph.nodes if n.op == "placeholder"]
            prefix = f"{self.prefix}{node.name}_body_"

            def finish(outs, inputs):
                # inputs: the carried values, then the passed extra values
                cphs = [n for n in cond_graph.nodes if n.op == "placeholder"]
                for ph, v in zip(cphs, list(outs) + [self.env[p] for p in
                                                     body_phs[len(carried):]]):
                    self.env[ph] = v
                [keep] = self.walk(cond_graph)
                keep = self.scalar_bool(self.value(keep))
                return [keep] + list(outs) + inputs[len(carried):]

            # carried values are block inputs even when they repeat: bind them one by one
            carried_in = [Boundary(self.block_name(f"{prefix}c{k}"), b.type)
                          for k, b in enumerate(init)]
            bindings = list(zip(body_phs, carried_in + extra))
            block, inputs = self.block(body_graph, bindings, prefix, finish)
            # the block's inputs: the carried (in order), then the passed extras
            block = Block((Value(counter.name, counter.type),) + block.inputs, block.steps,
                          block.outputs)
            outs = [self.block_name(f"{self.prefix}{node.name}_{k}") for k in range(len(init))]
            extra_outs = [self.block_name(f"{self.prefix}{node.name}_pass{k}")
                          for k in range(len(passed))]
            self.steps.append(Loop(tuple(b.name for b in init) + tuple(p.name for p in passed),
                                   block, tuple(outs + extra_outs), None, c0b.name, 0))
            # the carried values keep their types (an int is an i64[] tensor here)
            self.env[node] = tuple(Boundary(o, b.type) for o, b in zip(outs, init))

        # -- the top level ------------------------------------------------------------------

        def program(self) -> Program:
            self._name_symbols()
            self.precheck()
            specs = iter(ep.graph_signature.input_specs)
            inputs = []
            for node in ep.graph.nodes:
                if node.op != "placeholder":
                    continue
                spec, val = next(specs), node.meta.get("val")
                if spec.kind is InputKind.USER_INPUT:
                    if isinstance(val, torch.Tensor):
                        b = Boundary(self.block_name(node.name), self._type(val))
                        inputs.append(b)
                        self.env[node] = b
                    else:
                        self.env[node] = self._scalar(val)
                elif spec.target in self.written:  # state of a program with control flow
                    self.problems.append((f"the model writes buffer {spec.target} and has "
                                          "control flow: tdag carries written buffers as "
                                          "state only in straight-line models so far",
                                          Origin(op="placeholder", scope=spec.target)))
                elif spec.kind in (InputKind.PARAMETER, InputKind.BUFFER,
                                   InputKind.CONSTANT_TENSOR):
                    w = self._weight(spec, val)  # into a scratch builder, for its value
                    weight = self.builder.weights[w.name]
                    self.env[node] = _Lazy(w.name, weight.kind, weight.value, weight.type)
                elif spec.kind is InputKind.TOKEN:
                    self.env[node] = None
                else:
                    self.problems.append((f"input {spec.target or node.name} of kind "
                                          f"{spec.kind.name}",
                                          Origin(op="placeholder", scope=node.name)))
            if self.problems:
                raise unsupported_error(self.problems)
            self.builder = Builder()
            # input order: a block input is read by the segments in any order
            outputs = self.walk(ep.graph)
            outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            values = []
            for spec, value in zip(ep.graph_signature.output_specs, outputs):
                if spec.kind is OutputKind.USER_OUTPUT:
                    values.append(self.tensor(self.value(value)))
                elif spec.kind is not OutputKind.TOKEN:
                    self.problems.append((f"the model writes {spec.kind.name.lower()} "
                                          f"{spec.target}: stateful modules are not supported",
                                          Origin(op="output", scope=spec.target or "")))
            if self.problems:
                raise unsupported_error(self.problems)
            outs = self.close(values)
            main = Block(tuple(Value(b.name, b.type) for b in inputs), tuple(self.steps),
                         tuple(b.name for b in outs))
            return Program(self.graphs, main)

        @property
        def graph_module(self):
            return ep.graph_module

        def precheck(self) -> None:
            for gm in ep.graph_module.modules():
                if not isinstance(gm, torch.fx.GraphModule):
                    continue
                for node in gm.graph.nodes:
                    if node.op == "call_function" and not handled(node):
                        self.problems.append((why_unsupported(node.target),
                                              self._origin(node)))
            if self.problems:
                raise unsupported_error(self.problems)

    return Segmented().program()
