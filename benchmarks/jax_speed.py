"""tdag.to_jax against torch eager on the test zoo (``MODELS`` of
tests/support/torch_models.py): each model through from_torch -> to_jax, the jitted
function's time over the eager module's, one thread each (torch.set_num_threads(1); XLA's CPU
client without Eigen's thread pool), interleaved rounds, medians. A ratio below 1 means the
JAX function is faster. Target: geo-mean at most 1.0x.

    python benchmarks/jax_speed.py
    python benchmarks/jax_speed.py --models mlp,cnn --batch 32 --rounds 50
"""
from __future__ import annotations

import os

# before jax is imported: XLA reads its flags once
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import tdag  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tests"))
from support.jax_arrays import to_numpy  # noqa: E402
from support.torch_models import MODELS, make_model  # noqa: E402


def measure(name: str, batch: int, rounds: int) -> tuple[float, float, float]:
    """(torch median s, jax median s, max |difference|) for one model of the zoo."""
    model, inputs = make_model(name)
    args = inputs(batch)
    fn = tdag.to_jax(tdag.from_torch(model, inputs(2), dynamic_batch=True))
    with jax.enable_x64(True):  # i64 token ids stay i64 on the device
        arrays = [jax.device_put(to_numpy(a)) for a in args]

    def run_torch():
        with torch.no_grad():
            return model(*args)

    def run_jax():
        return jax.block_until_ready(fn(*arrays))

    ref, got = run_torch(), run_jax()  # the first call compiles
    refs = torch.utils._pytree.tree_leaves(ref)
    gots = got if isinstance(got, tuple) else (got,)
    difference = max(float(np.abs(np.asarray(g) - r.numpy()).max()) for g, r in zip(gots, refs))
    times: list[list[float]] = [[], []]
    for r in range(rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            (run_torch, run_jax)[k]()
            times[k].append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1]), difference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated, e.g. mlp,cnn")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    names = args.models.split(",") if args.models else list(MODELS)
    print(f"jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}, "
          f"batch {args.batch}, {args.rounds} rounds, 1 thread")
    rows = {name: measure(name, args.batch, args.rounds) for name in names}
    print(f"{'model':<10}{'torch ms':>10}{'jax ms':>10}{'ratio':>8}{'max |diff|':>12}")
    for name, (eager, jitted, difference) in rows.items():
        print(f"{name:<10}{eager * 1e3:>10.3f}{jitted * 1e3:>10.3f}{jitted / eager:>8.2f}"
              f"{difference:>12.1e}")
    ratios = [jitted / eager for eager, jitted, _ in rows.values()]
    print(f"geo-mean ratio {statistics.geometric_mean(ratios):.3f}, worst {max(ratios):.2f} "
          f"({len(ratios)} models)")


if __name__ == "__main__":
    main()
