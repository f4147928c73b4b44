"""Names and provenance from torch: module paths, source lines, names of dynamic dims."""
from __future__ import annotations

import inspect
import os
import re

import torch
from torch.export import ExportedProgram

from tdag.canonicalize.torch.symbols import BATCH
from tdag.ir.types import Origin

_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


# -- provenance -----------------------------------------------------------------------------------

def origin_of(node, cache: dict) -> Origin:
    """``aten.conv2d @ encoder.layer.3.conv (model.py:12)`` for an fx node."""
    op = op_name(node.target)
    scope = module_path(node.meta.get("nn_module_stack"))
    trace = node.meta.get("stack_trace")
    if trace not in cache:
        cache[trace] = source_line(trace)
    return Origin(op=op, scope=scope, location=cache[trace])


def op_name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target.overloadpacket.__name__}"
    return getattr(target, "__name__", str(target))


def module_path(stack) -> str:
    """The innermost module's path in the model (``layers.0.attn``), from nn_module_stack."""
    if not stack:
        return ""
    for path, _ in reversed(list(stack.values())):
        if isinstance(path, str) and not path.startswith("_"):
            return normalise_path(path)
    return ""


def normalise_path(path: str) -> str:
    """``L['self'].layers[0]._modules['attn']`` (strict export) -> ``layers.0.attn``."""
    path = re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"getattr\(([^,]+), '([^']+)'\)", r"\1.\2", path)
    return path.strip(".")


def source_line(trace: str | None) -> str:
    """``model.py:12``: the innermost frame of the user's code (not torch's own modules)."""
    if not trace:
        return ""
    frames = _FRAME.findall(trace)
    if not frames:
        return ""
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    file, line = (user or frames)[-1]
    return f"{os.path.basename(file)}:{line}"


# -- names of dynamic dims ------------------------------------------------------------------------

def dim_names(ep: ExportedProgram, source, args, kwargs, dynamic_batch: bool,
              dynamic_shapes) -> dict:
    """(user tensor input number, axis) -> the name the caller gave that dim."""
    if dynamic_shapes is None:
        if not dynamic_batch:
            return {}
        count = sum(1 for s in ep.graph_signature.input_specs if s.kind.name == "USER_INPUT")
        return {(i, 0): BATCH for i in range(count)}
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(kwargs or {})
    if isinstance(dynamic_shapes, dict) and isinstance(source, torch.nn.Module):
        bound = inspect.signature(source.forward).bind(*args, **kwargs).arguments
        pairs = [(value, dynamic_shapes.get(name)) for name, value in bound.items()]
    else:
        values = list(args) + list(kwargs.values())
        pairs = list(zip(values, list(dynamic_shapes) + [None] * len(values)))
    names = {}
    specs = [spec for value, shapes in pairs for spec in _tensor_specs(value, shapes)]
    for i, spec in enumerate(specs):
        items = spec.items() if isinstance(spec, dict) else enumerate(spec or ())
        for axis, dim in items:
            name = getattr(dim, "__name__", None)
            if isinstance(name, str):
                names[(i, axis)] = name
    return names


def _tensor_specs(value, shapes):
    """The per-tensor dynamic-shape specs of ``value``, in pytree flattening order."""
    if isinstance(value, torch.Tensor):
        yield shapes
    elif isinstance(value, (tuple, list)):
        shapes = shapes if isinstance(shapes, (tuple, list)) else [None] * len(value)
        for v, s in zip(value, shapes):
            yield from _tensor_specs(v, s)
    elif isinstance(value, dict):
        shapes = shapes if isinstance(shapes, dict) else {}
        for k, v in value.items():
            yield from _tensor_specs(v, shapes.get(k))
