"""ONNX's backend node conformance cases: the model, inputs and expected outputs of each.

The cases are read from ``onnx/backend/test/data/node`` where the wheel ships the folders,
else built by the generators that write them (``onnx.backend.test.case.node``: the same
models and data); this onnx wheel ships only the generators.

    cases = node_cases()                       # {name: (model, inputs, outputs)}
    cases = node_cases(("test_loop", "test_if"), modules=("loop", "if_"))   # a few, fast
"""
from __future__ import annotations

import glob
import importlib
import os
import warnings

import onnx
from onnx import TensorProto, numpy_helper


def _from_folders(root: str, prefixes) -> dict:
    cases = {}
    for folder in sorted(glob.glob(os.path.join(root, "test_*"))):
        name = os.path.basename(folder)
        if prefixes and not name.startswith(prefixes):
            continue
        data = os.path.join(folder, "test_data_set_0")
        ins, outs = [], []
        for kind, into in (("input", ins), ("output", outs)):
            for path in sorted(glob.glob(os.path.join(data, f"{kind}_*.pb")),
                               key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0])):
                proto = TensorProto()
                with open(path, "rb") as f:
                    proto.ParseFromString(f.read())
                into.append(numpy_helper.to_array(proto))
        cases[name] = (onnx.load(os.path.join(folder, "model.onnx")), ins, outs)
    return cases


def _from_generators(prefixes, modules) -> dict:
    """The cases of the generator ``modules`` (all of them when None: importing every one
    runs each ``export``, ~6 s)."""
    from onnx.backend.test.case import node  # noqa: PLC0415  (importing it runs nothing)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if modules is None:
            node.collect_testcases()
        for module in modules or ():
            importlib.import_module(f"onnx.backend.test.case.node.{module}")
    found = node._NodeTestCases
    return {c.name: (c.model, *(_arrays(d) for d in c.data_sets[0])) for c in found
            if not prefixes or c.name.startswith(prefixes)}


def _arrays(values: list) -> list:
    """A data set's values as arrays (some generators hand TensorProtos, e.g. Cast's)."""
    return [numpy_helper.to_array(v) if isinstance(v, TensorProto) else v for v in values]


def node_cases(prefixes: tuple = (), modules: tuple | None = None) -> dict:
    """``{name: (model, inputs, expected outputs)}`` of the node cases whose names start
    with one of ``prefixes`` (all when empty), sorted by name; ``modules`` names the
    generator modules to import where the folders are absent (``("loop", "if_")``), all
    when None."""
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    prefixes = tuple(prefixes)
    cases = _from_folders(root, prefixes) if os.path.isdir(root) else {}
    cases = cases or _from_generators(prefixes, modules)
    return dict(sorted(cases.items()))


def only_tensors(model: onnx.ModelProto) -> bool:
    """Whether every graph input and output is a tensor (not a sequence, map or optional)."""
    values = list(model.graph.input) + list(model.graph.output)
    return all(v.type.HasField("tensor_type") for v in values)
