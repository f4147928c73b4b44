"""The reference interpreter: runs a Program on torch tensors with each primitive's evaluator.

Symbols are bound from the shapes of the tensors each TDAG receives, so a loop whose carried
values grow (a KV cache) re-binds them on every iteration; a fresh symbol (a size that only
data decides, ``tdag/deinops/runtime.py``) is bound from the result of the node defining it.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from tdag.errors import InvalidModelError, ShapeError, TdagError
from tdag.ir.graph import TDAG, Value
from tdag.ir.program import Block, Call, If, Loop, Program
from tdag.ir.carriers import run_carried
from tdag.ir.record import REGISTRY, Trait
from tdag.ir.symbols import evaluate, format_dim, is_static
from tdag.ir.types import DType, TensorType
from tdag.ir.verify import block_types


def run(prog: Program | TDAG, *tensors: torch.Tensor, state: Mapping | None = None,
        return_state: bool = False):
    """Evaluate ``prog`` on ``tensors``; one output is returned bare, several as a tuple.

    With ``return_state=True`` the result is ``(outputs, new_state)``.
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    store = {name: w.value for name, w in prog.state.items()}
    store.update(state or {})
    outs = _run_block(prog, prog.main, list(tensors), store, {})
    result = outs[0] if len(outs) == 1 else tuple(outs)
    return (result, store) if return_state else result


def bind(values: Sequence[Value], tensors: Sequence[torch.Tensor], bindings: dict,
         where: str) -> dict:
    """Check tensors against declared types and bind the symbols of their shapes."""
    if len(values) != len(tensors):
        raise TdagError(f"{where}: expected {len(values)} inputs, got {len(tensors)}")
    bound = dict(bindings)
    fresh: dict = {}  # symbols bound by these tensors: they must agree with one another
    for value, tensor in zip(values, tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TdagError(f"{where}: input %{value.name} must be a torch.Tensor, "
                            f"got {type(tensor).__name__}")
        _bind_one(value, tensor, bound, fresh, where)
    return bound


def _bind_one(value: Value, tensor: torch.Tensor, bound: dict, fresh: dict,
              where: str) -> None:
    declared = value.type
    if tensor.dim() != declared.rank or DType.of(tensor.dtype) is not declared.dtype:
        raise ShapeError(f"{where}: input %{value.name} should be {declared}, got "
                         f"{DType.of(tensor.dtype).value}{list(tensor.shape)}")
    deferred = []
    for dim, actual in zip(declared.shape, tensor.shape):
        if is_static(dim):
            if dim != actual:
                raise ShapeError(f"{where}: input %{value.name} should be {declared}, "
                                 f"got shape {list(tensor.shape)}")
        elif dim.is_Symbol:
            if fresh.get(dim.name, actual) != actual:
                raise ShapeError(f"{where}: input %{value.name} should be {declared}, got "
                                 f"shape {list(tensor.shape)}, but {dim.name} = "
                                 f"{fresh[dim.name]} from an earlier input")
            bound[dim.name] = fresh[dim.name] = int(actual)
        else:
            deferred.append((dim, actual))
    for dim, actual in deferred:
        if evaluate(dim, bound) != actual:
            raise ShapeError(f"{where}: input %{value.name} dimension {format_dim(dim)} "
                             f"should be {evaluate(dim, bound)}, got {actual}")


def run_tdag(graph: TDAG, args: Sequence[torch.Tensor], bindings: Mapping | None = None,
             where: str = "tdag") -> list[torch.Tensor]:
    bound = bind(graph.inputs, args, dict(bindings or {}), where)
    resolve = lambda dim: evaluate(dim, bound)  # noqa: E731
    env: dict[str, torch.Tensor] = {v.name: t for v, t in zip(graph.inputs, args)}
    for name, weight in graph.weights.items():
        if weight.value is None:
            raise TdagError(f"{where}: weight %{name} has no value (a shape-only or meta "
                            "program cannot run); load real weights first")
        env[name] = weight.value
    last_use = _last_uses(graph)
    for i, node in enumerate(graph.nodes):
        try:
            args_ = [env[n] for n in node.inputs]
        except KeyError as exc:
            missing = exc.args[0]
            problem = ("is used before its definition (a cycle, or nodes out of topological "
                       "order)" if any(n.name == missing for n in graph.nodes[i:])
                       else "is not defined (a dangling name)")
            raise InvalidModelError(f"{where}: input %{missing} {problem}", node=node.name,
                                    origin=node.origin) from None
        rec = REGISTRY[node.op]
        try:
            env[node.name] = run_carried(
                node, lambda xs: rec.evaluate(node.spec, xs, resolve), args_)
            if rec.traits & Trait.FRESH_SIZE:
                bind_fresh(node, env[node.name], bound)
        except TdagError:
            raise
        except (RuntimeError, IndexError, ValueError) as exc:
            raise TdagError(f"{node.op.value} failed at run time: {exc}", node=node.name,
                            origin=node.origin) from None
        for name in last_use.get(i, ()):
            env.pop(name, None)
    return [env[name] for name in graph.outputs]


def bind_fresh(node, result: torch.Tensor, bound: dict) -> None:
    """Bind the fresh symbols ``node`` defines (``spec.fresh``) from its result's shape, so
    the specs of later nodes that mention them resolve."""
    for axis, dim in enumerate(node.type.shape):
        if not is_static(dim) and dim.is_Symbol and dim.name in node.spec.fresh:
            bound[dim.name] = int(result.shape[axis])


def _last_uses(graph: TDAG) -> dict[int, list[str]]:
    """Node index -> intermediate names that can be freed after it (keeps peak memory low)."""
    last: dict[str, int] = {}
    for i, node in enumerate(graph.nodes):
        for name in node.inputs:
            last[name] = i
    keep = set(graph.outputs)
    result: dict[int, list[str]] = {}
    for name, i in last.items():
        if name not in keep:
            result.setdefault(i, []).append(name)
    return result


def _run_block(prog: Program, block: Block, args: Sequence[torch.Tensor], store: dict,
               bindings: dict) -> list[torch.Tensor]:
    bound = bind(block.inputs, args, bindings, "program")
    env = dict(store)
    env.update((v.name, t) for v, t in zip(block.inputs, args))
    inputs = {v.name for v in block.inputs}
    for step in block.steps:
        outs = _run_step(prog, step, env, store, bound)
        if not isinstance(step, Call):  # a branch or loop body may have written the state
            env.update((k, store[k]) for k in prog.state if k in store and k not in inputs)
        for name, value in zip(step.outputs, outs):
            env[name] = value
            if name in prog.state:
                store[name] = value
    return [env[name] for name in block.outputs]


def _run_step(prog: Program, step, env: dict, store: dict, bound: dict) -> list[torch.Tensor]:
    args = [env[name] for name in step.inputs]
    if isinstance(step, Call):
        return run_tdag(prog.graphs[step.graph], args, bound, where=f"call {step.graph}")
    if isinstance(step, If):
        cond = env[step.cond]
        if cond.numel() != 1:
            raise ShapeError(f"if: condition %{step.cond} must be a single value")
        branch = step.then_branch if bool(cond) else step.else_branch
        return _run_block(prog, branch, args, store, bound)
    if isinstance(step, Loop):
        return _run_loop(prog, step, env, args, store, bound)
    raise InvalidModelError(f"unknown controller {type(step).__name__}")


def _run_loop(prog: Program, loop: Loop, env: dict, carried: list, store: dict,
              bound: dict) -> list[torch.Tensor]:
    count = evaluate(loop.count, bound) if loop.count is not None else None
    keep_going = bool(env[loop.cond]) if loop.cond is not None else True
    scanned: list[list[torch.Tensor]] = [[] for _ in range(loop.scanned)]
    i = 0
    while keep_going and (count is None or i < count):
        outs = _run_block(prog, loop.body, [torch.tensor(i), *carried], store, bound)
        if loop.cond is not None:
            keep_going, outs = bool(outs[0]), outs[1:]
        carried = list(outs[:len(carried)])
        for acc, value in zip(scanned, outs[len(carried):]):
            acc.append(value)
        i += 1
    stacked = [torch.stack(acc) if acc else _empty_scan(prog, loop, j, bound)
               for j, acc in enumerate(scanned)]
    return carried + stacked


def _empty_scan(prog: Program, loop: Loop, j: int, bound: dict) -> torch.Tensor:
    """A scanned output of a loop that ran no trip: empty, of the type the body declares
    (a generation that stops at once, a sequence of length 0)."""
    k = (1 if loop.cond else 0) + len(loop.inputs) + j
    t = block_types(prog, loop.body)[k]
    try:
        shape = [evaluate(d, bound) for d in t.shape]
    except ShapeError:
        raise TdagError(f"loop ran zero iterations: scanned output %{loop.body.outputs[k]} "
                        f"is {t}, a shape that only a trip would decide") from None
    return torch.empty((0, *shape), dtype=t.dtype.torch)


def output_types(prog: Program) -> tuple[TensorType, ...]:
    return block_types(prog, prog.main)
