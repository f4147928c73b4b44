"""Writes at computed positions at a real size, through tdag's ``scatter`` primitive:

    gnn           x.scatter_add(0, dst.expand_as(msg), msg): 200,000 edges x 32 into 20,000
    moe           index_add of 4,096 tokens x 64 into 8 experts' buffers of 1,024 slots
    embedding_bag 100,000 indices into 10,000 bags (sum) of a 50,000 x 64 table
    bincount      1,000,000 values in [0, 1,000) (a length data decides)
    kv_cache      index_copy of 1 step into a [1, 8, 4096, 64] cache (functional: the cache
                  is copied, as eager's out-of-place index_copy does)

Each is a torch function captured with ``tdag.from_torch`` and reified with ``tdag.to_torch``:
its time over eager's (one thread, interleaved medians; target <= 1.5x), then ``tdag.to_onnx``
on onnxruntime over ``torch.onnx.export``'s file where torch exports it; the largest value
the program computes over the largest eager tensor (target <= 2x); and ``tdag.cost``'s flops
over the kernel's own count (one combine per value written: linear).

    python benchmarks/real_sizes_scatter.py
    python benchmarks/real_sizes_scatter.py --scale 0.05 --cases gnn,moe
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
from tdag.ir.symbols import evaluate  # noqa: E402


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _gnn(s):
    nodes, edges = int(20000 * s), int(200000 * s)
    return ((lambda x, dst, msg: x.scatter_add(0, dst[:, None].expand_as(msg), msg)),
            (torch.zeros(nodes, 32), torch.randint(0, nodes, (edges,)), torch.randn(edges, 32)),
            edges * 32)


def _moe(s):
    tokens = int(4096 * s)
    slots = torch.randperm(8 * 1024)[:tokens]  # each token's slot in its expert's buffer
    return ((lambda buf, slot, x: buf.index_add(0, slot, x)),
            (torch.zeros(8 * 1024, 64), slots, torch.randn(tokens, 64)), tokens * 64)


def _embedding_bag(s):
    n, bags = int(100000 * s), int(10000 * s)
    offsets = torch.sort(torch.randint(0, n, (bags,))).values
    offsets[0] = 0
    return ((lambda w, i, o: torch.nn.functional.embedding_bag(i, w, o, mode="sum")),
            (torch.randn(50000, 64), torch.randint(0, 50000, (n,)), offsets), n * 64)


def _bincount(s):
    n = int(1000000 * s)
    return (lambda x: torch.bincount(x)), (torch.randint(0, 1000, (n,)),), n


def _kv_cache(s):
    return ((lambda cache, pos, k: torch.index_copy(cache, 2, pos, k)),
            (torch.randn(1, 8, 4096, 64), torch.tensor([1234]), torch.randn(1, 8, 1, 64)),
            None)  # a copy: no arithmetic to count


CASES = {"gnn": _gnn, "moe": _moe, "embedding_bag": _embedding_bag, "bincount": _bincount,
         "kv_cache": _kv_cache}


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
    """torch.onnx.export's file, or the exporter's error name where torch does not export."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(module, args, buffer, dynamo=False, opset_version=20)
    except Exception as e:  # noqa: BLE001 - any exporter failure means "does not export"
        return type(e).__name__
    return buffer.getvalue()


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


def _largest_value(prog, dims) -> int:
    """Bytes of the largest value the program computes."""
    return max((int(evaluate(n.type.nbytes, dims)) for n in prog.graph.nodes), default=0)


def _feeds(session, args) -> dict:
    return {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}


def measure(name: str, scale: float, rounds: int) -> dict:
    fn, args, kernel_flops = CASES[name](scale)
    module = Fn(fn)
    prog = tdag.from_torch(module, args)
    reified = tdag.to_torch(prog)
    with torch.no_grad():
        want = module(*args)
        torch.testing.assert_close(reified(*args), want)
        eager_s, tdag_s = interleaved(lambda: module(*args), lambda: reified(*args), rounds)
    eager_largest = max(t.numel() * t.element_size() for t in (*args, want))
    dims = _bindings(prog, args, (want,))
    row = {"case": name, "eager_ms": eager_s * 1e3, "tdag_ms": tdag_s * 1e3,
           "torch_ratio": tdag_s / eager_s,
           "memory_ratio": _largest_value(prog, dims) / eager_largest,
           "flops_ratio": evaluate(tdag.cost(prog).flops, dims) / kernel_flops
           if kernel_flops else float("nan")}
    ours = _session(tdag.to_onnx(prog).SerializeToString())
    theirs_file = _exported(module, args)
    if isinstance(theirs_file, bytes):
        theirs = _session(theirs_file)
        export_s, onnx_s = interleaved(lambda: theirs.run(None, _feeds(theirs, args)),
                                       lambda: ours.run(None, _feeds(ours, args)), rounds)
        row.update(onnx_ms=onnx_s * 1e3, export_ms=f"{export_s * 1e3:.2f}",
                   onnx_ratio=f"{onnx_s / export_s:.2f}")
    else:
        start = time.perf_counter()
        for _ in range(rounds):
            ours.run(None, _feeds(ours, args))
        row.update(onnx_ms=(time.perf_counter() - start) / rounds * 1e3,
                   export_ms=theirs_file[:11], onnx_ratio="-")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="of every case's sizes")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print(f"scale {args.scale}, one thread, medians of {args.rounds} interleaved rounds")
    print(f"{'case':<14}{'eager ms':>10}{'tdag ms':>10}{'ratio':>7}{'ort ms':>9}"
          f"{'export ms':>12}{'ratio':>7}{'memory':>8}{'flops':>7}")
    for name in args.cases.split(","):
        r = measure(name, args.scale, args.rounds)
        print(f"{name:<14}{r['eager_ms']:>10.2f}{r['tdag_ms']:>10.2f}{r['torch_ratio']:>7.2f}"
              f"{r['onnx_ms']:>9.2f}{r['export_ms']:>12}{r['onnx_ratio']:>7}"
              f"{r['memory_ratio']:>8.2f}{r['flops_ratio']:>7.2f}")


if __name__ == "__main__":
    main()
