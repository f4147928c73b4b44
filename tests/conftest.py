"""The suite's shared setup: the import path of its helpers.

tests/ is no package, so pytest (its default prepend import mode) puts this folder on
``sys.path`` before it imports any test: the helpers the tests share import as
``from support.guards import run_onnx``. benchmarks/ goes on the path too (at its end), for the
tests that feed onnxruntime as the conformance sweep does (``from onnx_conformance import ...``).
A test module never imports another test module: what two of them share lives in support/.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))
