"""Cumulative ops at a real size: cumsum, cumprod, cummax (values and indices) and
logcumsumexp over 65,536 positions ([8, 65536]).

Each is a torch function captured with ``tdag.from_torch`` and reified with ``tdag.to_torch``
(lowered): its time over eager's (one thread, interleaved medians; target <= 1.5x), then
``tdag.to_onnx`` on onnxruntime over ``torch.onnx.export``'s file where torch exports it, and
``tdag.cost``'s flops per element (a scan is linear: a small constant; the unfolded
composition it replaced counted n/2 per element).

    python benchmarks/real_sizes_scan.py                 # [8, 65536]
    python benchmarks/real_sizes_scan.py --n 2048        # a smaller axis
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import sys
import time
import warnings

import onnxruntime as ort
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tdag  # noqa: E402


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


CASES = {
    "cumsum": (lambda x: torch.cumsum(x, 1), lambda r, n: torch.randn(r, n)),
    "cumprod": (lambda x: torch.cumprod(x, 1), lambda r, n: 1 + torch.randn(r, n) * 1e-3),
    "cummax": (lambda x: tuple(torch.cummax(x, 1)), lambda r, n: torch.randn(r, n)),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), lambda r, n: torch.randn(r, n)),
}


def interleaved(a, b, rounds: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, timed in alternating order."""
    for _ in range(2):
        a(), b()
    times = ([], [])
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            (a, b)[i]()
            times[i].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def _session(model_bytes: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def _exported(module, x) -> bytes | None:
    """torch.onnx.export's file, or None where torch does not export the op."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (x,), buffer, dynamo=False, opset_version=20)
    except Exception as e:  # noqa: BLE001 - any exporter failure means "does not export"
        return type(e).__name__
    return buffer.getvalue()


def measure(name: str, rows: int, n: int, rounds: int) -> dict:
    fn, draw = CASES[name]
    x = draw(rows, n)
    module = Fn(fn)
    prog = tdag.from_torch(module, (x,))
    reified = tdag.to_torch(prog)
    with torch.no_grad():
        eager_s, tdag_s = interleaved(lambda: module(x), lambda: reified(x), rounds)
    row = {"case": name, "eager_ms": eager_s * 1e3, "tdag_ms": tdag_s * 1e3,
           "torch_ratio": tdag_s / eager_s,
           "flops_per_element": float(tdag.cost(prog).flops) / (rows * n)}
    ours = _session(tdag.to_onnx(prog).SerializeToString())
    feed_ours = {ours.get_inputs()[0].name: x.numpy()}
    theirs_file = _exported(module, x)
    if isinstance(theirs_file, bytes):
        theirs = _session(theirs_file)
        feed_theirs = {theirs.get_inputs()[0].name: x.numpy()}
        export_s, onnx_s = interleaved(lambda: theirs.run(None, feed_theirs),
                                       lambda: ours.run(None, feed_ours), rounds)
        row.update(onnx_ms=onnx_s * 1e3, export_ms=export_s * 1e3, onnx_ratio=onnx_s / export_s)
    else:
        start = time.perf_counter()
        for _ in range(rounds):
            ours.run(None, feed_ours)
        row.update(onnx_ms=(time.perf_counter() - start) / rounds * 1e3,
                   export_ms="no export", onnx_ratio=None)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--n", type=int, default=65536)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"[{args.rows}, {args.n}], one thread, medians of {args.rounds} interleaved rounds")
    print(f"{'case':<14}{'eager ms':>10}{'tdag ms':>10}{'ratio':>8}{'ort ms':>10}"
          f"{'export ms':>12}{'ratio':>8}{'flops/elt':>11}")
    for name in args.cases.split(","):
        r = measure(name, args.rows, args.n, args.rounds)
        export = r["export_ms"] if isinstance(r["export_ms"], str) else f"{r['export_ms']:.2f}"
        ratio = "-" if r["onnx_ratio"] is None else f"{r['onnx_ratio']:.2f}"
        print(f"{name:<14}{r['eager_ms']:>10.2f}{r['tdag_ms']:>10.2f}{r['torch_ratio']:>8.2f}"
              f"{r['onnx_ms']:>10.2f}{export:>12}{ratio:>8}{r['flops_per_element']:>11.1f}")


if __name__ == "__main__":
    main()
