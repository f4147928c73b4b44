"""Order statistics at real sizes: argmax, top-k (k=50) and top-p filtering over a
128,000-word vocabulary ([1, 128000] and [8, 128000]), a sort of 1,000,000 floats, unique over
100,000 ids, searchsorted of 100,000 values in 10,000 boundaries.

Each is a torch function captured with ``tdag.from_torch`` and reified with ``tdag.to_torch``
(lowered): its time over eager's (one thread, interleaved medians; target <= 1.5x), then
``tdag.to_onnx`` on onnxruntime over ``torch.onnx.export``'s file where torch exports it, and
``tdag.cost``'s flops over n log2 n (n the elements sorted; argmax: over n).

    python benchmarks/real_sizes_sort.py
    python benchmarks/real_sizes_sort.py --cases argmax-1,topk-8 --rounds 11
"""
from __future__ import annotations

import argparse
import contextlib
import io
import math
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

    def forward(self, *args):
        return self.fn(*args)


VOCAB = 128_000


def _top_k_filter(logits):
    """transformers' TopKLogitsWarper: everything below the 50th largest is -inf."""
    kth = torch.topk(logits, 50)[0][..., -1, None]
    return logits.masked_fill(logits < kth, -float("inf"))


def _top_p_filter(logits):
    """transformers' TopPLogitsWarper (top_p 0.9): sort, softmax, cumsum, mask, and the mask
    sent back to vocabulary order."""
    sorted_logits, sorted_indices = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= 1 - 0.9
    remove[..., -1:] = 0
    remove = remove.scatter(1, sorted_indices, remove)
    return logits.masked_fill(remove, -float("inf"))


def _logits(rows):
    return lambda: (torch.randn(rows, VOCAB),)


def _ids():
    return (torch.randint(0, 32_000, (100_000,)),)


def _search():
    return torch.sort(torch.randn(10_000)).values, torch.randn(100_000)


# name: (function, inputs, n for n log2 n: the elements sorted per call)
CASES = {
    "argmax-1": (lambda x: torch.argmax(x, -1), _logits(1), VOCAB),
    "argmax-8": (lambda x: torch.argmax(x, -1), _logits(8), 8 * VOCAB),
    "topk-1": (lambda x: torch.topk(x, 50), _logits(1), VOCAB),
    "topk-8": (lambda x: torch.topk(x, 50), _logits(8), 8 * VOCAB),
    "top-k-filter-1": (_top_k_filter, _logits(1), VOCAB),
    "top-k-filter-8": (_top_k_filter, _logits(8), 8 * VOCAB),
    "top-p-filter-1": (_top_p_filter, _logits(1), VOCAB),
    "top-p-filter-8": (_top_p_filter, _logits(8), 8 * VOCAB),
    "sort-1m": (lambda x: torch.sort(x), lambda: (torch.randn(1_000_000),), 1_000_000),
    "unique-100k": (lambda x: torch.unique(x), _ids, 100_000),
    "searchsorted": (lambda b, v: torch.searchsorted(b, v), _search, 110_000),
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


def _exported(module, args) -> bytes | str:
    """torch.onnx.export's file, or why torch does not export the function."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, buffer, dynamo=False, opset_version=20)
    except Exception as e:  # noqa: BLE001 - any exporter failure means "does not export"
        return type(e).__name__
    return buffer.getvalue()


def _feed(session, args):
    return {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}


def measure(name: str, rounds: int) -> dict:
    fn, draw, n = CASES[name]
    args = draw()
    module = Fn(fn)
    prog = tdag.from_torch(module, args)
    reified = tdag.to_torch(prog)
    with torch.no_grad():
        eager_s, tdag_s = interleaved(lambda: module(*args), lambda: reified(*args), rounds)
    scale = n if name.startswith("argmax") else n * math.log2(n)
    row = {"case": name, "eager_ms": eager_s * 1e3, "tdag_ms": tdag_s * 1e3,
           "torch_ratio": tdag_s / eager_s, "flops_ratio": float(tdag.cost(prog).flops) / scale}
    ours = _session(tdag.to_onnx(prog).SerializeToString())
    feed_ours = _feed(ours, args)
    theirs_file = _exported(module, args)
    if isinstance(theirs_file, bytes):
        theirs = _session(theirs_file)
        feed_theirs = _feed(theirs, args)
        export_s, onnx_s = interleaved(lambda: theirs.run(None, feed_theirs),
                                       lambda: ours.run(None, feed_ours), rounds)
        row.update(onnx_ms=onnx_s * 1e3, export_ms=export_s * 1e3, onnx_ratio=onnx_s / export_s)
    else:
        start = time.perf_counter()
        for _ in range(rounds):
            ours.run(None, feed_ours)
        row.update(onnx_ms=(time.perf_counter() - start) / rounds * 1e3,
                   export_ms=theirs_file, onnx_ratio=None)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"one thread, medians of {args.rounds} interleaved rounds")
    print(f"{'case':<16}{'eager ms':>10}{'tdag ms':>10}{'ratio':>8}{'ort ms':>10}"
          f"{'export ms':>18}{'ratio':>8}{'flops/nlogn':>13}")
    for name in args.cases.split(","):
        r = measure(name, args.rounds)
        export = r["export_ms"] if isinstance(r["export_ms"], str) else f"{r['export_ms']:.2f}"
        ratio = "-" if r["onnx_ratio"] is None else f"{r['onnx_ratio']:.2f}"
        print(f"{name:<16}{r['eager_ms']:>10.2f}{r['tdag_ms']:>10.2f}{r['torch_ratio']:>8.2f}"
              f"{r['onnx_ms']:>10.2f}{export:>18}{ratio:>8}{r['flops_ratio']:>13.2f}", flush=True)


if __name__ == "__main__":
    main()
