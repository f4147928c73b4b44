"""ONNX If and Loop as tdag controllers.

The current segment is closed (its values read later become a TDAG's outputs), each
subgraph becomes a Block by its own importer, and the controller joins them. An ONNX
subgraph reads outer values by name; a tdag Block is closed, so the outer tensors a body
reads become its inputs (for Loop: extra carried values the body passes through unchanged).
Shape values and initializers need no passing: the body's importer re-creates them. An If
whose condition is known at import time is inlined instead.
"""
from __future__ import annotations

import re

import numpy as np
import onnx

from tdag import ops
from tdag.canonicalize.onnx.load import declared_clash
from tdag.canonicalize.onnx.values import Known, Param, free_names
from tdag.canonicalize.common.segments import Boundary
from tdag.deinops.runtime import Arange
from tdag.errors import InvalidModelError, UnsupportedOpError
from tdag.ops.builder import Builder
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ops.tensor import Tensor
from tdag.ir.op import Op
from tdag.ir.symbols import is_static, shapes_equal, symbol
from tdag.ir.types import DType, TensorType
from tdag.ir.verify import block_types, trips_name

CONTROL_OPS = ("If", "Loop", "Scan")  # the ops onnx/importer.py hands to this module


def convert_if(importer, node: onnx.NodeProto, index: int) -> None:
    branches = {a.name: a.g for a in node.attribute}
    for key in ("then_branch", "else_branch"):
        if len(branches[key].output) != len(node.output):
            raise InvalidModelError(f"If: {key} returns {len(branches[key].output)} values "
                                    f"for {len(node.output)} outputs")
    cond = importer.read(node.input[0])
    if isinstance(cond, Known) and cond.static:
        branch = branches["then_branch" if cond.values.reshape(-1)[0] else "else_branch"]
        if not any(n.op_type in CONTROL_OPS for n in branch.node):  # no nested controllers
            _inline(importer, node, branch)
            return
    key = f"{node.output[0]}__cond"  # the bool scalar the controller reads
    with importer.builder.active():
        importer.env[key] = ops.reshape(ops.cast(importer.as_tensor(cond), DType.bool))
    before = len(importer.problems)
    blocks, passed = _bodies(importer, node, index, [branches["then_branch"],
                                                      branches["else_branch"]], {key})
    _bodies_imported(importer, node, before)
    types = [_types(importer, b) for b in blocks]
    for k, (a, b) in enumerate(zip(*types)):
        if a.dtype is not b.dtype or a.rank != b.rank:
            _one_type(a, b, f"If: output {k} ({node.output[k]!r}) is {a} in the then branch "
                            f"but {b} in the else branch", "a tdag If returns one type")
    blocks, types = _joined(importer, node, blocks, types)
    outs = tuple(importer.names(o) for o in node.output)
    step = If(importer.env[key].name, tuple(importer.env[f].name for f in passed),
              blocks[0], blocks[1], outs)
    _append(importer, node, step, types[0])


def _joined(importer, node, blocks: list, types: list) -> tuple[list, list]:
    """Branches that return one type. Where they give an output of other sizes (a merged
    decoder's present is past + new long in the with-past branch and new long in the other,
    which its caller feeds a past of length 0), each branch ends with a gather of the output
    to a size that data decides, one fresh symbol both branches define, per pair of sizes:
    the copy costs what one more write of the output costs."""
    fresh: dict = {}  # (then size, else size) -> the fresh symbol's name
    for out, a, b in zip(node.output, *types):
        for axis, (d, e) in enumerate(zip(a.shape, b.shape)):
            if not shapes_equal((d,), (e,)) and (d, e) not in fresh:
                stem = re.sub(r"\W", "_", f"{out}__size{axis}")
                fresh[d, e] = importer.shared.graph_names.fresh(
                    stem, avoid=importer.shared.input_symbols)
    if not fresh:
        return blocks, types
    axes = [[(j, fresh.get((d, e))) for j, (d, e) in enumerate(zip(a.shape, b.shape))
             if (d, e) in fresh] for a, b in zip(*types)]
    joined = [_join_sizes(importer, node, block, ts, axes, k)
              for k, (block, ts) in enumerate(zip(blocks, types))]
    return joined, [_types(importer, b) for b in joined]


def _join_sizes(importer, node, block: Block, types, axes: list, k: int) -> Block:
    """``block`` with a Call that gathers each output along its ``axes`` [(axis, symbol)]
    to the fresh sizes, each defined once by an arange over the size it replaces."""
    builder = Builder()
    made, outs = {}, []
    with builder.active():
        for i, (t, plan) in enumerate(zip(types, axes)):
            x = builder.input(f"x{i}", t)
            for axis, name in plan:
                if name not in made:
                    n = ops.reshape(ops.size_tensor(x, (axis,), DType.i64), ())
                    made[name] = builder.emit(Op.arange, Arange(name), n)
                x = ops.gather(x, made[name], axis, wrap=False)
            outs.append(x)
    gname = importer.shared.graph_name(f"{importer.prefix}_if_sizes{k}")
    importer.shared.graphs[gname] = builder.build(outs)
    names = tuple(importer.names(f"{o}__{gname}") for o in node.output)
    return Block(block.inputs, block.steps + (Call(gname, block.outputs, names),), names)


def convert_loop(importer, node: onnx.NodeProto, index: int) -> None:
    """Loop(M, cond, v...) with body (i, cond_in, v...) -> (cond_out, v..., scans...).

    A trip count computed from data becomes part of the condition: the loop runs while
    ``i < M`` (and the body's condition, where the node has one), M passed to the body."""
    body = next(a.g for a in node.attribute if a.name == "body")
    carried = list(node.input[2:])
    _check_loop_arity(node, body, len(carried))
    count = importer.read(node.input[0]) if node.input[0] else None
    trips = None  # the key of a run-time trip count
    if count is not None and not isinstance(count, Known):
        trips, count = f"{_base(node)}__trips", None
        with importer.builder.active():
            m = ops.reshape(ops.cast(importer.as_tensor(importer.read(node.input[0])),
                                     DType.i64))
            importer.env[trips] = m
    count = count.dims()[0] if count is not None else None
    if is_static(count) and count < 0:
        raise UnsupportedOpError(f"Loop: the negative trip count {count}")
    if count is None and trips is None and not node.input[1]:
        raise UnsupportedOpError("Loop: neither a trip count nor a condition (an endless loop)")
    key = None
    if node.input[1] or trips:
        key = f"{_base(node)}__cond"
        with importer.builder.active():
            value = ops.lt(ops.full((), 0, DType.i64), importer.env[trips]) if trips else None
            if node.input[1]:
                given = ops.reshape(ops.cast(importer.as_tensor(importer.read(node.input[1])),
                                             DType.bool))
                value = given if value is None else ops.logical_and(value, given)
            importer.env[key] = value
    with importer.builder.active():
        for name in carried:  # shape values and initializers become tensors of the block
            if isinstance(importer.env.get(name), (Known, Param)):
                importer.env[name] = importer.as_tensor(importer.read(name))
    hook = _trip_condition(body, trips, bool(node.input[1])) if trips else None
    before = len(importer.problems)
    blocks, passed = _bodies(importer, node, index, [body], {key, *carried} - {None},
                             loop_carried=carried, extra=[trips] if trips else [], hook=hook)
    _bodies_imported(importer, node, before)
    n_scan = len(body.output) - 1 - len(carried)
    outs = [importer.names(o) if o else importer.names(f"{node.name}_unused_{i}")
            for i, o in enumerate(node.output)]
    extra = [importer.names(f"{_base(node)}__pass_{f}") for f in passed]
    step = Loop(tuple(importer.env[n].name for n in carried) +
                tuple(importer.env[f].name for f in passed), blocks[0],
                tuple(outs[:len(carried)] + extra + outs[len(carried):]), count,
                importer.env[key].name if key else None, n_scan)
    types = _types(importer, blocks[0])
    offset = 1 if key else 0
    _check_carried(importer, node, carried, types[offset:offset + len(carried)])
    _append(importer, node, step, types, skip=len(carried), drop=len(extra))


def _types(importer, block: Block) -> tuple:
    """The block's output types, checked, in a Program of just the TDAGs it calls (one of
    all TDAGs made so far would copy them at every controller)."""
    graphs = {name: importer.shared.graphs[name] for name in _called(block)}
    return block_types(Program(graphs, block), block)


def _called(block: Block):
    for step in block.steps:
        if isinstance(step, Call):
            yield step.graph
        for inner in (step.then_branch, step.else_branch) if isinstance(step, If) else \
                (step.body,) if isinstance(step, Loop) else ():
            yield from _called(inner)


def _check_loop_arity(node, body: onnx.GraphProto, n_carried: int) -> None:
    """ONNX's counts: the body takes (i, cond, v...) and returns (cond, v..., scans...), and
    the node returns (v..., scans...)."""
    if len(body.input) != 2 + n_carried or len(body.output) < 1 + n_carried or \
            len(node.output) != len(body.output) - 1:
        raise InvalidModelError(f"Loop: {n_carried} carried values, but the body takes "
                                f"{len(body.input)} inputs and returns {len(body.output)} "
                                f"values for {len(node.output)} outputs")


def _check_carried(importer, node, carried: list, after: list) -> None:
    """A carried value keeps its type from one iteration to the next."""
    for name, t in zip(carried, after):
        before = importer.env[name].type
        _one_type(before, t, f"Loop: the carried value {name!r} enters as {before} but the "
                             f"body returns {t}", "a tdag Loop keeps the types of carried values")


def _one_type(a, b, what: str, why: str) -> None:
    """Two types a controller needs equal: another dtype is a malformed model; another shape
    (legal ONNX) is what tdag's controllers do not take."""
    if a.dtype is not b.dtype:
        raise InvalidModelError(what)
    if not a.same_as(b):
        raise UnsupportedOpError(f"{what} ({why})")


def _inline(importer, node, branch: onnx.GraphProto) -> None:
    """A branch chosen at import time: its nodes join the current segment."""
    importer.read_initializers(branch)
    for i, inner in enumerate(branch.node):
        importer.convert_node(inner, i, branch)
    for out, inner in zip(node.output, branch.output):
        importer.env[out] = importer.env.get(inner.name)
        importer.check_declared(out, importer.env[out])


def _bodies(importer, node, index, graphs, keep: set, loop_carried=None, extra=(),
            hook=None):
    """Close the segment, then convert each subgraph into a Block. ``extra`` names values
    the importer made that the bodies read too; ``hook`` (given a body's importer) makes
    a loop body's condition in place of the plain bool scalar."""
    importer.close(importer.live_after(index, keep | set(extra)))
    free = sorted(set().union(*[free_names(g) for g in graphs]))
    passed = [f for f in free if isinstance(importer.env.get(f), Boundary)] + list(extra)
    outer = {f: importer.env[f] for f in [*free, *extra] if f in importer.env}
    blocks = []
    for k, graph in enumerate(graphs):
        prefix = importer.shared.graph_name(f"{importer.prefix}_{node.op_type.lower()}{k}")
        env = dict(outer)
        if loop_carried is None:
            inputs = [outer[f] for f in passed]
        else:
            inputs = _loop_inputs(importer, graph, loop_carried, env)
            inputs += [outer[f] for f in passed]
        sub = type(importer)(graph, importer.shared, prefix, env)  # a nested importer
        sub.types = _scoped_types(importer.types, graph, graphs[:k] + graphs[k + 1:])
        if hook is not None:
            sub.graph_outputs_hook = hook(sub)
        block = sub.sub_block(inputs, bool_first=loop_carried is not None and hook is None and
                              bool(node.input[1]))
        if loop_carried is not None:  # the passed-through outer values go out unchanged
            out, split = block.outputs, 1 + len(loop_carried)
            # no initial condition (and no run-time count): no keep_going output
            first = 0 if node.input[1] or hook is not None else 1
            block = Block(block.inputs, block.steps, out[first:split] +
                          tuple(outer[f].name for f in passed) + out[split:])
        blocks.append(block)
    return blocks, passed


def _scoped_types(types: dict, graph: onnx.GraphProto, siblings: list) -> dict:
    """The declared types a subgraph's importer checks against: its own over the enclosing
    scope's, without its siblings'. Sibling subgraphs may each hold a value of one name with
    other types (an optimum merged decoder's two branches are two exports that name their
    values alike); ONNX forbids only the shadowing of an outer name."""
    others = {name for g in siblings for name in _declared(g)}
    return {**{k: t for k, t in types.items() if k not in others}, **_declared(graph)}


def _declared(graph: onnx.GraphProto) -> dict:
    """The value_info and output types of ``graph`` and of the subgraphs in it."""
    found = {v.name: v.type for v in [*graph.value_info, *graph.output]}
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                found = {**_declared(sub), **found}
    return found


def _loop_inputs(importer, body: onnx.GraphProto, carried, env) -> list:
    i = body.input[0].name
    values = [Boundary(importer.names(i), TensorType((), DType.i64))]
    env[i] = values[0]
    # the body only runs while the condition holds, so the condition it sees is true
    env[body.input[1].name] = Known(np.array(True, dtype=object), DType.bool)
    for inner, outer in zip(body.input[2:], carried):
        b = Boundary(importer.names(inner.name), importer.env[outer].type)
        clash = declared_clash(inner.type.tensor_type, b.type) \
            if inner.type.HasField("tensor_type") else None
        if clash is not None:
            raise InvalidModelError(f"Loop: the body input {inner.name!r} is declared {clash} "
                                    f"but receives {outer!r}, {b.type}")
        env[inner.name] = b
        values.append(b)
    return values


def _append(importer, node, step, types, skip: int = 0, drop: int = 0) -> None:
    """Add the controller and bind its outputs (less ``drop`` pass-through values after the
    first ``skip``) as block-level values; ``types`` are its body's output types."""
    if isinstance(step, Loop):
        offset = 1 if step.cond is not None else 0
        carried_types = types[offset:offset + len(step.inputs)]
        # as verify types them: a loop with a condition may stop before its count
        trips = step.count if step.cond is None else symbol(trips_name(step))
        scans = [TensorType((trips, *t.shape), t.dtype) for t in types[offset + len(step.inputs):]]
        types = list(carried_types) + scans
    importer.steps.append(step)
    names = list(step.outputs[:skip]) + list(step.outputs[skip + drop:])
    types = list(types[:skip]) + list(types[skip + drop:])
    for out, name, t in zip(node.output, names, types):
        if out:
            importer.env[out] = Boundary(name, t)
            importer.check_declared(out, importer.env[out])


def _bodies_imported(importer, node, before: int) -> None:
    """A body with a node tdag could not convert (listed already) has holes: the
    controller is not built, and the report names it too."""
    if len(importer.problems) > before:
        raise UnsupportedOpError(f"{node.op_type}: its body holds the unsupported uses listed")


def _base(node: onnx.NodeProto) -> str:
    """A stem for the names the importer makes for a node: its first named output."""
    return next((o for o in node.output if o), node.name or node.op_type)


def _trip_condition(body: onnx.GraphProto, trips: str, with_cond: bool):
    """The hook that makes a loop body's condition ``i + 1 < M`` (and the body's own
    condition where the node has one): M is a trip count computed from data."""
    def make(sub):
        def hook(name: str) -> None:
            value = sub.read(name)
            with sub.builder.active():
                i = sub.read(body.input[0].name)
                keep = ops.lt(ops.add(i, ops.full((), 1, DType.i64)), sub.read(trips))
                if with_cond:
                    if not isinstance(value, (Tensor, Known)):
                        return  # not computed: the failure is reported already
                    own = ops.reshape(ops.cast(sub.as_tensor(value), DType.bool))
                    keep = ops.logical_and(keep, own)
                sub.env[name] = keep
        return hook
    return make



def convert_scan(importer, node: onnx.NodeProto, index: int) -> None:
    """Scan(state..., scan_in...) with body (state..., elements...) -> (state...,
    scan_out...) as a Loop over the scan axis: the body reads element ``i`` of each scan
    input by a gather (``-1-i`` reversed), and the stacked outputs are moved to their axis
    (put back in order where reversed) after the loop. Scan-8's leading batch axis is
    taken where it is 1."""
    body = next(a.g for a in node.attribute if a.name == "body")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    n_in = attrs["num_scan_inputs"]
    names, legacy = list(node.input), importer.opset < 9
    if legacy:
        if names[0]:
            raise UnsupportedOpError("Scan: the sequence_lens of opset 8")
        names = names[1:]
    n_state, n_out = len(names) - n_in, len(body.output) - (len(names) - n_in)
    if n_state < 0 or len(body.input) != len(names) or len(node.output) != len(body.output):
        raise InvalidModelError(f"Scan: {len(names)} inputs of which {n_in} scanned, but the "
                                f"body takes {len(body.input)} and returns "
                                f"{len(body.output)} for {len(node.output)} outputs")
    legacy_dirs = attrs.get("directions") if legacy else None
    in_axes = [1] * n_in if legacy else list(attrs.get("scan_input_axes") or [0] * n_in)
    in_dirs = list(legacy_dirs or attrs.get("scan_input_directions") or [0] * n_in)
    out_axes = list(attrs.get("scan_output_axes") or [0] * n_out)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * n_out)
    base = _base(node)
    with importer.builder.active():
        values = [importer.as_tensor(importer.read(n)) for n in names]
        if legacy:  # [batch, ...] with batch 1: the body's per-sample values
            values = [_unbatch(v) for v in values]
            in_axes = [0] * n_in
        in_axes = [_axis(a, v.ndim) for a, v in zip(in_axes, values[n_state:])]
        keys = [f"{base}__scan{k}" for k in range(len(values))]
        for key, value in zip(keys, values):
            importer.env[key] = value
    count = values[n_state].shape[in_axes[0]] if n_in else None
    if count is None:
        raise UnsupportedOpError("Scan: no scan inputs (the trip count is unknown)")
    for v, a in zip(values[n_state:], in_axes):
        if is_static(count) and is_static(v.shape[a]) and v.shape[a] != count:
            raise InvalidModelError(f"Scan: scan inputs of lengths {count} and {v.shape[a]}")
    loop, types = _scan_loop(importer, node, index, body, keys, n_state, in_axes, in_dirs,
                             count)
    importer.steps.append(loop)
    _check_carried(importer, node, keys[:n_state], types[:n_state])
    n_pass = len(loop.inputs) - n_state
    outs = list(zip(loop.outputs[:n_state], types[:n_state])) + \
        [(name, TensorType((count, *t.shape), t.dtype))
         for name, t in zip(loop.outputs[n_state + n_pass:], types[n_state:])]
    with importer.builder.active():
        for k, (out, (name, t)) in enumerate(zip(node.output, outs)):
            importer.env[f"{base}__done{k}"] = Boundary(name, t)
            value = importer.read(f"{base}__done{k}")
            if k >= n_state:
                value = _place(value, out_axes[k - n_state], out_dirs[k - n_state])
            if legacy:
                value = ops.unsqueeze(value, 0)
            if out:
                importer.env[out] = value
                importer.check_declared(out, value)


def _unbatch(value):
    if value.ndim == 0 or value.shape[0] != 1:
        raise UnsupportedOpError(f"Scan (opset 8): a batch axis of {value.type.shape[:1]} "
                                 "(tdag takes a batch of 1)")
    return ops.select(value, 0, 0)


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise InvalidModelError(f"Scan: axis {axis} is out of range for rank {rank}")
    return axis % rank


def _place(stacked, axis: int, reverse: int):
    """A stacked scan output (steps on axis 0) in ONNX's place: reversed, then moved."""
    if reverse:
        stacked = ops.gather(stacked, ops.sub(-1, ops.iota(stacked.shape[0])), 0)
    return ops.movedim(stacked, 0, _axis(axis, stacked.ndim))


def _scan_loop(importer, node, index, body, keys, n_state, in_axes, in_dirs, count):
    """Close the segment, make the Loop's body from the Scan's, and return the Loop with
    its body's output types (states, then one step of each scan output)."""
    importer.close(importer.live_after(index, set(keys)))
    free = sorted(free_names(body))
    passed = [f for f in free if isinstance(importer.env.get(f), Boundary)]
    base = _base(node)
    env = {f: importer.env[f] for f in free if f in importer.env}
    i_key = f"{base}__i"
    env[i_key] = Boundary(importer.names(i_key), TensorType((), DType.i64))
    states = []
    for inner, key in zip(body.input[:n_state], keys[:n_state]):
        env[inner.name] = Boundary(importer.names(inner.name), importer.env[key].type)
        states.append(env[inner.name])
    scans = []
    for key in keys[n_state:]:
        env[key] = Boundary(importer.names(f"{key}_in"), importer.env[key].type)
        scans.append(env[key])
    prefix = importer.shared.graph_name(f"{importer.prefix}_scan")
    sub = type(importer)(body, importer.shared, prefix, env)  # a nested importer
    with sub.builder.active():
        i = sub.read(i_key)
        for inner, key, axis, reverse in zip(body.input[n_state:], keys[n_state:], in_axes,
                                             in_dirs):
            step = ops.sub(ops.neg(i), 1) if reverse else i  # -1-i wraps to the end
            # a one-element index, then squeezed: the gather evaluator cannot make a 0-d
            # result (a scalar element of a 1-d scan input)
            picked = ops.gather(sub.read(key), ops.reshape(step, 1), axis, wrap=bool(reverse))
            sub.env[inner.name] = ops.squeeze(picked, axis)
    inputs = [env[i_key], *states, *scans, *[importer.env[f] for f in passed]]
    before = len(importer.problems)
    block = sub.sub_block(inputs)
    _bodies_imported(importer, node, before)
    through = tuple(v.name for v in inputs[1 + n_state:])
    block = Block(block.inputs, block.steps,
                  block.outputs[:n_state] + through + block.outputs[n_state:])
    n_out = len(body.output) - n_state
    outs = tuple(importer.names(o) if o else importer.names(f"{base}__unused{k}")
                 for k, o in enumerate(node.output[:n_state])) + \
        tuple(importer.names(f"{base}__pass{k}") for k in range(len(through))) + \
        tuple(importer.names(f"{base}__stack{k}") for k in range(n_out))
    loop = Loop(tuple(importer.env[k].name for k in keys) +
                tuple(importer.env[f].name for f in passed), block, outs, count,
                scanned=n_out)
    types = _types(importer, block)
    return loop, list(types[:n_state]) + list(types[n_state + len(through):])
