"""tdag's cost figures beside torch's FlopCounterMode and fvcore's FlopCountAnalysis.

    python benchmarks/cost_vs_peers.py [--batch 4]

For each model of tests/support/torch_models.py: tdag's contraction flops (``matmul_flops``, the
``torch.utils.flop_counter`` convention, 2 per multiply-add), all its flops, and its fused and
unfused traffic; FlopCounterMode's total (2 per multiply-add, contractions it has formulas
for); fvcore's total (1 per multiply-add: fvcore counts MACs, and some elementwise ops). The
time of each is the analysis alone; tdag's capture (from_torch) is shown apart.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from tdag.canonicalize import from_torch  # noqa: E402
from tdag.refine import cost  # noqa: E402

from support import torch_models as M  # noqa: E402


class Tuple(torch.nn.Module):
    """Outputs as a tuple (fvcore's jit trace takes no dataclasses)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, *args):
        out = self.model(*args)
        return tuple(vars(out).values()) if hasattr(out, "__dataclass_fields__") else out


def models(b: int) -> dict:
    return {
        "MLP": (M.MLP(), (torch.randn(b, 16),)),
        "CNN": (M.CNN(), (torch.randn(b, 3, 32, 32),)),
        "UNetBlock": (M.UNetBlock(), (torch.randn(b, 4, 32, 32),)),
        "Encoder (sdpa)": (M.Encoder(), (torch.randn(b, 16, 32),
                                         torch.zeros(b, 16, dtype=torch.bool))),
        "Decoder (sdpa)": (M.Decoder(), (torch.randint(0, 64, (b, 16)),
                                         torch.ones(b, 16, dtype=torch.long))),
        "Tagger (LSTM)": (M.Tagger(), (torch.randint(1, 50, (b, 12)),)),
    }


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def flop_counter(model, args) -> int:
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(*args)
    return counter.get_total_flops()


def fvcore(model, args):
    try:
        from fvcore.nn import FlopCountAnalysis
    except ImportError:
        return None
    analysis = FlopCountAnalysis(Tuple(model), args)
    analysis.unsupported_ops_warnings(False)
    analysis.uncalled_modules_warnings(False)
    try:
        return analysis.total()
    except Exception as exc:  # fvcore's jit trace fails on some models
        return f"failed: {type(exc).__name__}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=4)
    b = parser.parse_args(argv).batch
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    header = (f"{'model':<16} {'tdag matmul':>12} {'tdag flops':>12} {'fused MB':>9} "
              f"{'unfused MB':>10} {'t cost':>7} {'(capture)':>9} | {'FlopCounter':>12} "
              f"{'t':>6} | {'fvcore (MAC)':>12} {'t':>6}")
    print(f"batch {b}\n{header}\n{'-' * len(header)}")
    for name, (model, args) in models(b).items():
        model.eval()
        prog, t_capture = timed(from_torch, model, args)
        report, t_cost = timed(cost, prog)
        counted, t_fc = timed(flop_counter, model, args)
        macs, t_fv = timed(fvcore, model, args)
        print(f"{name:<16} {report.matmul_flops:>12,} {report.flops:>12,} "
              f"{report.fused_bytes / 1e6:>9.2f} {report.unfused_bytes / 1e6:>10.2f} "
              f"{t_cost:>6.2f}s "
              f"{t_capture:>8.2f}s | {counted:>12,} {t_fc:>5.2f}s | "
              f"{macs if isinstance(macs, str) else format(macs, ','):>12} {t_fv:>5.2f}s")
    print("\nFlopCounterMode has no formula for CPU scaled_dot_product_attention, aten.mv or "
          "LSTM cells; tdag sees every contraction as multiply + reduce-sum.")


if __name__ == "__main__":
    main()
