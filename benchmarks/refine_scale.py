"""How the refine passes scale: cost, simplify, strip_batch, add_batch and extract on deep
MLPs of about 1k, 10k and 100k nodes (the time per node should stay flat), and cost +
simplify of the Llama-7B configuration captured on the meta device.

    python benchmarks/refine_scale.py [--sizes 1000 10000 100000] [--no-7b]

The deep MLPs are built by copying one traced layer's nodes under new names (tracing 100k
nodes one op at a time would measure the tracer, not the passes).
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import tdag  # noqa: E402
from tdag import ops  # noqa: E402
from tdag.ir.graph import TDAG, Value, Weight  # noqa: E402
from tdag.ir.program import Program  # noqa: E402
from tdag.ir.types import Origin, TensorKind  # noqa: E402
from tdag.refine import add_batch, cost, extract, simplify, strip_batch  # noqa: E402

WIDTH = 16


def layer_template() -> TDAG:
    """One residual layer, x + tanh(linear(x)) * 1.0, traced once with a symbolic batch."""
    w, b = torch.empty(WIDTH, WIDTH), torch.empty(WIDTH)
    return tdag.trace(lambda x: x + ops.tanh(ops.linear(x, ops.param("w", w), ops.param("b", b)))
                      * 1.0, tdag.TensorSpec(("batch", WIDTH))).graph


def deep_mlp(nodes: int) -> Program:
    """About ``nodes`` nodes: copies of the template, each in scope ``layers.{i}``."""
    layer = layer_template()
    x = layer.inputs[0]
    depth = max(1, nodes // len(layer.nodes))
    weights, out_nodes, prev = {}, [], x.name
    for i in range(depth):
        rename = {x.name: prev}
        for name, weight in layer.weights.items():
            rename[name] = f"layers.{i}.{name}" if weight.kind is not TensorKind.const else \
                f"{name}_{i}"
            value = None if weight.kind is TensorKind.parameter else weight.value
            weights[rename[name]] = Weight(weight.kind, weight.type, value)
        origin = Origin("aten.linear", f"layers.{i}")
        for node in layer.nodes:
            rename[node.name] = f"l{i}_{node.name}"
            out_nodes.append(node.replace(name=rename[node.name], origin=origin,
                                          inputs=tuple(rename[n] for n in node.inputs)))
        prev = rename[layer.outputs[0]]
    graph = TDAG((Value(x.name, x.type),), weights, tuple(out_nodes), (prev,))
    return Program.from_tdag(graph)


def timed(fn, *args, repeat: int = 1, **kwargs):
    """(result, the best of ``repeat`` wall-clock times)."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - start)
    return result, best


def scale(sizes) -> None:
    print(f"{'nodes':>8} {'pass':<12} {'seconds':>9} {'us/node':>9}")
    for size in sizes:
        prog = deep_mlp(size)
        n = prog.num_nodes
        depth = n // len(layer_template().nodes)
        passes = [
            ("verify", lambda: tdag.verify(prog)),
            ("cost", lambda: cost(prog)),
            ("simplify", lambda: simplify(prog)),
            ("strip_batch", lambda: strip_batch(prog)),
            ("add_batch", lambda: add_batch(strip_batch(prog), "n")),
            ("extract", lambda: extract(prog, scope=f"layers.{depth // 2}")),
        ]
        for name, run in passes:
            _, seconds = timed(run, repeat=3 if n <= 20000 else 1)
            print(f"{n:>8} {name:<12} {seconds:>9.3f} {1e6 * seconds / n:>9.1f}")
        report = cost(prog)
        simple = simplify(prog)
        print(f"{n:>8} {'(figures)':<12} flops={report.flops}  fused bytes={report.fused_bytes}"
              f"  simplified nodes={simple.num_nodes}")


def llama_7b() -> None:
    from tdag.canonicalize import from_torch
    from support.torch_models import Decoder, llama_config_7b

    class Logits(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, ids, mask):
            return self.model(ids, mask).logits

    with torch.device("meta"):
        model = Logits(Decoder(**llama_config_7b())).eval()
        args = (torch.zeros(1, 128, dtype=torch.long), torch.ones(1, 128, dtype=torch.long))
    prog, t_capture = timed(from_torch, model, args, dynamic_batch=True)
    report, t_cost = timed(cost, prog)
    simple, t_simplify = timed(simplify, prog)
    stripped, t_strip = timed(strip_batch, prog)
    print(f"\nLlama-7B config on meta: {prog.num_nodes} nodes "
          f"(from_torch {t_capture:.1f}s, not a refine pass)")
    print(f"  cost        {t_cost:6.2f}s  matmul flops at batch 1, seq 128: "
          f"{report.evaluate(batch=1).matmul_flops / 1e12:.2f} TFLOP "
          f"(2 * params * tokens = {2 * 6.74e9 * 128 / 1e12:.2f})")
    print(f"  simplify    {t_simplify:6.2f}s  {prog.num_nodes} -> {simple.num_nodes} nodes")
    print(f"  strip_batch {t_strip:6.2f}s")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1000, 10000, 100000])
    parser.add_argument("--no-7b", action="store_true")
    args = parser.parse_args(argv)
    scale(args.sizes)
    if not args.no_7b:
        llama_7b()


if __name__ == "__main__":
    main()
