"""The suite's shared setup: the import path of its helpers.

tests/ is no package, so pytest (its default prepend import mode) puts this folder on
``sys.path`` before it imports any test: the helpers the tests share import as
``from support.guards import run_onnx``. benchmarks/ goes on the path too (at its end), for the
tests that feed onnxruntime as the conformance sweep does (``from onnx_conformance import ...``).
A test module never imports another test module: what two of them share lives in support/.

The suite runs on every core (pytest-xdist's ``-n auto`` in pyproject.toml): each worker
keeps torch to its share of the cores, as two pools of spinning threads on two cores make
small kernels many times slower.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))


def pytest_configure(config):
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workers)))
