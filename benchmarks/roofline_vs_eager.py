"""The roofline estimate on this machine (``--device local``) beside the measured eager
latency, for the test zoo (tests/support/torch_models.py), one thread, medians.

Each model is captured at ``--batch``, costed (bytes as the lowered program moves them), and
estimated on a device measured here (fp32 matmul throughput, clone bandwidth, one thread);
the eager model runs ``--runs`` times under ``torch.no_grad``. The ratio estimate / eager is
at most 1 where the roofline holds (an estimate is a lower bound); far below 1 it says the
model spends its time on per-op overhead (tiny tensors), not on flops or bytes.

    python benchmarks/roofline_vs_eager.py
    python benchmarks/roofline_vs_eager.py --batch 128 --runs 50
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import tdag  # noqa: E402
from tdag.refine.cost import roofline  # noqa: E402

from support.refine_programs import MODELS, model  # noqa: E402


def eager_median(module, args, runs: int) -> float:
    with torch.no_grad():
        for _ in range(3):
            module(*args)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            module(*args)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    device = roofline.device("local")
    print(f"device: {device.source}")
    print(f"batch {args.batch}, one thread, median of {args.runs} eager runs\n")
    print(f"{'model':<10} {'flops':>14} {'bytes':>14} {'bound':>8} {'estimate':>11} "
          f"{'eager':>11} {'est/eager':>10}")
    ratios = []
    for name in args.models.split(","):
        module, make_args = model(name)
        example = make_args(args.batch)
        data = tdag.cost(tdag.from_torch(module, example)).to_dict(device=device)
        total = data["total"]
        eager = eager_median(module, example, args.runs)
        ratio = total["time_s"] / eager
        ratios.append(ratio)
        print(f"{name:<10} {total['flops']:>14,} {total['bytes']:>14,} {total['bound']:>8} "
              f"{roofline.format_time(total['time_s']):>11} {roofline.format_time(eager):>11} "
              f"{ratio:>10.3f}")
    print(f"\ngeometric mean est/eager: {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    main()
