"""Fuzzing every loader of tdag with hostile and damaged input.

Targets: ``tdag.from_onnx`` (onnx_cases.py), ``tdag.load`` (tdag_cases.py), ``tdag.parse``
(text_cases.py, and hypothesis in test_fuzz_text.py), ``tdag.from_torch`` on ``.pt2`` files
(pt2_cases.py) and the command line (test_fuzz_cli.py). harness.py runs the cases in worker
processes and classifies each outcome: ok, clean, escape, hang, executed, malformed (and
leaked, harness); the tests assert that none is escape, hang, executed or malformed.

    python -m pytest tests/fuzz                 # the quick run: fixed seeds, a few minutes
    python -m pytest tests/fuzz -m fuzz         # the long run (deselected by default)
    TDAG_FUZZ_OUT=/tmp/fuzz python -m pytest tests/fuzz    # keep summary and reproductions

Environment: TDAG_FUZZ_WORKERS (parallel workers, default 2), TDAG_FUZZ_MEMORY (a worker's
address-space limit in bytes), TDAG_FUZZ_KEEP (keep the files of every case, not only the
bad ones).
"""
