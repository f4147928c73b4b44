"""scikit-learn models as skl2onnx writes them (the classic ai.onnx.ml ops: LinearClassifier,
SVMClassifier, TreeEnsembleClassifier, Scaler, ZipMap ...): each fitted in code on seeded
random data, converted with skl2onnx, imported with tdag.from_onnx and compared with
onnxruntime on the original file, through tdag.run and through tdag.to_onnx on onnxruntime,
on random rows: floats within 1e-5 relative / 1e-6 absolute, labels exactly. ZipMap's maps
are compared as the probability tensor tdag.run keeps (columns in ZipMap's label order), and
the file tdag.to_onnx writes gives onnxruntime's own list of maps under the same name. Then
single ai.onnx.ml nodes built by hand for what scikit-learn does not write (each
post_transform, the other aggregates, kernels and binary rules), and the errors."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import tdag
from tdag.errors import UnsupportedOpError

from support.guards import run_onnx

skl2onnx = pytest.importorskip("skl2onnx")
sklearn = pytest.importorskip("sklearn")

from sklearn import ensemble, impute, linear_model, pipeline, preprocessing, svm, tree  # noqa: E402

RNG = np.random.default_rng(20)
X_FIT = RNG.standard_normal((60, 4)).astype(np.float32)
Y_BINARY = (X_FIT[:, 0] + 0.5 * X_FIT[:, 1] > 0).astype(np.int64)
Y_THREE = np.digitize(X_FIT[:, 2] + 0.3 * X_FIT[:, 3], [-0.5, 0.5]).astype(np.int64)
Y_REAL = X_FIT @ np.array([1.0, -2.0, 0.5, 3.0], np.float32) + 0.1
X_INT = RNG.integers(0, 3, (60, 2)).astype(np.int64)
OPSET = {"": 17, "ai.onnx.ml": 3}
RTOL, ATOL = 1e-5, 1e-6


def _rows(count=9, seed=1):
    return np.random.default_rng(seed).standard_normal((count, 4)).astype(np.float32)


def _with_nan(count=9):
    x = _rows(count, 2)
    x[::3, 1] = np.nan
    x[1, 3] = np.nan
    return x


def _fit(make, y=None):
    return lambda: make().fit(X_FIT, y) if y is not None else make().fit(X_FIT)


def _proba_svc(**kw):
    return lambda: svm.SVC(probability=True, random_state=0, **kw)


def _forest(kind, max_depth=4):
    return lambda: kind(n_estimators=5, max_depth=max_depth, random_state=0)


MODELS = {  # name: (the fitted model, the rows it runs on)
    "LogisticRegression-binary": (_fit(linear_model.LogisticRegression, Y_BINARY), _rows),
    "LogisticRegression-3": (_fit(linear_model.LogisticRegression, Y_THREE), _rows),
    "LinearRegression": (_fit(linear_model.LinearRegression, Y_REAL), _rows),
    "Ridge": (_fit(lambda: linear_model.Ridge(alpha=0.5), Y_REAL), _rows),
    "LinearSVC-3": (_fit(svm.LinearSVC, Y_THREE), _rows),
    "LinearSVC-binary": (_fit(svm.LinearSVC, Y_BINARY), _rows),
    "SVC-rbf": (_fit(svm.SVC, Y_THREE), _rows),
    "SVC-rbf-binary": (_fit(svm.SVC, Y_BINARY), _rows),
    "SVC-poly": (_fit(lambda: svm.SVC(kernel="poly", degree=3), Y_THREE), _rows),
    "SVC-rbf-probability": (_fit(_proba_svc(), Y_THREE), _rows),
    "SVC-sigmoid-probability-binary": (_fit(_proba_svc(kernel="sigmoid"), Y_BINARY), _rows),
    "SVR": (_fit(svm.SVR, Y_REAL), _rows),
    "SVR-linear": (_fit(lambda: svm.SVR(kernel="linear"), Y_REAL), _rows),
    "DecisionTreeClassifier": (_fit(lambda: tree.DecisionTreeClassifier(
        max_depth=4, random_state=0), Y_THREE), _rows),
    "DecisionTreeRegressor": (_fit(lambda: tree.DecisionTreeRegressor(
        max_depth=4, random_state=0), Y_REAL), _rows),
    "RandomForestClassifier": (_fit(_forest(ensemble.RandomForestClassifier), Y_THREE), _rows),
    "RandomForestRegressor": (_fit(_forest(ensemble.RandomForestRegressor), Y_REAL), _rows),
    "GradientBoostingClassifier-binary": (_fit(_forest(
        ensemble.GradientBoostingClassifier, max_depth=2), Y_BINARY), _rows),
    "GradientBoostingClassifier-3": (_fit(_forest(
        ensemble.GradientBoostingClassifier, max_depth=2), Y_THREE), _rows),
    "GradientBoostingRegressor": (_fit(_forest(
        ensemble.GradientBoostingRegressor, max_depth=2), Y_REAL), _rows),
    "StandardScaler": (_fit(preprocessing.StandardScaler), _rows),
    "MinMaxScaler": (_fit(preprocessing.MinMaxScaler), _rows),
    "Normalizer-l2": (_fit(preprocessing.Normalizer), _rows),
    "Normalizer-l1": (_fit(lambda: preprocessing.Normalizer("l1")), _rows),
    "Normalizer-max": (_fit(lambda: preprocessing.Normalizer("max")), _rows),
    "OneHotEncoder": (lambda: preprocessing.OneHotEncoder().fit(X_INT), lambda: X_INT[:9]),
    "SimpleImputer": (lambda: impute.SimpleImputer().fit(_with_nan(30)), _with_nan),
    "Pipeline-scaler-LogisticRegression": (_fit(lambda: pipeline.make_pipeline(
        preprocessing.StandardScaler(), linear_model.LogisticRegression()), Y_THREE), _rows),
}


def _convert(model, x, zipmap: bool) -> onnx.ModelProto:
    options = None
    final = model.steps[-1][1] if hasattr(model, "steps") else model
    if hasattr(final, "predict_proba") and not zipmap:
        options = {id(final): {"zipmap": False}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return skl2onnx.to_onnx(model, x[:1], target_opset=OPSET, options=options)


def _onnxruntime(model: onnx.ModelProto, x) -> list:
    """onnxruntime's outputs; a ZipMap's list of maps as [N, C] in the ZipMap's label order."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = session.run(None, {session.get_inputs()[0].name: x})
    zipmap = next((n for n in model.graph.node if n.op_type == "ZipMap"), None)
    if zipmap is not None:
        labels = list(helper.get_attribute_value(
            next(a for a in zipmap.attribute if a.name == "classlabels_int64s")))
        outs = [np.array([[row[k] for k in labels] for row in out], np.float32)
                if isinstance(out, list) else out for out in outs]
    return outs


def _compare(got, expected, what: str) -> None:
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(expected), what
    for g, e in zip(got, expected):
        g, e = np.asarray(g), np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape, (what, g.dtype, g.shape, e.dtype, e.shape)
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e, err_msg=what)
        else:
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL, err_msg=what)


def _check(model: onnx.ModelProto, x) -> None:
    expected = _onnxruntime(model, x)
    prog = tdag.from_onnx(model)
    tensor = torch.from_numpy(x)
    _compare(tdag.run(prog, tensor), expected, "tdag.run")
    emitted = tdag.to_onnx(prog)
    onnx.checker.check_model(emitted, full_check=True)
    _compare(_onnxruntime(emitted, x), expected, "tdag.to_onnx on onnxruntime")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_sklearn_model(name):
    fit, rows = MODELS[name]
    model, x = fit(), rows()
    _check(_convert(model, x, zipmap=False), x)


def _maps_alike(got: list, expected: list, what: str) -> None:
    assert isinstance(got, list) and len(got) == len(expected), what
    for g, e in zip(got, expected):
        assert list(g) == list(e), what  # the same labels, in the same order
        np.testing.assert_allclose(list(g.values()), list(e.values()), rtol=RTOL, atol=ATOL,
                                   err_msg=what)


@pytest.mark.parametrize("name", ["LogisticRegression-3", "RandomForestClassifier",
                                  "Pipeline-scaler-LogisticRegression",
                                  "SVC-sigmoid-probability-binary"])
def test_zipmap_keeps_the_probability_tensor_and_to_onnx_writes_the_maps(name):
    fit, rows = MODELS[name]
    model, x = fit(), rows()
    onnx_model = _convert(model, x, zipmap=True)
    zipmap = next(n for n in onnx_model.graph.node if n.op_type == "ZipMap")
    prog = tdag.from_onnx(onnx_model)
    assert prog.class_labels == {"output_probability": tuple(
        helper.get_attribute_value(zipmap.attribute[0]))}
    _compare(tdag.run(prog, torch.from_numpy(x)), _onnxruntime(onnx_model, x), "tdag.run")
    # the re-emitted file is a drop-in replacement: same names, types and list of maps
    original, emitted = (ort.InferenceSession(m.SerializeToString(),
                                              providers=["CPUExecutionProvider"])
                         for m in (onnx_model, tdag.to_onnx(prog)))
    assert [(o.name, o.type) for o in emitted.get_outputs()] == \
        [(o.name, o.type) for o in original.get_outputs()]
    (label, maps), (label_again, maps_again) = (s.run(None, {"X": x}) for s in (original,
                                                                              emitted))
    np.testing.assert_array_equal(label_again, label)
    _maps_alike(maps_again, maps, "to_onnx's ZipMap")
    again = tdag.parse(str(prog))  # the labels round-trip through the text form
    assert again.class_labels == prog.class_labels


def test_a_zipmap_read_by_another_node_is_refused():
    model = _node_model("ZipMap", dict(classlabels_int64s=[3, 4]), [("x", _rows(2)[:, :2])],
                        [("z", TensorProto.FLOAT)])
    model.graph.node.append(helper.make_node("Identity", ["z"], ["copy"], name="copy"))
    model.graph.output[0].name = "copy"
    with pytest.raises(UnsupportedOpError, match="ZipMap.*read by another node"):
        tdag.from_onnx(model)


# -- single ai.onnx.ml nodes ----------------------------------------------------------------------

def _node_model(op, attrs, inputs, outputs):
    """One ai.onnx.ml node; ``inputs`` [(name, array)], ``outputs`` [(name, elem type)]."""
    node = helper.make_node(op, [n for n, _ in inputs], [n for n, _ in outputs], name=f"my_{op}",
                            domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph(
        [node], op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    return model


def _check_node(op, attrs, inputs, outputs):
    model = _node_model(op, attrs, inputs, outputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, dict(inputs))
    prog = tdag.from_onnx(model)
    tensors = [torch.from_numpy(a) for _, a in inputs]
    _compare(tdag.run(prog, *tensors), expected, f"{op} tdag.run")
    _compare(run_onnx(tdag.to_onnx(prog), *tensors), expected, f"{op} tdag.to_onnx")


LABEL, SCORES = [("label", TensorProto.INT64), ("scores", TensorProto.FLOAT)]
TRANSFORMS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("classes", [2, 3])
def test_linear_classifier(transform, classes):
    x = _rows(8, 3) * 0.3
    count = 1 if classes == 2 else classes  # two labels, one score column: the binary rule
    coefficients = RNG.uniform(-0.5, 0.5, count * 4).astype(np.float32)
    if transform == "SOFTMAX_ZERO":
        x[2] = 0.0  # rows of exact zeros: SOFTMAX_ZERO leaves them out
    attrs = dict(coefficients=coefficients.tolist(), intercepts=[0.5] * count,
                 classlabels_ints=[3, 7, 9][:classes], post_transform=transform)
    if classes == 2 and transform == "PROBIT":
        with pytest.raises(UnsupportedOpError, match="LinearClassifier.*PROBIT"):
            tdag.from_onnx(_node_model("LinearClassifier", attrs, [("x", x)], [LABEL, SCORES]))
        return
    _check_node("LinearClassifier", attrs, [("x", x)], [LABEL, SCORES])


@pytest.mark.parametrize("targets,transform", [(1, "NONE"), (1, "LOGISTIC"), (1, "PROBIT"),
                                               (3, "SOFTMAX"), (2, "LOGISTIC")])
def test_linear_regressor(targets, transform):
    x = _rows(6, 4) * 0.2
    attrs = dict(coefficients=RNG.uniform(-0.5, 0.5, 4 * targets).tolist(), targets=targets,
                 intercepts=[0.5] * targets, post_transform=transform)
    _check_node("LinearRegressor", attrs, [("x", x)], [("y", TensorProto.FLOAT)])


def test_linear_classifier_int_input():
    x = RNG.integers(-3, 4, (5, 2)).astype(np.int64)
    attrs = dict(coefficients=[0.5, -1.0, 1.5, 0.25], intercepts=[0.0, 0.1],
                 classlabels_ints=[0, 1])
    _check_node("LinearClassifier", attrs, [("x", x)], [LABEL, SCORES])


# a forest of two trees over 3 features: tree 0 splits twice, tree 1 once, with every mode
TREE = dict(nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1],
            nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
            nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 0],
            nodes_values=[0.1, -0.3, 0, 0, 0, 0.4, 0, 0],
            nodes_modes=["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF", "BRANCH_LT",
                         "LEAF", "LEAF"],
            nodes_truenodeids=[1, 3, 0, 0, 0, 1, 0, 0],
            nodes_falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0],
            nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 0])
LEAVES = [(0, 2), (0, 3), (0, 4), (1, 1), (1, 2)]


def _weights(prefix, targets, skip=()):
    """A weight per (leaf, target) (but those in ``skip``), the same whichever tests ran
    before (drawn from the shared RNG, a PROBIT case's scores once landed by 0.5 on some
    xdist workers, where onnxruntime's float32 erfinv cancels: 3e-4 relative)."""
    entries = [(t, n, c) for t, n in LEAVES for c in range(targets) if (t, n, c) not in skip]
    rng = np.random.default_rng(len(entries))
    return {f"{prefix}_treeids": [e[0] for e in entries],
            f"{prefix}_nodeids": [e[1] for e in entries],
            f"{prefix}_ids": [e[2] for e in entries],
            f"{prefix}_weights": rng.uniform(-1, 1, len(entries)).round(3).tolist()}


@pytest.mark.parametrize("name", ["RandomForestClassifier", "GradientBoostingRegressor"])
def test_a_float_forest_walks_its_float_rows_without_a_cast(name):
    """The importer compares a float forest's rows in f64; against thresholds f32 holds,
    f32 compares alike, so the file walks the input as it comes (test_sklearn_model and
    test_tree_ensemble_regressor check the values, nan and rows on a threshold included)."""
    fit, rows = MODELS[name]
    model, x = fit(), rows()
    emitted = tdag.to_onnx(tdag.from_onnx(_convert(model, x, zipmap=False)))
    forest = next(n for n in emitted.graph.node if n.op_type == "TreeEnsembleRegressor")
    assert list(forest.input) == [emitted.graph.input[0].name], emitted.graph.node
    _compare(_onnxruntime(emitted, x), _onnxruntime(_convert(model, x, zipmap=False), x), name)


def _tree_rows():
    x = _rows(12, 5)[:, :3]
    x[0, 0] = np.nan  # tracks true
    x[1, 0], x[2, 2], x[3, 1] = 0.1, 0.4, -0.3  # on the thresholds
    return x


SOME_LEAVES = {(0, 2, 1), (0, 3, 1), (1, 1, 1)}  # target 1 scored on some leaves only


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("targets,skip", [(1, ()), (2, {(1, 2, 1)}), (2, SOME_LEAVES)])
def test_tree_ensemble_regressor(aggregate, targets, skip):
    attrs = dict(TREE, n_targets=targets, aggregate_function=aggregate,
                 base_values=[0.25] * targets, post_transform="NONE",
                 **_weights("target", targets, skip=skip))
    _check_node("TreeEnsembleRegressor", attrs, [("x", _tree_rows())], [("y", TensorProto.FLOAT)])


def test_tree_ensemble_regressor_as_tensor_attributes():
    """ai.onnx.ml 3's double thresholds and weights (``*_as_tensor``) over float64 rows."""
    attrs = dict(TREE, n_targets=2, **_weights("target", 2))
    for name in ("nodes_values", "target_weights"):
        values = np.array(attrs.pop(name), np.float64) + 1e-9  # not float32 numbers
        attrs[name + "_as_tensor"] = onnx.numpy_helper.from_array(values, name)
    attrs["base_values_as_tensor"] = onnx.numpy_helper.from_array(np.array([0.5, -0.5]))
    x = _tree_rows().astype(np.float64)
    x[4, 0] = 0.1 + 2e-9  # above the threshold 0.1 + 1e-9; in float32 both are 0.1f
    _check_node("TreeEnsembleRegressor", attrs, [("x", x)], [("y", TensorProto.FLOAT)])


@pytest.mark.parametrize("transform", ["SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT"])
def test_tree_ensemble_regressor_transforms(transform):
    targets = 1 if transform == "PROBIT" else 3
    attrs = dict(TREE, n_targets=targets, post_transform=transform,
                 **_weights("target", targets, skip={(0, 3, 2)}))
    if transform == "PROBIT":  # scores in (0, 1)
        attrs["target_weights"] = [abs(w) / 3 for w in attrs["target_weights"]]
    _check_node("TreeEnsembleRegressor", attrs, [("x", _tree_rows())], [("y", TensorProto.FLOAT)])


@pytest.mark.parametrize("case", ["both-scored", "both-scored-base", "one-scored-positive",
                                  "one-scored", "one-scored-base", "three", "three-some-leaves",
                                  "three-base-probit"])
def test_tree_ensemble_classifier(case):
    classes = 3 if case.startswith("three") else 2
    skip = {(t, n, 1) for t, n in LEAVES} if case.startswith("one") else \
        SOME_LEAVES if case == "three-some-leaves" else set()
    attrs = dict(TREE, classlabels_int64s=[4, 5, 6][:classes],
                 **_weights("class", classes, skip=skip))
    if case == "one-scored-positive":
        attrs["class_weights"] = [abs(w) for w in attrs["class_weights"]]
        attrs["post_transform"] = "LOGISTIC"
    if case.endswith("base"):
        attrs["base_values"] = [0.1 * (k + 1) for k in range(classes)]
    if case == "one-scored-base":
        attrs["base_values"], attrs["post_transform"] = [-0.2], "LOGISTIC"
    if case == "three-base-probit":
        attrs["base_values"], attrs["post_transform"] = [0.5, 0.5, 0.5], "PROBIT"
        attrs["class_weights"] = [w / 8 for w in attrs["class_weights"]]
    _check_node("TreeEnsembleClassifier", attrs, [("x", _tree_rows())], [LABEL, SCORES])


SUPPORT = dict(vectors_per_class=[2, 1, 2], support_vectors=RNG.standard_normal(20).tolist(),
               coefficients=RNG.uniform(-1, 1, 10).tolist(), rho=[0.1, -0.2, 0.3])


@pytest.mark.parametrize("kernel,transform", [("LINEAR", "NONE"), ("POLY", "SOFTMAX"),
                                              ("SIGMOID", "LOGISTIC"), ("RBF", "NONE")])
def test_svm_classifier_kernels(kernel, transform):
    attrs = dict(SUPPORT, kernel_type=kernel, kernel_params=[0.3, 0.5, 3.0],
                 classlabels_ints=[1, 2, 3], post_transform=transform)
    _check_node("SVMClassifier", attrs, [("x", _rows(7, 6))], [LABEL, SCORES])


@pytest.mark.parametrize("transform", ["NONE", "LOGISTIC"])
def test_svm_classifier_binary(transform):
    attrs = dict(vectors_per_class=[2, 1], support_vectors=RNG.standard_normal(12).tolist(),
                 coefficients=[0.5, -0.7, 0.2], rho=[0.1], kernel_type="RBF",
                 kernel_params=[0.2, 0.0, 3.0], classlabels_ints=[0, 1], post_transform=transform)
    _check_node("SVMClassifier", attrs, [("x", _rows(7, 7))], [LABEL, SCORES])


@pytest.mark.parametrize("classes,positive", [(2, True), (2, False), (3, False)])
def test_svm_classifier_liblinear(classes, positive):
    coefficients = RNG.uniform(-0.3 if not positive else 0, 0.3, classes * 4)
    attrs = dict(coefficients=coefficients.tolist(), rho=[0.2], kernel_params=[0.0, 0.0, 0.0],
                 classlabels_ints=list(range(classes)), post_transform="NONE")
    _check_node("SVMClassifier", attrs, [("x", _rows(9, 8))], [LABEL, SCORES])


@pytest.mark.parametrize("kernel,one_class", [("POLY", 0), ("RBF", 1), ("LINEAR", 0)])
def test_svm_regressor(kernel, one_class):
    attrs = dict(n_supports=3, support_vectors=RNG.standard_normal(12).tolist(),
                 coefficients=[0.4, -0.6, 0.9], rho=[0.05], kernel_type=kernel,
                 kernel_params=[0.4, 0.1, 2.0], one_class=one_class)
    _check_node("SVMRegressor", attrs, [("x", _rows(7, 9))], [("y", TensorProto.FLOAT)])


FLOAT_OUT = [("y", TensorProto.FLOAT)]


def test_featurizers():
    x_int = RNG.integers(-4, 5, (6, 3)).astype(np.int64)
    _check_node("Normalizer", dict(norm="L2"), [("x", x_int)], FLOAT_OUT)
    zero_row = _rows(4, 10)
    zero_row[1] = 0.0
    _check_node("Normalizer", dict(norm="MAX"), [("x", zero_row)], FLOAT_OUT)
    _check_node("Scaler", dict(scale=[2.0], offset=[0.5]), [("x", x_int)], FLOAT_OUT)
    _check_node("Scaler", dict(scale=[2.0, 1.0, 0.5], offset=[0.5, 0, 1]),
                [("x", zero_row[:, :3].astype(np.float64))], FLOAT_OUT)
    x_float = np.array([[0.0, 2.7], [-1.2, 5.0], [3.0, 2.0]], np.float32)
    _check_node("OneHotEncoder", dict(cats_int64s=[2, 0, -1, 2], zeros=1), [("x", x_float)],
                FLOAT_OUT)
    _check_node("Imputer", dict(imputed_value_int64s=[7, 8, 9], replaced_value_int64=0),
                [("x", x_int)], [("y", TensorProto.INT64)])
    _check_node("Imputer", dict(imputed_value_floats=[1.5], replaced_value_float=0.0),
                [("x", zero_row)], FLOAT_OUT)
    _check_node("FeatureVectorizer", dict(inputdimensions=[2, 5]),
                [("a", _rows(4, 11)), ("b", _rows(4, 12)[:, :3])], FLOAT_OUT)


def test_strings_are_refused_naming_the_op_and_node():
    attrs = dict(coefficients=[1.0, 2.0], intercepts=[0.0], classlabels_strings=["no", "yes"])
    model = _node_model("LinearClassifier", attrs, [("x", _rows(2)[:, :2])],
                        [("label", TensorProto.STRING), ("scores", TensorProto.FLOAT)])
    with pytest.raises(UnsupportedOpError, match="LinearClassifier.*my_LinearClassifier"
                                                 "(.|\n)*string class labels"):
        tdag.from_onnx(model)
    model = _node_model("ZipMap", dict(classlabels_strings=["a", "b"]), [("x", _rows(2)[:, :2])],
                        [("z", TensorProto.FLOAT)])
    with pytest.raises(UnsupportedOpError, match="ZipMap.*my_ZipMap(.|\n)*string keys"):
        tdag.from_onnx(model)


def test_string_inputs_and_unmapped_ml_ops_are_refused_by_name():
    strings = np.array([["a", "b"], ["b", "c"], ["a", "c"]])
    model = _convert(preprocessing.OneHotEncoder().fit(strings), strings, zipmap=False)
    with pytest.raises(UnsupportedOpError, match="STRING of X .*read by .*node"):
        tdag.from_onnx(model)
    model = _node_model("LabelEncoder", dict(keys_int64s=[1, 2], values_int64s=[5, 6]),
                        [("x", np.array([1, 2], np.int64))], [("y", TensorProto.INT64)])
    with pytest.raises(UnsupportedOpError, match="LabelEncoder .*my_LabelEncoder.*ai.onnx.ml"):
        tdag.from_onnx(model)


def test_a_linear_classifier_labels_nan_scores_as_onnxruntime():
    """An infinite input makes some scores NaN (inf - inf): onnxruntime scans for a strictly
    higher score left to right, so a NaN is never picked after the first column and a NaN in
    the first column keeps label 0 (torch's argmax would pick the first NaN)."""
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain="ai.onnx.ml",
                            coefficients=[1e-3, 1.0, 1.0, -1.0, 1.0, 1.0, -1.0, -1.0],
                            intercepts=[0.5, 0.0, 0.0, 0.0], classlabels_ints=[10, 11, 12, 13])
    graph = helper.make_graph(
        [node], "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 2])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [None]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [None, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 1)])
    inf = np.inf
    x = np.array([[inf, inf], [-inf, inf], [1.0, 2.0], [inf, 1.0], [np.nan, 1.0]], np.float32)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    label, scores = session.run(None, {"x": x})
    # [inf, nan, inf, -inf] (torch's argmax: 1) and [nan, -inf, nan, nan] (a NaN first)
    assert np.isnan(scores[0, 1]) and not np.isnan(scores[0, 0]) and np.isnan(scores[1, 0])
    prog = tdag.from_onnx(model)
    for got in (tdag.run(prog, torch.from_numpy(x)), run_onnx(tdag.to_onnx(prog),
                                                             torch.from_numpy(x))):
        np.testing.assert_array_equal(np.asarray(got[0]), label)
        np.testing.assert_array_equal(np.asarray(got[1]), scores)
