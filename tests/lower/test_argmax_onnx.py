"""The argmax/argmin kernels' ONNX form against torch: onnxruntime's ArgMax/ArgMin skip NaN
where torch returns the first NaN, so the file guards it under an If on the tensor's sum
being NaN. Checked on rows with NaN anywhere, +inf before a NaN, inf - inf sums without a
NaN, and ties (the first position wins), in every float width."""
from __future__ import annotations

import onnxruntime as ort
import pytest
import torch

import tdag

NAN, INF = float("nan"), float("inf")
ROWS = {
    "random": torch.randn(6, 7),
    "nan_and_inf": torch.tensor([[NAN, 1, 2, 3, 4, 5, 6], [1, NAN, 3, 2, 0, 0, NAN],
                                 [1, 2, 3, 4, 5, 6, NAN], [INF, NAN, 1, 2, 3, 4, 5],
                                 [-INF, 1, INF, 2, -INF, 3, NAN], [3, 3, 1, 3, -INF, -INF, 2]]),
    "inf_minus_inf": torch.tensor([[INF, -INF, 1, 2, INF, -INF, 5]] * 6),
    "ties": torch.tensor([[1, 3, 3, 1, 1, 3, 1]] * 6),
}


class Arg(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x, -1)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("fn", [torch.argmax, torch.argmin])
def test_onnx_arg_extreme_returns_torchs_first_nan_or_extreme(fn, dtype):
    prog = tdag.from_torch(Arg(fn), (torch.randn(6, 7, dtype=dtype),))
    model = tdag.to_onnx(prog)
    assert {"ArgMax", "ArgMin"} & {n.op_type for n in model.graph.node}
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    for name, rows in ROWS.items():
        x = rows.to(dtype)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        assert got.tolist() == fn(x, -1).tolist(), name
