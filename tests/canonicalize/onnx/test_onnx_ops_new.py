"""The ONNX ops tdag maps as compositions of its primitives in onnx/ops/vision.py,
onnx/ops/signal.py and onnx/ops/resize.py: each on small hand-built graphs (random inputs,
attributes varied) against onnxruntime, or onnx's ReferenceEvaluator where onnxruntime lacks
the op or the opset, through tdag.run, tdag.to_torch and tdag.to_onnx (on onnxruntime)."""
from __future__ import annotations


import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import tdag

from support.guards import run_onnx

RNG = np.random.default_rng(7)
F32, I64 = TensorProto.FLOAT, TensorProto.INT64


def _r(*shape, low=-1.0, high=1.0):
    return RNG.uniform(low, high, shape).astype(np.float32)


class Const:
    """An input given as an initializer (known while importing)."""

    def __init__(self, value):
        self.value = np.asarray(value)


def _model(op, inputs, attrs=None, opset=20, outputs=1):
    """One node; ``inputs`` (name, array | Const | None) in the node's order: an array is a
    graph input, a Const an initializer, None an omitted optional input."""
    names = [name if value is not None else "" for name, value in inputs]
    while names and not names[-1]:  # trailing omitted inputs are left out
        names.pop()
    graph_inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(value.dtype), value.shape)
        for name, value in inputs if isinstance(value, np.ndarray)]
    inits = [numpy_helper.from_array(value.value, name) for name, value in inputs
             if isinstance(value, Const)]
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    graph = helper.make_graph([node], op, graph_inputs,
                              [helper.make_tensor_value_info(o, F32, None) for o in outs],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    feeds = {name: value for name, value in inputs if isinstance(value, np.ndarray)}
    return model, feeds


def _expected(model, feeds, oracle: str):
    if oracle == "ort":
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        return session.run(None, feeds)
    return ReferenceEvaluator(model).run(None, feeds)


def _close(got, expected, what):
    got = [np.asarray(g) for g in (got if isinstance(got, (tuple, list)) else (got,))]
    assert len(got) == len(expected), what
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.shape == e.shape, (what, g.shape, e.shape)
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e, err_msg=what)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5, err_msg=what)


def numpy(out):
    return out.numpy() if isinstance(out, torch.Tensor) else tuple(o.numpy() for o in out)


def _check(model, feeds, oracle="ort"):
    """tdag.run, to_torch and to_onnx all give the oracle's outputs."""
    expected = _expected(model, feeds, oracle)
    prog = tdag.from_onnx(model)
    args = [torch.from_numpy(np.require(v)) for v in feeds.values()]
    _close(numpy(tdag.run(prog, *args)), expected, "tdag.run")
    with torch.no_grad():
        _close(numpy(tdag.to_torch(prog)(*args)), expected, "to_torch")
    _close(numpy(run_onnx(tdag.to_onnx(prog), *args)), expected, "to_onnx")


# -- GridSample, AffineGrid ---------------------------------------------------------------------

GRID_SAMPLE = [  # (opset, mode, padding, align_corners, spatial)
    (16, "bilinear", "zeros", 0, 2), (16, "bilinear", "border", 1, 2),
    (16, "nearest", "reflection", 0, 2), (16, "bicubic", "zeros", 1, 2),
    (20, "cubic", "reflection", 1, 2), (20, "cubic", "border", 0, 2),
    (20, "linear", "reflection", 1, 2), (20, "nearest", "border", 1, 2),
    (20, "linear", "zeros", 0, 3), (20, "nearest", "reflection", 1, 3),
]


@pytest.mark.parametrize("opset,mode,padding,align,spatial", GRID_SAMPLE)
def test_grid_sample(opset, mode, padding, align, spatial):
    x = _r(2, 3, *(5, 4, 3)[:spatial])
    grid = _r(2, *(4, 3, 2)[:spatial], spatial, low=-1.4, high=1.4)  # some points outside
    model, feeds = _model("GridSample", [("x", x), ("grid", grid)],
                          dict(mode=mode, padding_mode=padding, align_corners=align), opset)
    _check(model, feeds, "ort" if spatial == 2 else "ref")


@pytest.mark.parametrize("spatial,align,runtime_size", [(2, 0, False), (2, 1, True),
                                                         (3, 0, True), (3, 1, False)])
def test_affine_grid(spatial, align, runtime_size):
    theta = _r(2, spatial, spatial + 1)
    size = np.array([2, 3, 4, 5, 6][:spatial + 2], np.int64)
    model, feeds = _model("AffineGrid", [("theta", theta),
                                         ("size", size if runtime_size else Const(size))],
                          dict(align_corners=align))
    _check(model, feeds, "ref")


# -- NonMaxSuppression --------------------------------------------------------------------------

def _boxes(batches, count, center):
    centre, extent = _r(batches, count, 2, low=0, high=4), _r(batches, count, 2, low=0.5, high=2)
    if center:
        return np.concatenate([centre, extent], -1)
    corner0, corner1 = centre - extent / 2, centre + extent / 2
    flip = RNG.random((batches, count, 1)) < 0.5  # either diagonal is a valid box
    y0 = np.where(flip, corner1[..., 1:], corner0[..., 1:])
    y1 = np.where(flip, corner0[..., 1:], corner1[..., 1:])
    return np.concatenate([y0, corner0[..., :1], y1, corner1[..., :1]], -1).astype(np.float32)


@pytest.mark.parametrize("center,limit,iou,score", [(0, 3, 0.3, 0.2), (1, 5, 0.5, None),
                                                     (0, 10, 0.0, 0.6), (1, 2, 0.7, 0.0)])
def test_non_max_suppression(center, limit, iou, score):
    boxes, scores = _boxes(2, 9, center), _r(2, 3, 9, low=0, high=1)
    inputs = [("boxes", boxes), ("scores", scores),
              ("limit", np.array([limit], np.int64)), ("iou", np.array([iou], np.float32)),
              ("score", None if score is None else np.array([score], np.float32))]
    model, feeds = _model("NonMaxSuppression", inputs, dict(center_point_box=center), 11)
    model.graph.output[0].type.tensor_type.elem_type = I64
    _check(model, feeds)


def test_non_max_suppression_without_a_limit_selects_nothing():
    model, feeds = _model("NonMaxSuppression", [("boxes", _boxes(1, 4, 0)),
                                                ("scores", _r(1, 2, 4))], opset=11)
    model.graph.output[0].type.tensor_type.elem_type = I64
    _check(model, feeds)


# -- RoiAlign, DeformConv -----------------------------------------------------------------------

@pytest.mark.parametrize("mode,transform,scale,ratio", [("avg", "half_pixel", 1.0, 2),
                                                        ("avg", "output_half_pixel", 0.5, 3),
                                                        ("max", "output_half_pixel", 1.0, 2),
                                                        ("max", "half_pixel", 0.5, 1)])
def test_roi_align(mode, transform, scale, ratio):
    x = _r(2, 3, 8, 7)
    rois = np.sort(_r(4, 2, 2, low=-2, high=12), axis=1).reshape(4, 4)  # x1 y1 x2 y2
    model, feeds = _model("RoiAlign", [("x", x), ("rois", rois),
                                       ("batch", np.array([0, 1, 1, 0], np.int64))],
                          dict(mode=mode, coordinate_transformation_mode=transform,
                               output_height=3, output_width=2, sampling_ratio=ratio,
                               spatial_scale=scale), 22)
    _check(model, feeds, "ref")


@pytest.mark.parametrize("group,offset_group,mask,bias,stride,dilation,pad", [
    (1, 1, False, False, 1, 1, 0), (2, 2, True, True, 1, 1, 1), (1, 2, True, False, 2, 1, 1),
    (2, 1, False, True, 1, 2, 0)])
def test_deform_conv(group, offset_group, mask, bias, stride, dilation, pad):
    x, w = _r(2, 4, 6, 5), _r(6, 4 // group, 3, 2)
    out_h = (6 + 2 * pad - dilation * 2 - 1) // stride + 1
    out_w = (5 + 2 * pad - dilation * 1 - 1) // stride + 1
    inputs = [("x", x), ("w", w), ("offset", _r(2, offset_group * 12, out_h, out_w, low=-2,
                                               high=2)),
              ("b", _r(6) if bias else None),
              ("mask", _r(2, offset_group * 6, out_h, out_w, low=0, high=1) if mask else None)]
    model, feeds = _model("DeformConv", inputs, dict(
        group=group, offset_group=offset_group, kernel_shape=[3, 2], strides=[stride] * 2,
        dilations=[dilation] * 2, pads=[pad] * 4), 22)
    _check(model, feeds, "ref")


# -- DFT ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("opset,parts,axis,inverse,onesided,length", [
    (17, 1, 1, 0, 0, None), (17, 2, 2, 0, 0, None), (17, 2, 1, 1, 0, None),
    (17, 1, 2, 0, 1, None), (17, 1, 1, 0, 0, 9), (17, 2, 1, 1, 0, 4),
    (20, 2, -2, 0, 0, None), (20, 1, 1, 0, 1, 8), (20, 2, 1, 1, 1, None), (20, 2, 1, 1, 1, 7)])
def test_dft(opset, parts, axis, inverse, onesided, length):
    x = _r(2, 6, 5, parts)
    length_input = ("n", None if length is None else Const(np.array(length, np.int64)))
    attrs = dict(inverse=inverse, onesided=onesided)
    if opset < 20:
        inputs, attrs["axis"] = [("x", x), length_input], axis
    else:
        inputs = [("x", x), length_input, ("axis", Const(np.array(axis, np.int64)))]
    model, feeds = _model("DFT", inputs, attrs, opset)
    _check(model, feeds, "ref")


def test_dft_axis_given_at_run_time():
    x = _r(2, 6, 6, 2)
    for axis in (1, -3, 2):
        model, feeds = _model("DFT", [("x", x), ("n", None), ("axis", np.array(axis, np.int64))],
                              dict(inverse=1))
        _check(model, feeds, "ref")


# -- Resize -------------------------------------------------------------------------------------

RESIZE = {
    "cubic": dict(mode="cubic"),
    "cubic_a_exclude": dict(mode="cubic", cubic_coeff_a=-0.5, exclude_outside=1),
    "cubic_asymmetric": dict(mode="cubic", coordinate_transformation_mode="asymmetric"),
    "linear_antialias": dict(mode="linear", antialias=1),
    "cubic_antialias": dict(mode="cubic", antialias=1),
    "linear_half_pixel_symmetric": dict(mode="linear",
                                        coordinate_transformation_mode="half_pixel_symmetric"),
    "nearest_pytorch_half_pixel": dict(mode="nearest", nearest_mode="round_prefer_ceil",
                                       coordinate_transformation_mode="pytorch_half_pixel"),
}


@pytest.mark.parametrize("name", sorted(RESIZE))
@pytest.mark.parametrize("scales", [(1, 1, 0.6, 0.75), (1, 1, 1.7, 2.5)])
def test_resize_scales(name, scales):
    model, feeds = _model("Resize", [("x", _r(2, 3, 7, 6)), ("roi", None),
                                     ("scales", Const(np.array(scales, np.float32)))],
                          RESIZE[name], 19)
    _check(model, feeds)


@pytest.mark.parametrize("policy,sizes", [("not_larger", (4, 9)), ("not_smaller", (4, 9)),
                                          ("stretch", (3, 11))])
def test_resize_sizes_keep_aspect_ratio(policy, sizes):
    model, feeds = _model("Resize", [("x", _r(1, 2, 5, 6)), ("roi", None), ("scales", None),
                                     ("sizes", Const(np.array(sizes, np.int64)))],
                          dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy=policy),
                          19)
    _check(model, feeds)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
def test_resize_tf_crop_and_resize(mode):
    roi = np.array([0, 0, 0.2, -0.1, 1, 1, 0.9, 1.2], np.float32)  # partly outside: extrapolated
    model, feeds = _model("Resize", [("x", _r(1, 2, 6, 6)), ("roi", Const(roi)), ("scales", None),
                                     ("sizes", Const(np.array([1, 2, 4, 5], np.int64)))],
                          dict(mode=mode, coordinate_transformation_mode="tf_crop_and_resize",
                               extrapolation_value=3.0), 19)
    _check(model, feeds, "ref")


def test_resize_align_corners_with_a_fractional_length_is_refused():
    model, _ = _model("Resize", [("x", _r(1, 1, 2, 4)), ("roi", None),
                                 ("scales", Const(np.array([1, 1, 0.6, 0.6], np.float32)))],
                      dict(mode="linear", coordinate_transformation_mode="align_corners"), 19)
    with pytest.raises(tdag.UnsupportedOpError, match="align_corners"):
        tdag.from_onnx(model)


# -- STFT, MelWeightMatrix ----------------------------------------------------------------------

@pytest.mark.parametrize("parts,step,runtime_step,window,length,onesided", [
    (1, 4, True, True, None, 1), (1, 3, False, False, 10, 1), (2, 5, True, False, 8, 0),
    (1, 6, False, True, None, 0), (1, 4, True, False, "runtime", 1)])
def test_stft(parts, step, runtime_step, window, length, onesided):
    step_value = np.array(step, np.int64)
    inputs = [("signal", _r(2, 40, parts)),
              ("step", step_value if runtime_step else Const(step_value)),
              ("window", _r(12, low=0, high=1) if window else None),
              ("length", None if length is None else np.array(9, np.int64)
               if length == "runtime" else Const(np.array(length, np.int64)))]
    model, feeds = _model("STFT", inputs, dict(onesided=onesided), 17)
    _check(model, feeds, "ref")


@pytest.mark.parametrize("bins,length,rate,low,high", [(8, 16, 8192, 0.0, 4096.0),
                                                        (5, 32, 16000, 100.0, 7000.0),
                                                        (12, 64, 22050, 20.0, 9000.0)])
def test_mel_weight_matrix(bins, length, rate, low, high):
    model, feeds = _model("MelWeightMatrix", [
        ("bins", np.array(bins, np.int32)), ("length", np.array(length, np.int32)),
        ("rate", np.array(rate, np.int32)), ("low", np.array(low, np.float32)),
        ("high", np.array(high, np.float32))], opset=17)
    _check(model, feeds, "ref")


# -- Col2Im -------------------------------------------------------------------------------------

@pytest.mark.parametrize("image,block,strides,dilations,pads,runtime", [
    ((5, 6), (2, 3), (1, 1), (1, 1), (0, 0, 0, 0), False),
    ((7, 6), (3, 2), (2, 1), (1, 2), (1, 0, 1, 1), True),
    ((4, 5, 3), (2, 2, 1), (1, 2, 1), (1, 1, 1), (0, 1, 0, 0, 1, 0), True),
    ((6, 6), (2, 2), (2, 2), (1, 1), (0, 0, 0, 0), False)])
def test_col2im(image, block, strides, dilations, pads, runtime):
    rank = len(image)
    blocks = [(image[d] + pads[d] + pads[rank + d] - dilations[d] * (block[d] - 1) - 1)
              // strides[d] + 1 for d in range(rank)]
    x = _r(2, 3 * int(np.prod(block)), int(np.prod(blocks)))
    image_shape, block_shape = np.array(image, np.int64), np.array(block, np.int64)
    inputs = [("x", x), ("image", image_shape if runtime else Const(image_shape)),
              ("block", block_shape if runtime else Const(block_shape))]
    model, feeds = _model("Col2Im", inputs, dict(strides=list(strides),
                                                 dilations=list(dilations), pads=list(pads)), 18)
    _check(model, feeds, "ref")



# -- pooling past torch's kernels: dilated averages, pads past half the kernel ------------------

@pytest.mark.parametrize("op,dilations,pads,ceil,include", [
    ("AveragePool", (2, 1), (0, 0, 0, 0), 0, 0), ("AveragePool", (2, 2), (1, 2, 1, 0), 1, 1),
    ("AveragePool", (1, 1), (2, 2, 2, 2), 0, 1), ("AveragePool", (1, 2), (2, 0, 2, 2), 1, 0),
    ("MaxPool", (1, 1), (2, 2, 2, 2), 0, 0), ("MaxPool", (2, 1), (2, 1, 2, 0), 1, 0),
    ("LpPool", (2, 1), (2, 2, 2, 2), 0, 0), ("LpPool", (1, 1), (1, 0, 1, 1), 1, 0)])
def test_pooling_beyond_torch(op, dilations, pads, ceil, include):
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], dilations=list(dilations),
                 pads=list(pads), ceil_mode=ceil)
    if op == "AveragePool":
        attrs["count_include_pad"] = include
    if op == "LpPool":
        attrs["p"] = 3
    model, feeds = _model(op, [("x", _r(2, 3, 9, 8))], attrs, 19)
    _check(model, feeds)


# -- ConvTranspose's output_shape and auto_pad --------------------------------------------------

@pytest.mark.parametrize("attrs", [
    dict(output_shape=[10, 8], strides=[3, 2]),
    dict(output_shape=[9, 6], strides=[3, 2], pads=[1, 0, 1, 1]),
    dict(output_shape=[10, 8], strides=[3, 2], output_padding=[1, 1]),
    dict(auto_pad="SAME_UPPER", strides=[2, 2]),
    dict(auto_pad="SAME_LOWER", strides=[2, 3], dilations=[2, 1]),
    dict(output_shape=[8, 9], strides=[2, 3], auto_pad="SAME_UPPER")])
def test_conv_transpose_output_shape_and_auto_pad(attrs):
    model, feeds = _model("ConvTranspose", [("x", _r(2, 4, 3, 3)), ("w", _r(4, 2, 3, 3))],
                          attrs, 22)
    _check(model, feeds)


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1])),
    ((2, 3, 7, 6), dict(kernel_shape=[3, 3], strides=[2, 1], storage_order=1, ceil_mode=1)),
    ((1, 2, 5, 4, 6), dict(kernel_shape=[2, 2, 3], strides=[1, 2, 2], pads=[0, 1, 1, 1, 0, 1]))])
def test_max_pool_indices(shape, attrs):
    model, feeds = _model("MaxPool", [("x", _r(*shape))], attrs, 12, outputs=2)
    model.graph.output[1].type.tensor_type.elem_type = I64
    _check(model, feeds)


@pytest.mark.parametrize("output_shape", [None, "const", "runtime"])
def test_max_unpool(output_shape):
    pool = dict(kernel_shape=[2, 3], strides=[2, 2])  # unpools back to 6 x 7
    pooled, _ = _model("MaxPool", [("x", _r(2, 3, 6, 7))], pool, 12, outputs=2)
    pooled.graph.output[1].type.tensor_type.elem_type = I64
    values, indices = _expected(pooled, {"x": _r(2, 3, 6, 7)}, "ort")
    shape = np.array([2, 3, 8, 9], np.int64)
    given = {None: None, "const": Const(shape), "runtime": shape}[output_shape]
    model, feeds = _model("MaxUnpool", [("x", values), ("i", indices), ("shape", given)],
                          pool, 11)
    # with output_shape, onnxruntime reads the indices in the output's shape; the reference
    # and ONNX's own test case (test_maxunpool_export_with_output_shape) in the unpooled
    # shape, zero-filled at the end: tdag follows the latter
    _check(model, feeds, "ort" if output_shape is None else "ref")


@pytest.mark.parametrize("mode,scales", [("nearest", (1, 1, 2, 3)), ("linear", (1, 1, 1.5, 2.5)),
                                         ("nearest", (1, 2, 1, 1.7))])
def test_upsample_scales_at_run_time(mode, scales):
    model, feeds = _model("Upsample", [("x", _r(2, 3, 4, 5)),
                                       ("scales", np.array(scales, np.float32))],
                          dict(mode=mode), 9)
    _check(model, feeds)


# -- ops the standard defines as functions ------------------------------------------------------

@pytest.mark.parametrize("alpha", [None, 1.7])
def test_swiglu(alpha):
    model, feeds = _model("SwiGLU", [("a", _r(2, 5, 6)), ("b", _r(2, 5, 6))],
                          {} if alpha is None else dict(alpha=alpha), 28)
    _check(model, feeds, "ref")


@pytest.mark.parametrize("activation,bias,past", [("none", False, False), ("silu", True, True),
                                                   ("none", True, False)])
def test_causal_conv_with_state(activation, bias, past):
    inputs = [("x", _r(2, 4, 7)), ("w", _r(4, 1, 3)), ("b", _r(4) if bias else None),
              ("past", _r(2, 4, 2) if past else None)]
    model, feeds = _model("CausalConvWithState", inputs, dict(activation=activation), 27,
                          outputs=2)
    _check(model, feeds, "ref")


@pytest.mark.parametrize("mode,axis,indices", [("linear", -2, None), ("linear", 2, (0, 3)),
                                               ("circular", -2, (5, 2)), ("circular", 1, (6, 0))])
def test_tensor_scatter(mode, axis, indices):
    cache_shape, update_shape = [2, 3, 7, 4], [2, 3, 7, 4]
    update_shape[axis] = 3
    inputs = [("cache", _r(*cache_shape)), ("update", _r(*update_shape)),
              ("at", None if indices is None else np.array(indices, np.int64))]
    model, feeds = _model("TensorScatter", inputs, dict(mode=mode, axis=axis), 24)
    _check(model, feeds, "ref")


# -- conformance cases whose shipped outputs are rounded ----------------------------------------

ROUNDED = {"test_averagepool_2d_ceil_last_window_starts_on_pad": "averagepool",
           "test_gridsample_bicubic": "gridsample", "test_roialign_aligned_false": "roialign",
           "test_roialign_aligned_true": "roialign"}


@pytest.mark.parametrize("name", sorted(ROUNDED))
def test_conformance_cases_with_rounded_outputs_match_the_reference(name):
    """These cases ship hand-written outputs to 4 decimals (within a unit of the 4th of the
    exact values): past the conformance sweep's tolerance (rtol 1e-4, atol 1e-5), so the
    sweep counts them WRONG. tdag gives the ReferenceEvaluator's values (and onnxruntime's,
    where it runs the op), which the shipped ones approximate."""
    from support.onnx_cases import node_cases  # noqa: PLC0415
    model, inputs, (shipped,) = node_cases((name,), modules=(ROUNDED[name],))[name]
    feeds = dict(zip([i.name for i in model.graph.input], inputs))
    exact = _expected(model, feeds, "ref")[0]
    got = numpy(tdag.run(tdag.from_onnx(model), *[torch.from_numpy(i) for i in inputs]))
    np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(shipped, exact, rtol=0, atol=1.01e-4)


# -- Det ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["one", "batched", "pivoting", "singular", "larger"])
def test_det(name):
    x = {"one": _r(1, 1), "batched": _r(2, 3, 3, 3), "larger": _r(4, 6, 6),
         "pivoting": np.array([[0, 2, 1], [1, 0, 3], [2, 1, 0]], np.float32),
         "singular": np.array([[[1, 2, 3], [2, 4, 6], [0, 1, 1]], [[0, 0, 0], [1, 2, 3],
                                                                   [4, 5, 6]]], np.float32)}[name]
    model, feeds = _model("Det", [("x", x)], opset=11)
    _check(model, feeds)


@pytest.mark.parametrize("given", [True, False])
def test_optional_has_element_of_a_tensor(given):
    model, feeds = _model("OptionalHasElement", [("x", _r(2, 3) if given else None)],
                          opset=18)
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.BOOL
    _check(model, feeds)


@pytest.mark.parametrize("training,ratio", [(None, None), (False, 0.3), (True, 0.0)])
def test_dropout_mask_when_nothing_drops(training, ratio):
    inputs = [("x", _r(2, 3)), ("ratio", None if ratio is None else
                                Const(np.array(ratio, np.float32))),
              ("training", None if training is None else Const(np.array(training)))]
    model, feeds = _model("Dropout", inputs, opset=13, outputs=2)
    model.graph.output[1].type.tensor_type.elem_type = TensorProto.BOOL
    _check(model, feeds)


def test_dropout_in_training_is_refused():
    model, _ = _model("Dropout", [("x", _r(2, 3)), ("ratio", Const(np.array(0.5, np.float32))),
                                  ("training", Const(np.array(True)))], opset=13)
    with pytest.raises(tdag.UnsupportedOpError, match="training"):
        tdag.from_onnx(model)


@pytest.mark.parametrize("shape,momentum", [((4, 3, 5, 2), None), ((6, 2, 7), 0.7)])
def test_batch_norm_training(shape, momentum):
    channels = shape[1]
    inputs = [("x", _r(*shape)), ("scale", _r(channels)), ("bias", _r(channels)),
              ("mean", _r(channels)), ("var", _r(channels, low=0.5, high=2))]
    attrs = dict(training_mode=1, epsilon=1e-3)
    if momentum is not None:
        attrs["momentum"] = momentum
    model, feeds = _model("BatchNormalization", inputs, attrs, 15, outputs=3)
    _check(model, feeds)


@pytest.mark.parametrize("rule,q_heads,kv_heads,past,per_head,scale", [
    ("linear", 2, 2, False, False, None), ("gated", 4, 2, True, True, None),
    ("delta", 2, 1, False, False, 0.3), ("gated_delta", 4, 2, True, False, None),
    ("gated_delta", 2, 2, False, True, 0.5)])
def test_linear_attention(rule, q_heads, kv_heads, past, per_head, scale):
    batch, steps, key_dim, value_dim = 2, 3, 4, 5
    gated, delta = "gated" in rule, "delta" in rule
    decay = _r(batch, steps, kv_heads * (1 if per_head else key_dim), low=-1, high=0)
    inputs = [("q", _r(batch, steps, q_heads * key_dim)),
              ("k", _r(batch, steps, kv_heads * key_dim)),
              ("v", _r(batch, steps, kv_heads * value_dim)),
              ("past", _r(batch, kv_heads, key_dim, value_dim) if past else None),
              ("decay", decay if gated else None),
              ("beta", _r(batch, steps, kv_heads, low=0, high=1) if delta else None)]
    attrs = dict(update_rule=rule, q_num_heads=q_heads, kv_num_heads=kv_heads)
    if scale is not None:
        attrs["scale"] = scale
    model, feeds = _model("LinearAttention", inputs, attrs, 27, outputs=2)
    _check(model, feeds, "ref")


@pytest.mark.parametrize("q_heads,scale", [(2, None), (4, 0.2)])
def test_flex_attention_without_modifiers(q_heads, scale):
    """An ai.onnx.preview op: the node's domain and its opset import are set by hand."""
    inputs = [("q", _r(2, q_heads, 5, 8)), ("k", _r(2, 2, 6, 8)), ("v", _r(2, 2, 6, 3))]
    model, feeds = _model("FlexAttention", inputs, {} if scale is None else dict(scale=scale),
                          26)
    model.graph.node[0].domain = "ai.onnx.preview"
    model.opset_import.append(helper.make_opsetid("ai.onnx.preview", 1))
    _check(model, feeds, "ref")


# -- optimizer steps (ai.onnx.preview.training) -------------------------------------------------

@pytest.mark.parametrize("op,attrs,kinds", [
    ("Adagrad", dict(decay_factor=0.1, epsilon=1e-6, norm_coefficient=0.01), 3),
    ("Adam", dict(alpha=0.8, beta=0.95, epsilon=1e-6, norm_coefficient=0.02,
                  norm_coefficient_post=0.01), 4),
    ("Momentum", dict(alpha=0.9, beta=0.5, norm_coefficient=0.01, mode="standard"), 3),
    ("Momentum", dict(alpha=0.9, beta=0.5, norm_coefficient=0.0, mode="nesterov"), 3)])
@pytest.mark.parametrize("step", [0, 3])
def test_optimizer_steps(op, attrs, kinds, step):
    groups = [(3, 4), (5,)]
    inputs = [("r", np.array(0.1, np.float32)), ("t", np.array(step, np.int64))]
    for kind in range(kinds):
        squares = op != "Momentum" and kind == kinds - 1  # accumulated squares: positive
        inputs += [(f"in{kind}_{i}", _r(*shape, low=0.1 if squares else -1))
                   for i, shape in enumerate(groups)]
    model, feeds = _model(op, inputs, attrs, outputs=(kinds - 1) * len(groups))
    model.graph.node[0].domain = "ai.onnx.preview.training"
    del model.opset_import[:]  # such models import only the training domain
    model.opset_import.append(helper.make_opsetid("ai.onnx.preview.training", 1))
    _check(model, feeds, "ref")


# -- ai.onnx.ml ---------------------------------------------------------------------------------

def _ml(model):
    model.graph.node[0].domain = "ai.onnx.ml"
    del model.opset_import[:]  # such models import only the ml domain
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))
    return model


@pytest.mark.parametrize("threshold", [0.0, 0.3])
def test_binarizer(threshold):
    model, feeds = _model("Binarizer", [("x", _r(3, 4))], dict(threshold=threshold))
    _check(_ml(model), feeds)


def test_array_feature_extractor():
    model, feeds = _model("ArrayFeatureExtractor", [("x", _r(2, 3, 5)),
                                                    ("i", np.array([4, 0, 2, 2], np.int64))])
    _check(_ml(model), feeds)


@pytest.mark.parametrize("case", ["set_membership", "single_tree"])
@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble(case, aggregate):
    """ONNX's two tree ensembles, every aggregate function, on random features (with NaNs),
    against onnxruntime (where no tree scores a target under MIN or MAX it reads 0; ONNX's
    reference evaluator answers the aggregate's identity, the float's max or min)."""
    from support.onnx_cases import node_cases  # noqa: PLC0415
    name = f"test_ai_onnx_ml_tree_ensemble_{case}"
    model, (x,), _ = node_cases((name,), modules=("ai_onnx_ml.tree_ensemble",))[name]
    for attribute in model.graph.node[0].attribute:
        if attribute.name == "aggregate_function":
            attribute.i = aggregate
    x = RNG.uniform(-2, 6, (7,) + x.shape[1:]).astype(x.dtype)
    x[1, 0] = np.nan
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    _check(model, {model.graph.input[0].name: x}, "ort")


@pytest.mark.parametrize("mode,lowest,highest,skips,weighted,rank", [
    ("TF", 1, 2, 2, False, 2), ("IDF", 2, 2, 0, True, 1), ("TFIDF", 1, 3, 1, True, 2),
    ("IDF", 1, 1, 3, False, 2), ("TFIDF", 2, 3, 4, False, 1)])
def test_tfidf_vectorizer(mode, lowest, highest, skips, weighted, rank):
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 2, 3, 4]  # 4 unigrams, 3 bigrams, 1 trigram
    attrs = dict(mode=mode, min_gram_length=lowest, max_gram_length=highest,
                 max_skip_count=skips, ngram_counts=[0, 4, 10], pool_int64s=pool,
                 ngram_indexes=[0, 1, 2, 3, 4, 5, 6, 4] if not weighted else
                 [3, 1, 2, 0, 7, 5, 6, 4])  # two n-grams share an output where unweighted
    if weighted:
        attrs["weights"] = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0]
    x = RNG.integers(2, 9, (3, 12) if rank == 2 else (16,)).astype(np.int64)
    model, feeds = _model("TfIdfVectorizer", [("x", x)], attrs, 9)
    _check(model, feeds)
