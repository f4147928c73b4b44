"""The package's layers import downward only, and the front ends share no private names.

ir < deinops < ops < (canonicalize, refine) < lower < (reify, view): a module may import its
own layer and the layers below it. The torch and ONNX front ends (``canonicalize``) share
their common pieces through neutral modules, never through each other's underscore names.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tdag"

# what each layer may import from tdag (besides itself); tdag.errors is below everything
ALLOWED = {
    "ir": set(),
    "deinops": {"ir"},
    "ops": {"ir", "deinops"},  # the compositions over the primitives (tdag.ops)
    "refine": {"ir", "deinops", "ops"},
    "canonicalize": {"ir", "deinops", "ops", "refine"},
    "lower": {"ir", "deinops", "ops", "refine"},
    "reify": {"ir", "deinops", "ops", "refine", "lower"},
    "view": {"ir", "deinops", "ops", "refine", "lower"},  # the page, networkx
}
FRONT_ENDS = {"torch": ("torch",), "onnx": ("onnx",), "jax": ("jax",)}


def _imports(path: pathlib.Path):
    """(module imported, names imported) of every import in ``path``, at any depth."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def _layer_files():
    for layer in ALLOWED:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            yield layer, path


@pytest.mark.parametrize("layer,path", list(_layer_files()),
                         ids=[str(p.relative_to(PACKAGE)) for _, p in _layer_files()])
def test_layers_import_downward(layer, path):
    for module, names in _imports(path):
        parts = module.split(".")
        if parts[0] != "tdag":
            continue
        target = parts[1] if len(parts) > 1 else None
        if target is None:  # ``from tdag import ops``
            target = "ops" if names == ["ops"] else "tdag"
        if target in ("errors", layer):
            continue
        assert target in ALLOWED[layer], f"{path.relative_to(PACKAGE)} imports {module}"


def _front_end(path: pathlib.Path) -> str | None:
    rel = path.relative_to(PACKAGE / "canonicalize")
    for name, prefixes in FRONT_ENDS.items():
        if rel.parts[0].startswith(prefixes):
            return name
    return None


@pytest.mark.parametrize("path", sorted((PACKAGE / "canonicalize").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_front_ends_share_no_private_names(path):
    mine = _front_end(path)
    for module, names in _imports(path):
        if not module.startswith("tdag.canonicalize."):
            continue
        other = _front_end(PACKAGE / pathlib.Path(*module.split(".")[1:]).with_suffix(".py")) \
            if not module.endswith(".aten") else "torch"
        if mine is not None and other is not None and other != mine:
            pytest.fail(f"{path.name} (the {mine} front end) imports {module} "
                        f"(the {other} front end)")
        if other is not None and other != mine:
            continue
        private = [n for n in names if n.startswith("_")]
        assert not private or other == mine, f"{path.name} imports private {private}"
