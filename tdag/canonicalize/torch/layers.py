"""The checks stacked capture (``stacked.py``) makes before it trusts a one-layer probe: every
layer of the full model is the probe's layer again, the stacked program's weights and
state are the full model's, as ``from_torch`` names them, and the probe stacked to two
layers is the two-layer probe's program (``check_two_layers``).

Stacking repeats the probe's layer; a layer that differs from it (another class, another
weight shape, a sliding window only some layers have) would give a program that is not the
full model's. So each is refused with the layer and the attribute named.
"""
from __future__ import annotations

import re

import torch

from tdag.errors import ConversionError, InvalidModelError
from tdag.ir.graph import TDAG
from tdag.ir.program import Program
from tdag.ir.types import DType, TensorKind, TensorType

# attributes a layer may hold that say which layer it is, not what it computes
_INDEX_KEYS = frozenset({"layer_idx"})
# a model config's fields that say nothing about what a layer computes
_CONFIG_NOISE = frozenset({"_name_or_path", "_commit_hash", "_post_init_done"})


def probe_layer(probe: torch.nn.Module, layers: str, count: int) -> torch.nn.Module:
    """The first layer of ``probe``, the model ``probe(count)`` built: its ModuleList
    ``layers`` holds ``count`` layers."""
    if not isinstance(probe, torch.nn.Module):
        raise InvalidModelError(f"probe({count}) gave a {type(probe).__name__}, not an "
                                "nn.Module")
    stack = _layer_list(probe, layers, f"probe({count})")
    if len(stack) != count:
        raise InvalidModelError(f"probe({count}) has {len(stack)} layers in {layers}: probe(k) "
                                "must build the model with k layers (num_hidden_layers=k)")
    return stack[0]


def layer_count(full: torch.nn.Module, layer: torch.nn.Module, layers: str) -> int:
    """The number of layers of ``full``'s ModuleList ``layers``, each checked equal to the
    probe's ``layer`` but for its index (``layer_idx``)."""
    stack = _layer_list(full, layers, "full")
    for k, one in enumerate(stack):
        _same_module(layer, one, f"{layers}.{k}", len(stack))
    return len(stack)


def _layer_list(model: torch.nn.Module, path: str, which: str) -> list:
    try:
        stack = model.get_submodule(path)
    except AttributeError as exc:
        raise InvalidModelError(f"the {which} model has no module {path!r}: name the "
                                "ModuleList of repeated layers (layers=...)") from exc
    if not isinstance(stack, (torch.nn.ModuleList, torch.nn.Sequential)):
        raise InvalidModelError(f"{path} of the {which} model is a {type(stack).__name__}, "
                                "not a ModuleList of repeated layers")
    return list(stack)


def _same_module(probe: torch.nn.Module, layer: torch.nn.Module, path: str,
                 count: int) -> None:
    mine, theirs = dict(probe.named_modules()), dict(layer.named_modules())
    if mine.keys() != theirs.keys():
        odd = sorted(mine.keys() ^ theirs.keys())[0]
        raise InvalidModelError(f"{_join(path, odd)}: a submodule only one of the full model's "
                                "layer and the probe's layer has")
    for name, module in mine.items():
        other, where = theirs[name], _join(path, name)
        if type(module) is not type(other):
            raise InvalidModelError(f"{where}: a {type(other).__name__} in the full model, a "
                                    f"{type(module).__name__} in the probe's layer")
        _same_tensors(module, other, where)
        attributes = vars(other)
        for key, value in vars(module).items():
            if not key.startswith("_") and key not in _INDEX_KEYS:
                _same_value(value, attributes.get(key, _MISSING), f"{where}.{key}", count)


def _same_tensors(module: torch.nn.Module, other: torch.nn.Module, where: str) -> None:
    """The module's own parameters and buffers: the same names, shapes, dtypes, kinds."""
    def own(m):
        return {name: (type(t).__name__, tuple(t.shape), t.dtype, t.requires_grad)
                for name, t in [*m.named_parameters(recurse=False),
                                *m.named_buffers(recurse=False)]}
    mine, theirs = own(module), own(other)
    for name in sorted(mine.keys() | theirs.keys()):
        if mine.get(name) != theirs.get(name):
            raise InvalidModelError(f"{_join(where, name)}: {_tensor_text(theirs.get(name))} "
                                    f"in the full model, {_tensor_text(mine.get(name))} in the "
                                    "probe's layer")


def _tensor_text(entry) -> str:
    if entry is None:
        return "absent"
    kind, shape, dtype, trained = entry
    return f"{kind} {list(shape)} {dtype}" + ("" if trained else " (frozen)")


class _Missing:
    def __repr__(self) -> str:
        return "absent"


_MISSING = _Missing()


def _same_value(mine, theirs, where: str, count: int) -> None:
    """``theirs`` (the full model's layer) equals ``mine`` (the probe's), recursively. A
    config's layer count (1 against ``count``) and its per-layer lists (one entry against
    ``count`` equal ones, e.g. ``layer_types``) are the one-layer probe's by design."""
    if hasattr(mine, "to_dict") and hasattr(theirs, "to_dict"):  # a model config
        _same_config(vars(mine), vars(theirs), where, count)
    elif isinstance(mine, dict) and isinstance(theirs, dict):
        _same_config(mine, theirs, where, count)
    elif isinstance(mine, (list, tuple)) and isinstance(theirs, (list, tuple)) and \
            len(mine) == len(theirs):
        for i, (a, b) in enumerate(zip(mine, theirs)):
            _same_value(a, b, f"{where}[{i}]", count)
    elif isinstance(mine, torch.Tensor) or isinstance(theirs, torch.Tensor):
        if not (isinstance(mine, torch.Tensor) and isinstance(theirs, torch.Tensor) and
                mine.shape == theirs.shape and mine.dtype == theirs.dtype):
            _differ(mine, theirs, where)
    elif not _equal(mine, theirs):
        _differ(mine, theirs, where)


def _same_config(mine: dict, theirs: dict, where: str, count: int) -> None:
    for key in sorted(mine.keys() | theirs.keys(), key=str):
        if key in _CONFIG_NOISE or key in _INDEX_KEYS:
            continue
        a, b = mine.get(key, _MISSING), theirs.get(key, _MISSING)
        here = f"{where}.{key}"
        if _counts_layers(key, a, b, count):
            continue
        if isinstance(a, list) and isinstance(b, list) and len(a) == 1 and len(b) == count:
            for i, entry in enumerate(b):  # a per-layer list: each layer's entry is the probe's
                _same_value(a[0], entry, f"{here}[{i}]", count)
            continue
        _same_value(a, b, here, count)


def _counts_layers(key, mine, theirs, count: int) -> bool:
    return isinstance(key, str) and "layer" in key and mine == 1 and theirs == count and \
        not isinstance(mine, bool)


def _equal(a, b) -> bool:
    try:
        return bool(a == b)
    except Exception:  # values with no boolean equality: compared by their text
        return repr(a) == repr(b)


def _differ(mine, theirs, where: str) -> None:
    raise InvalidModelError(f"{where}: {theirs!r} in the full model, {mine!r} in the probe's "
                            "layer; stacking repeats one layer, so every layer of the full "
                            "model must equal it but for its index")


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if name else path


# -- after stacking ------------------------------------------------------------------------------

def full_tensors(full: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer of ``full`` by each of its names (tied ones twice)."""
    return {**dict(full.named_parameters(remove_duplicate=False)),
            **dict(full.named_buffers(remove_duplicate=False))}


def transient_buffers(full: torch.nn.Module) -> frozenset[str]:
    """The full names of ``full``'s non-persistent buffers (a rotary ``inv_freq``): not in
    its state dict, so from_torch reads them as consts."""
    return frozenset(f"{prefix}.{name}" if prefix else name
                     for prefix, module in full.named_modules(remove_duplicate=False)
                     for name in module._non_persistent_buffers_set)


def weight_of(name: str, type: TensorType, tensors: dict, transient: frozenset = frozenset()):
    """(kind, value) of the full model's tensor ``name`` as from_torch reads it, after
    checking its shape and dtype against ``type`` (the probe's, renamed): a frozen parameter
    is a buffer, a non-persistent buffer (one of ``transient``) a const; a meta tensor has
    no value."""
    tensor = tensors.get(name)
    if tensor is None:
        raise InvalidModelError(f"{name}: the stacked program reads it but the full model has "
                                "no such parameter or buffer")
    own = TensorType(tuple(tensor.shape), DType.of(tensor.dtype))
    if own != type:
        raise InvalidModelError(f"{name}: {own} in the full model, {type} in the probe's "
                                "program")
    trained = isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad
    kind = TensorKind.const if name in transient else \
        TensorKind.parameter if trained else TensorKind.buffer
    return kind, tensor.detach()


def check_state_names(prog: Program, full: torch.nn.Module) -> None:
    """The stacked program holds exactly the full model's parameters and persistent buffers,
    as torch.export lifts them: each tensor under one of its names (a tied one under either).
    Non-persistent buffers are consts, as from_torch reads them."""
    ours = {k for g in prog.graphs.values() for k, w in g.weights.items()
            if w.kind is not TensorKind.const} | set(prog.state)
    consts = transient_buffers(full) - ours   # a non-persistent buffer written is state
    names: dict[int, list[str]] = {}
    for name, tensor in full_tensors(full).items():
        if name not in consts:
            names.setdefault(id(tensor), []).append(name)
    extra = sorted(ours - {n for group in names.values() for n in group})
    missing = sorted(group[0] for group in names.values() if not ours.intersection(group))
    if extra or missing:
        raise InvalidModelError(f"the stacked program's weights are not the full model's: "
                                f"{len(extra)} it has and the model lacks {extra[:3]}, "
                                f"{len(missing)} the model has and it lacks {missing[:3]}")


def check_two_layers(stacked: Program, exported: Program) -> None:
    """``stacked`` (the one-layer probe's program stacked to two layers) is ``exported`` (the
    two-layer probe's own), to its constants' values (``==`` compares their types only: a
    scalar such as ``len(self.layers)`` differs in value alone). Else a ConversionError
    naming the first node where they part."""
    if stacked == exported and _constant_apart(stacked.graph, exported.graph) is None:
        return
    raise ConversionError(f"the one-layer probe stacked to two layers differs from the two-layer "
                          f"probe's program at {_first_difference(stacked, exported)}: the "
                          "model runs code per layer that a one-layer probe does not show "
                          "(code the loop runs around each layer, a value computed once for "
                          "every layer, a constant that counts the layers); capture it with "
                          "tdag.from_torch")


def _first_difference(stacked: Program, exported: Program) -> str:
    ours, theirs = stacked.graph.nodes, exported.graph.nodes
    at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
              min(len(ours), len(theirs)))
    if at < max(len(ours), len(theirs)):
        return f"node {at}: " + "; ".join(
            f"the {which} has {_node_text(nodes[at]) if at < len(nodes) else 'no node'}"
            for which, nodes in (("two-layer export", theirs), ("stack", ours)))
    a, b = stacked.graph, exported.graph
    parts = {"inputs": a.inputs == b.inputs, "weights": a.weights == b.weights,
             "outputs": a.outputs == b.outputs, "state": stacked.state == exported.state}
    apart = next((f"its {part}" for part, same in parts.items() if not same), None)
    return apart or _constant_apart(a, b) or "its calls"


def _node_text(node) -> str:
    return f"%{node.name} = {node.op.name} ({node.origin.op} @ " \
           f"{node.origin.scope or 'the top level'})"


def _constant_apart(ours: TDAG, theirs: TDAG) -> str | None:
    """The first constant of ``ours`` whose value ``theirs`` holds otherwise, as text."""
    for name, weight in ours.weights.items():
        other = theirs.weights.get(name)
        if weight.kind is TensorKind.const and other is not None and \
                not _same_tensor(weight.value, other.value):
            reader = next((n for n in ours.nodes if name in n.inputs), None)
            read = "" if reader is None else f", read by {_node_text(reader)}"
            return f"its constant %{name}{read}: {_value_text(weight.value)} in the stack, " \
                   f"{_value_text(other.value)} in the two-layer export"
    return None


def _same_tensor(a, b) -> bool:
    """Equal values; a meta tensor or none (a shape-only program) by shape and dtype."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return "meta" in (a.device.type, b.device.type) or bool(torch.equal(a, b))


def _value_text(value) -> str:
    if value is None or value.device.type == "meta" or value.numel() > 4:
        return "a tensor" if value is not None else "no value"
    return str(value.tolist())


_ZERO = re.compile(r"(?<![0-9])0(?![0-9])")


def per_layer_names(name: str, layers: str, count: int, tensors: dict) -> list[str]:
    """The names of the ``count`` layers' own copies of the probe's buffer ``name``: under
    ``layers.0`` the index renamed, else the one ``0`` in its name (``key_cache_0``) that
    gives a buffer of the full model for every layer."""
    prefix = f"{layers}.0."
    if name.startswith(prefix):
        return [f"{layers}.{k}.{name[len(prefix):]}" for k in range(count)]
    fits = []
    for match in _ZERO.finditer(name):
        names = [name[:match.start()] + str(k) + name[match.end():] for k in range(count)]
        if all(n in tensors for n in names):
            fits.append(names)
    if len(fits) != 1:
        raise InvalidModelError(f"{name}: the probe's layer reads or writes this buffer, and "
                                f"{'no' if not fits else 'more than one'} index in its name "
                                "gives one buffer of the full model per layer")
    return fits[0]
