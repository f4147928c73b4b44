"""The writes, order statistics and scans of issue 21 at the sizes real models use, each run
through tdag's ``scatter``, ``sort`` and ``scan`` primitives:

    argmax-1/8        argmax over a 128,000-word vocabulary, [1, 128000] and [8, 128000]
    topk-1/8          torch.topk(k=50) over the vocabulary
    top-k-filter-1/8  transformers' TopKLogitsWarper (k=50)
    top-p-filter-1/8  transformers' TopPLogitsWarper (p=0.9): sort, softmax, cumsum, scatter
    sort-1m           torch.sort of 1,000,000 floats (values and permutation)
    unique-100k       torch.unique of 100,000 ids in [0, 32,000)
    searchsorted      100,000 values among 10,000 sorted boundaries
    cumsum, cumprod, cummax, logcumsumexp   over 65,536 positions, [8, 65536]
    gnn               x.scatter_add of 200,000 edges x 32 features into 20,000 nodes
    moe               index_add of 4,096 tokens x 64 into 8 experts' buffers of 1,024 slots
    embedding_bag     100,000 indices into 10,000 bags (sum) of a 50,000 x 64 table
    bincount          1,000,000 values in [0, 1,000) (a length data decides)
    kv_cache          index_copy of one step into a [1, 8, 4096, 64] cache (functional: the
                      cache is copied, as eager's out-of-place index_copy does)

Each is a torch function captured with ``tdag.from_torch`` and reified (lowered) with
``tdag.to_torch``, checked against eager, then measured; one row per case:

    eager ms, tdag ms, torch x  tdag's time over eager's (one thread, interleaved medians;
                                the issue's target <= 1.5x)
    ort ms, onnx x              ``tdag.to_onnx`` on onnxruntime (one thread), over
                                ``torch.onnx.export``'s file ("no export" where torch does
                                not export the function)
    memory x                    the largest value the lowered program computes over the
                                largest tensor eager's call reads or returns (a proxy for
                                peak memory; target <= 2x)
    flops x                     ``tdag.cost``'s flops over the framework kernel's own count
                                (n log2 n for a sort, n for a scan or an argmax, one combine
                                per value written for a scatter; target <= 2x)

    python benchmarks/real_sizes.py                        # every case, full size
    python benchmarks/real_sizes.py --scale 0.1            # every size a tenth: a quick run
    python benchmarks/real_sizes.py --cases gnn,topk-8 --rounds 11 --json out.json
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import onnxruntime as ort
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tdag  # noqa: E402
from tdag.ir.symbols import symbol  # noqa: E402
from tdag.lower import lower  # noqa: E402

VOCAB = 128_000


class Fn(torch.nn.Module):
    """A module whose forward is ``fn``, as from_torch and torch.onnx.export take it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


@dataclass(frozen=True)
class Case:
    fn: Callable
    inputs: Callable[[float], tuple]  # scale -> the arguments
    kernel_flops: Callable[[tuple], float | None]  # the framework kernel's count; None: a copy


def _n(size: int, scale: float) -> int:
    return max(2, int(size * scale))


def _sorted(args) -> float:
    """n log2 n over every row of the first argument (the elements sorted)."""
    x = args[0]
    return x.numel() * math.log2(x.shape[-1])


# -- order statistics ------------------------------------------------------------------------

def _top50(args) -> float:
    """n log2 k over every row (k = 50): a heap of the k largest, as top-k kernels keep."""
    return args[0].numel() * math.log2(50)


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


def _logits(rows: int):
    return lambda s: (torch.randn(rows, _n(VOCAB, s)),)


def _search(s):
    return torch.sort(torch.randn(_n(10_000, s))).values, torch.randn(_n(100_000, s))


ORDER = {
    "argmax-1": Case(lambda x: torch.argmax(x, -1), _logits(1), lambda a: a[0].numel()),
    "argmax-8": Case(lambda x: torch.argmax(x, -1), _logits(8), lambda a: a[0].numel()),
    "topk-1": Case(lambda x: torch.topk(x, 50), _logits(1), _top50),
    "topk-8": Case(lambda x: torch.topk(x, 50), _logits(8), _top50),
    "top-k-filter-1": Case(_top_k_filter, _logits(1), _top50),
    "top-k-filter-8": Case(_top_k_filter, _logits(8), _top50),
    "top-p-filter-1": Case(_top_p_filter, _logits(1), _sorted),
    "top-p-filter-8": Case(_top_p_filter, _logits(8), _sorted),
    "sort-1m": Case(lambda x: torch.sort(x, stable=True),  # tdag's sort is stable: its ties
                    lambda s: (torch.randn(_n(1_000_000, s)),), _sorted),
    "unique-100k": Case(lambda x: torch.unique(x),
                        lambda s: (torch.randint(0, 32_000, (_n(100_000, s),)),), _sorted),
    # the kernel's binary search: log2(boundaries) comparisons per value
    "searchsorted": Case(lambda b, v: torch.searchsorted(b, v), _search,
                         lambda a: a[1].numel() * math.log2(a[0].numel())),
}


# -- scans: one combine per element ----------------------------------------------------------

def _rows(draw):
    return lambda s: (draw(8, _n(65_536, s)),)


SCANS = {
    "cumsum": Case(lambda x: torch.cumsum(x, 1), _rows(torch.randn), lambda a: a[0].numel()),
    "cumprod": Case(lambda x: torch.cumprod(x, 1),
                    _rows(lambda r, n: 1 + torch.randn(r, n) * 1e-3), lambda a: a[0].numel()),
    "cummax": Case(lambda x: tuple(torch.cummax(x, 1)), _rows(torch.randn),
                   lambda a: a[0].numel()),
    # ATen's log-add-exp per element: min, max, their difference, exp, log1p and an add
    "logcumsumexp": Case(lambda x: torch.logcumsumexp(x, 1), _rows(torch.randn),
                         lambda a: 6 * a[0].numel()),
}


# -- writes at computed positions: one combine per value written -----------------------------

def _gnn(s):
    nodes, edges = _n(20_000, s), _n(200_000, s)
    return torch.zeros(nodes, 32), torch.randint(0, nodes, (edges,)), torch.randn(edges, 32)


def _moe(s):
    slots = torch.randperm(8 * 1024)[:_n(4096, s)]  # each token's slot in its expert's buffer
    return torch.zeros(8 * 1024, 64), slots, torch.randn(len(slots), 64)


def _embedding_bag(s):
    n = _n(100_000, s)
    offsets = torch.sort(torch.randint(0, n, (_n(10_000, s),))).values
    offsets[0] = 0
    return torch.randn(50_000, 64), torch.randint(0, 50_000, (n,)), offsets


def _kv_cache(s):
    positions = _n(4096, s)
    return torch.randn(1, 8, positions, 64), torch.tensor([positions // 3]), \
        torch.randn(1, 8, 1, 64)


WRITES = {
    "gnn": Case(lambda x, dst, msg: x.scatter_add(0, dst[:, None].expand_as(msg), msg), _gnn,
                lambda a: a[2].numel()),
    "moe": Case(lambda buf, slot, x: buf.index_add(0, slot, x), _moe, lambda a: a[2].numel()),
    "embedding_bag": Case(
        lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o, mode="sum"),
        _embedding_bag, lambda a: a[1].numel() * a[0].shape[1]),
    # ATen's CPU bincount makes three passes: min (no negative value), max (the length) and
    # the count (SummaryOps.cpp), as tdag's composition does
    "bincount": Case(lambda x: torch.bincount(x),
                     lambda s: (torch.randint(0, 1000, (_n(1_000_000, s),)),),
                     lambda a: 3 * a[0].numel()),
    "kv_cache": Case(lambda cache, pos, k: torch.index_copy(cache, 2, pos, k), _kv_cache,
                     lambda a: None),  # a copy: no arithmetic to count
}

CASES = {**ORDER, **SCANS, **WRITES}


# -- measuring -------------------------------------------------------------------------------

def interleaved(a, b, rounds: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, timed in alternating order (so drift in
    the machine's load falls on both)."""
    for _ in range(2):
        a(), b()
    times = ([], [])
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            (a, b)[i]()
            times[i].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def session(model_bytes: bytes) -> ort.InferenceSession:
    """onnxruntime on one thread, as eager is timed."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


@contextlib.contextmanager
def _silenced():
    """Standard output and error to /dev/null at the file descriptors: the exporter logs
    its failures from C++, past Python's streams."""
    sys.stdout.flush()
    saved = [os.dup(fd) for fd in (1, 2)]
    with open(os.devnull, "w") as null:
        for fd in (1, 2):
            os.dup2(null.fileno(), fd)
        try:
            yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


def exported(module, args) -> bytes | None:
    """torch.onnx.export's file, or None where torch does not export the function."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), _silenced():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, buffer, dynamo=False, opset_version=20)
    except Exception:  # noqa: BLE001 - any exporter failure means "does not export"
        return None
    return buffer.getvalue()


def _feeds(sess, args) -> dict:
    return {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}


def _bindings(prog, args, outs) -> dict:
    """The program's size symbols as this run binds them (inputs, then outputs: a length
    data decides)."""
    types = [v.type for v in prog.inputs] + \
        [n.type for n in prog.graph.nodes if n.name in prog.graph.outputs]
    dims = {}
    for t, x in zip(types, (*args, *outs)):
        for d, n in zip(t.shape, x.shape):
            if getattr(d, "is_Symbol", False):
                dims[d.name] = n
    return dims


def _number(expr, dims) -> float:
    """``expr`` (a size or a cost, log2 terms included) with ``dims`` bound."""
    if isinstance(expr, (int, float)):
        return float(expr)
    return float(expr.subs({symbol(k): v for k, v in dims.items()}))


def _onnx(module, prog, args, rounds: int) -> dict:
    """tdag.to_onnx's time on onnxruntime, over torch.onnx.export's file where it exports."""
    ours = session(tdag.to_onnx(prog).SerializeToString())
    theirs_file = exported(module, args)
    if theirs_file is None:
        start = time.perf_counter()
        for _ in range(rounds):
            ours.run(None, _feeds(ours, args))
        return {"onnx_ms": (time.perf_counter() - start) / rounds * 1e3, "export_ms": None,
                "onnx_ratio": None}
    theirs = session(theirs_file)
    export_s, onnx_s = interleaved(lambda: theirs.run(None, _feeds(theirs, args)),
                                   lambda: ours.run(None, _feeds(ours, args)), rounds)
    return {"onnx_ms": onnx_s * 1e3, "export_ms": export_s * 1e3,
            "onnx_ratio": onnx_s / export_s}


def measure(name: str, scale: float, rounds: int) -> dict:
    """One case's row (see the module docstring)."""
    case = CASES[name]
    torch.manual_seed(0)
    args = case.inputs(scale)
    module = Fn(case.fn).eval()
    prog = tdag.from_torch(module, args)
    lowered = lower(prog)
    reified = tdag.to_torch(lowered, lower=False)
    with torch.no_grad():
        want = torch.utils._pytree.tree_leaves(module(*args))
        torch.testing.assert_close(torch.utils._pytree.tree_leaves(reified(*args)), want)
        eager_s, tdag_s = interleaved(lambda: module(*args), lambda: reified(*args), rounds)
    dims = _bindings(prog, args, want)
    largest = max(_number(n.type.nbytes, dims) for n in lowered.graph.nodes)
    kernel = case.kernel_flops(args)
    return {"case": name, "eager_ms": eager_s * 1e3, "tdag_ms": tdag_s * 1e3,
            "torch_ratio": tdag_s / eager_s,
            **_onnx(module, prog, args, rounds),
            "memory_ratio": largest / max(t.numel() * t.element_size() for t in (*args, *want)),
            "flops_ratio": _number(tdag.cost(prog).flops, dims) / kernel if kernel else None}


COLUMNS = (("case", "<16", "{}"), ("eager ms", ">10", "{:.2f}"), ("tdag ms", ">10", "{:.2f}"),
           ("torch x", ">8", "{:.2f}"), ("ort ms", ">10", "{:.2f}"), ("onnx x", ">11", "{:.2f}"),
           ("memory x", ">9", "{:.2f}"), ("flops x", ">8", "{:.2f}"))
KEYS = ("case", "eager_ms", "tdag_ms", "torch_ratio", "onnx_ms", "onnx_ratio", "memory_ratio",
        "flops_ratio")
MISSING = {"onnx_ratio": "no export", "flops_ratio": "-"}


def _line(row: dict) -> str:
    cells = []
    for (_, align, form), key in zip(COLUMNS, KEYS):
        value = row[key]
        cells.append(format(MISSING[key] if value is None else form.format(value), align))
    return "".join(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--scale", type=float, default=1.0, help="of every case's sizes")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args()
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; known: {', '.join(CASES)}")
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)  # torch's own deprecations, not ours
    print(f"scale {args.scale}, one thread, medians of {args.rounds} interleaved rounds")
    print("".join(format(title, align) for title, align, _ in COLUMNS))
    rows = []
    for name in args.cases.split(","):
        rows.append(measure(name, args.scale, args.rounds))
        print(_line(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
