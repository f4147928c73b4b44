"""Issue 20's real-file corpus, file by file: does tdag import it, does it compute what
onnxruntime computes on the original (through tdag.run, the file tdag.to_onnx writes and the
module tdag.to_torch makes), and how fast does the re-emitted file run next to the original on
onnxruntime.

The corpus (tests/support/real_files.py) is built into a temporary folder from tiny random
models by the real tools: torch.onnx (legacy with dynamic axes, dynamo; decoders with their KV
cache), onnxslim, onnxruntime's transformers optimizer and its own session optimisation
(ORT_ENABLE_EXTENDED), quantize_dynamic, quantize_static (QDQ, QOperator), the MatMulNBits
quantizer, skl2onnx.

Errors are the largest |tdag - onnxruntime| over every output and feed, relative to the
output's largest magnitude (integer outputs: 1 if any element differs); the float bound is
1e-4. A quantized file is compared the same way and reported, not judged: onnxruntime's
integer kernels round differently from the reference arithmetic. A ZipMap's maps are compared
as their [N, C] probabilities (tdag.run's convention, Program.class_labels).

Time: the median of ``--repeats`` runs of the original and of the re-emitted file on
onnxruntime, side by side in one process with the same session options (the default graph
optimisation; ORT_DISABLE_ALL for both where onnxruntime cannot re-optimise the original),
``--threads`` intra-op threads (1 by default; 0 is onnxruntime's default). The ratio is
re-emitted/original; the issue asks for a geo-mean <= 1.05 and each <= 1.25.

The re-emitted file is for the original's runtime (``--runtime as-original``, the "emit"
column): an original holding onnxruntime's com.microsoft ops runs on onnxruntime only, so it
is set beside ``to_onnx(prog, runtime="onnxruntime")``; every other original beside standard
ONNX. ``--runtime standard`` or ``onnxruntime`` re-emits every file one way.

    python benchmarks/real_files.py                      # the table
    python benchmarks/real_files.py --groups bert resnet --json out.json
    python benchmarks/real_files.py --groups bert --runtime standard   # no com.microsoft ops
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import tdag  # noqa: E402

from support.real_files import GROUPS, File, build, quiet  # noqa: E402

FLOAT_BOUND = 1e-4


def session(model, threads: int, level) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = level
    options.intra_op_num_threads = threads
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def arrays(outputs) -> list[np.ndarray]:
    """Outputs as arrays: a ZipMap's list of {label: p} as [N, C] in its label order."""
    return [np.array([list(row.values()) for row in out], np.float32)
            if isinstance(out, list) else np.asarray(out) for out in outputs]


def error(got, expected) -> float:
    """The largest difference relative to the reference's largest magnitude (integers: 1 if
    any element differs); inf where the shapes or counts differ."""
    if len(got) != len(expected):
        return math.inf
    worst = 0.0
    for g, e in zip(got, expected):
        g, e = np.asarray(g), np.asarray(e)
        if g.shape != e.shape:
            return math.inf
        if e.dtype.kind in "iub":
            worst = max(worst, float(not np.array_equal(g, e)))
        elif e.size:
            scale = max(float(np.nanmax(np.abs(e))), 1e-6)
            worst = max(worst, float(np.nanmax(np.abs(g.astype(np.float64) - e))) / scale)
    return worst


def ort_only(path) -> bool:
    """Whether the file at ``path`` holds onnxruntime's own (com.microsoft) ops."""
    model = onnx.load(str(path), load_external_data=False)
    return any(n.domain == "com.microsoft" for n in model.graph.node)


def emit_runtime(file: File, runtime: str) -> str | None:
    """to_onnx's ``runtime=`` for re-emitting ``file`` (see the module's docstring)."""
    if runtime == "as-original":
        return "onnxruntime" if ort_only(file.path) else None
    return None if runtime == "standard" else runtime


def check(file: File, threads: int = 1, runtime: str = "as-original") -> dict:
    """Import ``file``, run it through tdag.run, to_onnx (for ``runtime``: standard,
    onnxruntime or as-original) and to_torch against onnxruntime on the original: the
    table's row (times not yet measured)."""
    row = {"file": file.name, "tool": file.tool, "quantized": file.quantized}
    if file.failed:
        row["import_error"] = f"the tool failed: {file.failed}"
        return row
    level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        original = session(str(file.path), threads, level)
    except Exception:  # noqa: BLE001  (onnxruntime fails to re-optimise some optimised files)
        level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        original = session(str(file.path), threads, level)
    row["ort_level"] = level.name
    names = [i.name for i in original.get_inputs()]
    expected = [arrays(original.run(None, feeds)) for feeds in file.feeds]
    try:
        with quiet():
            prog = tdag.from_onnx(str(file.path))
    except Exception as exc:  # noqa: BLE001  (the table reports every failure)
        row["import_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        return row
    row["run_error"] = max(error(_outputs(tdag.run(prog, *[torch.from_numpy(f[n]) for n in names])),
                                 ref) for f, ref in zip(file.feeds, expected))
    target = emit_runtime(file, runtime)
    row["emit"] = "ort" if target else "std"
    emitted = session(tdag.to_onnx(prog, runtime=target), threads, level)
    row["onnx_error"] = max(error(arrays(emitted.run(None, f)), ref)
                            for f, ref in zip(file.feeds, expected))
    module = tdag.to_torch(prog)
    with torch.no_grad():
        row["torch_error"] = max(
            error(_outputs(module(*[torch.from_numpy(f[n]) for n in names])), ref)
            for f, ref in zip(file.feeds, expected))
    row["sessions"] = (original, emitted)
    return row


def _outputs(result) -> list:
    return [t.numpy() for t in (result if isinstance(result, (tuple, list)) else (result,))]


def timed(row: dict, feeds: dict, repeats: int) -> None:
    """The median microseconds of the original and the re-emitted file, run in turn."""
    original, emitted = row.pop("sessions")
    times = {"original_us": [], "emitted_us": []}
    for k in range(repeats + 3):  # three warm-up runs each
        for key, s in (("original_us", original), ("emitted_us", emitted)):
            start = time.perf_counter()
            s.run(None, feeds)
            if k >= 3:
                times[key].append((time.perf_counter() - start) * 1e6)
    row.update({k: float(np.median(v)) for k, v in times.items()})
    row["ratio"] = row["emitted_us"] / row["original_us"]


def verdict(row: dict) -> str:
    if "import_error" in row:
        return "no import"
    if row["quantized"]:
        return "quantized"
    worst = max(row["run_error"], row["onnx_error"], row["torch_error"])
    return "ok" if worst <= FLOAT_BOUND else "WRONG"


def geomean(values) -> float:
    values = list(values)
    return math.exp(sum(map(math.log, values)) / len(values)) if values else math.nan


def table(rows: list[dict]) -> str:
    head = f"{'file':42} {'tool':24} {'status':9} {'run err':>9} {'onnx err':>9} " \
           f"{'torch err':>9} {'emit':>4} {'orig us':>9} {'tdag us':>9} {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "import_error" in r:
            lines.append(f"{r['file']:42} {r['tool']:24} {verdict(r):9} {r['import_error']}")
            continue
        lines.append(f"{r['file']:42} {r['tool']:24} {verdict(r):9} {r['run_error']:9.1e} "
                     f"{r['onnx_error']:9.1e} {r['torch_error']:9.1e} {r['emit']:>4} "
                     f"{r['original_us']:9.0f} {r['emitted_us']:9.0f} {r['ratio']:6.2f}")
    for what, keep in (("float", False), ("quantized", True)):
        ratios = [r["ratio"] for r in rows if "ratio" in r and r["quantized"] == keep]
        if ratios:
            lines.append(f"{what}: {len(ratios)} re-emitted, geo-mean ratio "
                         f"{geomean(ratios):.3f}, worst {max(ratios):.2f}")
    imported = sum("import_error" not in r for r in rows)
    lines.append(f"imported {imported} of {len(rows)} files")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", nargs="*", choices=sorted(GROUPS), default=None)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (0: default)")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--runtime", choices=["as-original", "standard", "onnxruntime"],
                        default="as-original",
                        help="to_onnx's runtime= for the re-emitted files: onnxruntime's "
                             "fused kernels where the original has com.microsoft ops (as-"
                             "original), never (standard) or always (onnxruntime)")
    args = parser.parse_args(argv)
    torch.set_num_threads(max(args.threads, 1))
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for file in build(Path(folder), args.groups):
            row = check(file, args.threads, args.runtime)
            if "sessions" in row:
                timed(row, file.feeds[0], args.repeats)
            rows.append(row)
            print(f"{file.name}: {verdict(row)}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
