"""The verifier: ``verify(prog)`` raises InvalidModelError naming the first bad node.

It checks names (valid, unique, defined before use: a cycle shows up as a use before its
definition), ops and specs, every node's type against its op's shape rule, weights against
their declared types, and the controllers' signatures against the TDAGs they run. A fresh
size symbol (one data decides, ``tdag/deinops/runtime.py``) is defined by exactly one node of
its TDAG, is no input's size, and appears in no type or spec before that node.
"""
from __future__ import annotations

import dataclasses
import re

import sympy

from tdag.errors import InvalidModelError, ShapeError
from tdag.ir.graph import TDAG, valid_name
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.record import REGISTRY, Trait
from tdag.ir.symbols import as_dim, shape_is_static, symbol
from tdag.ir.types import DType, TensorType, spec_of


def verify(prog: Program | TDAG) -> None:
    """Raise InvalidModelError if ``prog`` is malformed; return None if it is sound."""
    if isinstance(prog, TDAG):
        verify_tdag(prog)
        return
    if not isinstance(prog, Program):
        raise InvalidModelError(f"not a tdag Program: {type(prog).__name__}")
    for name, graph in prog.graphs.items():
        verify_tdag(graph, name)
    outputs = dict(zip(prog.main.outputs, block_types(prog, prog.main)))
    for name, labels in prog.class_labels.items():
        _check_class_labels(name, labels, outputs.get(name))


def _check_class_labels(name: str, labels: tuple, ttype: TensorType | None) -> None:
    """Labels name an [N, C] float32 output of the program, one label per column, each once."""
    if ttype is None:
        raise InvalidModelError(f"class labels of %{name}, which is no output of the program")
    if ttype.dtype is not DType.f32 or len(ttype.shape) != 2 or \
            ttype.shape[1] != len(labels) or len(set(labels)) != len(labels):
        raise InvalidModelError(f"class labels {list(labels)} of %{name}: {ttype} is not f32 "
                                f"[N, {len(labels)}] or a label repeats")


def verify_tdag(graph: TDAG, where: str = "main") -> None:
    defined: dict[str, TensorType] = {}
    all_names = {n.name for n in graph.nodes}

    def define(name: str, type: TensorType, node: str | None = None) -> None:
        if not valid_name(name):
            raise InvalidModelError(f"{where}: invalid name {name!r}", node=node)
        if name in defined:
            raise InvalidModelError(f"{where}: %{name} is defined twice", node=node)
        defined[name] = type

    for value in graph.inputs:
        define(value.name, value.type)
    for name, weight in graph.weights.items():
        define(name, weight.type)
        _check_weight(name, weight, where)
    fresh = _fresh_sizes(graph, where)
    for i, node in enumerate(graph.nodes):
        if fresh:
            _check_fresh_uses(node, i, fresh, where)
        for name in node.inputs:
            if name not in defined:
                problem = ("used before its definition (a cycle, or nodes out of topological "
                           "order)" if name in all_names else "is not defined (a dangling name)")
                raise InvalidModelError(f"{where}: input %{name} {problem}", node=node.name,
                                        origin=node.origin)
        _check_node(node, [defined[n] for n in node.inputs], where)
        define(node.name, node.type, node.name)
    for name in graph.outputs:
        if name not in defined:
            raise InvalidModelError(f"{where}: output %{name} is not defined")


def _fresh_sizes(graph: TDAG, where: str) -> dict[str, int]:
    """Each fresh symbol (a size data decides) -> the index of the one node defining it."""
    found: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        if node.op in REGISTRY and REGISTRY[node.op].has(Trait.FRESH_SIZE):
            for name in getattr(node.spec, "fresh", ()):
                if name in found:
                    raise InvalidModelError(f"{where}: the fresh size {name} is defined twice "
                                            f"(by %{graph.nodes[found[name]].name} too)",
                                            node=node.name, origin=node.origin)
                found[name] = i
    if found:
        for value in graph.inputs:
            clash = _symbols_of(value.type.shape) & set(found)
            if clash:
                raise InvalidModelError(f"{where}: the fresh size {min(clash)} is also the "
                                        f"size of input %{value.name}")
    return found


def _check_fresh_uses(node, index: int, fresh: dict[str, int], where: str) -> None:
    """A fresh symbol is used (in a node's type or spec) only after the node defining it."""
    used = _symbols_of(node.type.shape) | _symbols_of(node.spec)
    for name in used & set(fresh):
        if fresh[name] > index or (fresh[name] == index and
                                   name not in getattr(node.spec, "fresh", ())):
            raise InvalidModelError(f"{where}: uses the fresh size {name} before the node "
                                    "that defines it", node=node.name, origin=node.origin)


def _symbols_of(value) -> set[str]:
    """The symbol names in a Dim, a shape or a spec (its fields, nested)."""
    if isinstance(value, sympy.Expr):
        return {s.name for s in value.free_symbols}
    if isinstance(value, (tuple, list)):
        return set().union(*(_symbols_of(v) for v in value)) if value else set()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _symbols_of(tuple(getattr(value, f.name) for f in dataclasses.fields(value)))
    return set()


def _check_node(node, in_types, where: str) -> None:
    prim = REGISTRY.get(node.op)
    if prim is None:
        raise InvalidModelError(f"{where}: unknown op {node.op!r}", node=node.name,
                                origin=node.origin)
    if not isinstance(node.spec, prim.spec_type):
        raise InvalidModelError(f"{where}: {node.op.value} needs a {prim.spec_type.__name__} "
                                f"spec, got {type(node.spec).__name__}", node=node.name,
                                origin=node.origin)
    if not prim.takes(len(in_types)):
        raise InvalidModelError(f"{where}: {node.op.value} takes {prim.arity} inputs, got "
                                f"{len(in_types)}", node=node.name, origin=node.origin)
    try:
        expected = prim.shape(node.spec, in_types)
    except ShapeError as exc:
        raise InvalidModelError(f"{where}: {exc.args[0]}", node=node.name,
                                origin=node.origin) from None
    except (TypeError, ValueError, IndexError, KeyError, OverflowError) as exc:
        # a spec a pass would never build (a list where a tuple of ints belongs, say) reaches
        # here only from a file or hand-written text; say so instead of escaping
        raise InvalidModelError(f"{where}: {node.op.value} spec {node.spec} is malformed "
                                f"({type(exc).__name__}: {exc})", node=node.name,
                                origin=node.origin) from None
    if not expected.same_as(node.type):
        raise InvalidModelError(f"{where}: {node.op.value} gives {expected} but the node "
                                f"says {node.type}", node=node.name, origin=node.origin)


def _check_weight(name: str, weight, where: str) -> None:
    if weight.value is None:
        return
    actual = spec_of(weight.value)
    declared = weight.type
    if shape_is_static(declared.shape) and not actual.same_as(declared):
        raise InvalidModelError(f"{where}: weight %{name} is declared {declared} but holds "
                                f"{actual}")


def block_types(prog: Program, block: Block) -> tuple[TensorType, ...]:
    """Check a block's steps and return the types of its outputs."""
    env = {name: w.type for name, w in prog.state.items()}
    for value in block.inputs:
        env[value.name] = value.type
    for step in block.steps:
        for name in step.inputs:
            if name not in env:
                raise InvalidModelError(f"{_describe(step)}: input %{name} is not defined")
        types = _step_types(prog, step, env, [env[n] for n in step.inputs])
        if len(types) != len(step.outputs):
            raise InvalidModelError(f"{_describe(step)}: {len(step.outputs)} outputs named, "
                                    f"{len(types)} produced")
        for name, type in zip(step.outputs, types):
            if name in prog.state and not prog.state[name].type.same_as(type):
                raise InvalidModelError(f"{_describe(step)}: writes state %{name} as {type}, "
                                        f"declared {prog.state[name].type}")
            env[name] = type
    for name in block.outputs:
        if name not in env:
            raise InvalidModelError(f"block output %{name} is not defined")
    return tuple(env[n] for n in block.outputs)


def trips_name(loop: Loop) -> str:
    first = loop.outputs[0] if loop.outputs else "loop"
    return "trips_" + re.sub(r"[^A-Za-z0-9_]", "_", first)


def _describe(step) -> str:
    if isinstance(step, Call):
        return f"call {step.graph}"
    return type(step).__name__.lower()


def _same_types(a, b) -> bool:
    return len(a) == len(b) and all(x.same_as(y) for x, y in zip(a, b))


def _check_args(what: str, params, args) -> None:
    if not _same_types([p.type for p in params], args):
        raise InvalidModelError(f"{what}: takes ({', '.join(str(p.type) for p in params)}), "
                                f"given ({', '.join(str(a) for a in args)})")


def _step_types(prog: Program, step, env, args) -> tuple[TensorType, ...]:
    if isinstance(step, Call):
        graph = prog.graphs.get(step.graph)
        if graph is None:
            raise InvalidModelError(f"call of unknown TDAG {step.graph!r}")
        _check_args(f"call {step.graph}", graph.inputs, args)
        return graph.output_types
    if isinstance(step, If):
        cond = env.get(step.cond)
        if cond is None or cond.dtype is not DType.bool or cond.rank != 0:
            raise InvalidModelError(f"if: condition %{step.cond} must be a bool scalar")
        _check_args("if/then", step.then_branch.inputs, args)
        _check_args("if/else", step.else_branch.inputs, args)
        then_types = block_types(prog, step.then_branch)
        else_types = block_types(prog, step.else_branch)
        if not _same_types(then_types, else_types):
            raise InvalidModelError("if: branches return different types")
        return then_types
    if isinstance(step, Loop):
        return _loop_types(prog, step, env, args)
    raise InvalidModelError(f"unknown controller {type(step).__name__}")


def _loop_types(prog: Program, loop: Loop, env, args) -> tuple[TensorType, ...]:
    if loop.count is None and loop.cond is None:
        raise InvalidModelError("loop: needs a count, a condition, or both")
    if loop.cond is not None:
        cond = env.get(loop.cond)
        if cond is None or cond.dtype is not DType.bool or cond.rank != 0:
            raise InvalidModelError(f"loop: condition %{loop.cond} must be a bool scalar")
    _check_args("loop body", loop.body.inputs, [TensorType((), DType.i64), *args])
    outs = block_types(prog, loop.body)
    offset = 1 if loop.cond is not None else 0
    if loop.cond is not None and (outs[0].dtype is not DType.bool or outs[0].rank != 0):
        raise InvalidModelError("loop: the body's first output must be the bool condition")
    carried = outs[offset:offset + len(args)]
    if not _same_types(carried, args):
        raise InvalidModelError("loop: the body changes the types of carried values")
    scanned = outs[offset + len(args):]
    if len(scanned) != loop.scanned:
        raise InvalidModelError(f"loop: {loop.scanned} scanned outputs declared, "
                                f"{len(scanned)} produced")
    # a loop with a condition may stop before its count: its trip count is known only at run
    # time, a fresh symbol named after the loop's first output, so two loops (or a user's own
    # `n`) never share it
    count = loop.count if loop.cond is None else symbol(trips_name(loop))
    return tuple(carried) + tuple(t.with_shape((as_dim(count),) + t.shape) for t in scanned)
