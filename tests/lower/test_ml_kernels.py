"""scikit-learn's tree ensembles keep onnxruntime's native tree kernel when re-emitted.

Each model is fitted in code on seeded random data, converted with skl2onnx, imported with
tdag.from_onnx, lowered (its walk becomes the tree_sum kernel) and written back by
tdag.to_onnx: the file holds an ai.onnx.ml TreeEnsembleRegressor and nothing of the walk
(a few nodes of post-processing), and on random rows (some with NaN) it computes what
onnxruntime computes on the original: labels exactly, scores within 1e-6. to_torch runs the
kernel's walk and agrees. Then hand-built forests for what scikit-learn does not write:
mixed comparison modes, NaN tracking the true branch, double thresholds. Other ai.onnx.ml
ops a scikit-learn file holds (LogisticRegression's Normalizer) are kept the same way."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import tdag
from tdag.ir.op import Op
from tdag.ir.program import Program
from tdag.ir.symbols import symbol
from tdag.ops.builder import Builder
from tdag.ops.ml import svm_label

skl2onnx = pytest.importorskip("skl2onnx")
sklearn = pytest.importorskip("sklearn")

from sklearn import ensemble, linear_model, svm, tree  # noqa: E402
from sklearn.base import is_classifier  # noqa: E402

RNG = np.random.default_rng(21)
X_FIT = RNG.standard_normal((80, 4)).astype(np.float32)
Y_THREE = np.digitize(X_FIT[:, 2] + 0.3 * X_FIT[:, 3], [-0.5, 0.5]).astype(np.int64) * 2 + 1
Y_BINARY = (X_FIT[:, 0] + 0.5 * X_FIT[:, 1] > 0).astype(np.int64)
Y_REAL = X_FIT @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)
TOL = 1e-6
WALK = 40  # the most nodes a re-emitted file holds: post-processing (argmax, logistic)

MODELS = {
    "DecisionTreeClassifier": lambda: tree.DecisionTreeClassifier(max_depth=5, random_state=0)
    .fit(X_FIT, Y_THREE),
    "RandomForestClassifier": lambda: ensemble.RandomForestClassifier(
        n_estimators=6, max_depth=4, random_state=0).fit(X_FIT, Y_THREE),
    "RandomForestRegressor": lambda: ensemble.RandomForestRegressor(
        n_estimators=4, max_depth=5, random_state=0).fit(X_FIT, Y_REAL),
    "GradientBoostingClassifier-binary": lambda: ensemble.GradientBoostingClassifier(
        n_estimators=5, max_depth=2, random_state=0).fit(X_FIT, Y_BINARY),
    "GradientBoostingClassifier-3": lambda: ensemble.GradientBoostingClassifier(
        n_estimators=4, max_depth=3, random_state=0).fit(X_FIT, Y_THREE),
    "GradientBoostingRegressor": lambda: ensemble.GradientBoostingRegressor(
        n_estimators=5, max_depth=3, random_state=0).fit(X_FIT, Y_REAL),
}
# what else scikit-learn's files hold that an ai.onnx.ml op computes natively
OTHERS = {
    "LogisticRegression-normalizer": (lambda: linear_model.LogisticRegression().fit(
        X_FIT, Y_THREE), Op.normalize_rows, "Normalizer"),
}

# SVMs, re-emitted as SVMClassifier (its label and scores; skl2onnx's one-vs-rest transform
# stays nodes after it: up to SVM_WALK) or SVMRegressor
SVMS = {
    "SVC-rbf": (lambda: svm.SVC().fit(X_FIT, Y_THREE), "SVMClassifier"),
    "SVC-rbf-binary": (lambda: svm.SVC().fit(X_FIT, Y_BINARY), "SVMClassifier"),
    "SVC-poly": (lambda: svm.SVC(kernel="poly", degree=3).fit(X_FIT, Y_THREE),
                 "SVMClassifier"),
    "SVC-sigmoid-binary": (lambda: svm.SVC(kernel="sigmoid").fit(X_FIT, Y_BINARY),
                           "SVMClassifier"),
    "SVR": (lambda: svm.SVR().fit(X_FIT, Y_REAL), "SVMRegressor"),
}
SVM_WALK = 60


def _rows(count: int = 11) -> np.ndarray:
    x = np.random.default_rng(3).standard_normal((count, 4)).astype(np.float32)
    x[2, 1] = x[5, 3] = np.nan
    return x


def _ort(model: onnx.ModelProto, x: np.ndarray) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})


def _compare(got, expected, what: str) -> None:
    assert len(got) == len(expected), what
    for g, e in zip(got, expected):
        g, e = np.asarray(g), np.asarray(e)
        assert g.dtype == e.dtype and g.shape == e.shape, (what, g.dtype, g.shape, e.shape)
        if e.dtype.kind in "iub":
            np.testing.assert_array_equal(g, e, err_msg=what)
        else:
            np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL, err_msg=what)


def _check(model: onnx.ModelProto, x: np.ndarray, kernel: Op = Op.tree_sum,
           native: str = "TreeEnsembleRegressor", walk: int = WALK) -> None:
    """Lowered, the composition is ``kernel``; re-emitted, a ``native`` ai.onnx.ml op, and
    the file matches."""
    expected = _ort(model, x)
    prog = tdag.from_onnx(model)
    assert kernel in {n.op for n in tdag.lower.lower(prog).graph.nodes}
    emitted = tdag.to_onnx(prog)
    onnx.checker.check_model(emitted, full_check=True)
    kinds = {(n.domain, n.op_type) for n in emitted.graph.node}
    assert ("ai.onnx.ml", native) in kinds
    assert len(emitted.graph.node) <= walk, kinds
    _compare(_ort(emitted, x), expected, "to_onnx on onnxruntime")
    got = tdag.to_torch(prog)(torch.from_numpy(x))
    _compare([t.detach().numpy() for t in (got if isinstance(got, tuple) else (got,))], expected,
             "to_torch")


def _convert(make) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        final = make()
        options = {id(final): {"zipmap": False}} if is_classifier(final) else None
        return skl2onnx.to_onnx(final, X_FIT[:1], target_opset={"": 17, "ai.onnx.ml": 3},
                                options=options)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_sklearn_tree_ensembles_keep_the_tree_kernel(name):
    _check(_convert(MODELS[name]), _rows())


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_sklearn_files_keep_their_ml_ops(name):
    make, kernel, native = OTHERS[name]
    _check(_convert(make), _rows(), kernel, native)


@pytest.mark.parametrize("name", sorted(SVMS))
def test_sklearn_svms_keep_the_svm_kernel(name):
    """Matched on the importer's folded constants, re-emitted as ai.onnx.ml's SVM op: the
    file matches the original on onnxruntime to 1e-6 (the scores were exact in the runs)."""
    make, native = SVMS[name]
    _check(_convert(make), _rows(), Op.svm_scores, native, SVM_WALK)


@pytest.mark.parametrize("name", ["SVC-rbf", "SVC-rbf-binary"])
def test_svm_labels_come_from_the_classifier_op(name):
    """The one-vs-one votes lower to svm_label and re-emit as the label output of the one
    SVMClassifier that also answers the scores: no votes (MatMul, ArgMax) after it."""
    model = _convert(SVMS[name][0])
    prog = tdag.from_onnx(model)
    assert Op.svm_label in {n.op for n in tdag.lower.lower(prog).graph.nodes}
    emitted = tdag.to_onnx(prog)
    kinds = [n.op_type for n in emitted.graph.node]
    assert kinds.count("SVMClassifier") == 1 and not {"ArgMax", "MatMul"} & set(kinds), kinds
    _compare(_ort(emitted, _rows()), _ort(model, _rows()), name)


def test_a_linear_svr_stays_a_matmul():
    """A linear SVR's scores are x @ (V^T W) + rho, which any linear layer also computes: the
    rule leaves them a matmul rather than write an SVMRegressor into a torch model's file."""
    model = _convert(lambda: svm.SVR(kernel="linear").fit(X_FIT, Y_REAL))
    emitted = tdag.to_onnx(tdag.from_onnx(model))
    assert "SVMRegressor" not in {n.op_type for n in emitted.graph.node}
    _compare(_ort(emitted, _rows()), _ort(model, _rows()), "linear SVR")


def test_base_values_go_into_the_tree_kernel():
    """GradientBoostingRegressor's base value is added inside the re-emitted tree op."""
    model = _convert(MODELS["GradientBoostingRegressor"])
    emitted = tdag.to_onnx(tdag.from_onnx(model))
    assert "Add" not in {n.op_type for n in emitted.graph.node}
    _compare(_ort(emitted, _rows()), _ort(model, _rows()), "base values")


# two trees over 3 features: tree 0 splits twice (LEQ, GT), tree 1 once (LT)
TREE = dict(nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
            nodes_featureids=[0, 1, 0, 0, 0, 2, 0, 0],
            nodes_values=[0.1, -0.3, 0, 0, 0, 0.4, 0, 0],
            nodes_modes=["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF", "BRANCH_LT", "LEAF",
                         "LEAF"],
            nodes_truenodeids=[1, 3, 0, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 4, 0, 0, 0, 2, 0, 0],
            nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 0, 0],
            target_treeids=[0, 0, 0, 1, 1, 0, 1], target_nodeids=[2, 3, 4, 1, 2, 2, 2],
            target_ids=[0, 0, 0, 0, 0, 1, 1],
            target_weights=[0.5, -1.25, 2.0, 0.75, -0.5, 3.0, 1.5])


@pytest.mark.parametrize("wide", [False, True])
def test_mixed_modes_nan_and_double_thresholds(wide):
    attrs = dict(TREE, n_targets=2, aggregate_function="SUM", base_values=[0.25, -0.25])
    x = np.random.default_rng(4).standard_normal((12, 3)).astype(np.float32)
    x[0, 0], x[1, 0], x[2, 2], x[3, 1] = np.nan, 0.1, 0.4, -0.3  # NaN and on the thresholds
    if wide:
        values = np.array(attrs.pop("nodes_values"), np.float64) + 1e-9
        attrs["nodes_values_as_tensor"] = onnx.numpy_helper.from_array(values, "values")
        x = x.astype(np.float64)
    node = helper.make_node("TreeEnsembleRegressor", ["x"], ["y"], domain="ai.onnx.ml", **attrs)
    graph = helper.make_graph(
        [node], "forest", [helper.make_tensor_value_info(
            "x", TensorProto.DOUBLE if wide else TensorProto.FLOAT, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("ai.onnx.ml", 3)])
    model.ir_version = 8
    _check(model, x)


def test_the_walk_costs_depth_not_leaves():
    """A forest of 2**9 leaves per tree lowers to one kernel whose work per row and tree is
    its depth's, and whose torch code does not grow with the tree."""
    x = RNG.standard_normal((400, 4)).astype(np.float32)
    deep = ensemble.RandomForestRegressor(n_estimators=3, max_depth=9, random_state=0) \
        .fit(x, x[:, 0] * x[:, 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = skl2onnx.to_onnx(deep, x[:1], target_opset={"": 17, "ai.onnx.ml": 3})
    prog = tdag.from_onnx(model)
    assert len(prog.graph.nodes) < 120  # nine levels of a handful of gathers, not one per leaf
    low = tdag.lower.lower(prog)
    (kernel,) = [n for n in low.graph.nodes if n.op is Op.tree_sum]
    assert kernel.spec.depth == 9
    _compare([tdag.to_torch(prog)(torch.from_numpy(x[:50])).numpy()], _ort(model, x[:50]),
             "to_torch, depth 9")


@pytest.mark.parametrize("name", ["RandomForestClassifier", "GradientBoostingClassifier-3"])
def test_forest_labels_skip_the_argmax_nan_guard(name):
    """A forest's scores are sums of finite constant leaves: never NaN, whatever the rows, so
    the re-emitted label is a bare ArgMax (no IsNaN guard), and still what onnxruntime
    answers on the original, rows with NaN included."""
    model = _convert(MODELS[name])
    emitted = tdag.to_onnx(tdag.from_onnx(model))
    kinds = [n.op_type for n in emitted.graph.node]
    assert "ArgMax" in kinds and "IsNaN" not in kinds, kinds
    _compare(_ort(emitted, _rows()), _ort(model, _rows()), name)



def test_votes_of_other_scores_are_written_as_onnx_ops():
    """svm_label over pair scores no SVM kernel computes (a traced input) is ONNX's votes:
    Greater, two MatMul, ArgMax (the first of equal votes) and the label Gather."""
    builder = Builder()
    with builder.active():
        scores = builder.input("s", tdag.TensorType((symbol("n"), 6), tdag.DType.f32))
        prog = Program.from_tdag(builder.build([svm_label(scores, (5, 1, 7, 2))]))
    assert [n.op for n in tdag.lower.lower(prog).graph.nodes] == [Op.svm_label]
    s = np.random.default_rng(5).standard_normal((40, 6)).astype(np.float32)
    s[:4] = [1, 1, -1, -1, 1, -1]  # classes 0 and 3 win two votes each: the first, label 5
    expected = tdag.run(prog, torch.from_numpy(s)).numpy()
    np.testing.assert_array_equal(_ort(tdag.to_onnx(prog), s)[0], expected)
    assert expected[0] == 5
