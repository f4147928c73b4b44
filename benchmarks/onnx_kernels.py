"""Where does onnxruntime spend its time in tdag's ONNX file and in torch.onnx.export's?
Kernel microseconds per op type, from onnxruntime's profiler, for the files that
``reify_speed.py --save`` keeps.

Every file's session runs in turn, interleaved, one thread, optimiser at "all" (as
reify_speed.py runs them); each node's time is the lower quartile over the runs and
``model_run`` is the whole run's. Lower quartiles of one process's interleaved runs move
little when other work loads the machine, where medians of wall time swing by tens of per
cent: compare files here, confirm with reify_speed.py.

    python benchmarks/reify_speed.py --models bert --save /tmp/files
    python benchmarks/onnx_kernels.py bert /tmp/files            # tdag.onnx vs export.onnx
    python benchmarks/onnx_kernels.py bert /tmp/files --files tdag,mine,export --nodes 10
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

import onnxruntime as ort
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reify_speed  # noqa: E402


def _session(path: str, prefix: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling = True
    options.profile_file_prefix = prefix
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _quartile(values: list) -> float:
    return sorted(values)[len(values) // 4]


def profile(session: ort.InferenceSession) -> tuple[dict, float]:
    """({(op type, node): lower-quartile kernel us}, the runs' lower-quartile us)."""
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    kernels, runs = collections.defaultdict(list), []
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            kernels[e["args"]["op_name"], e["name"][:-len("_kernel_time")]].append(e["dur"])
        elif e.get("cat") == "Session" and e["name"] == "model_run":
            runs.append(e["dur"])
    return {key: _quartile(d) for key, d in kernels.items()}, _quartile(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", choices=reify_speed.MODELS)
    parser.add_argument("folder", help="reify_speed.py's --save folder")
    parser.add_argument("--files", default="tdag,export", help="<name>.onnx in folder/model")
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--nodes", type=int, default=0, help="the slowest nodes of each file")
    opts = parser.parse_args()
    reify_speed.set_threads(1)
    torch.manual_seed(0)  # the inputs reify_speed.py made
    _, args = reify_speed.MODELS[opts.model](2.0)
    names = opts.files.split(",")
    folder = os.path.join(opts.folder, opts.model)
    sessions = [_session(os.path.join(folder, f"{n}.onnx"), os.path.join(folder, n))
                for n in names]
    feeds = [{i.name: a.numpy() for i, a in zip(s.get_inputs(), args)} for s in sessions]
    for _ in range(opts.runs):
        for session, feed in zip(sessions, feeds):
            session.run(None, feed)
    results = [profile(s) for s in sessions]
    per_op = [collections.Counter() for _ in names]
    counts = [collections.Counter() for _ in names]
    for (kernels, _), ops, count in zip(results, per_op, counts):
        for (op, _), us in kernels.items():
            ops[op] += us
            count[op] += 1
    print(f"{opts.model}: kernel us per run (nodes), lower quartiles of {opts.runs} runs")
    print(f"{'op':32}" + "".join(f"{n:>18}" for n in names))
    for op in sorted(set().union(*per_op), key=lambda o: -max(p[o] for p in per_op)):
        print(f"{op:32}" + "".join(f"{p[op]:>12.0f} ({c[op]:>3})" for p, c in zip(per_op, counts)))
    print(f"{'kernels':32}" + "".join(f"{sum(p.values()):>18.0f}" for p in per_op))
    print(f"{'model_run':32}" + "".join(f"{run:>18.0f}" for _, run in results))
    for name, (kernels, _) in zip(names, results):
        slowest = sorted(kernels.items(), key=lambda kv: -kv[1])[:opts.nodes]
        for (op, node), us in slowest:
            print(f"  {name}: {op:24} {node:48} {us:8.0f}")


if __name__ == "__main__":
    main()
