"""Pytree specs read as data: a node whose type this process has not registered.

``torch.export.save`` writes a program's input and output structure as treespec JSON whose
nodes name their Python type (``transformers.modeling_outputs.CausalLMOutputWithPast``)
and keep a context (for a ``ModelOutput``, its field names). torch rebuilds a node only
through its pytree registry, so an archive of a transformers model does not load where
transformers was not imported, and tdag never imports what an archive names (trust model).

So a node of a type not registered here becomes a builtin node with the same children, in
the same order: a ``dict`` keyed by the field names where its context names one per child,
else a ``tuple``. The flat inputs and outputs of the program are unchanged; only the
container they unflatten into is plain. Contexts that name the fields:

- a list of distinct strings, one per child: a ``ModelOutput`` (an OrderedDict), a dict-like
  node registered with torch's default serializer;
- ``[names, dropped]``, a list of strings per child and a list of strings: a dataclass
  registered with ``register_dataclass`` (``dropped`` names the fields that were None).
"""
from __future__ import annotations

import json
from typing import Container

_DICT = "builtins.dict"
_TUPLE = "builtins.tuple"


def neutral_spec(text: str, known: Container[str]) -> str:
    """The treespec JSON ``text`` with each node whose type is not in ``known`` (the
    serialized type names of the registered nodes) made a dict or a tuple.

    >>> leaf = {"type": None, "context": None, "children_spec": []}
    >>> node = {"type": "transformers.X", "context": '["logits"]', "children_spec": [leaf]}
    >>> json.loads(neutral_spec(json.dumps([1, node]), {"builtins.dict"}))[1]["type"]
    'builtins.dict'
    """
    protocol, root = json.loads(text)
    changed = False
    stack = [root]
    while stack:  # iterative: a deep spec cannot exhaust the interpreter's stack here
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        children = node.get("children_spec")
        if isinstance(children, list):
            stack.extend(children)
        kind = node.get("type")
        if not isinstance(kind, str) or kind in known or not isinstance(children, list):
            continue
        names = field_names(_context(node.get("context")), len(children))
        node["type"], node["context"] = (_DICT, json.dumps(names)) if names is not None \
            else (_TUPLE, "null")
        changed = True
    return json.dumps([protocol, root]) if changed else text


def field_names(context, count: int) -> list[str] | None:
    """The names of a node's ``count`` children that its (deserialized) ``context`` gives,
    or None where it gives none.

    >>> field_names(["logits", "loss"], 2), field_names([["a", "b"], ["c"]], 2)
    (['logits', 'loss'], ['a', 'b'])
    >>> field_names(None, 1) is None, field_names(["a", "a"], 2) is None
    (True, True)
    """
    if isinstance(context, list) and len(context) == 2 and all(
            isinstance(part, list) and all(isinstance(s, str) for s in part)
            for part in context) and len(context[0]) == count:
        context = context[0]  # a dataclass: [names of the children, names of None fields]
    if isinstance(context, list) and len(context) == count \
            and all(isinstance(name, str) for name in context) \
            and len(set(context)) == count:
        return list(context)
    return None


def _context(value):
    """A node's context as the registry's default serializer wrote it (JSON in a string);
    a custom serializer's value is kept as it is."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except (ValueError, RecursionError):
        return None
