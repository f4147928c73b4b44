"""``to_onnx(prog)``: an ``onnx.ModelProto`` that passes the full checker and runs on
onnxruntime.

Each TDAG call is inlined; If and Loop controllers become ONNX If and Loop with subgraphs.
Symbolic dimensions become named dynamic axes (``dim_param``) and are read at run time with
``Shape`` where an op needs their value; a fresh symbol (a size data decides) from the result
of the node defining it. Parameters and buffers are initializers under their
own names. An output with class labels (``Program.class_labels``, an imported ZipMap) is
written through an ai.onnx.ml ZipMap, as the file it came from had it.

ONNX models hold no state, so the Program's state dict is threaded through explicitly: each
state tensor is a graph input whose initializer is its default (a caller may pass the value
from an earlier run, or leave it out), and each one the program writes is returned after the
outputs as ``<name>.next``. Inside a Loop, the state its body writes is carried from one
iteration to the next; inside an If, it is an output of both branches.
"""
from __future__ import annotations

import os
from typing import Callable

import onnx
from onnx import helper

from tdag.deinops.bitcast import BITCAST_OPSET, needs_onnx_bitcast
from tdag.errors import UnsupportedOpError
from tdag.ir.graph import TDAG
from tdag.ir.op import Op
from tdag.ir.program import Block, Call, If, Loop, Program, state_writes
from tdag.ir.record import Trait, has, record
from tdag.ir.rewrite import Context
from tdag.ir.types import FLOAT8, DType, TensorKind, TensorType
from tdag.ir.verify import block_types
from tdag.lower.match import scalar
from tdag.lower.pipeline import lower as lower_program
from tdag.refine.constants import Constants
from tdag.refine.dataflow import fresh_definers, sizes_named
from tdag.reify.onnx import ort
from tdag.reify.onnx.carriers import emit_carried
from tdag.reify.onnx.complex import refuse_complex_io
from tdag.reify.onnx.shortcuts import (
    counted_size,
    emit_mean,
    is_normalised_sum,
    mean_of,
    unwrapped_index,
)
from tdag.reify.onnx.graph import (
    ONNX_DTYPE,
    GraphBuilder,
    Symbols,
    all_graphs,
    prune,
    rename,
    value_info,
    zipmap,
)
from tdag.ops.promotion import broadcasts_to

DEFAULT_OPSET = 20  # what torch.onnx.export uses by default in torch 2.13
RUNTIMES = (None, "onnxruntime")  # standard ONNX, or with onnxruntime's fused kernels
# elements: the largest computed constant an emitter may read (``_GraphEmitter.constant``):
# a [8, 1, 512, 512] mask, not a weight's transform
CONSTANT_LIMIT = 1 << 21
_IR_VERSION = {18: 8, 19: 9, 20: 9, 21: 10, 22: 10, 23: 11, 24: 11}


def to_onnx(prog: Program | TDAG, opset: int | None = None, lower: bool = True,
            runtime: str | None = None) -> onnx.ModelProto:
    """An ONNX model computing ``prog``; symbolic dims are dynamic axes named after them.

    By default the model holds standard ONNX only. ``runtime="onnxruntime"`` writes
    onnxruntime's fused kernels where a lowered kernel matches one (``tdag.reify.onnx.ort``:
    attention -> com.microsoft ``Attention`` or ``MultiHeadAttention``, gelu -> ``Gelu`` /
    ``FastGelu``, rms_norm -> ``SimplifiedLayerNormalization``): a file for
    onnxruntime only, which ONNX's checker does not know. ``opset`` defaults to 20
    (torch.onnx.export's), or the newer one that an element type of ``prog`` needs or that
    writes one of its ops as one node (23: rms_norm as RMSNormalization).

    >>> import tdag, tdag.reify
    >>> from tdag import ops
    >>> model = tdag.reify.to_onnx(tdag.trace(lambda x: ops.exp(x), tdag.TensorSpec(("b", 3))))
    >>> model.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    'b'
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    if lower:
        prog = lower_program(prog)
    least, dtype = _least_opset(prog)
    opset = opset or max(DEFAULT_OPSET, least, _faster_opset(prog))
    if opset < 18:
        raise ValueError(f"to_onnx needs opset 18 or later, got {opset}")
    if opset < least:
        raise UnsupportedOpError(f"element type {dtype.value} (or a bitcast to it) needs ONNX "
                                 f"opset {least} or later; to_onnx was asked for opset {opset}")
    if runtime not in RUNTIMES:
        raise ValueError(f"to_onnx: runtime must be one of {RUNTIMES}, got {runtime!r}")
    return _Exporter(prog, opset, runtime).model()


def _copy(src: str, dst: str, dtype: DType, name: str) -> onnx.NodeProto:
    """A node copying ``src`` to ``dst``: an Identity, but a Cast to its own type for
    float8e8m0, for which onnxruntime registers no Identity."""
    if dtype is DType.f8e8m0fnu:
        return helper.make_node("Cast", [src], [dst], name=name, to=ONNX_DTYPE[dtype])
    return helper.make_node("Identity", [src], [dst], name=name)


# the first opset whose ops take each newer element type (Cast-19 the float8 kinds, Cast-24
# float8e8m0); older types, any opset to_onnx writes
_TYPE_OPSET = {**{d: 19 for d in FLOAT8}, DType.f8e8m0fnu: 24}


def _least_opset(prog: Program) -> tuple:
    """(the least opset holding every element type of ``prog`` and its bitcasts, the type
    that needs it)."""
    types = {t.dtype for g in prog.graphs.values()
             for t in [v.type for v in g.inputs] + [w.type for w in g.weights.values()] +
             [n.type for n in g.nodes]}
    types |= {w.type.dtype for w in prog.state.values()}
    needs = [(_TYPE_OPSET.get(d, 18), d) for d in types]
    for g in prog.graphs.values():
        types_of = {v.name: v.type for v in g.inputs} | \
            {n: w.type for n, w in g.weights.items()} | {n.name: n.type for n in g.nodes}
        needs += [(BITCAST_OPSET, n.type.dtype) for n in g.nodes if n.op is Op.bitcast and
                  needs_onnx_bitcast(types_of[n.inputs[0]].dtype, n.type.dtype)]
    return max(needs, key=lambda p: p[0], default=(18, None))


def _faster_opset(prog: Program) -> int:
    """23 where ``prog`` holds a float32 rms_norm, which RMSNormalization-23 writes as one
    node where earlier opsets need six that onnxruntime runs pass by pass (T5's encoder and
    Llama 2-6% faster on onnxruntime 1.32); else the least opset to_onnx writes."""
    return 23 if any(n.op is Op.rms_norm and n.type.dtype is DType.f32
                     for g in prog.graphs.values() for n in g.nodes) else 18


def _uses_ml(nodes) -> bool:
    """Whether ``nodes`` (their subgraphs included) hold an ai.onnx.ml op (a kernel written
    back as one: a tree ensemble); ai.onnx.ml 3 reads double thresholds as tensors."""
    return any(n.domain == "ai.onnx.ml" or any(_uses_ml(a.g.node) for a in n.attribute
                                                 if a.type == onnx.AttributeProto.GRAPH)
               for n in nodes)


class _Exporter:
    def __init__(self, prog: Program, opset: int, runtime: str | None = None):
        self.prog, self.opset = prog, opset
        self.root = GraphBuilder(opset, runtime=runtime)
        self.weights: dict[tuple, str] = {}

    def model(self) -> onnx.ModelProto:
        g, main = self.root, self.prog.main
        if not main.outputs and not state_writes(main, self.prog.state):
            # torch.broadcast_shapes gives sizes only; onnxruntime loads no such graph
            raise UnsupportedOpError("to_onnx: the program computes no tensor (no output, "
                                     "no state written); an ONNX graph needs an output")
        env = {}
        for v in main.inputs:
            g.names.taken.add(v.name)
            env[v.name] = v.name
            g.symbols.bind(v.name, v.type.shape)
        for name, w in self.prog.state.items():
            env[name] = self.weight(("state", name), name, w)
        written = sorted(state_writes(main, self.prog.state))
        # only a program that writes its state takes it as inputs: one that only reads it
        # keeps plain initializers, which onnxruntime may fold
        state_inputs = [value_info(env[name], w.type) for name, w in self.prog.state.items()
                        if written]
        outs, after = self.block(g, main, env)
        outs += [after[name] for name in written]
        out_types = list(block_types(self.prog, main)) + \
            [self.prog.state[name].type for name in written]
        out_names = [g.names(name) for name in main.outputs] + \
            [g.names(f"{name}.next") for name in written]
        # the node computing an output writes it under the output's name; an Identity (a
        # copy in onnxruntime) only where that is not possible: an input or weight returned
        # as is, or one value returned twice
        produced = {o for node in g.nodes for o in node.output}
        renames = {}
        labels = [self.prog.class_labels.get(name) for name in main.outputs] + \
            [None] * len(written)
        refuse_complex_io([(v.name, v.type) for v in main.inputs] +
                          list(zip(main.outputs, out_types)))
        infos = []
        for src, dst, t, classes in zip(outs, out_names, out_types, labels):
            if classes is not None:  # probabilities -> their maps (Program.class_labels)
                node, info = zipmap(src, dst, classes, g.names("n_zipmap"))
                g.nodes.append(node)
                infos.append(info)
                continue
            infos.append(value_info(dst, t))
            if src in produced and src not in renames:
                renames[src] = dst
            else:
                g.nodes.append(_copy(src, dst, t.dtype, g.names("n_out")))
        domains = [("", self.opset)] + [("ai.onnx.ml", 3)] * (any(labels) or _uses_ml(g.nodes))
        model = helper.make_model(onnx.GraphProto(), producer_name="tdag", opset_imports=[
            helper.make_opsetid(domain, version) for domain, version in domains])
        graph = g.graph("tdag", [value_info(v.name, v.type) for v in main.inputs] + state_inputs,
                        infos, model.graph)
        rename(graph, renames)
        prune(graph)
        if any(n.domain == ort.DOMAIN for sub in all_graphs(graph) for n in sub.node):
            model.opset_import.append(helper.make_opsetid(ort.DOMAIN, 1))
        model.ir_version = _IR_VERSION.get(self.opset, onnx.IR_VERSION)
        return model

    def weight(self, key: tuple, name: str, weight) -> str:
        if key not in self.weights:
            if weight.value is None:
                raise ValueError(f"weight %{name} has no value; ONNX needs initializers")
            hint = name if weight.kind is not TensorKind.const else f"const_{name}"
            self.weights[key] = self.root.initializer(hint, weight.value) \
                if key[0] == "state" else self.root.weight(hint, weight.value)
        return self.weights[key]

    # -- controllers --------------------------------------------------------------------------

    def block(self, g: GraphBuilder, block: Block, env: dict) -> tuple[list[str], dict]:
        """The ONNX names of ``block``'s outputs, and the environment after it (where the
        state it wrote stands)."""
        env = dict(env)
        for step in block.steps:
            args = [env[n] for n in step.inputs]
            if isinstance(step, Call):
                outs = self.call(g, self.prog.graphs[step.graph], step.graph, args)
            elif isinstance(step, If):
                outs = self.branch(g, step, env, args)
            else:
                outs = self.loop(g, step, env, args)
            env.update(zip(step.outputs, outs))
        return [env[n] for n in block.outputs], env

    def call(self, g: GraphBuilder, graph: TDAG, gname: str, args) -> list[str]:
        saved = g.symbols
        g.symbols = Symbols(saved)
        for value, arg in zip(graph.inputs, args):
            g.symbols.bind(arg, value.type.shape)
        try:
            return _GraphEmitter(self, g, graph, gname).emit(args)
        finally:
            g.symbols = saved

    def subgraph(self, g: GraphBuilder, block: Block, env: dict, inputs, first: list,
                 extra=(), state=(), carried=0) -> onnx.GraphProto:
        """A subgraph running ``block`` on ``inputs`` (outer names, or the subgraph's own
        inputs ``first``); ``extra`` bool outputs go before the block's outputs, and the final
        values of the ``state`` it writes after the first ``carried`` of them."""
        sub = g.child()
        inner = dict(env)
        inner.update((v.name, name) for v, name in zip(block.inputs, inputs))
        for v, name in zip(block.inputs, inputs):
            sub.symbols.bind(name, v.type.shape)
        results, after = self.block(sub, block, inner)
        types = list(block_types(self.prog, block))
        results[carried:carried] = [after[s] for s in state]
        types[carried:carried] = [self.prog.state[s].type for s in state]
        outs = list(extra) + results
        types = [TensorType((), DType.bool)] * len(extra) + types
        names = [sub.names("sub_out") for _ in outs]
        sub.nodes.extend(_copy(o, n, t.dtype, sub.names("n_Identity"))
                         for o, n, t in zip(outs, names, types))
        infos = [helper.make_tensor_value_info(n, ONNX_DTYPE[t.dtype], None)
                 for n, t in zip(names, types)]
        return sub.graph(g.names("body"), first, infos)

    def branch(self, g: GraphBuilder, step: If, env: dict, args) -> list[str]:
        state = sorted(state_writes(step.then_branch, self.prog.state) |
                       state_writes(step.else_branch, self.prog.state))
        n = len(step.outputs)
        graphs = [self.subgraph(g, b, env, args, [], state=state, carried=n)
                  for b in (step.then_branch, step.else_branch)]
        outs = g.node("If", [env[step.cond]], outputs=n + len(state), hint="if",
                      then_branch=graphs[0], else_branch=graphs[1])
        outs = [outs] if isinstance(outs, str) else outs
        env.update(zip(state, outs[n:]))
        return outs[:n]

    def loop(self, g: GraphBuilder, step: Loop, env: dict, args) -> list[str]:
        it, cond_in = g.names("iter"), g.names("cond_in")
        state = sorted(state_writes(step.body, self.prog.state))
        carried = [g.names(f"carry_{v.name}") for v in step.body.inputs[1:]]
        held = [g.names(f"carry_{name}") for name in state]  # the state the body writes
        types = [v.type for v in step.body.inputs[1:]] + [self.prog.state[s].type for s in state]
        first = [helper.make_tensor_value_info(it, onnx.TensorProto.INT64, []),
                 helper.make_tensor_value_info(cond_in, onnx.TensorProto.BOOL, [])]
        first += [helper.make_tensor_value_info(c, ONNX_DTYPE[t.dtype], None)
                  for c, t in zip(carried + held, types)]
        extra = [] if step.cond is not None else [cond_in]
        inner = {**env, **dict(zip(state, held))}
        keep_going = 1 if step.cond is not None else 0  # the body's own first output
        body = self.subgraph(g, step.body, inner, [it] + carried, first, extra, state,
                             keep_going + len(carried))
        count = g.scalar_dim(step.count) if step.count is not None else ""
        cond = env[step.cond] if step.cond is not None else ""
        n_out = len(step.inputs) + len(state) + step.scanned
        outs = g.node("Loop", [count, cond] + list(args) + [env[s] for s in state],
                      outputs=n_out, hint="loop", body=body)
        outs = [outs] if isinstance(outs, str) else outs
        n = len(step.inputs)
        env.update(zip(state, outs[n:n + len(state)]))
        return outs[:n] + outs[n + len(state):]


class _GraphEmitter:
    """Inlines one TDAG into a GraphBuilder."""

    def __init__(self, exporter: _Exporter, g: GraphBuilder, graph: TDAG, gname: str):
        self.exporter, self.g, self.graph, self.gname = exporter, g, graph, gname
        self.ctx = Context(graph)
        self.env: dict[str, str] = {}  # tdag name -> ONNX name, as written so far
        # node name -> how to write it from its operands, where a shortcut applies
        self.shortcuts: dict[str, Callable] = {}
        # (tdag name, perm) -> an ONNX value holding that permutation of it (ort.py's
        # attention writes [B, S, N, H] before the Transpose to tdag's [B, N, S, H])
        self.views: dict[tuple, str] = {}
        self.constants: Constants | None = None  # made by ``constant`` when first asked

    def type(self, name: str) -> TensorType:
        return self.ctx.type(name)

    def constant(self, name: str):
        """``name``'s value (a torch tensor) where the graph computes it from constants
        alone, at most ``CONSTANT_LIMIT`` elements (an attention mask made from positions),
        else None: an emitter leaves out the work such values make moot. Evaluated once per
        graph, on the first question."""
        if self.constants is None:
            self.constants = Constants(self.graph.weights, CONSTANT_LIMIT)
            for node in self.graph.nodes:
                self.constants.add(node)
        return self.constants.value(name)

    def emit(self, args) -> list[str]:
        graph = self.graph
        env = self.env
        env.update((v.name, a) for v, a in zip(graph.inputs, args))
        operands = {n.name: self.operands(n) for n in graph.nodes}
        live = set(graph.outputs)
        definer = fresh_definers(graph)  # a run-time size needs its definer (see torch code)
        for node in reversed(graph.nodes):
            if node.name in live:
                live.update(o for o in operands[node.name] if isinstance(o, str))
                if definer:
                    live.update(definer[s] for s in sizes_named(node) if s in definer)
        for name, w in graph.weights.items():
            if name in live:
                key = (self.gname, name) if w.kind is TensorKind.const else ("w", name)
                env[name] = self.exporter.weight(key, name, w)
        for node in graph.nodes:
            if node.name not in live:
                continue
            ins = [env[o] if isinstance(o, str) else self.g.const(o[0], o[1])
                   for o in operands[node.name]]
            shortcut = self.shortcuts.get(node.name)
            env[node.name] = shortcut(ins) if shortcut else \
                emit_carried(node, ins, self, self.g, self._emit_one)
            # a symbol where it is fresh (read with Shape of the result where needed), and a
            # size expression from whatever tensor has it first
            self.g.symbols.bind(env[node.name], node.type.shape,
                                expressions=not has(node.op, Trait.FRESH_SIZE))
        return [env[n] for n in graph.outputs]

    def _emit_one(self, node, ins: list, cx) -> str:
        if node.op is Op.permute and (node.inputs[0], node.spec.perm) in self.views:
            return self.views[node.inputs[0], node.spec.perm]
        if is_normalised_sum(self.ctx, node):
            return self.g.node("Sum", ins)
        if self.g.runtime == "onnxruntime":
            fused = ort.fused(node, ins, self.g, cx)
            if fused is not None:
                return fused
        return record(node.op).onnx(node, ins, self.g, cx)

    def _size(self, node, count) -> str:
        size = self.g.scalar_dim(count)
        return size if node.type.dtype is DType.i64 else self.g.cast(size, node.type.dtype)

    def operands(self, node) -> list:
        """tdag names to read (an expand's source where ONNX broadcasting rebuilds it), or
        ``(value, dtype)`` for a scalar constant."""
        names = list(node.inputs)
        count = counted_size(self.ctx, node)
        if count is not None:
            self.shortcuts[node.name] = lambda ins: self._size(node, count)
            return []
        mean = mean_of(self.ctx, node)
        if mean is not None:
            x, axes = mean
            rank = self.type(x).rank
            self.shortcuts[node.name] = lambda ins: emit_mean(node, ins[0], axes, self.g, rank)
            return [x]
        if node.op is Op.gather and unwrapped_index(self.ctx, node) is not None:
            return [names[0], unwrapped_index(self.ctx, node)]
        if not has(node.op, Trait.SCALAR_OPERAND):
            return names
        shapes = [self.type(n).shape for n in names]
        out = list(names)
        for i, n in enumerate(names):
            if node.op is Op.where and i == 0:
                continue
            # a per-channel vector stays one even when its values agree (a file's filled
            # BatchNorm terms): onnxruntime folds an initializer of that shape into the Conv
            # before it, never a scalar
            value = scalar(self.ctx, n, single=True)
            dtype = self.type(n).dtype
            others = [j for j in range(len(names)) if j != i and not isinstance(out[j], tuple)]
            if value is not None and dtype is not DType.bf16 and \
                    broadcasts_to([shapes[j] for j in others], node.type.shape):
                out[i], shapes[i] = (_typed(value, dtype), dtype), ()
        for i, n in enumerate(names):
            producer = self.ctx.producer(n)
            if isinstance(out[i], tuple) or producer is None or \
                    producer.op not in (Op.expand, Op.repeat):
                continue
            trial = list(shapes)
            trial[i] = self.type(producer.inputs[0]).shape
            if broadcasts_to(trial, node.type.shape):
                shapes, out[i] = trial, producer.inputs[0]
        return out


# protobuf serializes at most 2 GiB: a larger model's weights go to a file beside it
EXTERNAL_ABOVE = 2**31 - 2**24


def write_onnx(model: onnx.ModelProto, path) -> None:
    """Save ``model`` to ``path``; past 2 GiB its tensors go to ``<name>.data`` in the same
    folder (ONNX external data, the only form onnxruntime and tdag.from_onnx read back)."""
    path = os.fspath(path)
    try:
        small = model.ByteSize() <= EXTERNAL_ABOVE
    except Exception:  # noqa: BLE001  (protobuf cannot even size it: past 2 GiB)
        small = False
    if small:
        onnx.save(model, path)
        return
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=os.path.basename(path) + ".data", size_threshold=1024)


def _typed(value: float, dtype: DType):
    if dtype is DType.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    return float(value) if dtype.is_float else int(value)
