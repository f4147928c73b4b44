"""In-place ATen ops in torch's training IR (``masked_fill_`` on a fresh mask, ``add_``, a
static KV cache's ``index_copy_`` into its buffer).

tdag values are immutable, so ``y = x.op_(...)`` is converted as ``y = op(x, ...)`` and every
tensor sharing x's memory is pointed at ``y`` for the readers after it. That is exact when
each of those tensors is all of x: x itself, the in-place results written into it, and
aliases that change nothing (``x.to(x.dtype)``, ``x.view(x.shape)``, ``x.detach()``). A
partial view (``x[:, 0]``, a transpose) would see the write at other positions; those
graphs are left to torch's functionalization (``run_decompositions``), which rewrites them
without mutation. The tensor written is either fresh (made by an op of the graph) or a
buffer the caller allows to be written (``writable``): the converter carries that buffer as
state, read as an input and returned written, as it does for the buffer mutations that
functionalization reports. An input or a parameter written in place is left to
functionalization too, which reports it.
"""
from __future__ import annotations

import operator
from collections.abc import Collection, Iterator

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from tdag.canonicalize.torch.aten.registry import is_inplace

# views that are all of their input when their result has its shape and dtype (``to`` also
# when it converts nothing: it aliases then, and copies otherwise)
_WHOLE_WHEN_SAME_TYPE = frozenset({"alias", "detach", "view", "_unsafe_view", "reshape",
                                   "expand", "slice", "lift_fresh", "to"})


def is_view(target) -> bool:
    """An op whose result aliases its input (its schema's return has a non-write alias)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return any(r.alias_info is not None and not r.alias_info.is_write
               for r in target._schema.returns)


def buffer_placeholders(ep: ExportedProgram) -> dict[str, str]:
    """The placeholder name of each buffer, to its state-dict name."""
    return {s.arg.name: s.target for s in ep.graph_signature.input_specs
            if s.kind is InputKind.BUFFER}


def inplace_safe(node, writable: Collection[str] = ()) -> bool:
    """Whether node, an in-place op, may be converted as its functional op plus a rebind of
    every alias of the tensor it writes; ``writable`` names the placeholders it may write."""
    if not _writes(node):
        return True
    root = alias_root(node.args[0]) if isinstance(node.args[0], torch.fx.Node) else None
    if root is None or not (root.op == "call_function" or
                            (root.op == "placeholder" and root.name in writable)):
        return False
    return all(_whole(member, root) for member in aliases(root))


def written_buffers(ep: ExportedProgram, writable: Collection[str]) -> dict:
    """The placeholder of each buffer that an in-place op safely writes, to its name."""
    names = buffer_placeholders(ep)
    written = {}
    for node in ep.graph.nodes:
        if _writes(node) and inplace_safe(node, writable):
            root = alias_root(node.args[0])
            if root.op == "placeholder":
                written[root] = names[root.name]
    return written


def alias_root(node):
    """The tensor whose memory ``node`` shares: up through views and in-place results."""
    while (parent := _alias_parent(node)) is not None:
        node = parent
    return node


def aliases(root) -> Iterator:
    """Every node sharing ``root``'s memory, root first (views of views included)."""
    seen, todo = {root}, [root]
    while todo:
        node = todo.pop()
        yield node
        for user in node.users:
            if user not in seen and _alias_parent(user) is node:
                seen.add(user)
                todo.append(user)


def _writes(node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload) \
        and is_inplace(node.target) and bool(node.args)


def _alias_parent(node):
    """The node whose memory ``node``'s result shares, or None for a fresh tensor."""
    if node.op != "call_function" or not node.args or \
            not isinstance(node.args[0], torch.fx.Node):
        return None
    if _writes(node):
        return node.args[0]
    if node.target is operator.getitem:  # one result of split, unbind...: a view of x
        return node.args[0] if is_view(node.args[0].target) else None
    if not is_view(node.target):
        return None
    if node.target.overloadpacket.__name__ == "to" and \
            (_argument(node, "copy") or not _same_type(node, node.args[0])):
        return None  # a conversion: a new tensor
    return node.args[0]


def _argument(node, name: str):
    """An argument of node's op by its schema name, given by position or keyword."""
    for i, argument in enumerate(node.target._schema.arguments):
        if argument.name == name:
            if i < len(node.args):
                return node.args[i]
            return node.kwargs.get(name, argument.default_value)
    return None


def _whole(node, root) -> bool:
    """Whether ``node`` (an alias of root) is all of root, element for element."""
    if node is root or _writes(node):
        return True
    return isinstance(node.target, torch._ops.OpOverload) and \
        node.target.overloadpacket.__name__ in _WHOLE_WHEN_SAME_TYPE and \
        _same_type(node, root)


def _same_type(a, b) -> bool:
    va, vb = a.meta.get("val"), b.meta.get("val")
    if not isinstance(va, torch.Tensor) or not isinstance(vb, torch.Tensor):
        return False
    return va.dtype == vb.dtype and va.device == vb.device and \
        len(va.shape) == len(vb.shape) and \
        all(_expr(x) == _expr(y) for x, y in zip(va.shape, vb.shape))


def _expr(size):
    """A size as plain data: comparing SymInts themselves would add guards to torch's shape
    environment."""
    return size.node.expr if isinstance(size, torch.SymInt) else size
