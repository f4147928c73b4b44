"""How long from_torch takes next to torch.export alone, and what a 7B meta model costs.

    python benchmarks/from_torch_speed.py            # the test models, then the 7B config
    python benchmarks/from_torch_speed.py --skip-7b

For each model: the median of several runs of ``torch.export.export`` (non-strict, the
capture from_torch itself uses) and of ``from_torch`` (export + decomposing what the table
lacks + conversion); target: from_torch at most 1.5x export. The 7B Llama-shaped decoder is
built on the meta device and canonicalized in a fresh process, so that its peak memory is
its own.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import torch  # noqa: E402
from torch.export import Dim  # noqa: E402

from tdag.canonicalize import from_torch  # noqa: E402
from tdag.canonicalize.torch.symbols import BATCH  # noqa: E402
from support.torch_models import (CNN, MLP, Decoder, Encoder, Tagger, UNetBlock,  # noqa: E402
                          llama_config_7b)


def models():
    torch.manual_seed(0)
    mask = torch.zeros(2, 6, dtype=torch.bool)
    ids = torch.randint(0, 64, (2, 7))
    return {
        "mlp": (MLP(), (torch.randn(2, 16),)),
        "cnn": (CNN(), (torch.randn(2, 3, 12, 12),)),
        "encoder": (Encoder(), (torch.randn(2, 6, 32), mask)),
        "decoder": (Decoder(), (ids, torch.ones_like(ids))),
        "tagger": (Tagger(), (torch.randint(0, 50, (2, 9)),)),
        "unet": (UNetBlock(), (torch.randn(2, 4, 8, 8),)),
    }


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def compare(name, model, args, dynamic: bool, repeats: int) -> float:
    model.eval()
    batch = Dim(BATCH, min=1)  # what from_torch's dynamic_batch asks of torch.export
    shapes = tuple({0: batch} for _ in args) if dynamic else None

    def export():
        return torch.export.export(model, args, dynamic_shapes=shapes, strict=False)

    def convert():
        return from_torch(model, args, dynamic_batch=dynamic)

    convert()  # warm caches (decomposition tables, imports) once for both
    t_export = _median_time(export, repeats)
    t_tdag = _median_time(convert, repeats)
    nodes = convert().num_nodes
    ratio = t_tdag / t_export
    print(f"{name:10s} {'dynamic' if dynamic else 'static':8s} export {t_export * 1e3:8.1f} ms"
          f"   from_torch {t_tdag * 1e3:8.1f} ms   ratio {ratio:5.2f}   {nodes:6d} nodes")
    return ratio


def llama_7b() -> None:
    """Run in a child process: build the 7B decoder on meta and canonicalize it."""
    started = time.perf_counter()
    with torch.device("meta"):
        model = Decoder(**llama_config_7b()).eval()
    ids = torch.zeros(2, 128, dtype=torch.long, device="meta")
    built = time.perf_counter()
    batch = Dim(BATCH, min=1)
    t0 = time.perf_counter()
    torch.export.export(model, (ids, torch.ones_like(ids)), strict=False,
                        dynamic_shapes=({0: batch}, {0: batch}))
    t_export = time.perf_counter() - t0
    t0 = time.perf_counter()
    prog = from_torch(model, (ids, torch.ones_like(ids)), dynamic_batch=True)
    t_tdag = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"7B meta: {params / 1e9:.2f}e9 parameters, {prog.num_nodes} nodes, "
          f"{len(prog.graph.weights)} weights (none materialised)")
    print(f"7B meta: build {built - started:.1f} s, torch.export (dynamic batch) {t_export:.1f} s, "
          f"from_torch (dynamic batch) {t_tdag:.1f} s, ratio {t_tdag / t_export:.2f}, "
          f"peak RSS {peak:.0f} MiB")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-7b", action="store_true")
    parser.add_argument("--only-7b", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    if args.only_7b:
        llama_7b()
        return 0
    ratios = []
    for name, (model, example) in models().items():
        for dynamic in (False, True):
            ratios.append(compare(name, model, example, dynamic, args.repeats))
    print(f"from_torch / torch.export: median {statistics.median(ratios):.2f}, "
          f"max {max(ratios):.2f} (target <= 1.5)")
    if not args.skip_7b:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--only-7b"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
