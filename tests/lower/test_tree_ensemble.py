"""ai.onnx.ml's TreeEnsemble (opset 5) is the classic ops' O(depth) walk.

A forest made with onnx.helper (skl2onnx writes the classic ops): three random trees of a
few hundred leaves, two comparison modes, NaN tracking the true branch on some nodes, leaves
scoring one of two targets (and one leaf that no tree reaches). Imported, it is
``tdag.ops.ml.tree_sum``'s walk (a handful of nodes per level, not a where() per leaf);
lowered, the tree kernel; re-emitted, one TreeEnsembleRegressor. Checked against
onnxruntime on the original, rows with NaN and values on the thresholds included, for every
aggregate function (under MIN and MAX a target that no tree scores reads 0, as onnxruntime
answers)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import tdag
from tdag.ir.op import Op

TOL = 1e-6
DEPTH = 8


def _tree(rng, nodes: dict, leaves: dict, depth: int) -> tuple[int, bool]:
    """A random subtree: (its index, whether it is a leaf), appended to the tables."""
    if depth == DEPTH or (depth > 2 and rng.random() < 0.15):
        leaves.setdefault("weights", []).append(float(rng.standard_normal()))
        leaves.setdefault("targets", []).append(int(rng.integers(2)))
        return len(leaves["weights"]) - 1, True
    k = len(nodes.setdefault("modes", []))
    nodes["modes"].append(int(rng.choice([0, 3])))  # BRANCH_LEQ, BRANCH_GT
    for name, value in (("features", int(rng.integers(4))),
                        ("splits", float(np.float32(rng.standard_normal()))),
                        ("missing", int(rng.random() < 0.3))):
        nodes.setdefault(name, []).append(value)
    for side in ("true", "false"):
        nodes.setdefault(side, []).append(None)
        nodes.setdefault(f"{side}_leaf", []).append(None)
    for side in ("true", "false"):
        nodes[side][k], nodes[f"{side}_leaf"][k] = _tree(rng, nodes, leaves, depth + 1)
    return k, False


def _forest(aggregate: int):
    rng = np.random.default_rng(11)
    nodes, leaves = {}, {}
    roots = [_tree(rng, nodes, leaves, 0)[0] for _ in range(3)]
    leaves["weights"].append(100.0)  # a leaf no tree reaches counts nowhere
    leaves["targets"].append(0)
    floats = lambda values: numpy_helper.from_array(np.array(values, np.float32))  # noqa: E731
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain="ai.onnx.ml", n_targets=2, tree_roots=roots,
        aggregate_function=aggregate, post_transform=0, nodes_featureids=nodes["features"],
        nodes_splits=floats(nodes["splits"]),
        nodes_modes=numpy_helper.from_array(np.array(nodes["modes"], np.uint8)),
        nodes_truenodeids=nodes["true"], nodes_falsenodeids=nodes["false"],
        nodes_trueleafs=[int(b) for b in nodes["true_leaf"]],
        nodes_falseleafs=[int(b) for b in nodes["false_leaf"]],
        nodes_missing_value_tracks_true=nodes["missing"],
        leaf_targetids=leaves["targets"], leaf_weights=floats(leaves["weights"]))
    graph = helper.make_graph([node], "forest", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("ai.onnx.ml", 5)])
    model.ir_version = 10
    x = rng.standard_normal((64, 4)).astype(np.float32)
    x[0, :], x[1, 1], x[2, 2] = np.nan, np.nan, np.float32(nodes["splits"][0])
    return model, x, len(leaves["weights"])


def _ort(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_walks_in_depth_steps(aggregate):
    model, x, leaves = _forest(aggregate)
    assert leaves > 200
    expected = _ort(model, x)
    prog = tdag.from_onnx(model)
    # per level two dozen gathers, compares and selects, not a where() per leaf (MIN, MAX:
    # one walk too, the trees' columns side by side, then how many scored each target)
    assert len(prog.graph.nodes) < 30 * DEPTH < leaves
    lowered = [n.op for n in tdag.lower.lower(prog).graph.nodes]
    assert lowered.count(Op.tree_sum) == 1
    np.testing.assert_allclose(tdag.run(prog, torch.from_numpy(x)).numpy(), expected,
                               rtol=TOL, atol=TOL)
    emitted = tdag.to_onnx(prog)
    kinds = [n.op_type for n in emitted.graph.node]
    # the walk is one tree op; then the aggregate: a division, or a min/max and a where
    assert kinds.count("TreeEnsembleRegressor") == 1 and len(kinds) < 12, kinds
    np.testing.assert_allclose(_ort(emitted, x), expected, rtol=TOL, atol=TOL)
    got = tdag.to_torch(prog)(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=TOL, atol=TOL)
