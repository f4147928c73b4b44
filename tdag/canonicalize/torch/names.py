"""Names and provenance from torch: module paths, source lines, names of dynamic dims,
names of outputs."""
from __future__ import annotations

import inspect
import os
import re
from collections import OrderedDict, defaultdict

import torch
from torch.export import ExportedProgram

from tdag.canonicalize.torch.pt2.pytrees import field_names
from tdag.canonicalize.torch.symbols import BATCH
from tdag.ir.graph import TDAG, valid_name
from tdag.ir.names import FreshNames
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


# -- names of outputs -----------------------------------------------------------------------------

def leaf_fields(spec) -> list[str | None]:
    """The field path of each leaf of the treespec ``spec`` (``logits``, ``past.0``), read
    from the spec alone (no object is built); None for a leaf reached by positions only,
    as the outputs of a plain tuple.

    >>> import torch.utils._pytree as pytree
    >>> leaf_fields(pytree.tree_structure({"logits": 0, "hidden": (0, 0)}))
    ['logits', 'hidden.0', 'hidden.1']
    >>> leaf_fields(pytree.tree_structure((0, 0)))
    [None, None]
    """
    fields: list[str | None] = []
    stack = [(spec, ())]
    while stack:
        node, path = stack.pop()
        if node.is_leaf():
            named = any(isinstance(key, str) for key in path)
            fields.append(".".join(_sanitized(key) for key in path) if named else None)
            continue
        keys = list(_child_keys(node))
        stack.extend(reversed([(child, path + (key,))
                               for key, child in zip(keys, node.children())]))
    return fields


def _child_keys(node):
    """The key of each child of a pytree node: dict keys, a namedtuple's or a dataclass's
    field names, a ModelOutput's; positions otherwise."""
    count, context = node.num_children, node.context
    if node.type in (dict, OrderedDict):
        keys = list(context)
    elif node.type is defaultdict:
        keys = list(context[1])
    elif isinstance(getattr(context, "_fields", None), tuple):  # a namedtuple's class
        keys = list(context._fields)
    else:
        keys = field_names(context, count)
    if keys is None or len(keys) != count:
        return range(count)
    return [key if isinstance(key, (str, int)) else repr(key) for key in keys]


def _sanitized(key) -> str:
    return str(key) if isinstance(key, int) else re.sub(r"[^A-Za-z0-9_]", "_", key) or "_"


def name_outputs(graph: TDAG, fields) -> TDAG:
    """``graph`` with the node behind each output renamed to that output's field (None
    keeps a name); a name another value holds gets a suffix (``logits_1``). Inputs and
    weights returned as they are keep their names."""
    produced = {n.name for n in graph.nodes}
    names = FreshNames({v.name for v in graph.inputs} | set(graph.weights) | produced)
    rename: dict[str, str] = {}
    for output, field in zip(graph.outputs, fields):
        if field is None or output not in produced or output in rename or field == output:
            continue
        new = names.fresh(field)
        if valid_name(new):
            rename[output] = new
    if not rename:
        return graph
    nodes = tuple(n.replace(name=rename.get(n.name, n.name),
                            inputs=tuple(rename.get(i, i) for i in n.inputs))
                  for n in graph.nodes)
    return graph.replace(nodes=nodes, outputs=tuple(rename.get(o, o) for o in graph.outputs))
