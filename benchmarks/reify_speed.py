"""How fast is reified code? tdag's torch module vs the eager original, and tdag's ONNX vs
``torch.onnx.export``'s file on onnxruntime, as exported and after onnxruntime's own offline
optimiser (``SessionOptions.optimized_model_filepath``).

Each model goes torch -> ``tdag.from_torch`` -> ``tdag.lower`` -> ``to_torch`` / ``to_onnx``.
The sides of each comparison are timed interleaved (the order rotates every round); the ms
columns are each side's median, a ratio the median over rounds of that round's ratio (its
two sides timed back to back, so a machine whose speed drifts slows both alike). A ratio
below 1 means tdag's version is faster. Issue 25's targets: tdag's ONNX over the exporter's
<= 0.95x geo-mean, none above 1.05x; the torch module over eager <= 0.6x geo-mean; outputs
within 1e-5 relative.

    eager, tdag, torch x     eager ms, the reified module's ms, tdag / eager
    export, export-opt       the exporter's file on onnxruntime, and that file after
                             onnxruntime's offline optimiser (saved, then loaded as a file)
    tdag-onnx, x exp, x opt  ``to_onnx``'s file on onnxruntime, over each of the two
    nodes                    ONNX nodes (subgraphs included): tdag / export / export-opt
    err                      the largest relative error of the three files and the module
    floor                    the program's matmul flops (``tdag.cost``: products,
                             convolutions, attention, an LSTM's gates) at the peak rate
                             of one float32 GEMM (512^3, measured here) / eager: what a
                             module doing nothing but its products at full speed would take

    python benchmarks/reify_speed.py                        # issue 25's eleven models
    python benchmarks/reify_speed.py --models mlp,cnn --rounds 30   # the small models
    python benchmarks/reify_speed.py --models gpt2 --ops    # op types of both optimised files
    python benchmarks/reify_speed.py --save /tmp/files      # keep the four files per model
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import io
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "benchmarks"), os.path.join(ROOT, "tests")]

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

import tdag  # noqa: E402
import tdag.lower  # noqa: E402
from tdag.canonicalize import from_torch  # noqa: E402
from tdag.reify import to_onnx, to_torch  # noqa: E402
from support.torch_models import (CNN, MLP, Decoder, Encoder, Tagger, UNetBlock,  # noqa: E402
                                  attention_mask, padding_mask)

# one thread each for torch and onnxruntime: on a shared machine, thread pools that wait
# for busy cores make small kernels 100x slower at random, which no interleaving evens out
THREADS = 1
LEVELS = {"extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


class First(torch.nn.Module):
    """A transformers model's first output (logits or the last hidden state): one tensor,
    as both exporters take it, without the KV cache an LM would return beside it."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        if hasattr(model.config, "use_cache"):
            model.config.use_cache = False

    def forward(self, *args):
        return self.model(*args)[0]


def _transformers(name: str):
    """A builder of benchmarks/train_step_speed.py, taking a scale of its widths."""
    def build(scale: float):
        import train_step_speed  # transformers loads only where a model needs it
        model, args, _ = train_step_speed.MODELS[name](scale)
        return First(model), args
    return build


def _fixed(factory, inputs):
    return lambda scale: (factory(), inputs())


# name -> scale -> (model, example inputs): sizes where kernels, not Python, take the time
MODELS = {
    **{name: _transformers(name) for name in (
        "gpt2", "bert", "llama", "vit", "resnet", "convnext", "mobilenet-v2", "t5-encoder",
        "whisper-encoder")},
    "tagger": _fixed(lambda: Tagger(200, 64, 64, 9), lambda: (torch.randint(1, 200, (8, 24)),)),
    "unet": _fixed(lambda: UNetBlock(16), lambda: (torch.randn(4, 16, 64, 64),)),
    "mlp": _fixed(lambda: MLP((256, 512, 512, 10)), lambda: (torch.randn(64, 256),)),
    "cnn": _fixed(lambda: CNN(3, 10), lambda: (torch.randn(16, 3, 32, 32),)),
    "encoder": _fixed(lambda: Encoder(128, 4, 2),
                      lambda: (torch.randn(8, 64, 128), padding_mask(8, 64))),
    "decoder": _fixed(lambda: Decoder(vocab=512, d=128, layers=2, heads=4, kv_heads=2,
                                      hidden=256),
                      lambda: (torch.randint(1, 512, (4, 64)), attention_mask(4, 64))),
}
ISSUE_25 = ("gpt2", "bert", "llama", "vit", "resnet", "convnext", "mobilenet-v2", "t5-encoder",
            "whisper-encoder", "tagger", "unet")


def set_threads(n: int) -> None:
    global THREADS
    THREADS = n
    torch.set_num_threads(n)


def round_times(fns, rounds: int, inner: int) -> list[list[float]]:
    """Seconds per call of each of ``fns`` in each round, the order rotating every round."""
    for _ in range(3):  # warm up every side
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for r in range(rounds):
        order = list(range(len(fns)))
        order = order[r % len(fns):] + order[:r % len(fns)]
        for i in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            for _ in range(inner):
                fns[i]()
            times[i].append((time.perf_counter() - start) / inner)
    return times


def paired_ratio(times: list[float], reference: list[float]) -> float:
    """The median over rounds of each round's ``times / reference``: the two timed back to
    back, so a machine whose speed drifts between rounds (a shared core: the 512^3 product
    read 92-145 GFLOP/s between runs on one Xeon) moves both sides of each ratio alike."""
    return statistics.median(t / r for t, r in zip(times, reference))


def paired_quartiles(times: list[float], reference: list[float]) -> tuple[float, float]:
    """The first and third quartiles over rounds of each round's ``times / reference``: how
    far one run's ratio can be trusted on this machine (the geo-mean's band in ``main``)."""
    q1, _, q3 = statistics.quantiles([t / r for t, r in zip(times, reference)], n=4)
    return q1, q3


def interleaved_all(fns, rounds: int, inner: int) -> list[float]:
    """Median seconds per call of each of ``fns``, the order rotating every round.

    Not for two variants of one module: the rotation often runs the second slot right after
    the first, and a module called after its twin finds its shapes warm (two instances of
    one reified MobileNet-v2 came out 0.89-0.95 of each other, a UNet block 0.93). Use
    ``after_each`` there."""
    return [statistics.median(t) for t in round_times(fns, rounds, inner)]


def after_each(reference, variants, rounds: int, inner: int) -> tuple[float, list[float]]:
    """Median seconds per call of ``reference`` and of each of ``variants``, each variant's
    calls timed right after ``reference``'s (as ``interleaved`` times a module after eager),
    the variants' order reversed every other round: an A/B of variants of one module, whose
    twins measured so agree within 2% (MobileNet-v2 1.009 and 1.012, a UNet block 0.990 and
    1.015)."""
    for _ in range(3):
        for fn in (reference, *variants):
            fn()
    ref, times = [], [[] for _ in variants]
    for r in range(rounds):
        order = range(len(variants)) if r % 2 == 0 else reversed(range(len(variants)))
        for i in order:
            for fn, out in ((reference, ref), (variants[i], times[i])):
                start = time.perf_counter()
                for _ in range(inner):
                    fn()
                out.append((time.perf_counter() - start) / inner)
    return statistics.median(ref), [statistics.median(t) for t in times]


def interleaved(a, b, rounds: int, inner: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, timed in alternating order."""
    t_a, t_b = interleaved_all((a, b), rounds, inner)
    return t_a, t_b


def _inner(fn, budget: float = 0.02) -> int:
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-6)
    return max(1, min(200, int(budget / once)))


def _options(level: str = "all", save: str | None = None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = options.inter_op_num_threads = THREADS
    options.graph_optimization_level = LEVELS[level]
    if save:
        options.optimized_model_filepath = save
    return options


def _session(model_bytes: bytes) -> ort.InferenceSession:
    return ort.InferenceSession(model_bytes, _options(), providers=["CPUExecutionProvider"])


def optimised(model_bytes: bytes, path: str, level: str) -> bytes:
    """``model_bytes`` after onnxruntime's offline optimiser at ``level``, saved to ``path``."""
    ort.InferenceSession(model_bytes, _options(level, path), providers=["CPUExecutionProvider"])
    with open(path, "rb") as f:
        return f.read()


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stdout, sys.stdout = sys.stdout, io.StringIO()
        try:
            yield
        finally:
            sys.stdout = stdout


def _torch_onnx(model, args) -> bytes:
    with _quiet():
        program = torch.onnx.export(model, args, dynamo=True)
    return program.model_proto.SerializeToString()


def op_counts(model_bytes: bytes) -> collections.Counter:
    """How many nodes of each op type (``domain:op`` outside ONNX's), subgraphs included."""
    graphs, counts = [onnx.load_from_string(model_bytes).graph], collections.Counter()
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            counts[f"{node.domain}:{node.op_type}" if node.domain else node.op_type] += 1
            graphs.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return counts


def _error(got, want) -> float:
    return max(float(np.abs(np.asarray(g) - w).max() / (np.abs(w).max() + 1e-12))
               for g, w in zip(got, want))


def _files(model, args, lowered, folder: str, level: str, runtime: str | None) -> dict:
    """name -> the bytes of tdag's file, the exporter's, and both after the optimiser."""
    files = {"tdag": to_onnx(lowered, lower=False, runtime=runtime).SerializeToString(),
             "export": _torch_onnx(model, args)}
    for name in ("tdag", "export"):
        files[f"{name}-opt"] = optimised(files[name], os.path.join(folder, f"{name}-opt.onnx"),
                                         level)
    for name in ("tdag", "export"):
        with open(os.path.join(folder, f"{name}.onnx"), "wb") as f:
            f.write(files[name])
    return files


def bench(name: str, rounds: int, scale: float = 2.0, level: str = "all",
          runtime: str | None = None, save: str | None = None) -> dict:
    torch.manual_seed(0)
    with _quiet():
        model, args = MODELS[name](scale)
        model = model.eval()
        prog = from_torch(model, args)
    lowered = tdag.lower.lower(prog)
    module = to_torch(lowered, lower=False).eval()
    with torch.inference_mode():
        ref = [r.numpy() for r in torch.utils._pytree.tree_leaves(model(*args))]
        got = module(*args)
    got = got if isinstance(got, tuple) else (got,)
    errors = [_error([g.numpy() for g in got], ref)]

    def eager():
        with torch.inference_mode():
            return model(*args)

    def reified():
        with torch.inference_mode():
            return module(*args)

    eager_times, tdag_times = round_times((eager, reified), rounds, _inner(eager))
    folder = save and os.path.join(save, name)
    with tempfile.TemporaryDirectory() as tmp:
        if folder:
            os.makedirs(folder, exist_ok=True)
        files = _files(model, args, lowered, folder or tmp, level, runtime)
    runs = {}
    for key in ("export", "export-opt", "tdag"):
        sess = _session(files[key])
        feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
        runs[key] = (lambda s, f: lambda: s.run(None, f))(sess, feed)
        errors.append(_error(runs[key](), ref))
    export, opt, ours = round_times(list(runs.values()), rounds, _inner(runs["export"]))
    counts = {key: op_counts(data) for key, data in files.items()}
    floor = float(tdag.cost(prog).matmul_flops) / gemm_rate()
    t_eager = statistics.median(eager_times)
    return {"model": name, "floor": floor / t_eager, "eager_ms": t_eager * 1e3,
            "tdag_ms": statistics.median(tdag_times) * 1e3,
            "torch_ratio": paired_ratio(tdag_times, eager_times),
            "torch_quartiles": paired_quartiles(tdag_times, eager_times),
            "export_ms": statistics.median(export) * 1e3, "opt_ms": statistics.median(opt) * 1e3,
            "onnx_ms": statistics.median(ours) * 1e3, "export_ratio": paired_ratio(ours, export),
            "opt_ratio": paired_ratio(ours, opt), "counts": counts,
            "nodes": "/".join(str(sum(counts[k].values()))
                              for k in ("tdag", "export", "export-opt")),
            "error": max(errors)}


COLUMNS = (("model", "<16", "{}"), ("eager", ">8", "{:.3f}"), ("tdag", ">8", "{:.3f}"),
           ("torch x", ">8", "{:.3f}"), ("export", ">9", "{:.3f}"),
           ("export-opt", ">11", "{:.3f}"), ("tdag-onnx", ">10", "{:.3f}"),
           ("x exp", ">7", "{:.3f}"), ("x opt", ">7", "{:.3f}"), ("nodes", ">14", "{}"),
           ("err", ">9", "{:.1e}"), ("floor", ">7", "{:.3f}"))
KEYS = ("model", "eager_ms", "tdag_ms", "torch_ratio", "export_ms", "opt_ms", "onnx_ms",
        "export_ratio", "opt_ratio", "nodes", "error", "floor")


@functools.cache
def gemm_rate() -> float:
    """Flops per second of one float32 512^3 product on this machine's threads (MKL)."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    (seconds,) = interleaved_all([lambda: a @ b], 15, 10)
    return 2 * 512 ** 3 / seconds


def _line(row: dict) -> str:
    return "".join(format(form.format(row[key]), align)
                   for (_, align, form), key in zip(COLUMNS, KEYS))


def _op_table(row: dict) -> str:
    """Op types of the four files, side by side, those whose counts differ first."""
    files = ("tdag", "export", "tdag-opt", "export-opt")
    ops = sorted(set().union(*(row["counts"][f] for f in files)),
                 key=lambda op: (row["counts"]["tdag-opt"][op] == row["counts"]["export-opt"][op],
                                 op))
    lines = [f"  {'op':<40}" + "".join(f"{f:>11}" for f in files)]
    lines += [f"  {op:<40}" + "".join(f"{row['counts'][f][op]:>11}" for f in files)
              for op in ops]
    return "\n".join(lines)


def geomean(values) -> float:
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ISSUE_25),
                        help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--scale", type=float, default=2.0,
                        help="of the transformers models' widths (train_step_speed's)")
    parser.add_argument("--level", choices=LEVELS, default="all",
                        help="onnxruntime's offline optimiser level for the -opt files")
    parser.add_argument("--runtime", choices=("onnxruntime",),
                        help="to_onnx's runtime= (onnxruntime's contrib kernels)")
    parser.add_argument("--ops", action="store_true", help="print each model's op types")
    parser.add_argument("--save", help="a folder to keep each model's four files in")
    opts = parser.parse_args()
    names = opts.models.split(",")
    unknown = set(names) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {', '.join(MODELS)}")
    set_threads(opts.threads)
    print(f"scale {opts.scale}, {opts.threads} thread(s), {opts.rounds} interleaved rounds: ms "
          f"medians, ratios medians of each round's; -opt: onnxruntime's optimiser at "
          f"{opts.level}; nodes: tdag/export/export-opt")
    print("".join(format(title, align) for title, align, _ in COLUMNS))
    rows = []
    for name in names:
        rows.append(bench(name, opts.rounds, opts.scale, opts.level, opts.runtime, opts.save))
        print(_line(rows[-1]), flush=True)
        if opts.ops:
            print(_op_table(rows[-1]), flush=True)
    band = [geomean(r["torch_quartiles"][i] for r in rows) for i in (0, 1)]
    print(f"geo-mean: torch x {geomean(r['torch_ratio'] for r in rows):.3f} (target <= 0.6; "
          f"{band[0]:.3f}-{band[1]:.3f} at the rounds' quartiles), "
          f"onnx x export {geomean(r['export_ratio'] for r in rows):.3f} (target <= 0.95, "
          f"none above 1.05), x export-opt {geomean(r['opt_ratio'] for r in rows):.3f}; "
          f"matmul floor {geomean(r['floor'] for r in rows):.3f} at "
          f"{gemm_rate() / 1e9:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
