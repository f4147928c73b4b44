"""How fast is a JAX model after from_jax -> to_onnx on onnxruntime, next to the jitted JAX
function (XLA on the CPU)? The flax models of tests/support/flax_models.py at benchmark sizes.

Both sides run on one thread (XLA's eigen pool off, onnxruntime's intra/inter-op pools at
1): on a shared machine thread pools waiting for busy cores make small kernels slow at
random. The sides are timed interleaved (the order alternates every round), each side's
median is taken, and the ratio is onnxruntime's time over JAX's: below 1 means tdag's ONNX
is faster. The largest relative output difference is printed beside.

    python benchmarks/from_jax_speed.py                     # mlp, cnn, transformer
    python benchmarks/from_jax_speed.py --models cnn --rounds 40
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# one thread for XLA: set before jax is imported
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

import jax  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import tdag  # noqa: E402
from support.flax_models import CNN, MLP, TransformerBlock, random_variables  # noqa: E402

# name -> (flax module, input shape): sizes where kernels, not dispatch, take the time
MODELS = {
    "mlp": (MLP, (256, 16)),
    "cnn": (CNN, (16, 32, 32, 3)),
    "transformer": (TransformerBlock, (8, 64, 32)),
}


def interleaved(a, b, rounds: int, inner: int) -> tuple[float, float]:
    """Median seconds per call of ``a`` and ``b``, timed in alternating order."""
    for _ in range(3):
        a(), b()
    times: dict = {0: [], 1: []}
    for r in range(rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            fn = (a, b)[i]
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            times[i].append((time.perf_counter() - start) / inner)
    return statistics.median(times[0]), statistics.median(times[1])


def _inner(fn, budget: float = 0.02) -> int:
    start = time.perf_counter()
    fn()
    return max(1, min(200, int(budget / max(time.perf_counter() - start, 1e-6))))


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def bench(name: str, rounds: int) -> dict:
    cls, shape = MODELS[name]
    module = cls()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    variables = random_variables(module, x)
    jitted = jax.jit(module.apply)
    prog = tdag.from_jax(module.apply, variables, x)
    session = _session(tdag.to_onnx(prog))
    feeds = {session.get_inputs()[0].name: x}
    expected = np.asarray(jitted(variables, x))
    got = session.run(None, feeds)[0]
    error = float(np.abs(got - expected).max() / (np.abs(expected).max() + 1e-12))

    on_device = jax.device_put((variables, x))  # not a host-to-device copy per call

    def run_jax():
        return jitted(*on_device).block_until_ready()

    def run_onnx():
        return session.run(None, feeds)

    t_jax, t_onnx = interleaved(run_jax, run_onnx, rounds, _inner(run_jax))
    return {"model": name, "nodes": prog.num_nodes, "jax_ms": t_jax * 1e3,
            "onnx_ms": t_onnx * 1e3, "ratio": t_onnx / t_jax, "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(f"jax {jax.__version__}, onnxruntime {ort.__version__}, 1 thread each; "
          f"medians of {args.rounds} interleaved rounds")
    print(f"{'model':<12} {'nodes':>6} {'jax jit ms':>11} {'tdag onnx ms':>13} "
          f"{'ratio':>6} {'max rel err':>12}")
    ratios = []
    for name in args.models.split(","):
        r = bench(name, args.rounds)
        ratios.append(r["ratio"])
        print(f"{r['model']:<12} {r['nodes']:>6} {r['jax_ms']:>11.3f} {r['onnx_ms']:>13.3f} "
              f"{r['ratio']:>6.2f} {r['error']:>12.1e}")
    geo = statistics.geometric_mean(ratios)
    print(f"geo-mean ratio (tdag onnx / jax jit) {geo:.3f} over {len(ratios)} models")


if __name__ == "__main__":
    main()
