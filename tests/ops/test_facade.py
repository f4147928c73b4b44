"""``tdag.ops`` is a facade of functions: an explicit ``__all__``, no re-exported modules or
classes, and one ``reduce`` whatever was imported first."""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
import types

import tdag
import tdag.ops as ops
from tdag.ops.tensor import Tensor


def test_all_names_only_functions():
    assert len(ops.__all__) == len(set(ops.__all__))
    for name in ops.__all__:
        value = getattr(ops, name)
        assert inspect.isfunction(value), f"ops.{name} is {type(value).__name__}, not a function"


def test_no_modules_or_classes_leak():
    for leaked in ("torch", "sympy", "math", "builtins", "Builder", "Op", "Tensor", "DType",
                   "Permute", "ReduceKind", "DivideMode", "active_builder", "is_static"):
        assert not hasattr(ops, leaked), f"tdag.ops re-exports {leaked}"
    public = {n for n in vars(ops) if not n.startswith("_")}
    submodules = {n for n in public if isinstance(getattr(ops, n), types.ModuleType)
                  and getattr(ops, n).__name__ == f"tdag.ops.{n}"}
    assert public - submodules == set(ops.__all__)


def test_names_survive_importing_every_submodule():
    """A submodule named as a function would replace it on the package once imported."""
    for info in pkgutil.walk_packages(ops.__path__, "tdag.ops."):
        if info.name != "tdag.ops.einops_backend":  # einops is optional
            importlib.import_module(info.name)
    for name in ops.__all__:
        assert inspect.isfunction(getattr(ops, name)), name


def test_reduce_takes_both_calls():
    prog = tdag.trace(lambda x: (ops.reduce(x, "sum", 1), ops.reduce(x, "a b -> a", "max"),
                                 ops.reduce(x, "max", (0,), keepdim=True)),
                      tdag.TensorSpec((2, 3)))
    assert [str(t) for t in prog.graph.output_types] == ["f32[2]", "f32[2]", "f32[1,3]"]
    assert ops.reduce.__module__ == "tdag.ops.einops"


def test_reduce_is_one_function_whatever_the_import_order():
    code = ("import tdag.ops.core, tdag.ops.einops, tdag.ops.masking\n"
            "from tdag import ops\n"
            "from tdag.ops.einops import reduce_or_pattern\n"
            "assert ops.reduce is reduce_or_pattern, ops.reduce\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tensor_operators_are_installed():
    def fn(x):
        assert isinstance(x, Tensor)
        y = (x + 1.0) * 2.0 - x / 3.0
        return y[0], y.T, y.reshape(-1), y.sum(1), x == x, -abs(x) @ x.T
    prog = tdag.trace(fn, tdag.TensorSpec((2, 3)))
    assert [str(t) for t in prog.graph.output_types] == [
        "f32[3]", "f32[3,2]", "f32[6]", "f32[2]", "bool[2,3]", "f32[2,2]"]
    assert Tensor.__add__.__qualname__ == "Tensor.__add__"
