"""OpInfo coverage sweep: every op in torch's own OpInfo database, through from_torch.

For each op of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
float32 on CPU, the first float32 sample is wrapped in a module whose inputs are the sample's
tensors (everything else is baked in) and captured with torch.export. Ops torch.export
captures are canonicalized with ``tdag.from_torch`` and run with ``tdag.run``; the outputs
must equal eager within rtol 1e-4 (atol 1e-4 of the output's scale; nan where torch has nan).

    python benchmarks/opinfo_sweep.py             # the whole database, a table and the rates
    python benchmarks/opinfo_sweep.py --ops add,mul --verbose

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
    "random": "random sampling, or uninitialised memory (empty*): eager's values are arbitrary",
    "data-dependent": "the output's shape depends on the values (nonzero, unique, item, "
                      "masked_select); torch.export itself marks these sizes unbacked "
                      "(combinations: C(n, r) is static, but torch's graph computes it "
                      "with masked_select)",
    "complex": "complex dtypes and FFTs: tdag's dtypes are real",
    "factorization": "factorizations, solvers and matrix functions: SVD, eig/eigh and "
                     "lstsq iterate to convergence (value-dependent step counts); the direct "
                     "ones (Cholesky, LU with pivoting, QR, triangular solves, inverse, det, "
                     "matrix_exp) would unroll to O(n) dependent steps per matrix and are out "
                     "of scope for inference graphs, not inexpressible",
    "special": "special functions not mapped yet (gamma family, Bessel, zeta, erfcx, ndtri): "
               "torch evaluates most with fixed Chebyshev/rational fits or bounded loops, "
               "so they are expressible, but need torch's coefficient tables ported; the "
               "orthogonal polynomials take the degree n as a tensor: a recurrence whose "
               "length is a value",
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
        "empty_permuted"], "random"),
    **dict.fromkeys([
        "item", "combinations", "masked_select", "tensor_split", "unique", "unique_consecutive",
        "nonzero", "nonzero_static", "argwhere", "nn.functional.ctc_loss",
        "_segment_reduce.lengths", "_segment_reduce.offsets"], "data-dependent"),
    **dict.fromkeys([
        "view_as_complex", "complex", "polar", "stft", "cdouble", "cfloat", "chalf",
        "linalg.eig", "linalg.eigvals", "fft.fft", "fft.fft2", "fft.fftn", "fft.hfft",
        "fft.hfft2", "fft.hfftn", "fft.rfft", "fft.rfft2", "fft.rfftn", "fft.ifft", "fft.ifft2",
        "fft.ifftn", "fft.ihfft", "fft.ihfft2", "fft.ihfftn", "fft.irfft", "fft.irfft2",
        "fft.irfftn"], "complex"),
    **dict.fromkeys([
        "cholesky", "cholesky_inverse", "cholesky_solve", "geqrf", "lu", "lu_solve", "lu_unpack",
        "matrix_exp", "ormqr", "qr", "triangular_solve", "svd", "svd_lowrank", "pca_lowrank",
        "pinverse", "logdet", "norm.nuc", "linalg.det", "linalg.cholesky", "linalg.cholesky_ex",
        "linalg.cond", "linalg.eigh", "linalg.eigvalsh", "linalg.householder_product",
        "linalg.ldl_factor", "linalg.ldl_factor_ex", "linalg.ldl_solve", "linalg.lstsq",
        "linalg.lstsq.grad_oriented", "linalg.qr", "linalg.slogdet", "linalg.lu_factor",
        "linalg.lu_factor_ex", "linalg.lu", "linalg.lu_solve", "linalg.inv", "linalg.inv_ex",
        "linalg.solve", "linalg.solve_ex", "linalg.solve_triangular", "linalg.matrix_rank",
        "linalg.matrix_rank.hermitian", "linalg.pinv", "linalg.pinv.singular",
        "linalg.pinv.hermitian", "linalg.svd", "linalg.svdvals", "linalg.tensorinv",
        "linalg.tensorsolve"], "factorization"),
    **dict.fromkeys([
        "lgamma", "digamma", "polygamma", "mvlgamma", "igamma", "igammac", "i0", "special.i0e",
        "special.i1", "special.i1e", "special.polygamma", "special.zeta", "special.ndtri",
        "special.log_ndtr", "special.erfcx", "special.airy_ai", "special.bessel_j0",
        "special.bessel_j1", "special.bessel_y0", "special.bessel_y1",
        "special.chebyshev_polynomial_t", "special.chebyshev_polynomial_u",
        "special.chebyshev_polynomial_v", "special.chebyshev_polynomial_w",
        "special.hermite_polynomial_h", "special.hermite_polynomial_he",
        "special.laguerre_polynomial_l", "special.legendre_polynomial_p",
        "special.modified_bessel_i0", "special.modified_bessel_i1",
        "special.modified_bessel_k0", "special.modified_bessel_k1",
        "special.scaled_modified_bessel_k0", "special.scaled_modified_bessel_k1",
        "special.shifted_chebyshev_polynomial_t", "special.shifted_chebyshev_polynomial_u",
        "special.shifted_chebyshev_polynomial_v", "special.shifted_chebyshev_polynomial_w",
        "special.spherical_bessel_j0"], "special"),
    **dict.fromkeys(["frexp", "nextafter", "hash_tensor"], "bitwise"),
    **dict.fromkeys(["to_sparse", "sparse.sampled_addmm", "sparse.mm.reduce"], "sparse"),
    **dict.fromkeys(["native_batch_norm", "_native_batch_norm_legit", "_batch_norm_with_update",
                     "nn.functional.batch_norm", "nn.functional.instance_norm"], "training"),
    **dict.fromkeys(["as_strided", "as_strided.partial_views", "as_strided_copy",
                     "as_strided_scatter", "resize_", "resize_as_"], "memory"),
}


def sweep_one(op, verbose: bool = False) -> tuple[str, str]:
    """(status, detail) for one OpInfo entry: pass, export-fail, unsupported, mismatch,
    error or no-sample."""
    import torch

    import tdag
    from tdag.canonicalize import from_torch

    sample = _first_sample(op)
    if sample is None:
        return "no-sample", ""
    module, tensors = _wrap(op, sample)
    try:
        with torch.no_grad():
            expected = module(*tensors)
    except Exception as exc:  # noqa: BLE001  (eager itself rejects the sample)
        return "no-sample", f"eager: {type(exc).__name__}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.export.export(module, tuple(tensors), strict=False)
    except Exception as exc:  # noqa: BLE001
        return "export-fail", _short(exc)
    try:
        prog = from_torch(exported)
        tdag.verify(prog)
        got = tdag.run(prog, *tensors)
    except tdag.UnsupportedOpError as exc:
        return "unsupported", _short(exc, 160)
    except Exception as exc:  # noqa: BLE001
        if verbose:
            traceback.print_exc()
        return "error", _short(exc)
    return _compare(got, expected)


def _first_sample(op):
    import torch
    try:
        return next(iter(op.sample_inputs("cpu", torch.float32, requires_grad=False)))
    except Exception:  # noqa: BLE001
        return None


def _wrap(op, sample):
    """A module whose arguments are the sample's tensors, the rest baked in."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten((sample.input, tuple(sample.args), dict(sample.kwargs)))
    slots = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]

    class OpModule(torch.nn.Module):
        def forward(self, *tensors):
            filled = list(leaves)
            for i, t in zip(slots, tensors):
                filled[i] = t
            x, args, kwargs = tree_unflatten(filled, spec)
            return op.op(x, *args, **kwargs)

    return OpModule().eval(), [leaves[i].detach().clone() for i in slots]


def _compare(got, expected) -> tuple[str, str]:
    import torch
    from torch.utils._pytree import tree_leaves

    got = list(got) if isinstance(got, tuple) else [got]
    want = [torch.as_tensor(x) for x in tree_leaves(expected) if x is not None]
    if len(got) != len(want):
        return "mismatch", f"{len(got)} outputs, eager has {len(want)}"
    for out, ref in zip(got, want):
        if out.shape != ref.shape or out.dtype != ref.dtype:
            return "mismatch", f"{out.dtype}{list(out.shape)} vs eager {ref.dtype}{list(ref.shape)}"
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


def _short(exc, n: int = 110) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:n]


def _job(index_and_verbose):
    index, verbose = index_and_verbose
    from torch.testing._internal.common_methods_invocations import op_db
    op = op_db[index]
    started = time.perf_counter()
    try:
        status, detail = sweep_one(op, verbose)
    except Exception as exc:  # noqa: BLE001
        status, detail = "error", _short(exc)
    return index, status, detail, time.perf_counter() - started


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--failures-only", action="store_true")
    args = parser.parse_args(argv)

    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    wanted = set(args.ops.split(",")) if args.ops else None
    todo = [i for i, op in enumerate(op_db) if torch.float32 in op.supported_dtypes("cpu")
            and (wanted is None or op.name in wanted)]
    started = time.perf_counter()
    if args.jobs > 1 and len(todo) > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs, maxtasksperchild=50) as pool:
            results = pool.map(_job, [(i, args.verbose) for i in todo], chunksize=4)
    else:
        results = [_job((i, args.verbose)) for i in todo]
    _report(op_db, sorted(results), time.perf_counter() - started, args.failures_only)
    return 0


def _report(op_db, results, elapsed: float, failures_only: bool) -> None:
    counts = collections.Counter()
    print(f"{'op':44s} {'status':12s} detail")
    for index, status, detail, _ in results:
        op = op_db[index]
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        excluded = EXCLUDED.get(name) or EXCLUDED.get(op.name)
        shown = status if status == "pass" or not excluded else f"excluded ({excluded})"
        counts[status] += 1
        if excluded and status not in ("pass", "no-sample", "export-fail"):
            counts["excluded"] += 1
        if not (failures_only and status == "pass"):
            print(f"{name:44s} {shown:12s} {detail}")
    total = len(results) - counts["no-sample"]
    captured = total - counts["export-fail"]
    passed = counts["pass"]
    print("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"torch.export captured {captured}/{total} OpInfo ops ({100 * captured / total:.1f}%)")
    print(f"from_torch matched eager on {passed}/{captured} captured ops "
          f"({100 * passed / captured:.1f}%); "
          f"{passed}/{captured - counts['excluded']} outside the justified exclusions "
          f"({100 * passed / max(1, captured - counts['excluded']):.1f}%)")
    print(f"swept in {elapsed:.0f} s")
    print("\nexclusion reasons:")
    for key, reason in EXCLUSION_REASONS.items():
        print(f"  {key}: {reason}")


if __name__ == "__main__":
    sys.exit(main())
