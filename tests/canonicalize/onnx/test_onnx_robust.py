"""from_onnx on bad or hostile input: a tdag error that names the ONNX node and the part of
the file, or a program that verifies (and matches onnxruntime) -- never another exception, a
silently wrong program, or memory that grows faster than the graph.

Every model is built here with onnx.helper; the hostile ones reproduce what a file fuzzer
found. Blow-up guards scale an input up and check it finishes under a generous alarm or
measure memory with tracemalloc (2x the nodes must cost about 2x the memory, not 4x).
"""
from __future__ import annotations

import glob
import os
import tracemalloc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from support.guards import deadline, run_onnx

import tdag
import tdag.lower
from tdag.canonicalize.common import segments
from tdag.canonicalize.onnx.ops.table import OPS

F32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


def _info(name, elem_type=F32, shape=None):
    return helper.make_tensor_value_info(name, elem_type, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17, value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits),
                              value_info=list(value_info))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _init(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.array(values, dtype=dtype), name)


def _one_node(op, inits=(), shape=(3, 4), opset=17, name="n", **attrs):
    """y = op(x, *inits) on x: f32[shape], the output's type left to the importer."""
    names = ["x"] + [i.name if i is not None else "" for i in inits]
    node = helper.make_node(op, names, ["y"], name=name, **attrs)
    return _model([node], [_info("x", F32, list(shape))], [_info("y", F32)],
                  [i for i in inits if i is not None], opset)


def _with_bytes(model, placeholder: bytes, replacement: bytes) -> onnx.ModelProto:
    """The model with a name's bytes replaced (onnx.helper only writes valid UTF-8)."""
    data = model.SerializeToString()
    assert placeholder in data
    damaged = onnx.ModelProto()
    damaged.ParseFromString(data.replace(placeholder, replacement))
    return damaged


def _against_ort(model, *arrays):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = sess.run(None, {i.name: a for i, a in zip(sess.get_inputs(), arrays)})
    prog = tdag.from_onnx(model)
    actual = tdag.run(prog, *[torch.from_numpy(a) for a in arrays])
    actual = actual if isinstance(actual, (list, tuple)) else [actual]
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        np.testing.assert_allclose(a.numpy(), e, rtol=1e-5, atol=1e-6)




# -- memory linear in the graph -----------------------------------------------------------------

def _neg_chain(n: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Neg", [f"v{i}" if i else "x"], [f"v{i + 1}" if i + 1 < n else "y"])
             for i in range(n)]
    return _model(nodes, [_info("x", F32, [4])], [_info("y", F32, [4])])


def _import_peak(model) -> tuple:
    tracemalloc.start()
    try:
        prog = tdag.from_onnx(model)
        return prog, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_long_chain_imports_in_linear_memory():
    """A set of live names per node made a 10,000-Neg chain take 2.6 GiB."""
    with deadline(300):
        _, small = _import_peak(_neg_chain(10_000))
        prog, large = _import_peak(_neg_chain(20_000))
    assert large < 200 * 2 ** 20  # about 20 MiB; the quadratic importer ran out of memory
    assert large < 3 * small  # linear: about 2x (quadratic: 4x)
    x = torch.randn(4)
    assert torch.equal(tdag.run(prog, x), x)  # an even number of negations


def _concat_doubling(n: int) -> onnx.ModelProto:
    """A shape value concatenated with itself n times: 2**n elements if folded eagerly."""
    nodes = [helper.make_node("Shape", ["x"], ["s0"])]
    nodes += [helper.make_node("Concat", [f"s{i}", f"s{i}"], [f"s{i + 1}"], axis=0)
              for i in range(n)]
    nodes.append(helper.make_node("ReduceSum", [f"s{n}"], ["y"], keepdims=0))
    return _model(nodes, [_info("x", F32, ["b", 3])], [_info("y", I64)])


def _symbolic_squaring(n: int) -> onnx.ModelProto:
    """(b + 1) squared n times: expanded eagerly, a polynomial of 2**n terms."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Add", ["s", "one"], ["t0"])]
    nodes += [helper.make_node("Mul", [f"t{i}", f"t{i}"], [f"t{i + 1}"]) for i in range(n)]
    return _model(nodes, [_info("x", F32, ["b", 3])], [_info(f"t{n}", I64)], [_init("one", [1])])


@pytest.mark.parametrize("make", [_concat_doubling, _symbolic_squaring])
def test_shape_values_that_double_stay_small(make):
    with deadline(120):
        _, peak = _import_peak(make(40))
    assert peak < 64 * 2 ** 20


def test_huge_sizes_stay_lazy():
    """A Range or ConstantOfShape of 2**40 elements is a node, not an allocation."""
    huge = [_init("a", 0), _init("b", 2 ** 40), _init("d", 1)]
    nodes = [helper.make_node("Range", ["a", "b", "d"], ["r"]),
             helper.make_node("ConstantOfShape", ["shape"], ["c"])]
    model = _model(nodes, [], [_info("r", I64), _info("c", F32)],
                   huge + [_init("shape", [2 ** 20, 2 ** 20])])
    with deadline(60):
        prog = tdag.from_onnx(model)
    assert [str(t) for t in prog.graph.output_types] == ["i64[1099511627776]",
                                                        "f32[1048576,1048576]"]


# -- exceptions that escaped from_onnx -----------------------------------------------------------

def test_non_utf8_node_name_is_a_file_format_error(tmp_path):
    model = _with_bytes(_model([helper.make_node("Relu", ["x"], ["y"], name="NAME")],
                               [_info("x", F32, [4])], [_info("y", F32, [4])]),
                        b"NAME", b"N\xff\xfeE")
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    for source in (model, str(path)):
        with pytest.raises(tdag.FileFormatError, match=r"graph\.node\[0\]\.name.*Relu.*UTF-8"):
            tdag.from_onnx(source)


def test_non_utf8_name_the_checker_would_report():
    """The checker's message about an undefined name was itself undecodable."""
    model = _with_bytes(_model([helper.make_node("Relu", ["XXXX"], ["y"], name="r")],
                               [_info("x", F32, [4])], [_info("y", F32, [4])]),
                        b"XXXX", b"X\xffXX")
    with pytest.raises(tdag.FileFormatError, match=r"node\[0\]\.input\[0\].*'r'.*Relu"):
        tdag.from_onnx(model)


def test_constant_of_shape_with_a_negative_size():
    model = _model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="fill")], [],
                   [_info("y")], [_init("s", [-3, 2])])
    with pytest.raises(tdag.InvalidModelError, match=r"'fill' \(ConstantOfShape.*negative"):
        tdag.from_onnx(model)


def test_value_info_of_another_type_is_refused():
    """A BOOL value_info before MaxPool made tdag cast to bool (then MaxPool failed); an
    INT8 one silently truncated the floats."""
    for elem_type, name in ((BOOL, "bool"), (TensorProto.INT8, "i8")):
        nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
                 helper.make_node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2])]
        model = _model(nodes, [_info("x", F32, [1, 1, 4, 4])], [_info("y")],
                       value_info=[_info("r", elem_type, [1, 1, 4, 4])])
        with pytest.raises(tdag.InvalidModelError,
                           match=rf"'relu' \(Relu.*'r' is declared {name}\[1,1,4,4\] but "
                                 r"computes to f32\[1,1,4,4\]"):
            tdag.from_onnx(model)


def test_graph_output_of_another_type_is_refused():
    model = _model([helper.make_node("Neg", ["x"], ["y"])], [_info("x", F32, [4])],
                   [_info("y", I64, [4])])
    with pytest.raises(tdag.InvalidModelError, match=r"'y' is declared i64\[4\].*f32\[4\]"):
        tdag.from_onnx(model)


def test_slice_axis_out_of_range():
    inits = [_init("s", [0]), _init("e", [2]), _init("a", [2 ** 62])]
    with pytest.raises(tdag.InvalidModelError, match=r"'n' \(Slice.*axis 4611686018427387904"):
        tdag.from_onnx(_one_node("Slice", inits))


def _external_model(folder, location: str) -> str:
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_info("x", F32, [4])],
                   [_info("y", F32, [4])], [_init("w", np.arange(4), np.float32)])
    path = os.path.join(folder, "m.onnx")
    onnx.save(model, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    model = onnx.load(path, load_external_data=False)
    for entry in model.graph.initializer[0].external_data:
        if entry.key == "location":
            entry.value = location
    onnx.save(model, path)
    return path


def test_external_data_location_with_a_nul_byte(tmp_path):
    with pytest.raises(tdag.FileFormatError, match="'w'.*NUL"):
        tdag.from_onnx(_external_model(str(tmp_path), "w\0.bin"))


def test_external_data_from_a_fifo_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "pipe.bin")
    with deadline(30), pytest.raises(tdag.FileFormatError, match="'w'.*not a file"):
        tdag.from_onnx(_external_model(str(tmp_path), "pipe.bin"))


def test_any_other_failure_names_the_node():
    """The boundary: an exception from converting a node becomes an InvalidModelError that
    says which node, of which op, and keeps the original as its cause."""
    def broken(ctx, x):
        raise RuntimeError("a bug")
    with OPS.replaced("Relu", broken), \
            pytest.raises(tdag.InvalidModelError,
                          match=r"'n' \(Relu, #0 of graph 'g'\).*a bug") as info:
        tdag.from_onnx(_one_node("Relu"))
    assert isinstance(info.value.__cause__, RuntimeError)


# -- silently wrong or malformed programs ----------------------------------------------------------

def _sparse_model(indices, dims=(2, 4)):
    values = numpy_helper.from_array(np.array([5.0, -2.0], np.float32), "w")
    sparse = helper.make_sparse_tensor(values, _init("", indices), list(dims))
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_info("x", F32, [2, 4])],
                   [_info("y", F32, [2, 4])])
    model.graph.sparse_initializer.append(sparse)
    return model, sparse


@pytest.mark.parametrize("indices", [[1, 6], [[0, 1], [1, 2]]], ids=["linear", "coordinates"])
def test_sparse_initializer_is_densified(indices):
    model, _ = _sparse_model(indices)
    _against_ort(model, np.ones((2, 4), np.float32))


def test_sparse_constant_is_densified():
    _, sparse = _sparse_model([1, 6])
    nodes = [helper.make_node("Constant", [], ["w"], sparse_value=sparse),
             helper.make_node("Add", ["x", "w"], ["y"])]
    model = _model(nodes, [_info("x", F32, [2, 4])], [_info("y", F32, [2, 4])])
    _against_ort(model, np.ones((2, 4), np.float32))


def test_sparse_initializer_too_large_to_densify():
    model, _ = _sparse_model([1, 6], dims=(2 ** 20, 2 ** 20))
    with pytest.raises(tdag.UnsupportedOpError, match="'w'.*dense"):
        tdag.from_onnx(model)


def _if_model(else_outputs):
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [], [_info("t")])
    else_g = helper.make_graph([helper.make_node("Abs", ["x"], ["e"])], "else", [],
                               [_info(name) for name in else_outputs])
    nodes = [helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="choose", then_branch=then_g,
                              else_branch=else_g)]
    return _model(nodes, [_info("x", F32, [4])], [_info("y")],
                  [_init("zero", 0.0, np.float32)])


def test_if_whose_branch_lost_its_output():
    with pytest.raises(tdag.InvalidModelError, match=r"'choose' \(If.*else_branch returns 0"):
        tdag.from_onnx(_if_model([]))
    prog = tdag.from_onnx(_if_model(["e"]))  # the intact model
    assert torch.equal(tdag.run(prog, torch.tensor([1.0, -3.0, 0.0, 1.0])),
                       torch.tensor([1.0, 3.0, 0.0, 1.0]))


def test_if_whose_branches_differ_in_type():
    model = _if_model(["e"])
    else_g = next(a.g for a in model.graph.node[2].attribute if a.name == "else_branch")
    else_g.node.append(helper.make_node("Cast", ["e"], ["e64"], to=TensorProto.DOUBLE))
    else_g.output[0].CopyFrom(_info("e64", TensorProto.DOUBLE))
    with pytest.raises(tdag.InvalidModelError, match=r"'choose' \(If.*f32\[4\].*f64\[4\]"):
        tdag.from_onnx(model)


def test_if_inside_a_branch_chosen_while_importing():
    """The outer condition is a shape fact, so its branch is inlined; the If inside it
    still becomes a controller (it escaped as a KeyError)."""
    inner = _if_model(["e"]).graph
    then_g = helper.make_graph(list(inner.node), "then", [], [_info("y")])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "else", [],
                               [_info("r")])
    nodes = [helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Equal", ["n", "four"], ["c0"]),
             helper.make_node("If", ["c0"], ["z"], then_branch=then_g, else_branch=else_g)]
    model = _model(nodes, [_info("x", F32, [4])], [_info("z")],
                   [_init("zero", 0.0, np.float32), _init("four", 4)])
    for x in ([1.0, -3.0, 0.0, 1.0], [1.0, 3.0, 0.0, 1.0]):
        _against_ort(model, np.array(x, np.float32))


def test_loop_whose_carried_value_changes_type():
    body = helper.make_graph(
        [helper.make_node("Cast", ["a_in"], ["a_out"], to=TensorProto.DOUBLE),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [_info("i", I64, []), _info("c_in", BOOL, []), _info("a_in", F32, None)],
        [_info("c_out", BOOL, []), _info("a_out", TensorProto.DOUBLE, None)])
    model = _model([helper.make_node("Loop", ["m", "", "x"], ["acc"], name="repeat", body=body)],
                   [_info("x", F32, [4])], [_info("acc")], [_init("m", 3)])
    with pytest.raises(tdag.InvalidModelError,
                       match=r"'repeat' \(Loop.*'x' enters as f32\[4\].*returns f64\[4\]"):
        tdag.from_onnx(model)


BAD_ATTRIBUTES = {
    "ReduceMean-keepdims": ("ReduceMean", [], dict(axes=[1], keepdims=2), 13, "keepdims"),
    "ReduceSum-repeated-axes": ("ReduceSum", [_init("ax", [1, -1])], {}, 17, "repeat"),
    "ArgMax-keepdims": ("ArgMax", [], dict(keepdims=3), 17, "keepdims"),
    "Gemm-transB": ("Gemm", [_init("w", np.ones((5, 4)), np.float32)], dict(transB=2), 17,
                    "transB"),
    "Transpose-perm": ("Transpose", [], dict(perm=[0, 0]), 17, "permutation"),
    "Concat-axis": ("Concat", [], dict(axis=2), 17, "axis 2"),
    "Softmax-axis": ("Softmax", [], dict(axis=-3), 17, "axis -3"),
    "Split-sizes": ("Split", [_init("sp", [1, 1])], dict(axis=1), 17, "sizes"),
    "Slice-lengths": ("Slice", [_init("s", [0, 0]), _init("e", [2])], {}, 17, "one entry"),
    "Slice-step-0": ("Slice", [_init("s", [0]), _init("e", [2]), _init("a", [0]),
                               _init("st", [0])], {}, 17, "steps not 0"),
    "Unsqueeze-repeated": ("Unsqueeze", [_init("u", [0, 0])], {}, 17, "repeat"),
    "Reshape-two-wildcards": ("Reshape", [_init("r", [-1, -1])], {}, 17, "malformed"),
    "Tile-count": ("Tile", [_init("t", [2])], {}, 17, "one count"),
    "Pad-count": ("Pad", [_init("p", [0, 1, 0])], {}, 17, "3 pads"),
    "Flatten-axis": ("Flatten", [], dict(axis=3), 17, "axis 3"),
    "CumSum-reverse": ("CumSum", [_init("ax", 1)], dict(reverse=2), 17, "reverse"),
    "Trilu-upper": ("Trilu", [], dict(upper=5), 17, "upper"),
}


@pytest.mark.parametrize("case", sorted(BAD_ATTRIBUTES))
def test_attribute_values_outside_the_spec(case):
    """Values the ONNX spec does not allow, which a lax reading would turn into another
    result (keepdims=2 kept the axes where onnxruntime drops them)."""
    op, inits, attrs, opset, expected = BAD_ATTRIBUTES[case]
    model = _one_node(op, inits, opset=opset, name="bad", **attrs)
    with pytest.raises(tdag.InvalidModelError, match=rf"'bad' \({op}.*{expected}"):
        tdag.from_onnx(model)


def test_conv_attributes_per_spatial_axis():
    weight = _init("w", np.ones((2, 1, 3, 3)), np.float32)
    for attrs, expected in ((dict(strides=[1]), "strides"), (dict(pads=[1, 1]), "pads"),
                            (dict(auto_pad="SAME"), "auto_pad"), (dict(group=0), "group")):
        model = _one_node("Conv", [weight], shape=(1, 1, 5, 5), name="conv", **attrs)
        with pytest.raises(tdag.InvalidModelError, match=rf"'conv' \(Conv.*{expected}"):
            tdag.from_onnx(model)


def test_squeeze_with_empty_axes_is_refused():
    """ONNX's shape inference squeezes no axis, onnxruntime every axis of size 1."""
    model = _one_node("Squeeze", [_init("ax", np.zeros(0))], shape=(2, 1, 3))
    with pytest.raises(tdag.UnsupportedOpError, match="Squeeze: an empty axes"):
        tdag.from_onnx(model)


# -- the invariant -------------------------------------------------------------------------------

def test_every_program_is_verified(monkeypatch):
    """from_onnx verifies what it returns, and reports a failure as an InvalidModelError."""
    seen = []
    monkeypatch.setattr(segments, "verify", seen.append)  # the front ends' one finishing step
    tdag.from_onnx(_one_node("Relu"))
    assert len(seen) == 1 and isinstance(seen[0], tdag.Program)

    def failing(prog):
        raise tdag.InvalidModelError("block output %y is not defined")
    monkeypatch.setattr(segments, "verify", failing)
    with pytest.raises(tdag.InvalidModelError,
                       match="the ONNX model does not verify.*%y is not defined"):
        tdag.from_onnx(_one_node("Relu"))


LIGHT = sorted(glob.glob(os.path.join(os.path.dirname(onnx.__file__),
                                      "backend/test/data/light/*.onnx")))


def _without_final_softmax(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` ending at the logits its last node, a Softmax, reads; None if it ends
    otherwise. These files' constant weights make logits of 1e10 whose softmax turns a
    1e-6 relative difference (another order of a conv's sum) into another answer."""
    last = model.graph.node[-1]
    if last.op_type != "Softmax":
        return None
    cut = onnx.ModelProto()
    cut.CopyFrom(model)
    cut.graph.node.pop()
    del cut.graph.output[:]
    cut.graph.output.append(model.graph.output[0])  # a softmax keeps its input's shape
    cut.graph.output[0].name = last.input[0]
    return cut


def _softmax_sums(model: onnx.ModelProto, probabilities: torch.Tensor) -> torch.Tensor:
    """The sums of ``probabilities`` over what ``model``'s final Softmax normalises: the axes
    from ``axis`` on before opset 13 (default 1), that one axis after (default -1)."""
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    given = [a.i for a in model.graph.node[-1].attribute if a.name == "axis"]
    axis = given[0] if given else (1 if opset < 13 else -1)
    return probabilities.flatten(axis).sum(-1) if opset < 13 else probabilities.sum(axis)


@pytest.mark.parametrize("path", LIGHT, ids=[os.path.basename(p) for p in LIGHT])
def test_light_models_import_and_match_onnxruntime(path):
    """Each of onnx's 9 real CNNs imports, verifies, and matches onnxruntime on the original
    through the lowered program, the reified module and the re-emitted ONNX; a weight the
    file fills with ConstantOfShape goes back out as one, not as a materialised initializer.

    Their weights are constants, so ResNet-50's logits reach 1e19 and equal each other only
    in exact arithmetic: the softmax after them then depends on the order of a sum, which
    differs between CPUs (onnxruntime's and torch's AVX-512 kernels against their AVX2 ones),
    between a Gemm and the primitive program's multiply + reduce-sum, and between layouts. A
    model ending in a Softmax is therefore compared at its logits, relative to their largest,
    and its own output checked to be a softmax of the right shape."""
    prog = tdag.from_onnx(path)
    reference = onnx.load_tensor(path.replace(".onnx", "_output_0.pb"))
    assert [int(d) for d in prog.graph.output_types[0].shape] == list(reference.dims)
    original = onnx.load(path)
    weights = {i.name for i in original.graph.initializer}  # old files list them as inputs
    data = next(i for i in original.graph.input if i.name not in weights)
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    emitted = tdag.to_onnx(prog)
    logits = _without_final_softmax(original)
    compared, model = (prog, original) if logits is None else (tdag.from_onnx(logits), logits)
    want = run_onnx(model, x)
    atol = 1e-5 if logits is None else 1e-5 * float(want.abs().max())
    with torch.no_grad():
        for what, got in [("lowered", tdag.run(tdag.lower.lower(compared), x)),
                          ("to_torch", tdag.to_torch(compared)(x)),
                          ("to_onnx", run_onnx(tdag.to_onnx(compared), x))]:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=atol,
                                       msg=lambda m, what=what: f"{what}: {m}")
        if logits is not None:
            probabilities = tdag.run(tdag.lower.lower(prog), x)
            assert probabilities.shape == want.shape and bool((probabilities >= 0).all())
            sums = _softmax_sums(original, probabilities)
            torch.testing.assert_close(sums, torch.ones_like(sums))
    assert emitted.ByteSize() < original.ByteSize() + 2**20  # VGG-19 fills 140M weights
