"""``to_torch(prog)``: a ``torch.nn.Module`` running the Program with torch's own kernels.

The module's ``forward`` is generated Python source (``module.code``): one method per TDAG
and the controllers as Python control flow (If -> ``if``, Loop -> ``for``/``while``).
Parameters and buffers keep the Program's dotted names, nested as submodules, so
``state_dict()`` has the source model's keys; consts are non-persistent buffers. The
weights only 2-d convolutions read are stored channels-last (``layout``: torch's CPU
convolutions run so); ``load_state_dict`` copies into them and keeps that layout.
"""
from __future__ import annotations

import itertools
import linecache

import torch
import torch.nn.functional as F
from torch import nn

from tdag.errors import UnsupportedOpError
from tdag.ir.graph import TDAG, Weight
from tdag.ir.program import Block, Call, If, Loop, Program, state_writes
from tdag.ir.symbols import is_static, shape_is_static
from tdag.ir.types import TensorKind
from tdag.ir.verify import block_types
from tdag.lower.pipeline import lower as lower_program
from tdag.refine.consumed import consumed_inputs
from tdag.reify.torch import runtime
from tdag.reify.torch.codegen import Scope, dim_expr, graph_source
from tdag.reify.torch.layout import channels_last_weights

_COUNTER = itertools.count()


class TdagModule(nn.Module):
    """Base class of reified modules; ``code`` is the generated source. ``_tdag_packs``
    holds oneDNN's packs of the weights (``tdag.lower.kernels.onednn``): a cache, never
    saved, copied or moved with the module."""

    code: str = ""
    # the program's parameters and buffers no code reads (an eval-mode batch norm's
    # num_batches_tracked): the module holds no tensor for them, and load_state_dict takes
    # the source model's state dict, strict, leaving those keys out
    _tdag_unread: frozenset = frozenset()

    def extra_repr(self) -> str:
        return f"{len(self.code.splitlines())} lines of generated code (see .code)"

    def tdag_unpack(self) -> None:
        """Drop the packed weights; the next call packs them anew. Needed only after a write
        that bypasses a weight's version counter (``param.data.copy_(...)``)."""
        self.__dict__["_tdag_packs"] = {}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the children's dicts are cut from this one after this call: they never see them
        for name in self._tdag_unread:
            state_dict.pop(prefix + name, None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn, recurse=True):  # .to(), .float(), .cuda(): the packs are stale
        self.tdag_unpack()
        return super()._apply(fn, recurse)

    def __getstate__(self):  # pickle, deepcopy: a pack is an opaque tensor, never copied
        state = super().__getstate__()
        return {**state, "_tdag_packs": {}}


def to_torch(prog: Program | TDAG, lower: bool = True, prepack: bool = True) -> nn.Module:
    """A ``torch.nn.Module`` computing ``prog``; one output returns a tensor, several a tuple.

    ``prepack``: the float32 products and 2-d convolutions oneDNN runs on the CPU read their
    weights packed into oneDNN's layout, packed on the first call that can use them and kept
    beside the weights (a second copy of those weights; ``tdag.lower.kernels.onednn``).

    >>> import torch, tdag, tdag.reify
    >>> from tdag import ops
    >>> prog = tdag.trace(lambda x: ops.softmax(x, -1), tdag.TensorSpec(("b", 4)))
    >>> m = tdag.reify.to_torch(prog)
    >>> x = torch.randn(2, 4)
    >>> bool(torch.allclose(m(x), torch.softmax(x, -1)))
    True
    """
    if isinstance(prog, TDAG):
        prog = Program.from_tdag(prog)
    if lower:
        prog = lowered(prog)
    with torch.inference_mode(False):  # built under inference_mode, weights stay trainable
        return _Builder(prog, prepack).build()


def lowered(prog: Program) -> Program:
    """The program ``to_torch``'s module runs: lowered, folding consts only, so that the
    module's parameters and buffers stay the source's to load by name (a 1x1 conv of a
    concatenation, split, reads slices of its weight as views). ``tdag.memory`` and
    ``tdag.remat`` replay this one: another lowering (the ONNX file's weight folds) holds
    other tensors."""
    return lower_program(prog, final=("split_concat_1x1", "fold_consts"))


class _Builder:
    def __init__(self, prog: Program, prepack: bool = True):
        self.prog, self.prepack = prog, prepack
        self.root = nn.Module()
        self.consts: dict[tuple, str] = {}
        self.registered: dict[str, Weight] = {}
        self.paths: dict[str, str] = {}  # weight name -> its dotted path in the module
        self.used_paths: set[str] = set()
        self.channels_last = channels_last_weights(prog)

    def build(self) -> nn.Module:
        sources, free = [], {}
        owned = consumed_inputs(self.prog)  # the state a call may write over (a KV cache)
        for name, graph in self.prog.graphs.items():
            src, free[name] = graph_source(_ident(name), graph,
                                           lambda w, g=name, gr=graph: self.weight_expr(g, gr, w),
                                           owned.get(name, frozenset()), self.prepack)
            sources.append(src)
        for name, weight in self.prog.state.items():
            self.register(name, weight, state=True)
        sources.append(_Forward(self.prog, free, self.state_expr).source())
        source = "\n\n\n".join(sources) + "\n"
        methods = _compile(source)
        cls = type("TdagModule", (TdagModule,), methods)
        module = cls()
        module.code = source
        for name, child in self.root.named_children():
            module.add_module(name, child)
        for name, p in self.root.named_parameters(recurse=False):
            module.register_parameter(name, p)
        for name, b in self.root.named_buffers(recurse=False):
            module.register_buffer(name, b, persistent=name not in self._nonpersistent())
        module.register_buffer("_tdag_device", torch.empty(0), persistent=False)
        module.tdag_unpack()
        module._tdag_inputs = self.prog.main.inputs  # what _rt.bad_input explains against
        module._tdag_unread = self._unread()
        return module

    def _unread(self) -> frozenset:
        """The parameters and buffers of the program that no code reads. (Lowering drops
        the weights it folds into consts, so these never affect a result.)"""
        return frozenset(name for graph in self.prog.graphs.values()
                         for name, weight in graph.weights.items()
                         if weight.kind is not TensorKind.const and name not in self.registered)

    def _nonpersistent(self) -> set[str]:
        return set(self.root._non_persistent_buffers_set)

    # -- weights ------------------------------------------------------------------------------

    def weight_expr(self, gname: str, graph: TDAG, name: str) -> str:
        weight = graph.weights[name]
        if weight.kind is TensorKind.const:
            key = (gname, name)
            if key not in self.consts:
                attr = f"_tdag_c{len(self.consts)}"
                self.root.register_buffer(attr, self.value(name, weight), persistent=False)
                self.consts[key] = attr
            return f"self._buffers[{self.consts[key]!r}]"  # ours: no attribute lookup
        self.register(name, weight)
        return _attr_path(self.paths[name])

    def state_expr(self, name: str) -> str:
        return _attr_path(self.paths[name])

    def register(self, name: str, weight: Weight, state: bool = False) -> None:
        if name in self.registered:
            return
        self.registered[name] = weight
        self.paths[name] = _free_path(name, self.used_paths)
        self.used_paths.add(self.paths[name])
        owner, leaf = _owner(self.root, self.paths[name])
        value = self.value(name, weight)
        if weight.kind is TensorKind.parameter and not state:
            trainable = value.is_floating_point()
            owner.register_parameter(leaf, nn.Parameter(value, requires_grad=trainable))
        else:
            owner.register_buffer(leaf, value)


    def value(self, name: str, weight: Weight) -> torch.Tensor:
        """The tensor to register: a copy of the weight's value, channels-last for a conv
        weight (``layout``), else empty on the meta device where the value is unknown."""
        if weight.value is None:
            return _meta(name, weight)
        if name in self.channels_last:
            return weight.value.detach().clone(memory_format=torch.channels_last)
        return weight.value.detach().clone()


def _meta(name: str, weight: Weight) -> torch.Tensor:
    if not shape_is_static(weight.type.shape):
        raise UnsupportedOpError(f"weight %{name} has a symbolic shape and no value")
    return torch.empty(weight.type.shape, dtype=weight.type.dtype.torch, device="meta")


def _owner(root: nn.Module, dotted: str) -> tuple[nn.Module, str]:
    """The submodule that holds ``dotted`` (created on the way) and the leaf name."""
    *path, leaf = dotted.split(".")
    owner = root
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            child = nn.Module()
            owner.add_module(part, child)
        owner = child
    return owner, leaf


def _free_path(dotted: str, used: set[str]) -> str:
    """``dotted`` with a ``_`` after each part that names an attribute of the module (an ONNX
    initializer called ``half``, ``float`` or ``code``: ``nn.Module`` refuses to register
    those, and ``module.half`` would be the method), and after the leaf while another
    weight's path is the same."""
    path = ".".join(part + "_" * (part in _TAKEN) for part in dotted.split("."))
    while path in used:
        path += "_"
    return path


def _attr_path(dotted: str) -> str:
    """``self.a.b.w`` as the generated code reads it: each submodule straight from its
    parent's ``_modules`` (``nn.Module.__getattr__`` costs about a microsecond a step, per
    weight and per call), the leaf as an attribute (so parametrized or pruned weights, which
    become properties or plain attributes, still read right)."""
    *path, leaf = dotted.split(".")
    expr = "self" + "".join(f"._modules[{part!r}]" for part in path)
    if leaf.isidentifier() and not leaf.startswith("_") and leaf not in _MODULE_ATTRS:
        return f"{expr}.{leaf}"
    return f"getattr({expr}, {leaf!r})"


_MODULE_ATTRS = set(dir(nn.Module))
_TAKEN = frozenset(dir(TdagModule)) | {"code"}  # nn.Module's and the reified module's own


def _ident(name: str) -> str:
    return Scope()(name)


def _compile(source: str) -> dict:
    filename = f"<tdag-reified-{next(_COUNTER)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch, "F": F, "_rt": runtime}
    exec(compile(source, filename, "exec"), namespace)
    return {k: v for k, v in namespace.items() if k == "forward" or k.startswith("_g_")}


class _Forward:
    """The ``forward`` method: the program's blocks of controllers as Python code."""

    def __init__(self, prog: Program, free: dict, state_expr):
        self.prog, self.free, self.state_expr = prog, free, state_expr
        self.scope = Scope()
        self.lines: list = []  # str, or (symbol, line) for a binding kept only if used
        self.used: set[str] = set()

    def source(self) -> str:
        params = [self.scope(v.name) for v in self.prog.main.inputs]
        env = {name: self.state_expr(name) for name in self.prog.state}
        env.update((v.name, p) for v, p in zip(self.prog.main.inputs, params))
        self.guard(self.prog.main.inputs, params)
        outs = self.block_body(self.prog.main, env, 1)
        self.emit(1, f"return {outs[0]}" if len(outs) == 1 else
                  f"return ({', '.join(outs)},)" if outs else "return ()")
        lines = [line if isinstance(line, str) else line[1] for line in self.lines
                 if isinstance(line, str) or line[0] in self.used]
        return "\n".join([f"def forward(self, {', '.join(params)}):"] + lines)

    def emit(self, depth: int, line: str) -> None:
        self.lines.append("    " * depth + line)

    def guard(self, values, params) -> None:
        """Check each input against its type before anything runs (rank, dtype, static
        sizes, one value per symbol), binding the symbols on the way: a module never answers
        for an input its Program does not describe. One comparison per axis, inline; on a
        mismatch ``_rt.bad_input`` says which input and why."""
        bound: set[str] = set()
        later = []  # composite sizes (2*b), checked once every symbol is bound
        for value, p in zip(values, params):
            t = value.type
            checks = [f"{p}.dim() != {t.rank}", f"{p}.dtype != {t.dtype.torch}"]
            fresh = []
            for i, d in enumerate(t.shape):
                if is_static(d):
                    checks.append(f"{p}.shape[{i}] != {d}")
                elif d.is_Symbol and d.name not in bound:
                    bound.add(d.name)
                    fresh.append(f"s_{d.name} = {p}.shape[{i}]")
                else:
                    later.append((p, i, d))
            self.emit(1, f"if {' or '.join(checks)}:")
            self.emit(2, f"_rt.bad_input(self, {', '.join(params)})")
            for line in fresh:
                self.emit(1, line)
        checks = [f"{p}.shape[{i}] != {dim_expr(d)}" for p, i, d in later
                  if {s.name for s in d.free_symbols} <= bound]
        if checks:
            self.emit(1, f"if {' or '.join(checks)}:")
            self.emit(2, f"_rt.bad_input(self, {', '.join(params)})")

    def bind(self, values, exprs, depth: int) -> None:
        seen = set()
        for value, expr in zip(values, exprs):
            for i, d in enumerate(value.type.shape):
                if not is_static(d) and d.is_Symbol and d.name not in seen:
                    seen.add(d.name)
                    self.lines.append((d.name, "    " * depth + f"s_{d.name} = {expr}.shape[{i}]"))

    def block_body(self, block: Block, env: dict, depth: int) -> list[str]:
        for step in block.steps:
            args = [env[n] for n in step.inputs]
            if isinstance(step, Call):
                outs = self.call(step, args, depth)
            elif isinstance(step, If):
                self.read_state_fresh(step.then_branch, env)
                self.read_state_fresh(step.else_branch, env)
                outs = self.branch(step, env, args, depth)
            elif isinstance(step, Loop):
                self.read_state_fresh(step.body, env)
                outs = self.loop(step, env, args, depth)
            else:
                raise UnsupportedOpError(f"unknown controller {type(step).__name__}")
            for name, var in zip(step.outputs, outs):
                env[name] = var
                if name in self.prog.state:
                    self.emit(depth, f"_rt.set_state(self, {name!r}, {var})")
        return [env[n] for n in block.outputs]

    def read_state_fresh(self, block: Block, env: dict) -> None:
        """State that a loop body or a branch writes is read from its buffer, in the block
        and after it: the code of a body runs many times, and a local variable from before
        the loop would hand every trip the state as it was before the first."""
        for name in state_writes(block, self.prog.state):
            env[name] = self.state_expr(name)

    def call(self, step: Call, args, depth: int) -> list[str]:
        outs = [self.scope.fresh(o) for o in step.outputs]
        extra = [f"s_{s}" for s in self.free[step.graph]]
        self.used.update(self.free[step.graph])
        target = f"{', '.join(outs)}, = " if outs else ""
        self.emit(depth, f"{target}self._g_{_ident(step.graph)}"
                         f"({', '.join(list(args) + extra)})")
        return outs

    def enter(self, block: Block, args, env: dict, depth: int) -> dict:
        inner = dict(env)
        names = [self.scope.fresh(v.name) for v in block.inputs]
        for var, arg in zip(names, args):
            self.emit(depth, f"{var} = {arg}")
        inner.update((v.name, var) for v, var in zip(block.inputs, names))
        self.bind(block.inputs, names, depth)
        return inner

    def branch(self, step: If, env: dict, args, depth: int) -> list[str]:
        outs = [self.scope.fresh(o) for o in step.outputs]
        self.emit(depth, f"if bool({env[step.cond]}):")
        for branch in (step.then_branch, step.else_branch):
            if branch is step.else_branch:
                self.emit(depth, "else:")
            inner = self.enter(branch, args, env, depth + 1)
            results = self.block_body(branch, inner, depth + 1)
            self.emit(depth + 1, f"{', '.join(outs)}, = ({', '.join(results)},)")
        return outs

    def loop(self, step: Loop, env: dict, args, depth: int) -> list[str]:
        carried = [self.scope.fresh(f"carry{i}") for i in range(len(step.inputs))]
        scans = [self.scope.fresh(f"scan{i}") for i in range(step.scanned)]
        it = self.scope.fresh("it")
        for var, arg in zip(carried, args):
            self.emit(depth, f"{var} = {arg}")
        for var in scans:
            self.emit(depth, f"{var} = []")
        if step.cond is not None:
            keep = self.scope.fresh("keep")
            self.emit(depth, f"{keep} = bool({env[step.cond]})")
            self.emit(depth, f"{it} = 0")
            bound = f" and {it} < {dim_expr(step.count, self.used)}" if step.count is not None \
                else ""
            self.emit(depth, f"while {keep}{bound}:")
        else:
            self.emit(depth, f"for {it} in range({dim_expr(step.count, self.used)}):")
        index = f"torch.tensor({it}, device={self._device(carried)})"
        inner = self.enter(step.body, [index] + carried, env, depth + 1)
        results = self.block_body(step.body, inner, depth + 1)
        if step.cond is not None:
            self.emit(depth + 1, f"{keep} = bool({results[0]})")
            results = results[1:]
        if carried:
            self.emit(depth + 1, f"{', '.join(carried)}, = ({', '.join(results[:len(carried)])},)")
        for var, value in zip(scans, results[len(carried):]):
            self.emit(depth + 1, f"{var}.append({value})")
        if step.cond is not None:
            self.emit(depth + 1, f"{it} += 1")
        return carried + [self.stacked(step, j, var, carried) for j, var in enumerate(scans)]

    def stacked(self, step: Loop, j: int, var: str, carried) -> str:
        """A scanned output: the stack of its trips, or for a loop that ran none an empty
        tensor of the body's type (its shape computed only then: it may need a symbol that
        only a trip binds)."""
        t = block_types(self.prog, step.body)[(1 if step.cond else 0) + len(step.inputs) + j]
        shape = "".join(f"{dim_expr(d, self.used)}, " for d in t.shape)
        return f"_rt.stack({var}, lambda: ({shape}), {t.dtype.torch}, {self._device(carried)})"

    def _device(self, carried) -> str:
        return f"{carried[0]}.device" if carried else "self._tdag_device.device"
