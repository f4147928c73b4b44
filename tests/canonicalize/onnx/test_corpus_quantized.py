"""The quantized part of issue 20's real-file corpus (tests/support/real_files.py): a ResNet
quantized by onnxruntime's quantize_static (QDQ) and quantize_dynamic, and a
BERT by quantize_dynamic, each written in the standard domains. tdag's program, reified by
to_torch, computes what onnx's reference evaluator computes on the original file: integer
outputs exactly, float outputs to float32 rounding (1e-5 of their scale), and an output
that a DequantizeLinear gives within one of its steps (a float conv summed in another order
may round a value at a tie to its neighbour: one element of the QDQ ResNet's 48 does).
onnxruntime's fused integer kernels round differently, also within one step
(benchmarks/real_files.py measures that and the speed)."""
from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.version_converter
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import tdag

pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("transformers")

from support import real_files as corpus  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quantized")
    resnet, bert = corpus.resnet(folder), corpus.bert(folder)
    with corpus.quiet():
        made = [corpus.static_quantized(resnet, "QDQ"), corpus.dynamic_quantized(resnet),
                corpus.dynamic_quantized(bert)]
    return {f.name: f for f in made}


# quantize_static's QOperator format writes com.microsoft QLinearAdd and
# QLinearGlobalAveragePool, which the reference evaluator does not run (test_contrib_quant.py
# checks them against onnxruntime's kernels)
NAMES = ["resnet+quantize_static-QDQ", "resnet+quantize_dynamic", "bert+quantize_dynamic"]


@pytest.mark.parametrize("name", NAMES)
def test_quantized_file_equals_the_reference_evaluator_through_to_torch(files, name):
    file = files[name]
    assert not file.failed, file.failed
    model = onnx.load(str(file.path))
    domains = {n.domain for n in model.graph.node} - {"", "ai.onnx"}
    assert not domains, f"{name}: nodes of {domains}: the reference evaluator cannot run them"
    # the evaluator implements DequantizeLinear from opset 19 on (same semantics as 13's)
    reference = ReferenceEvaluator(onnx.version_converter.convert_version(model, 21))
    module = tdag.to_torch(tdag.from_onnx(str(file.path)))
    inputs = [i.name for i in model.graph.input]
    steps = _dequantize_steps(model)
    for feed in file.feeds:
        want = reference.run(None, feed)
        got = module(*(torch.from_numpy(np.asarray(feed[n])) for n in inputs))
        got = got if isinstance(got, tuple) else (got,)
        for out, g, w in zip(model.graph.output, got, want):
            g, w = g.detach().numpy(), np.asarray(w)
            if np.issubdtype(w.dtype, np.integer):
                np.testing.assert_array_equal(g, w, err_msg=name)
                continue
            bound = max(1e-5 * max(float(np.abs(w).max()), 1e-6), steps.get(out.name, 0.0))
            np.testing.assert_allclose(g, w, rtol=0, atol=bound * 1.001, err_msg=name)


def _dequantize_steps(model) -> dict[str, float]:
    """Each graph output a DequantizeLinear writes -> its quantization step (the scale)."""
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    return {n.output[0]: float(np.max(consts[n.input[1]])) for n in model.graph.node
            if n.op_type == "DequantizeLinear" and n.output[0] in outputs
            and n.input[1] in consts}
