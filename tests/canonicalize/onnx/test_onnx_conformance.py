"""A fast, fixed subset of ONNX's node conformance sweep (benchmarks/onnx_conformance.py runs
all 1,855 tensor cases): one or two cases of each op that onnx/ops/tensor.py, onnx/ops/norm.py,
onnx/ops/loss.py and onnx/ops/quant.py add, and of each element type beyond the everyday ones
(uint16/32/64, the float8 kinds, bfloat16 where onnxruntime lacks kernels), each through
to_torch and through to_onnx on onnxruntime. None may run and differ (WRONG) or raise a
non-tdag exception (crash); each named here passes.
"""
from __future__ import annotations


import pytest

from onnx_conformance import BACKENDS, run_case

# the generator modules that hold the cases below (importing only these keeps it fast)
MODULES = ("gatherelements", "gathernd", "scatterelements", "scatternd", "topk", "argmax",
           "argmin", "hardmax", "cumsum", "cumprod", "trilu", "onehot", "eyelike",
           "depthtospace", "spacetodepth", "celu", "shrink", "thresholdedrelu", "swish",
           "isinf", "bitshift", "bitwiseand", "bitwisenot", "hannwindow",
           "layernormalization", "rmsnormalization", "lpnormalization", "attention",
           "rotaryembedding", "negativeloglikelihoodloss", "softmax_cross_entropy_loss",
           "quantizelinear", "dequantizelinear", "dynamicquantizelinear", "qlinearmatmul",
           "matmulinteger", "convinteger", "qlinearconv", "lppool", "center_crop_pad",
           "reversesequence", "meanvariancenormalization",
           # element types
           "cast", "castlike", "add", "sub", "max", "less", "div", "bitwisexor", "celu",
           "einsum", "bitcast", "mod",
           # function bodies that compute their shapes; slices along an axis
           "unique")
CASES = [
    "test_gather_elements_negative_indices", "test_gathernd_example_int32_batch_dim1",
    "test_scatter_elements_with_reduction_max", "test_scatternd_add",
    "test_top_k_smallest", "test_argmax_keepdims_random_select_last_index",
    "test_argmin_no_keepdims_example_select_last_index", "test_hardmax_axis_1",
    "test_cumsum_1d_reverse_exclusive", "test_cumprod_2d_axis_1", "test_triu_neg",
    "test_tril_zero", "test_onehot_negative_indices", "test_eyelike_with_dtype",
    "test_depthtospace_crd_mode_example", "test_spacetodepth_crd_mode_example",
    "test_celu", "test_shrink_soft", "test_thresholdedrelu", "test_swish", "test_isinf",
    "test_bitshift_right_int8_negative_shift", "test_bitshift_left_int32_shift_ge_width",
    "test_bitwise_and_i16_3d", "test_bitwise_not_4d", "test_hannwindow_symmetric",
    "test_layer_normalization_4d_axis_negative_2", "test_rms_normalization_3d_axis1_epsilon",
    "test_l2normalization_axis_0", "test_attention_4d_gqa_with_past_and_present",
    "test_attention_3d_causal", "test_attention_4d_attn_mask_bool",
    "test_rotary_embedding_interleaved", "test_nllloss_NCd1d2_with_weight_reduction_mean",
    "test_sce_mean_weight_ii_3d_log_prob", "test_quantizelinear_axis",
    "test_dequantizelinear_blocked", "test_dynamicquantizelinear_min_adjusted",
    "test_qlinearmatmul_2D_int8_float32", "test_matmulinteger", "test_convinteger_with_padding",
    "test_qlinearconv", "test_lppool_2d_same_upper", "test_center_crop_pad_crop_and_pad",
    "test_reversesequence_batch", "test_mvn",
    # element types
    "test_cast_FLOAT_to_FLOAT8E4M3FN", "test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2",
    "test_cast_FLOAT8E4M3FNUZ_to_FLOAT", "test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded",
    "test_cast_e8m0_FLOAT_to_FLOAT8E8M0", "test_add_uint32", "test_sub_uint64",
    "test_sub_uint16", "test_max_uint16", "test_less_uint64", "test_top_k_uint64",
    "test_bitshift_right_uint64", "test_bitwise_xor_ui64_bcast_3v1d", "test_bitwise_not_3d",
    "test_quantizelinear_e4m3fn", "test_quantizelinear_uint16", "test_dequantizelinear_e5m2",
    "test_celu_bfloat16", "test_einsum_batch_matmul_bfloat16", "test_bitcast_float32_to_int32",
    "test_bitcast_uint16_to_int16",
    # function bodies that compute their shapes (Shape -> Gather -> Div/Mod -> Concat ->
    # Reshape/Expand); Unique's distinct slices
    "test_attention_4d_gqa_expanded", "test_layer_normalization_2d_axis_negative_1_expanded",
    "test_unique_sorted_with_axis_3d",
]


@pytest.fixture(scope="module")
def cases():
    from support.onnx_cases import node_cases  # noqa: PLC0415
    return node_cases(tuple(CASES), modules=MODULES)


def test_every_named_case_exists(cases):
    assert set(CASES) <= set(cases), sorted(set(CASES) - set(cases))


@pytest.mark.parametrize("name", CASES)
def test_case_passes_both_ways(cases, name):
    model, ins, outs = cases[name]
    result = run_case(model, ins, outs, limit=60)
    for backend in BACKENDS:
        kind, detail = result[backend]
        assert kind == "pass", (backend, kind, detail)


def test_a_kernel_onnxruntime_lacks_is_unsupported_when_the_case_fails_there_too(monkeypatch):
    """BitCast of bool has no onnxruntime kernel, in the case's own model too: re-emitting
    that model as is counts as unsupported (the runtime lacks it), not as a crash."""
    import onnx_conformance  # noqa: PLC0415
    from support.onnx_cases import node_cases  # noqa: PLC0415
    name = "test_bitcast_bool_to_uint8"
    model, ins, outs = node_cases((name,), modules=("bitcast",))[name]
    monkeypatch.setattr(onnx_conformance.tdag, "to_onnx", lambda prog: model)
    kind, detail = run_case(model, ins, outs, limit=60)["onnx"]
    assert kind == "unsupported" and detail.startswith("onnxruntime lacks a kernel"), detail


def test_inexact_shipped_values_pass_only_against_the_reference():
    """RoiAlign's shipped values were written to four decimals: onnx's ReferenceEvaluator
    misses them too, so tdag's output passes against the reference (said in the detail); an
    output that misses the reference as well stays WRONG."""
    import numpy as np  # noqa: PLC0415
    from support.onnx_cases import node_cases  # noqa: PLC0415
    from onnx_conformance import REFERENCE_NOTE, judge  # noqa: PLC0415
    name = "test_roialign_aligned_true"
    model, ins, outs = node_cases((name,), modules=("roialign",))[name]
    result = run_case(model, ins, outs, limit=60)
    for backend in BACKENDS:
        kind, detail = result[backend]
        assert kind == "pass" and detail.startswith(REFERENCE_NOTE), (backend, kind, detail)
    off = [np.asarray(outs[0]) + np.float32(1e-3)]
    assert judge(off, outs, model, ins)[0] == "WRONG"
