"""ONNX conformance cases whose shape-like inputs (shapes, axes, pads, repeats, k, starts and
ends) arrive at run time, and the ops whose output size data decides (NonZero, Compress,
Unique), each through tdag.run, tdag.to_torch and tdag.to_onnx on onnxruntime against the
outputs the case ships.

Inputs of the PINNED ops (their value decides the output's rank or axes) are pinned to the
case's values with ``tdag.from_onnx(model, inputs=...)`` and dropped from the arguments; every
other shape-like input is passed at run time (a fresh size).

The cases come from ``onnx.backend.test.case.node``'s generators (this onnx wheel ships them
but not the case folders). ``PASSING`` is the count this checkout passes, so a regression or a
newly passing case both show here; for the list of each, run this file as a script with
benchmarks/ on the path (``PYTHONPATH=benchmarks python
tests/canonicalize/onnx/test_onnx_runtime_inputs.py``).
"""
from __future__ import annotations

import importlib
import pkgutil
import warnings

import numpy as np
import onnx
import pytest
import torch

import tdag

# onnxruntime fed and read as the conformance sweep does: bfloat16 and float8 by their bits
from onnx_conformance import _ort_run

# op -> the positions of its inputs that hold shapes, axes, pads, repeats, k, bounds
SHAPE_INPUTS = {
    "Expand": (1,), "Reshape": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3), "Tile": (1,),
    "TopK": (1,), "Range": (0, 1, 2), "ConstantOfShape": (0,), "OneHot": (1,),
    "Resize": (1, 2, 3), "Squeeze": (1,), "Unsqueeze": (1,), "Split": (1,),
    "ReduceSum": (1,), "ReduceMean": (1,), "ReduceMax": (1,), "ReduceMin": (1,),
    "ReduceProd": (1,), "ReduceL1": (1,), "ReduceL2": (1,), "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,), "ReduceSumSquare": (1,), "CenterCropPad": (1,),
}
DATA_SIZED = {"NonZero", "Compress", "Unique"}
# ops whose input decides the output's rank or the axes it touches: the case pins it
# (tdag.from_onnx(model, inputs=...)); every other shape-like input stays a run-time input
PINNED = {op for op in SHAPE_INPUTS if op.startswith("Reduce")} | \
    {"Squeeze", "Unsqueeze", "Resize", "CenterCropPad"}
PASSING = 247  # of 249 (9 before pinned inputs and run-time shapes, 200 before Unique along
# an axis, Resize's modes and bfloat16 fed by its bits); see the docstring
# a few cases of each kind the default run checks: slices along an axis, bfloat16, uint64
QUICK = ("test_unique_sorted_with_axis", "test_unique_sorted_with_axis_3d",
         "test_unique_sorted_with_negative_axis", "test_unique_not_sorted_without_axis",
         "test_compress_bfloat16", "test_top_k_uint64", "test_reshape_negative_dim")


def _runtime_shaped(model: onnx.ModelProto) -> bool:
    inputs = {v.name for v in model.graph.input} - {i.name for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type in DATA_SIZED:
            return True
        for i in SHAPE_INPUTS.get(node.op_type, ()):
            if i < len(node.input) and node.input[i] in inputs:
                return True
    return False


def _cases() -> dict:
    from onnx.backend.test.case import node  # noqa: PLC0415
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in pkgutil.iter_modules(node.__path__):
            try:
                importlib.import_module(f"onnx.backend.test.case.node.{info.name}")
            except Exception:  # noqa: BLE001  (a generator needing what this machine lacks)
                continue
    return {c.name: (c.model, *c.data_sets[0]) for c in node._NodeTestCases
            if c.model is not None and c.data_sets and _runtime_shaped(c.model) and
            all(v.type.HasField("tensor_type") for v in
                list(c.model.graph.input) + list(c.model.graph.output))}


CASES = _cases()


def _close(actual, expected) -> None:
    if isinstance(actual, torch.Tensor):
        actual = actual.detach()
        actual = (actual.float() if actual.dtype is torch.bfloat16 else actual).numpy()
    actual, expected = np.asarray(actual), np.asarray(expected)
    actual, expected = (a.astype(np.float32) if a.dtype.name == "bfloat16" else a
                        for a in (actual, expected))
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if np.issubdtype(expected.dtype, np.floating):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
    else:
        np.testing.assert_array_equal(actual, expected)


def _tensor(a) -> torch.Tensor:
    a = np.array(a)  # a copy, 0-d kept
    if a.dtype.name == "bfloat16":  # ml_dtypes' bfloat16, which torch.from_numpy refuses
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def pins(model: onnx.ModelProto) -> set:
    """The graph inputs the case pins: the shape-like inputs of PINNED ops."""
    inputs = {v.name for v in model.graph.input} - {i.name for i in model.graph.initializer}
    return {node.input[i] for node in model.graph.node if node.op_type in PINNED
            for i in SHAPE_INPUTS[node.op_type] if i < len(node.input) and
            node.input[i] in inputs}


def check(name: str) -> None:
    """Raise unless the case passes through run, to_torch and to_onnx."""
    model, ins, outs = CASES[name]
    pinned = pins(model)
    names = [v.name for v in model.graph.input]
    prog = tdag.from_onnx(model, inputs={n: _tensor(a) for n, a in zip(names, ins)
                                         if n in pinned})
    tdag.verify(prog)
    arrays = [a for n, a in zip(names, ins) if n not in pinned]
    args = [_tensor(a) for a in arrays]
    for result in (lambda: tdag.run(prog, *args), lambda: tdag.to_torch(prog)(*args),
                   lambda: _ort_run(tdag.to_onnx(prog), arrays)):
        got = result()
        got = list(got) if isinstance(got, (tuple, list)) else [got]
        assert len(got) == len(outs), name
        for a, e in zip(got, outs):
            _close(a, e)


def passing() -> tuple[list, dict]:
    ok, failed = [], {}
    for name in sorted(CASES):
        try:
            check(name)
            ok.append(name)
        except Exception as exc:  # noqa: BLE001  (a tally: every failure counts the same)
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:150]}"
    return ok, failed


@pytest.mark.parametrize("name", QUICK)
def test_case(name):
    check(name)


@pytest.mark.slow
def test_conformance_count():
    ok, failed = passing()
    assert len(ok) >= PASSING, failed


if __name__ == "__main__":
    ok, failed = passing()
    for name, why in sorted(failed.items()):
        print(f"FAIL {name}: {why}")
    print(f"{len(ok)} of {len(CASES)} pass")
