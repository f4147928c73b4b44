"""ONNX's backend node conformance cases through tdag, both ways out.

Each case of ``onnx.backend.test.case.node`` whose inputs and outputs are tensors (1,855 of
the 1,884 with onnx 1.23) is imported with ``tdag.from_onnx`` and run two ways: through
``tdag.to_torch(prog)(*inputs)`` and through ``tdag.to_onnx(prog)`` on onnxruntime's CPU
provider. Each way's outputs are compared with the outputs the case ships, and the case is
classified per backend:

    pass         every output has the expected shape, dtype and values
    unsupported  tdag raised one of its own errors (an op or attribute it does not handle)
    WRONG        it ran, and an output differs: a defect (silently wrong)
    crash        another exception (or the per-case time limit): a defect; but where
                 onnxruntime has no kernel for a node of the re-emitted model and the case's
                 own model fails on onnxruntime too, the runtime lacks it: unsupported

A few cases ship expected values written by hand to four decimals (RoiAlign, GridSample
bicubic, AveragePool ceil_last_window_starts_on_pad) that miss the exact answer by more than the
tolerance: onnx's own ReferenceEvaluator fails them too. Where an output differs, the case is
run on that reference; if the reference misses the shipped values as well and tdag's outputs
match the reference's, the case passes "against the reference" (listed apart, never silently).

An input that decides the output's rank or the axes an op touches (the axes of Reduce*,
Squeeze and Unsqueeze, Resize's scales and sizes, CenterCropPad's shape, the axis of CumSum and
DFT) is pinned: ``tdag.from_onnx(model, inputs={name: value})`` makes it a const of the Program, as
from_onnx documents for such inputs (no tdag type describes the result for every value); the
Program then takes the case's other inputs. ``--no-pin`` imports every case as it is.

Tolerances: float32/float64 within rtol 1e-4, atol 1e-5; float16 rtol 2e-3, atol 1e-3;
bfloat16 rtol 1e-2, atol 1e-2 (their precision); float8 kinds rtol 0.13, atol 1e-2 (one
step of the 3-bit mantissa); integers and bools exactly; NaN where NaN is expected.

    python benchmarks/onnx_conformance.py                  # every case: a table by op, totals
    python benchmarks/onnx_conformance.py --ops TopK,Trilu --verbose
    python benchmarks/onnx_conformance.py --json           # the figures as JSON
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import json
import os
import signal
import sys
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import onnx  # noqa: E402
import onnx.reference  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

import tdag  # noqa: E402
from support.onnx_cases import node_cases, only_tensors  # noqa: E402

BACKENDS = ("torch", "onnx")
KINDS = ("pass", "unsupported", "WRONG", "crash")
TOLERANCES = {"float32": (1e-4, 1e-5), "float64": (1e-4, 1e-5), "float16": (2e-3, 1e-3),
              "bfloat16": (1e-2, 1e-2)}
FLOAT8 = (0.13, 1e-2)


# op -> the positions of its inputs that decide the output's rank or the axes it touches
PINNED = {**{op: (1,) for op in (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Squeeze", "Unsqueeze",
    "CenterCropPad", "CumSum", "CumProd")}, "Resize": (1, 2, 3), "DFT": (2,)}


def pins(model: onnx.ModelProto) -> set:
    """The graph inputs a case pins: those PINNED names, where a graph input feeds them."""
    inputs = {v.name for v in model.graph.input} - {i.name for i in model.graph.initializer}
    return {node.input[i] for node in model.graph.node for i in PINNED.get(node.op_type, ())
            if i < len(node.input) and node.input[i] in inputs}


class CaseTimeout(Exception):
    pass


def _expire(signum, frame):
    raise CaseTimeout("past the per-case time limit")


# -- op of a case -------------------------------------------------------------------------------

def _op_names() -> list:
    names = {s.name for s in onnx.defs.get_all_schemas_with_history()}
    return sorted(names, key=len, reverse=True)


def op_of(name: str, model: onnx.ModelProto, names: list) -> str:
    """The op a case tests: the longest op type its name starts with (test_reduce_sum_... is
    ReduceSum), else its graph's first op."""
    flat = name.removeprefix("test_").replace("_", "").lower()
    for op in names:
        if flat.startswith(op.lower()):
            return op
    return model.graph.node[0].op_type if model.graph.node else "?"


# -- tensors and comparison ---------------------------------------------------------------------

def to_tensor(array) -> torch.Tensor:
    """A numpy array (ml_dtypes' bfloat16 and float8 kinds too) as a torch tensor."""
    array = np.asarray(array)
    kind = array.dtype.name
    special = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn,
               "float8_e8m0fnu": torch.float8_e8m0fnu,
               "float8_e4m3fnuz": torch.float8_e4m3fnuz, "float8_e5m2": torch.float8_e5m2,
               "float8_e5m2fnuz": torch.float8_e5m2fnuz}
    if kind in special:
        bits = np.ascontiguousarray(array).view(np.uint16 if kind == "bfloat16" else np.uint8)
        raw = torch.from_numpy(bits.astype(np.int16 if kind == "bfloat16" else np.uint8))
        return raw.view(special[kind]).reshape(array.shape)
    return torch.from_numpy(np.array(array))  # a copy; 0-d kept


def _as_numpy(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype in (torch.bfloat16,) or "float8" in str(value.dtype):
            return value.float().numpy()
        return value.numpy()
    return np.asarray(value)


def _dtype_name(value) -> str:
    if isinstance(value, torch.Tensor):
        return str(value.dtype).removeprefix("torch.")
    return np.asarray(value).dtype.name


def compare(actual, expected: list) -> str | None:
    """None where ``actual`` matches the expected outputs, else what differs."""
    actual = list(actual) if isinstance(actual, (list, tuple)) else [actual]
    if len(actual) != len(expected):
        return f"{len(actual)} outputs, expected {len(expected)}"
    for k, (a, e) in enumerate(zip(actual, expected)):
        e = np.asarray(e)
        kind = e.dtype.name
        got = _dtype_name(a)
        if got != kind and not (kind == "object" or {got, kind} <= {"bool", "bool_"}):
            return f"output {k}: dtype {got}, expected {kind}"
        a = _as_numpy(a)
        if a.shape != e.shape:
            return f"output {k}: shape {a.shape}, expected {e.shape}"
        if kind in TOLERANCES or kind.startswith("float8"):
            rtol, atol = TOLERANCES.get(kind, FLOAT8)
            with np.errstate(invalid="ignore"):  # float8 NaN to float64 warns, stays NaN
                a64, e64 = a.astype(np.float64), e.astype(np.float64)
            ok = np.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True)
            if not ok.all():
                bad = int((~ok).sum())
                worst = float(np.nanmax(np.abs(a64 - e64)[~ok])) if bad else 0.0
                return f"output {k}: {bad} of {e.size} values differ (max |diff| {worst:.3g})"
        elif not np.array_equal(a, e):
            return f"output {k}: {int((a != e).sum())} of {e.size} values differ"
    return None


# -- one case -----------------------------------------------------------------------------------

def _classify(error: BaseException) -> tuple:
    if isinstance(error, tdag.TdagError):
        return "unsupported", f"{type(error).__name__}: {error.message}"
    return "crash", f"{type(error).__name__}: {error}"


def _ort_value(array) -> ort.OrtValue:
    """An onnxruntime value; bfloat16 and float8 (ml_dtypes, which its numpy bridge refuses)
    from their raw bits."""
    array = np.require(array, requirements="C")  # ascontiguousarray makes a scalar 1-d
    code = _ONNX_TYPES.get(array.dtype.name)
    if code is None:
        return ort.OrtValue.ortvalue_from_numpy(array)
    bits = array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint8)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, code)


def _from_ort(value: ort.OrtValue) -> np.ndarray:
    kind = value.data_type().removeprefix("tensor(").removesuffix(")")
    kind = _ORT_NAMES.get(kind, kind)
    if kind not in _ONNX_TYPES:
        return value.numpy()
    import ml_dtypes  # noqa: PLC0415  (onnx's own dependency)
    dtype = np.dtype(getattr(ml_dtypes, kind))
    count = int(np.prod(value.shape()))
    raw = (ctypes.c_uint8 * (count * dtype.itemsize)).from_address(value.data_ptr()) \
        if count else b""
    return np.frombuffer(bytes(raw), dtype=dtype).reshape(value.shape()).copy()


_ONNX_TYPES = {"bfloat16": onnx.TensorProto.BFLOAT16,
               "float8_e4m3fn": onnx.TensorProto.FLOAT8E4M3FN,
               "float8_e4m3fnuz": onnx.TensorProto.FLOAT8E4M3FNUZ,
               "float8_e5m2": onnx.TensorProto.FLOAT8E5M2,
               "float8_e5m2fnuz": onnx.TensorProto.FLOAT8E5M2FNUZ,
               "float8_e8m0fnu": onnx.TensorProto.FLOAT8E8M0}
# onnxruntime's names of those types (tensor(float8e4m3fn)) -> ml_dtypes' (float8_e4m3fn)
_ORT_NAMES = {**{name.replace("_", ""): name for name in _ONNX_TYPES},
              "float8e8m0": "float8_e8m0fnu"}


def _ort_run(model: onnx.ModelProto, inputs: list) -> list:
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {i.name: _ort_value(a) for i, a in zip(session.get_inputs(), inputs)}
    return [_from_ort(v) for v in session.run_with_ort_values(None, feeds)]


def _runtime_lacks(model: onnx.ModelProto, inputs: list, error: BaseException) -> bool:
    """Whether ``error`` is onnxruntime's missing kernel and the case's own model fails on
    onnxruntime as well."""
    if "NOT_IMPLEMENTED" not in str(error):
        return False
    try:
        _ort_run(model, inputs)
    except Exception:  # noqa: BLE001  (any failure of the original counts)
        return True
    return False


def _reference_outputs(model: onnx.ModelProto, inputs: list) -> list | None:
    """The outputs onnx's ReferenceEvaluator computes for the case, or None if it cannot."""
    try:
        session = onnx.reference.ReferenceEvaluator(model)
        names = [v.name for v in model.graph.input]
        return session.run(None, dict(zip(names, inputs)))
    except Exception:  # noqa: BLE001  (no reference answer: the difference stands)
        return None


def judge(actual, outputs: list, model: onnx.ModelProto, fed: list) -> tuple:
    """(kind, detail) of outputs that ran: pass, or pass against the reference where the
    shipped values are inexact (the reference misses them too and tdag matches it), else
    WRONG."""
    diff = compare(actual, outputs)
    if diff is None:
        return "pass", ""
    reference = _reference_outputs(model, fed)
    if reference is not None and compare(reference, outputs) is not None \
            and compare(actual, reference) is None:
        return "pass", f"{REFERENCE_NOTE}: shipped values miss it by {diff.split(': ', 1)[-1]}"
    return "WRONG", diff


REFERENCE_NOTE = "matches onnx.reference"


def _first_line(text: str, width: int = 200) -> str:
    """The message's first line; for a list of problems (one UnsupportedOpError naming every
    unsupported node) the first problem instead."""
    lines = [line.strip() for line in text.strip().splitlines()] or [""]
    return (lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0])[:width]


def run_case(model, inputs, outputs, limit: int, pin: bool = True) -> dict:
    """``{backend: (kind, detail)}`` for one case."""
    result = {}
    names = [v.name for v in model.graph.input]
    pinned = pins(model) if pin else set()
    fixed = {n: to_tensor(a) for n, a in zip(names, inputs) if n in pinned}
    fed = list(inputs)
    inputs = [a for n, a in zip(names, inputs) if n not in pinned]
    previous = signal.signal(signal.SIGALRM, _expire)
    try:
        signal.alarm(limit)
        try:
            prog = tdag.from_onnx(model, inputs=fixed) if fixed else tdag.from_onnx(model)
        except BaseException as error:  # noqa: BLE001  (the class of the failure is the figure)
            if isinstance(error, KeyboardInterrupt):
                raise
            kind, detail = _classify(error)
            return {b: (kind, "from_onnx: " + _first_line(detail)) for b in BACKENDS}
        for backend in BACKENDS:
            signal.alarm(limit)
            try:
                if backend == "torch":
                    with torch.no_grad():
                        actual = tdag.to_torch(prog)(*[to_tensor(a) for a in inputs])
                else:
                    actual = _ort_run(tdag.to_onnx(prog), inputs)
                result[backend] = judge(actual, outputs, model, fed)
            except BaseException as error:  # noqa: BLE001
                if isinstance(error, KeyboardInterrupt):
                    raise
                kind, detail = _classify(error)
                if backend == "onnx" and kind == "crash" and _runtime_lacks(model, fed, error):
                    kind, detail = "unsupported", "onnxruntime lacks a kernel (the case's " \
                        "own model fails too): " + detail
                result[backend] = (kind, _first_line(detail))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return result


# -- the sweep ----------------------------------------------------------------------------------

def sweep(ops: set | None = None, names: set | None = None, limit: int = 30,
          progress: bool = False, pin: bool = True) -> dict:
    """``{case: {"op": op, backend: [kind, detail]}}`` over the tensor cases (of ``ops`` or
    ``names`` only, where given)."""
    op_names = _op_names()
    cases = {n: c for n, c in node_cases().items() if only_tensors(c[0])}
    results = {}
    for name, (model, inputs, outputs) in cases.items():
        op = op_of(name, model, op_names)
        if (ops and op not in ops) or (names and name not in names):
            continue
        if progress:
            print(f"  {name}", file=sys.stderr, flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            outcome = run_case(model, inputs, outputs, limit, pin)
        results[name] = {"op": op, **{b: list(v) for b, v in outcome.items()}}
    return results


def totals(results: dict) -> dict:
    counts = {b: collections.Counter() for b in BACKENDS}
    for r in results.values():
        for b in BACKENDS:
            counts[b][r[b][0]] += 1
    return {b: {k: counts[b][k] for k in KINDS} for b in BACKENDS}


def table(results: dict) -> str:
    by_op = collections.defaultdict(lambda: {b: collections.Counter() for b in BACKENDS})
    for r in results.values():
        for b in BACKENDS:
            by_op[r["op"]][b][r[b][0]] += 1
    head = f"{'op':<34}{'cases':>6}  " + "  ".join(
        f"{b + ' ' + '/'.join(k[0] if k != 'WRONG' else 'W' for k in KINDS):>14}"
        for b in BACKENDS)
    lines = [head, "-" * len(head)]
    for op in sorted(by_op):
        c = by_op[op]
        n = sum(c["torch"].values())
        cells = ["/".join(str(c[b][k]) for k in KINDS) for b in BACKENDS]
        lines.append(f"{op:<34}{n:>6}  " + "  ".join(f"{cell:>14}" for cell in cells))
    lines.append("-" * len(head))
    for b, t in totals(results).items():
        lines.append(f"{b:<8} " + "  ".join(f"{k} {t[k]}" for k in KINDS) +
                     f"   (of {len(results)})")
    return "\n".join(lines)


def defects(results: dict) -> list:
    return [(name, b, r[b][0], r[b][1]) for name, r in results.items() for b in BACKENDS
            if r[b][0] in ("WRONG", "crash")]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", help="comma-separated op types (TopK,Trilu)")
    parser.add_argument("--cases", help="comma-separated case names")
    parser.add_argument("--limit", type=int, default=30, help="seconds per case")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--verbose", action="store_true",
                        help="list every unsupported case with its reason too")
    parser.add_argument("--no-pin", action="store_true",
                        help="import every case as it is (no input pinned)")
    parser.add_argument("--progress", action="store_true", help="name each case as it runs")
    args = parser.parse_args(argv)
    ops = set(args.ops.split(",")) if args.ops else None
    names = set(args.cases.split(",")) if args.cases else None
    start = time.time()
    results = sweep(ops, names, args.limit, args.progress, not args.no_pin)
    if args.json:
        print(json.dumps({"totals": totals(results), "cases": results}, indent=1))
        return 0
    print(table(results))
    print(f"\n{len(results)} cases in {time.time() - start:.0f} s")
    against = [(name, b, r[b][1]) for name, r in results.items() for b in BACKENDS
               if r[b][0] == "pass" and r[b][1].startswith(REFERENCE_NOTE)]
    if against:
        print(f"\npassed against onnx's ReferenceEvaluator ({len(against)}; the shipped "
              "values are inexact):")
        for name, b, detail in against:
            print(f"  {b:<6} {name}: {detail}")
    found = defects(results)
    if found:
        print(f"\ndefects ({len(found)}):")
        for name, b, kind, detail in found:
            print(f"  {kind:<6} {b:<6} {name}: {detail}")
    if args.verbose:
        print("\nunsupported:")
        for name, r in results.items():
            for b in BACKENDS:
                if r[b][0] == "unsupported":
                    print(f"  {b:<6} {name}: {r[b][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
