"""Helpers the tests share: a deadline that turns a hang into a failure, a run of an ONNX
model on onnxruntime after the full checker, and the comparison of a back end's outputs with
``tdag.run``'s."""
from __future__ import annotations

import contextlib
import signal

import numpy as np
import onnx
import onnxruntime as ort
import torch

import tdag


class Hang(Exception):
    pass


@contextlib.contextmanager
def deadline(seconds: int):
    """Raise Hang if the block runs past ``seconds`` (a guard far above the expected time,
    not a timing assertion)."""
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_onnx(model: onnx.ModelProto, *args: torch.Tensor):
    """The outputs of ``model`` on onnxruntime's CPU provider (a tensor, or a tuple) for
    ``args`` given in the order of the graph's inputs."""
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    # inputs with a default (a program's state) come after the required ones
    inputs = session.get_inputs() + session.get_overridable_initializers()
    feeds = {i.name: a.numpy() for i, a in zip(inputs, args)}
    outs = [torch.from_numpy(np.asarray(o)) for o in session.run(None, feeds)]
    return outs[0] if len(outs) == 1 else tuple(outs)


_TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float64: 1e-7}


def reproduces(model: onnx.ModelProto, args, expected, compare) -> None:
    """``from_onnx(model)`` through tdag.run and through to_onnx on onnxruntime gives
    ``expected`` (the original's outputs on ``args``, numpy arrays): ``compare(got,
    expected_one, what)`` on each output."""
    prog = tdag.from_onnx(model)
    tensors = [torch.from_numpy(a) for a in args]
    for what, got in (("tdag.run", tdag.run(prog, *tensors)),
                      ("to_onnx", run_onnx(tdag.to_onnx(prog), *tensors))):
        got = got if isinstance(got, (tuple, list)) else (got,)
        assert len(got) == len(expected), what
        for g, e in zip(got, expected):
            compare(g, e, what)


def assert_close(got, ref, what=""):
    """Same count, shapes and dtypes; floats within a tolerance of the dtype scaled to the
    reference, NaNs equal; everything else exactly."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    assert len(got) == len(ref), what
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype, (what, a.shape, b.shape, a.dtype, b.dtype)
        if b.is_complex():  # compared as their (real, imaginary) pairs
            a, b = torch.view_as_real(a.resolve_conj()), torch.view_as_real(b.resolve_conj())
        if b.dtype.is_floating_point:
            rtol = _TOL.get(b.dtype, 1e-4)
            scale = b.double().abs().nan_to_num(0, 0, 0).max().item() if b.numel() else 1.0
            torch.testing.assert_close(a.double(), b.double(), rtol=rtol, atol=rtol * scale + 1e-6,
                                       equal_nan=True, msg=what)
        else:
            assert torch.equal(a, b), what
