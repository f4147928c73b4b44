"""The one op-table class (canonicalize/common/registry.py) and the three front ends' tables.

A key is registered once, the table names the file that registered each entry, and an ONNX
op's entry sits in the family file its name says.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

import tdag
from tdag.canonicalize.common.registry import DuplicateEntryError, Registry
from tdag.canonicalize.jax.ops import OPS as JAX_OPS
from tdag.canonicalize.jax.walker import CONTROL as JAX_CONTROL
from tdag.canonicalize.onnx.ops import OPS as ONNX_OPS
from tdag.canonicalize.torch.aten import TABLE as ATEN_TABLE

ROOT = pathlib.Path(tdag.__file__).resolve().parent.parent
HERE = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()


def _register_from(file: str, table: Registry, key: str) -> None:
    """Register ``key`` in ``table`` from code whose file is ``file``."""
    code = compile(f"table.add({key!r}, lambda ctx, x: x)", file, "exec")
    exec(code, {"table": table})


def test_a_duplicate_key_is_refused_naming_both_files():
    table = Registry("a test table")
    table.add("Add", lambda ctx, a, b: a)
    with pytest.raises(DuplicateEntryError, match=r"'Add' is registered twice") as info:
        _register_from("tdag/elsewhere/family.py", table, "Add")
    assert HERE in str(info.value) and "tdag/elsewhere/family.py" in str(info.value)
    with pytest.raises(DuplicateEntryError):
        table.register("Sub", "Add")(lambda ctx, a, b: a)


def test_where_names_the_registering_file():
    table = Registry("a test table")

    @table.register("Neg", "Negative")
    def neg(ctx, x):
        return x

    _register_from("tdag/canonicalize/other.py", table, "Abs")
    assert table.where("Neg") == table.where("Negative") == HERE
    assert table.where("Abs") == "tdag/canonicalize/other.py"
    assert table["Neg"] is neg and table.get("Missing") is None


def test_keys_answer_which_ops_are_mapped():
    table = Registry("a test table")
    for key in ("Sub", "Add", "Mul"):
        table.add(key, lambda ctx, x: x)
    assert table.keys() == ["Sub", "Add", "Mul"] and list(table) == table.keys()
    assert table.sorted() == ["Add", "Mul", "Sub"]
    assert len(table) == 3 and "Add" in table and "Div" not in table


def test_no_bare_item_assignment():
    table = Registry("a test table")
    with pytest.raises(TypeError, match="register"):
        table["Add"] = lambda ctx, a, b: a
    assert "Add" not in table


def test_replaced_stands_in_and_restores():
    table = Registry("a test table")
    table.add("Relu", lambda ctx, x: "real")
    with table.replaced("Relu", lambda ctx, x: "stand-in"):
        assert table["Relu"](None, None) == "stand-in"
    assert table["Relu"](None, None) == "real"


@pytest.mark.parametrize("table, package", [
    (ONNX_OPS, "tdag/canonicalize/onnx/ops/"),
    (ATEN_TABLE, "tdag/canonicalize/torch/aten/"),
    (JAX_OPS, "tdag/canonicalize/jax/ops/"),
    (JAX_CONTROL, "tdag/canonicalize/jax/"),
], ids=["onnx", "aten", "jax", "jax-control"])
def test_each_front_end_table_is_a_registry_filled_from_its_package(table, package):
    assert isinstance(table, Registry)
    assert len(table) > 0
    outside = {key: table.where(key) for key in table if not table.where(key).startswith(package)}
    assert not outside, f"entries registered outside {package}: {outside}"


@pytest.mark.parametrize("op, family", [
    ("Gelu", "activations"), ("LeakyRelu", "activations"), ("Celu", "activations"),
    ("Attention", "attention"), ("RotaryEmbedding", "attention"), ("LpPool", "pool"),
    ("HannWindow", "signal"), ("MeanVarianceNormalization", "norm"), ("Add", "elementwise"),
    ("Conv", "conv"), ("TopK", "sorting"),
])
def test_an_onnx_op_sits_in_its_family_file(op, family):
    assert ONNX_OPS.where(op) == f"tdag/canonicalize/onnx/ops/{family}.py"


def test_each_onnx_family_file_names_its_ops_and_fits_a_few_screens():
    """A reader finds an op by its family file's docstring (``Reduce*`` and ``Bitwise*``
    name a group): each op a file registers is named there; each file stays short."""
    by_file: dict[str, list] = {}
    for op in ONNX_OPS:
        by_file.setdefault(ONNX_OPS.where(op), []).append(op)
    for file, ops in sorted(by_file.items()):
        text = (ROOT / file).read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        groups = [word[:-1] for word in doc.replace(",", " ").split() if word.endswith("*")]
        unnamed = [op for op in ops if op not in doc and not op.startswith(tuple(groups))]
        assert not unnamed, f"{file}'s docstring does not name {unnamed}"
        assert len(text.splitlines()) < 450, f"{file} holds more than one family"
