"""OpInfo coverage sweep: every op in torch's own OpInfo database, through from_torch.

For each op of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
float32 on CPU, the first float32 sample is wrapped in a module whose inputs are the sample's
tensors (everything else is baked in) and captured with torch.export. Ops torch.export
captures are canonicalized with ``tdag.from_torch`` and run with ``tdag.run``; the outputs
must equal eager within rtol 1e-4 (atol 1e-4 of the output's scale; nan where torch has nan).

    python benchmarks/opinfo_sweep.py             # the whole database, a table and the rates
    python benchmarks/opinfo_sweep.py --ops add,mul --verbose
    python benchmarks/opinfo_sweep.py --targets run,torch,onnx   # also to_torch, to_onnx on ORT

With ``--targets`` each captured program is also reified (``to_torch``; ``to_onnx`` run on
onnxruntime's CPU provider) and compared with eager the same way; a column per target.

Ops in EXCLUDED are still swept but counted apart; each has the reason tdag leaves it out.
"""
from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import sys
import time
import traceback
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Justified exclusions: what no static tensor DAG over tdag's primitives can express, or what
# is out of scope for inference graphs (each reason says which). Each op listed here fails
# the sweep; ops that pass were taken off the list. Sorting is not excluded: sort, topk,
# median, mode and quantile are compositions over the sort primitive (aten/sorting.py).
EXCLUSION_REASONS = {
    "random": "random sampling (svd_lowrank and pca_lowrank draw a random projection), or "
              "uninitialised memory (empty*): eager's values are arbitrary",
    "data-dependent": "the output's shape depends on the values (nonzero, unique, item, "
                      "masked_select); torch.export itself marks these sizes unbacked "
                      "(combinations: C(n, r) is static, but torch's graph computes it "
                      "with masked_select)",
    "factorization": "lstsq, whose residuals' size depends on the driver's rank test "
                     "(torch.export itself fails on it). The others are compositions over a "
                     "static n (tdag/ops/linalg): LU, Cholesky, triangular solves, "
                     "Householder QR, matrix_exp, Jacobi eigh and SVD, Bunch-Kaufman LDL^T, "
                     "eig by Hessenberg QR iterations (n <= 12)",
    "bitwise": "bit manipulation of floats (frexp, nextafter, hash): no bitwise primitive",
    "sparse": "sparse layouts",
    "training": "training-mode normalisation writes the running statistics it is given "
                "(state); inference graphs use eval mode",
    "memory": "storage and strides (as_strided, resize_): tdag values have no memory layout",
}
EXCLUDED = {
    **dict.fromkeys([
        "cauchy", "exponential", "geometric", "log_normal", "normal", "normal.in_place",
        "normal.number_mean", "uniform", "bernoulli", "multinomial", "randn", "randn_like",
        "rand_like", "randint", "randint_like", "nn.functional.rrelu",
        "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d",
        "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
        "empty_permuted", "svd_lowrank", "pca_lowrank"], "random"),
    **dict.fromkeys([
        "item", "combinations", "masked_select", "tensor_split", "unique", "unique_consecutive",
        "nonzero", "nonzero_static", "argwhere", "nn.functional.ctc_loss",
        "_segment_reduce.lengths", "_segment_reduce.offsets"], "data-dependent"),
    **dict.fromkeys([
        "linalg.lstsq", "linalg.lstsq.grad_oriented"], "factorization"),
    **dict.fromkeys(["frexp", "nextafter", "hash_tensor"], "bitwise"),
    **dict.fromkeys(["to_sparse", "sparse.sampled_addmm", "sparse.mm.reduce"], "sparse"),
    **dict.fromkeys(["native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update",
                     "nn.functional.batch_norm", "nn.functional.instance_norm"], "training"),
    **dict.fromkeys(["as_strided", "as_strided.partial_views", "as_strided_copy",
                     "as_strided_scatter", "resize_", "resize_as_"], "memory"),
}


TARGETS = ("run", "torch", "onnx")


def sweep_one(op, verbose: bool = False, targets=("run",)) -> dict[str, tuple[str, str]]:
    """{target: (status, detail)} for one OpInfo entry: pass, export-fail, unsupported,
    mismatch, error or no-sample; a status before the program exists is every target's."""
    import torch

    import tdag
    from tdag.canonicalize import from_torch

    def every(status, detail=""):
        return dict.fromkeys(targets, (status, detail))

    sample = _first_sample(op)
    if sample is None:
        return every("no-sample")
    module, tensors = _wrap(op, sample)
    try:
        with torch.no_grad():
            expected = module(*tensors)
    except Exception as exc:  # noqa: BLE001  (eager itself rejects the sample)
        return every("no-sample", f"eager: {type(exc).__name__}")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(module, tuple(tensors), strict=False)
    except Exception as exc:  # noqa: BLE001
        return every("export-fail", _short(exc))
    try:
        prog = from_torch(exported)
        tdag.verify(prog)
    except tdag.UnsupportedOpError as exc:
        return every("unsupported", _short(exc, 160))
    except Exception as exc:  # noqa: BLE001
        if verbose:
            traceback.print_exc()
        return every("error", _short(exc))
    return {target: _through(target, prog, tensors, expected, op.name, verbose)
            for target in targets}


def _through(target: str, prog, tensors, expected, name: str,
             verbose: bool) -> tuple[str, str]:
    """The program run on one target, compared with eager."""
    import tdag
    try:
        got = _RUNNERS[target](prog, tensors)
    except tdag.UnsupportedOpError as exc:
        return "unsupported", _short(exc, 160)
    except Exception as exc:  # noqa: BLE001
        if verbose:
            traceback.print_exc()
        return "error", _short(exc)
    return _compare(got, expected, name)


def _run_tdag(prog, tensors):
    import tdag
    return tdag.run(prog, *tensors)


def _run_torch(prog, tensors):
    import torch

    import tdag
    with torch.no_grad():
        return tdag.to_torch(prog)(*tensors)


def _run_onnx(prog, tensors):
    """to_onnx on onnxruntime's CPU provider, one thread."""
    import numpy as np
    import onnxruntime as ort
    import torch

    import tdag
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    model, bf16 = _bf16_outputs_as_f32(tdag.to_onnx(prog))
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(session.get_inputs(), tensors)}
    outs = tuple(torch.from_numpy(np.asarray(o)) for o in session.run(None, feeds))
    outs = tuple(o.to(torch.bfloat16) if i in bf16 else o for i, o in enumerate(outs))
    return outs[0] if len(outs) == 1 else outs


def _bf16_outputs_as_f32(model):
    """onnxruntime's Python API returns no bfloat16 array (numpy has no such type): each
    bfloat16 output is read through a Cast to float32, which holds its values exactly, and
    turned back after. (model, positions of those outputs)."""
    from onnx import TensorProto, helper
    bf16 = [i for i, o in enumerate(model.graph.output)
            if o.type.tensor_type.elem_type == TensorProto.BFLOAT16]
    for i in bf16:
        out = model.graph.output[i]
        model.graph.node.append(helper.make_node("Cast", [out.name], [f"{out.name}_as_f32"],
                                                 to=TensorProto.FLOAT))
        out.name = f"{out.name}_as_f32"
        out.type.tensor_type.elem_type = TensorProto.FLOAT
    return model, set(bf16)


_RUNNERS = {"run": _run_tdag, "torch": _run_torch, "onnx": _run_onnx}


def _first_sample(op):
    import torch
    try:
        return next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=False)))
    except Exception:  # noqa: BLE001
        return None


def _wrap(op, sample):
    """A module whose arguments are the sample's tensors, the rest baked in; a complex
    output is returned as its (real, imaginary) pairs (``torch.view_as_real``), since ONNX
    has no complex tensors and every target is compared on the same values."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

    leaves, spec = tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    class OpModule(torch.nn.Module):
        def forward(self, *tensors):
            filled = list(leaves)
            for i, t in zip(slots, tensors):
                filled[i] = t
            x, args, kwargs = tree_unflatten(filled, spec)
            return tree_map(_as_pairs, op.op(x, *args, **kwargs))

    return OpModule().eval(), [leaves[i].detach().clone() for i in slots]


def _as_pairs(value):
    import torch
    if isinstance(value, torch.Tensor) and value.is_complex():
        return torch.view_as_real(value.resolve_conj())
    return value


# outputs whose columns are unique up to sign (eigenvectors): LAPACK's choice of sign is not
# specified, so both sides are compared with each column's largest entry made positive
SIGN_FREE = {"linalg.eigh": (1,)}
# the general eigenproblem's order of eigenvalues and phase of eigenvectors are
# implementation-defined (torch's docs say so): compared gauge-free (_match_eigen)
GAUGE_FREE = frozenset({"linalg.eig", "linalg.eigvals"})


def _compare(got, expected, op_name: str = "") -> tuple[str, str]:
    import torch
    from torch.utils._pytree import tree_leaves

    got = list(got) if isinstance(got, tuple) else [got]
    want = [torch.as_tensor(x) for x in tree_leaves(expected) if x is not None]
    if len(got) != len(want):
        return "mismatch", f"{len(got)} outputs, eager has {len(want)}"
    for i in SIGN_FREE.get(op_name, ()):
        got[i], want[i] = _column_signs(got[i]), _column_signs(want[i])
    if op_name in GAUGE_FREE:
        got, problem = _match_eigen(got, want)
        if problem:
            return "mismatch", problem
    for out, ref in zip(got, want):
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return "mismatch", f"{out.dtype}{list(out.shape)} vs eager {ref.dtype}{list(ref.shape)}"
        out, ref = _as_pairs(out), _as_pairs(ref)  # complex ones as (real, imaginary) pairs
        if not ref.is_floating_point():
            if not torch.equal(out, ref):
                return "mismatch", "integer or bool values differ"
            continue
        finite = ref[torch.isfinite(ref)]
        scale = finite.abs().max().item() if finite.numel() else 1.0
        try:
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4 * max(scale, 1e-6),
                                       equal_nan=True)
        except AssertionError as exc:
            return "mismatch", _short(exc)
    return "pass", ""


def _match_eigen(got: list, want: list) -> tuple[list, str]:
    """eig's or eigvals' outputs (as pairs) with tdag's eigenvalues put in eager's order (an
    assignment on |difference|, per matrix) and each eigenvector replaced by eager's where the
    two agree up to phase, |<v, v_eager>| >= 1 - 1e-4 (both unit norm); (outputs, the
    problem where one does not)."""
    import torch
    from scipy.optimize import linear_sum_assignment

    values = torch.view_as_complex(got[0].contiguous())
    n = values.shape[-1]
    order = []
    for mine, eager in zip(values.reshape(-1, n), torch.view_as_complex(want[0]).reshape(-1, n)):
        cost = (mine[:, None] - eager[None, :]).abs().nan_to_num(float("inf"), float("inf"))
        rows, cols = linear_sum_assignment(cost.numpy())
        matched = torch.empty(n, dtype=torch.long)
        matched[torch.as_tensor(cols)] = torch.as_tensor(rows)  # eager's j <- tdag's matched[j]
        order.append(matched)
    order = torch.stack(order).reshape(values.shape) if order else torch.zeros_like(values,
                                                                                   dtype=torch.long)
    got = [torch.view_as_real(torch.gather(values, -1, order))] + got[1:]
    if len(got) == 2:
        vectors = torch.view_as_complex(got[1].contiguous())
        vectors = torch.gather(vectors, -1, order.unsqueeze(-2).expand(vectors.shape))
        overlap = (vectors.conj() * torch.view_as_complex(want[1])).sum(-2).abs()
        if overlap.numel() and overlap.min() < 1 - 1e-4:
            return got, f"an eigenvector's overlap with eager's is {overlap.min():.6f}"
        got[1] = want[1]  # the same vectors up to phase: eager's phase
    return got, ""


def _column_signs(x):
    """x (..., n, k) with each column's largest-magnitude entry positive."""
    import torch
    top = x.abs().argmax(-2, keepdim=True)
    sign = torch.sign(torch.gather(x, -2, top))
    return x * torch.where(sign == 0, 1.0, sign)


def _short(exc, n: int = 110) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:n]


def _job(job):
    index, verbose, targets = job
    from torch.testing._internal.common_methods_invocations import op_db
    op = op_db[index]
    started = time.perf_counter()
    try:
        statuses = sweep_one(op, verbose, targets)
    except Exception as exc:  # noqa: BLE001
        statuses = dict.fromkeys(targets, ("error", _short(exc)))
    return index, statuses, time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--targets", default="run",
                        help=f"comma-separated, of {', '.join(TARGETS)} (default: run)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--failures-only", action="store_true")
    args = parser.parse_args(argv)
    targets = tuple(args.targets.split(","))
    if not set(targets) <= set(TARGETS):
        parser.error(f"--targets: each of {', '.join(TARGETS)}")

    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    wanted = set(args.ops.split(",")) if args.ops else None
    todo = [i for i, op in enumerate(op_db) if torch.float32 in op.supported_dtypes("cpu")
            and (wanted is None or op.name in wanted)]
    started = time.perf_counter()
    jobs = [(i, args.verbose, targets) for i in todo]
    if args.jobs > 1 and len(todo) > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs, maxtasksperchild=50) as pool:
            results = pool.map(_job, jobs, chunksize=4)
    else:
        results = [_job(job) for job in jobs]
    _report(op_db, sorted(results, key=lambda r: r[0]), targets,
            time.perf_counter() - started, args.failures_only)
    return 0


def _report(op_db, results, targets, elapsed: float, failures_only: bool) -> None:
    counts = {target: collections.Counter() for target in targets}
    print(f"{'op':44s} " + " ".join(f"{t:12s}" for t in targets) + " detail")
    for index, statuses, _ in results:
        op = op_db[index]
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        excluded = EXCLUDED.get(name) or EXCLUDED.get(op.name)
        for target, (status, _) in statuses.items():
            counts[target][status] += 1
            if excluded and status not in ("no-sample", "export-fail"):
                counts[target]["excluded"] += 1  # captured, and excluded whatever it gave
            elif status in ("pass", "mismatch"):
                counts[target][f"{status} outside the exclusions"] += 1
        if failures_only and all(status == "pass" for status, _ in statuses.values()):
            continue
        shown = [status if status == "pass" or not excluded else f"excluded ({excluded})"
                 for status, _ in statuses.values()]
        detail = next((d for s, d in statuses.values() if s != "pass"), "")
        print(f"{name:44s} " + " ".join(f"{s:12s}" for s in shown) + f" {detail}")
    for target in targets:
        _rates(target, counts[target])
    print(f"swept in {elapsed:.0f} s")
    print("\nexclusion reasons:")
    for key, reason in EXCLUSION_REASONS.items():
        print(f"  {key}: {reason}")


def _rates(target: str, counts: collections.Counter) -> None:
    """The rates; "excluded" and "... outside the exclusions" tag ops counted by status too,
    so an excluded op that passes or fails by chance (uninitialised memory) counts as
    neither a pass nor a wrong answer."""
    wrong = counts["mismatch outside the exclusions"]
    tags = counts["excluded"] + counts["pass outside the exclusions"] + wrong
    total = sum(counts.values()) - tags - counts["no-sample"]
    captured = total - counts["export-fail"]
    passed, clean = counts["pass"], counts["pass outside the exclusions"]
    outside = captured - counts["excluded"]
    print(f"\n[{target}] " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"torch.export captured {captured}/{total} OpInfo ops ({100 * captured / total:.1f}%)")
    print(f"[{target}] matched eager on {passed}/{captured} captured ops "
          f"({100 * passed / captured:.1f}%); {clean}/{outside} outside the justified "
          f"exclusions ({100 * clean / max(1, outside):.1f}%); wrong (mismatch) outside "
          f"them: {wrong} ({counts['mismatch']} in all)")


if __name__ == "__main__":
    sys.exit(main())
