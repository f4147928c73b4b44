"""The package's layers import downward only, and the front ends share no private names.

The layers are tdag's subpackages: ir < deinops < ops < (canonicalize, refine) < lower <
(reify, view). A module may import its own layer and the layers below it (and tdag.errors,
below everything); an import names its layer by package, so ``from tdag import ops`` is the
ops layer and ``from tdag import trace`` the facade, which no layer may import.

The front ends are packages too: tdag/canonicalize/torch, onnx and jax, with common/ the
pieces they share. No front end imports another front end's package, common/ imports none,
and a private (underscore) name is imported by no other module at all.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "tdag"
CANONICALIZE = PACKAGE / "canonicalize"

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
FRONT_ENDS = ("torch", "onnx", "jax")  # the packages tdag/canonicalize/<name>/
SHARED = "common"                      # tdag/canonicalize/common/: what the front ends share


def _dotted(path: pathlib.Path) -> list[str]:
    """The module name of a file under tdag/, as parts (a package's __init__ is the package)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: pathlib.Path):
    """(module imported, names imported) of every import in ``path``, at any depth; a
    relative import is resolved against the package of ``path``."""
    package = _dotted(path) if path.name == "__init__.py" else _dotted(path)[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def _is_module(parts: list[str]) -> bool:
    """Whether tdag's ``parts`` name a package or a module (not a name defined in one)."""
    path = PACKAGE.parent.joinpath(*parts)
    return path.is_dir() or path.with_suffix(".py").is_file()


def _targets(module: str, names: list[str]) -> set[str]:
    """The top-level packages or modules of tdag an import reaches: ``tdag.ir.types`` is ir;
    ``from tdag import ops, errors`` is ops and errors; a name the facade re-exports
    (``from tdag import trace``, ``import tdag``) is tdag itself."""
    parts = module.split(".")
    if parts[0] != "tdag":
        return set()
    if len(parts) > 1:
        return {parts[1]}
    return {n if _is_module(["tdag", n]) else "tdag" for n in names} or {"tdag"}


def _layer_files():
    for layer in ALLOWED:
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            yield layer, path


def test_every_subpackage_is_a_layer():
    """A new subpackage of tdag takes its place in ALLOWED before it holds code."""
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(ALLOWED)


@pytest.mark.parametrize("layer,path", list(_layer_files()),
                         ids=[str(p.relative_to(PACKAGE)) for _, p in _layer_files()])
def test_layers_import_downward(layer, path):
    for module, names in _imports(path):
        for target in _targets(module, names):
            if target in ("errors", layer):
                continue
            assert target in ALLOWED[layer], f"{path.relative_to(PACKAGE)} imports {module}"


def _room(parts: list[str]) -> str:
    """The package under tdag/canonicalize that a module of it lives in: a front end, common,
    or canonicalize itself (its facade, which imports the front ends, and any module beside
    it)."""
    inside = len(parts) > 3 or (len(parts) == 3 and PACKAGE.parent.joinpath(*parts).is_dir())
    return parts[2] if inside else "canonicalize"


def _rooms(module: str, names: list[str]) -> set[str]:
    """The packages of canonicalize an import reaches (none outside canonicalize)."""
    parts = module.split(".")
    if parts[:2] != ["tdag", "canonicalize"]:
        return set()
    if len(parts) > 2:
        return {_room(parts)}
    # ``from tdag.canonicalize import torch`` is the package; ``import from_onnx``, the facade
    return {_room(["tdag", "canonicalize", n]) if _is_module(["tdag", "canonicalize", n])
            else "canonicalize" for n in names} or {"canonicalize"}


@pytest.mark.parametrize("path", sorted(CANONICALIZE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_front_ends_share_no_private_names(path):
    mine = _room(_dotted(path))
    where = f"{path.relative_to(PACKAGE)} (the {mine} package)"
    for module, names in _imports(path):
        for other in _rooms(module, names) - {mine}:
            if mine in FRONT_ENDS + (SHARED,):
                assert other not in FRONT_ENDS, f"{where} imports {module}, the {other} front end"
                assert other != "canonicalize", \
                    f"{where} imports {module}, the facade that imports every front end"
            private = [n for n in names if n.startswith("_")]
            assert not private, f"{where} imports private {private} from {module} ({other})"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")),
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_crosses_a_module(path):
    """What two modules share is public in the module that owns it: an underscore name is
    that module's own, so no other module imports it (a dunder such as __version__ is not
    private)."""
    for module, names in _imports(path):
        if not module.startswith("tdag"):
            continue
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        assert not private, f"{path.relative_to(PACKAGE)} imports private {private} from {module}"
