"""How fast is a reified FFT? ``torch.fft.fft`` / ``rfft`` / ``irfft`` captured with
from_torch, over 65,536 points and over a batch of 1,024 transforms of 1,024 points (the
first irfft case: of a real 1,024 x 1,024 tensor, 2,046 points each): tdag's torch module /
eager, and tdag's ONNX file on onnxruntime / eager (issue 24's target: within 1.5x each).

Each side on one thread, timed interleaved (A B B A ...) in one process, medians compared.
ONNX has no complex tensors: each case returns ``torch.view_as_real`` of the transform, so
the file's output is the (real, imaginary) pairs tdag emits for it.

    python benchmarks/fft_speed.py
    python benchmarks/fft_speed.py --rounds 31
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402
from reify_speed import _inner, interleaved, set_threads  # noqa: E402
from support.torch_models import Fn  # noqa: E402

import tdag  # noqa: E402

CASES = {
    "fft 65,536": (lambda x: torch.view_as_real(torch.fft.fft(x)), (65_536,)),
    "rfft 65,536": (lambda x: torch.view_as_real(torch.fft.rfft(x)), (65_536,)),
    "fft 1,024 x 1,024": (lambda x: torch.view_as_real(torch.fft.fft(x)), (1_024, 1_024)),
    "rfft 1,024 x 1,024": (lambda x: torch.view_as_real(torch.fft.rfft(x)), (1_024, 1_024)),
    "irfft 1,024 x 1,024": (lambda x: torch.fft.irfft(x), (1_024, 1_024)),  # 2,046 points
    "irfft 1,024 x 513": (lambda x: torch.fft.irfft(torch.view_as_complex(x)), (1_024, 513, 2)),
}


def _session(prog):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(tdag.to_onnx(prog).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: session.run(None, {name: x})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    set_threads(1)
    print(f"{'case':22} {'eager ms':>9} {'tdag ms':>9} {'torch x':>8} {'ort ms':>9} "
          f"{'onnx x':>7}")
    for name, (fn, shape) in CASES.items():
        torch.manual_seed(0)
        x = torch.randn(*shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = tdag.from_torch(Fn(fn).eval(), (x,))
            module, run_onnx = tdag.to_torch(prog), _session(prog)
        with torch.no_grad():
            eager, reified = (lambda: fn(x)), (lambda: module(x))
            inner = _inner(eager)
            t_eager, t_tdag = interleaved(eager, reified, args.rounds, inner)
            xn = x.numpy()
            _, t_ort = interleaved(eager, lambda: run_onnx(xn), args.rounds, inner)
        print(f"{name:22} {t_eager * 1e3:>9.3f} {t_tdag * 1e3:>9.3f} {t_tdag / t_eager:>8.2f} "
              f"{t_ort * 1e3:>9.3f} {t_ort / t_eager:>7.2f}")


if __name__ == "__main__":
    main()
