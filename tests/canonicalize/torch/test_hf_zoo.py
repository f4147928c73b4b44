"""``benchmarks/hf_zoo.py``'s checks as tests: a Hugging Face architecture built from a tiny
config with random weights through from_torch, to_torch (values, the source's state dict
loaded strict, and every parameter's gradient against eager's), to_onnx on onnxruntime
(values) and the cost and memory reports. By default the architectures an earlier tdag
refused (RWKV's and RecurrentGemma's scans write into columns of a fresh tensor; BiT
standardises its conv weights with a batch-statistics batch norm) and one of each other
family; ``-m slow`` runs all of them (about five minutes)."""
from __future__ import annotations

import pytest

hf_zoo = pytest.importorskip("hf_zoo")

# torch.export itself fails on this (plain torch.export.export, strict=False, fails alike):
# a branch on whether any token is global (longformer). (DBRX's and Switch Transformers'
# loops over the experts hit are captured in traceable forms, and Switch's router moving
# its classifier to the dtype it has as the no-op it is: tdag/canonicalize/torch/experts.py.)
EXPORT_FAILS = {
    "longformer": "torch.export: data-dependent branch on global attention",
}
DEFAULT = ("rwkv", "recurrent_gemma", "bit", "mamba2", "deepseek_v3", "gemma3", "deberta_v2",
           "swin", "wav2vec2_conformer", "bart")


def _check(name: str) -> None:
    row = hf_zoo.check(name, hf_zoo.MODELS[name], "eager")
    assert hf_zoo.passed(row), "\n".join([hf_zoo.line(row), *hf_zoo.failures(row, True)])


@pytest.mark.parametrize("name", DEFAULT)
def test_architecture(name):
    _check(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(hf_zoo.MODELS) - set(DEFAULT)))
def test_every_architecture(name):
    if name in EXPORT_FAILS:
        pytest.xfail(EXPORT_FAILS[name])
    _check(name)
